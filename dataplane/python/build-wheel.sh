#!/usr/bin/env bash
# Builds the one wheel of joader: `import joader` (the native extension, abi3 for CPython >= 3.9)
# and the `joader` command (the daemon, `joader-tools --no-default-features`: the user's
# subcommands, no benches), both stripped, installed by pip or uv into the environment's bin
# folder.
#
#   bash dataplane/python/build-wheel.sh [-o DIR]
#       The release wheel, manylinux_2_28_x86_64: the daemon and the extension cross-built
#       against glibc 2.28 with zig (cargo-zigbuild, ziglang). About 8 minutes on 2 cores the
#       first time. Copy the wheel to the training machines and `pip install` it there: no
#       Rust, no C compiler, no nasm needed.
#   bash dataplane/python/build-wheel.sh --native --daemon BIN [-o DIR]
#       A wheel of this machine's build (its glibc's manylinux tag): the extension built here
#       (reusing the test build's release artifacts) and BIN, a `joader` built here, as its
#       command. The test command builds one of these (tests/python/test_wheel.py).
#
# Both end with `auditwheel show` (the tag the wheel earns) and `twine check` (its metadata
# renders on PyPI). The wheel's path is printed last. Tools come from the test command's
# Python environment (tests/pyenv.sh, from tests/requirements.lock): maturin, wheel,
# auditwheel, twine, and for the release build ziglang and cargo-zigbuild. aarch64 is not
# built: its Rust standard library cannot be fetched on the machines this project builds on.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
out="$CARGO_TARGET_DIR/wheels"
native=0
daemon=""
while [ $# -gt 0 ]; do
    case "$1" in
        -o) out="$2"; shift 2 ;;
        --native) native=1; shift ;;
        --daemon) daemon="$2"; shift 2 ;;
        -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-wheel.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ "$native" = 1 ] && [ -z "$daemon" ]; then
    echo "build-wheel.sh: --native needs --daemon BIN (the joader binary to ship)" >&2
    exit 2
fi
if [ "$native" = 0 ] && [ -n "$daemon" ]; then
    echo "build-wheel.sh: --daemon is for --native; the release build builds its own" >&2
    exit 2
fi
source "$root/tests/pyenv.sh"
mkdir -p "$out"
work="$(mktemp -d "$out/.build-XXXXXX")"
trap 'rm -rf "$work"' EXIT

glibc=2.28
target=x86_64-unknown-linux-gnu
if [ "$native" = 1 ]; then
    echo "== build-wheel: the extension (native, release)"
    maturin build --release --strip --locked -m "$here/Cargo.toml" -o "$work/plain" --quiet
else
    echo "== build-wheel: the daemon, against glibc $glibc (cargo zigbuild, release, no benches)"
    (cd "$root" && cargo zigbuild --release --locked --target "$target.$glibc" \
        -p joader-tools --bin joader --no-default-features)
    daemon="$CARGO_TARGET_DIR/$target/release/joader"
    echo "== build-wheel: the extension, manylinux_2_28 (maturin --zig)"
    maturin build --release --strip --locked --zig --target "$target" \
        --compatibility "manylinux_${glibc/./_}" -m "$here/Cargo.toml" -o "$work/plain" --quiet
fi
[ -x "$daemon" ] || { echo "build-wheel.sh: no daemon binary at $daemon" >&2; exit 1; }
plain=("$work"/plain/joader-*.whl)
[ "${#plain[@]}" = 1 ] && [ -f "${plain[0]}" ] || {
    echo "build-wheel.sh: expected one wheel from maturin, got: ${plain[*]}" >&2
    exit 1
}

echo "== build-wheel: the daemon into the wheel's scripts (stripped)"
python3 -m wheel unpack "${plain[0]}" -d "$work/tree" >/dev/null
tree=("$work"/tree/joader-*)
name="$(basename "${tree[0]}")"
mkdir -p "${tree[0]}/$name.data/scripts"
strip -o "${tree[0]}/$name.data/scripts/joader" "$daemon"
chmod 755 "${tree[0]}/$name.data/scripts/joader"
mkdir -p "$work/final"
python3 -m wheel pack "${tree[0]}" -d "$work/final" >/dev/null
packed=("$work"/final/joader-*.whl)
mv -f "${packed[0]}" "$out/"
wheel=("$out/$(basename "${packed[0]}")")

echo "== build-wheel: checks"
auditwheel show "${wheel[0]}"
twine check --strict "${wheel[0]}"
echo "build-wheel: $(du -h "${wheel[0]}" | cut -f1) (the daemon stripped: $(du -h \
    "${tree[0]}/$name.data/scripts/joader" | cut -f1))"
echo "${wheel[0]}"
