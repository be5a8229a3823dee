#!/usr/bin/env bash
# Runs every test of joader on a fresh machine: installs what the tests need, checks
# formatting and lints, then runs the Rust tests (unit, property, statistical and the
# integration binary) and the Python package's tests.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== formatting and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== rust tests"
cargo test --workspace

if [ -f dataplane/python/ci.sh ]; then
  echo "== python tests"
  bash dataplane/python/ci.sh
fi
