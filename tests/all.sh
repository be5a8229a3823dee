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

echo "== python: one environment, synced to tests/requirements.lock before any test (tests/pyenv.sh)"
# Every step below, the Rust tests that run python3 included, sees this environment's python3
# first on PATH and nothing of the system's site-packages. No test installs anything.
source tests/pyenv.sh
# The tests that need a tool fail (instead of skipping) when it is missing: the Rust tests,
# and the Python suites through `need` in their conftest.py.
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
# The shipped binary's build (docker/Dockerfile): without the benches.
cargo clippy -p joader-tools --no-default-features --all-targets --quiet -- -D warnings

echo "== builds: the joader binary, the data plane's fixture writer, the Python package (into the environment)"
# Everything any test runs is built before the first test, so that the order of the steps
# below does not matter.
cargo build --quiet -p joader-tools --bin joader
bash dataplane/python/ci.sh --build

echo "== rust tests"
# Not the Python extension: its tests are pytest's (test = false), and building it here would
# give the daemon its allocator features (Cargo.toml, `mimalloc`).
cargo test --workspace --exclude joader-python

echo "== REST API fuzzing: schemathesis against the real server"
JOADER_BIN="$CARGO_TARGET_DIR/debug/joader" bash tests/schemathesis.sh

echo "== python package: built into the environment, type-checked, its tests"
bash dataplane/python/ci.sh

echo "== python client against the real server, and the Kubernetes manifests"
JOADER_BIN="$CARGO_TARGET_DIR/debug/joader" python3 -m pytest -q -p no:cacheprovider tests/python
