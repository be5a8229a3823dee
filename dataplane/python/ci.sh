#!/usr/bin/env bash
# Builds and tests the `joader` Python package against the Rust fixture writer.
#
#   bash dataplane/python/ci.sh          (from anywhere; idempotent)
#
# Installs maturin/numpy/pytest if missing, builds the fixture binary and
# the extension (`pip install ./dataplane/python`, maturin as the PEP 517
# backend, no build isolation so that cargo's target dir and registry are
# reused), then runs pytest. torch and torchvision are installed from PyPI
# when missing, in one pip command (so that pip picks versions made for each
# other; the wheels pull the CUDA libraries, ~2.5 min here; the CPU-only index
# is not reachable), with no fallback: a failed install fails this script.
# JOADER_CI_TORCH=0 skips the install (a local run without torch: its test
# then skips, or fails under JOADER_REQUIRE_TOOLS=1, as tests/all.sh sets).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
py="${PYTHON:-python3}"

need=()
"$py" -c "import maturin" 2>/dev/null || need+=("maturin>=1.7,<2")
"$py" -c "import numpy" 2>/dev/null || need+=("numpy")
"$py" -c "import pytest" 2>/dev/null || need+=("pytest")
"$py" -c "import mypy" 2>/dev/null || need+=("mypy")
if [ "${#need[@]}" -gt 0 ]; then
  "$py" -m pip install -q "${need[@]}"
fi

if [ "${JOADER_CI_TORCH:-1}" = "1" ] && ! "$py" -c "import torch, torchvision" 2>/dev/null; then
  echo "ci.sh: installing torch and torchvision"
  "$py" -m pip install -q torch torchvision
fi

cargo build -q -p dataplane --bin dataplane-fixture --manifest-path "$root/Cargo.toml"
export JOADER_FIXTURE="$CARGO_TARGET_DIR/debug/dataplane-fixture"

# Reinstall only when the sources changed since the last install.
stamp="$CARGO_TARGET_DIR/joader-python.stamp"
# (The extension is a workspace member: the root manifest and lock file count too.)
sum="$(cd "$root" && find Cargo.toml Cargo.lock dataplane/src dataplane/Cargo.toml dataplane/python/src \
  dataplane/python/joader dataplane/python/Cargo.toml dataplane/python/pyproject.toml -type f -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum)"
if ! "$py" -c "import joader._native" 2>/dev/null || [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
  "$py" -m pip install -q --no-build-isolation --force-reinstall --no-deps "$here"
  echo "$sum" > "$stamp"
fi

# Types: the package is shipped with py.typed and stubs; keep them honest.
(cd "$here" && "$py" -m mypy --strict --ignore-missing-imports --no-incremental \
  joader/__init__.py joader/_native.pyi joader/torch.py joader/boxes.py)

# Run from the tests folder so that the installed package, not the source tree, is imported.
cd "$here/tests"
"$py" -m pytest -q -p no:cacheprovider "$@" .
