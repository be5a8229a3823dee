#!/usr/bin/env bash
# Builds and tests the `joader` Python package against the Rust fixture writer.
#
#   bash dataplane/python/ci.sh          (from anywhere; idempotent)
#   bash dataplane/python/ci.sh --build  (only build and install the package and the fixture)
#
# Runs in the test command's Python environment (tests/pyenv.sh, sourced here: numpy,
# pytest, mypy, maturin, torch with torchvision, ... all from tests/requirements.lock; nothing
# is installed here but the package under test). Builds the fixture binary and the extension
# (`uv pip install ./dataplane/python` into the environment, maturin as the PEP 517 backend,
# no build isolation so that cargo's target dir and registry are reused), then runs pytest.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
source "$root/tests/pyenv.sh"
py=python3

cargo build -q -p dataplane --bin dataplane-fixture --manifest-path "$root/Cargo.toml"
export JOADER_FIXTURE="$CARGO_TARGET_DIR/debug/dataplane-fixture"

# Reinstall only when the sources (or the checkout) changed since the last install into this
# environment. (The extension is a workspace member: the root manifest and lock file count too.)
stamp="$VIRTUAL_ENV/.joader-package"
sum="$here $(cd "$root" && find Cargo.toml Cargo.lock dataplane/shm/src dataplane/shm/Cargo.toml dataplane/python/src \
  dataplane/python/joader dataplane/python/Cargo.toml dataplane/python/pyproject.toml -type f -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum)"
# (A sync of the environment to a new lock removes the package: the import fails then.)
if ! "$py" -c "import joader._native" 2>/dev/null || [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
  "$JOADER_UV" pip install --quiet --python "$(command -v "$py")" --no-build-isolation \
    --reinstall --no-deps "$here"
  echo "$sum" > "$stamp"
fi
# `ci.sh --build`: the package and the fixture only (tests/all.sh builds them before any test).
[ "${1:-}" = "--build" ] && exit 0

# Types: the package is shipped with py.typed and stubs; keep them honest.
(cd "$here" && "$py" -m mypy --strict --ignore-missing-imports --no-incremental \
  joader/*.py joader/_native.pyi)

# Run from the tests folder so that the installed package, not the source tree, is imported.
cd "$here/tests"
"$py" -m pytest -q -p no:cacheprovider "$@" .
