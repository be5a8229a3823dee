#!/usr/bin/env bash
# Runs every test of joader on a fresh machine: installs what the tests need, checks
# formatting and lints, then runs the Rust tests (unit, property, statistical and the
# integration binary), schemathesis against the real server's OpenAPI document, the Python
# package's tests, and the Python client against the real server (training parity and a
# torchrun job included).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# One build per run: incremental caches would double the target dir on a CI machine's disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

echo "== tools: nasm (libjpeg-turbo's SIMD, built by the mozjpeg crate), and for the observability tests chromium, prometheus with promtool (Debian)"
if ! command -v nasm >/dev/null || ! command -v chromium >/dev/null || ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nasm chromium prometheus >/dev/null
fi
# The decode tests fetch real photos from the scikit-image and scikit-learn wheels with pip
# (into the build's temporary folder) and compare against Pillow when it is installed.
python3 -m pip --version >/dev/null
# The tests that need them fail (instead of skipping) when they are missing: the Rust tests,
# and the Python suites through `need` in their conftest.py (torch, scikit-learn, Pillow: the
# steps below install them, torch with torchvision in one pip command; a failed install fails
# the run).
export JOADER_REQUIRE_TOOLS=1

echo "== s3s-fs, the real S3 server of the s3 source's tests (built once, kept in the target dir)"
# 0.14.1: later versions need a newer Rust than the workspace's.
S3S_FS="$CARGO_TARGET_DIR/tools/bin/s3s-fs"
if [ ! -x "$S3S_FS" ]; then
    cargo install s3s-fs --version 0.14.1 --features binary --locked --root "$CARGO_TARGET_DIR/tools"
fi
export JOADER_S3S_FS="$S3S_FS"

echo "== formatting and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== rust tests"
cargo build --quiet -p joader-tools --bin joader
cargo test --workspace

echo "== REST API fuzzing: schemathesis against the real server (installs schemathesis when missing)"
JOADER_BIN="$CARGO_TARGET_DIR/debug/joader" bash tests/schemathesis.sh

echo "== python package (installs maturin, numpy, pytest, mypy, and torch with torchvision, when missing)"
bash dataplane/python/ci.sh

echo "== python client against the real server, and the Kubernetes manifests (installs scikit-learn and Pillow for the training-parity test, kubernetes-validate for the manifests)"
python3 -c "import sklearn, PIL" 2>/dev/null || python3 -m pip install -q scikit-learn pillow
python3 -c "import kubernetes_validate" 2>/dev/null || python3 -m pip install -q kubernetes-validate
JOADER_BIN="$CARGO_TARGET_DIR/debug/joader" python3 -m pytest -q -p no:cacheprovider tests/python
