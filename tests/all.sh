#!/usr/bin/env bash
# Runs every test of joader on a fresh machine: installs what the tests need, checks
# formatting and lints, then runs the Rust tests (unit, property, statistical and the
# integration binary), schemathesis against the real server's OpenAPI document, the Python
# package's tests, and the Python client against the real server.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

echo "== tools for the observability tests (Debian: chromium, prometheus with promtool)"
if ! command -v chromium >/dev/null || ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium prometheus >/dev/null
fi
# The tests that need them fail (instead of skipping) when they are missing.
export JOADER_REQUIRE_TOOLS=1

echo "== formatting and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== rust tests"
cargo build --quiet -p server --bin joader
cargo test --workspace

echo "== REST API fuzzing: schemathesis against the real server (installs schemathesis when missing)"
JOADER_BIN="$CARGO_TARGET_DIR/debug/joader" bash tests/schemathesis.sh

echo "== python package (installs maturin, numpy, pytest, mypy and torch when missing)"
bash dataplane/python/ci.sh

echo "== python client against the real server, and the Kubernetes manifests (installs kubernetes-validate when missing)"
python3 -c "import kubernetes_validate" 2>/dev/null || python3 -m pip install -q kubernetes-validate
JOADER_BIN="$CARGO_TARGET_DIR/debug/joader" python3 -m pytest -q -p no:cacheprovider tests/python
