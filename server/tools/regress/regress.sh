#!/usr/bin/env bash
# The regression guard: builds two commits (release `joader` binary and Python package each)
# and runs regress.py on them side by side, alternating.
#
#   bash server/tools/regress/regress.sh 2f15804 HEAD [regress.py flags: --rounds 3 ...]
#
# Run it before a change to a measured path (sampling, cache, decode, client, storage) lands:
# BASE is main, the other your branch. Each commit is checked out in a git worktree under
# target/regress/<sha> (a dirty work tree is not measured: commit first) and built in a cargo
# target folder of its own (two worktrees of one workspace in one target folder can link one's
# crates into the other's build: cargo names a workspace's crates by their relative paths),
# about 10 minutes a commit on 2 cores; its package is installed into a venv of its own (numpy
# and the package, by uv from the test command's environment, tests/pyenv.sh). The binaries
# and venvs are kept, the target folders not: a second run of the same commits starts
# measuring at once.
set -euo pipefail
cd "$(dirname "$0")/../../.."
root="$PWD"
[ $# -ge 2 ] || { echo "usage: $0 BASE OTHER [regress.py flags]" >&2; exit 2; }
a="$(git rev-parse --short=10 "$1^{commit}")"
b="$(git rev-parse --short=10 "$2^{commit}")"
shift 2
source tests/pyenv.sh
out="$root/target/regress"
mkdir -p "$out"

build() {
    local sha="$1" dir="$out/$1"
    if [ -x "$dir/joader" ] && [ -x "$dir/venv/bin/python" ] && [ -f "$dir/.complete" ]; then
        return 0
    fi
    echo "regress.sh: building $sha" >&2
    rm -rf "$dir/src" "$dir/wheel" "$dir/venv"
    git worktree prune
    git worktree add --detach --force "$dir/src" "$sha" >/dev/null
    (
        export CARGO_TARGET_DIR="$dir/target"
        cd "$dir/src"
        cargo build --release --quiet --bin joader
        cp "$CARGO_TARGET_DIR/release/joader" "$dir/joader"
        python3 -m maturin build --release --quiet -m dataplane/python/Cargo.toml -o "$dir/wheel"
    )
    "$JOADER_UV" venv --quiet --python "$(command -v python3)" "$dir/venv"
    "$JOADER_UV" pip install --quiet --python "$dir/venv/bin/python" \
        "numpy==$(sed -n 's/^numpy==\([^ ]*\).*/\1/p' tests/requirements.lock)" "$dir"/wheel/*.whl
    git worktree remove --force "$dir/src"
    rm -rf "$dir/target"
    touch "$dir/.complete"
}

build "$a"
build "$b"
python3 server/tools/regress/regress.py --work "$out/work" \
    --side "$a=$out/$a/joader,$out/$a/venv/bin/python" \
    --side "$b=$out/$b/joader,$out/$b/venv/bin/python" "$@"
