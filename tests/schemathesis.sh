#!/usr/bin/env bash
# Fuzzes the REST API with schemathesis against a real `joader serve`, from the OpenAPI
# document the server itself serves (`/v1/openapi.json`). Checks: every answer has a status
# its operation documents and a body that matches the documented schema, no 5xx except a
# 503 where the operation documents one (503 means transient: see the ErrorCode schema), a
# method a path does not have is a 405, and the server is still up afterwards. schemathesis
# comes from the test command's Python environment (tests/pyenv.sh; sourced here when this
# script runs alone).
#
#   bash tests/schemathesis.sh            # uses $CARGO_TARGET_DIR/debug/joader (built if absent)
#   ST_MAX_EXAMPLES=200 bash tests/schemathesis.sh   # a longer run
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
BIN="${JOADER_BIN:-$CARGO_TARGET_DIR/debug/joader}"
# Examples per operation in the fuzzing phase: 150 make a run of about 15 s.
MAX_EXAMPLES="${ST_MAX_EXAMPLES:-150}"

source tests/pyenv.sh
# The CLI's flags and config keys are those of schemathesis 4.
version="$(python3 -c 'import importlib.metadata as m; print(m.version("schemathesis"))' \
    2>/dev/null || true)"
if [ "${version%%.*}" != 4 ]; then
    echo "schemathesis 4 is not in the environment ($(command -v python3)): found '${version}'" >&2
    exit 1
fi
[ -x "$BIN" ] || cargo build --quiet -p joader-tools --bin joader

work="$(mktemp -d "${TMPDIR:-/tmp}/joader-st-XXXXXX")"
instance="st_$$_${RANDOM}"
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        # Drains for at most --drain-grace-s (1 s here), then stops.
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    # A killed server leaves its segments; the server removes them itself when it stops.
    rm -f /dev/shm/joader-"$instance"-* 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# A tiny dataset named `example`, the name the request examples of the document use, so
# that the examples phase registers real jobs (rings in shared memory) and deletes them.
"$BIN" gen-dataset --out "$work/root/example" --classes 2 --per-class 4 --width 32 --height 24 \
    >/dev/null 2>&1
# A small cache: registrations that fuzzing piles up cannot fill /dev/shm.
JOADER_LOG=info "$BIN" serve --bind 127.0.0.1:0 --instance "$instance" \
    --cache-bytes 8MiB --cache-slots 512 --drain-grace-s 1 \
    --data-dir "$work/data" --allowed-root "$work/root" >"$work/server.log" 2>&1 &
pid=$!
addr=""
for _ in $(seq 1200); do
    addr="$(grep -o 'addr=[0-9.:]*' "$work/server.log" | head -n1 | cut -d= -f2 || true)"
    [ -n "$addr" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$addr" ]; then
    echo "joader serve did not start:" >&2
    cat "$work/server.log" >&2
    exit 1
fi
url="http://$addr"
spec="{\"kind\": \"image_folder\", \"path\": \"$work/root/example\"}"
curl -fsS -X POST "$url/v1/datasets" -H 'content-type: application/json' \
    -d "{\"name\": \"example\", \"source\": $spec}" >/dev/null
ready=0
for _ in $(seq 1200); do
    curl -fsS "$url/v1/datasets/example" | grep -q '"state":"ready"' && { ready=1; break; }
    sleep 0.1
done
if [ "$ready" != 1 ]; then
    echo "the example dataset was not indexed:" >&2
    curl -sS "$url/v1/datasets/example" >&2 || true
    exit 1
fi

# not_a_server_error lets a 503 through; status_code_conformance then fails it on every
# operation that does not document one, and the ErrorCode schema says that 503 is transient.
cat >"$work/schemathesis.toml" <<'EOF'
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "503"]
EOF

status=0
# From the temporary folder: schemathesis keeps a cache in its working directory.
checks=not_a_server_error,status_code_conformance,response_schema_conformance,unsupported_method
(cd "$work" && python3 -m schemathesis.cli --config-file "$work/schemathesis.toml" \
    run "$url/v1/openapi.json" --checks "$checks" \
    --phases examples,coverage,fuzzing \
    --max-examples "$MAX_EXAMPLES" --seed "${ST_SEED:-1}" --workers 2 \
    --generation-database none --no-color) || status=$?

if ! kill -0 "$pid" 2>/dev/null || ! curl -fsS "$url/healthz" >/dev/null; then
    echo "joader serve did not survive the fuzzing; its log:" >&2
    tail -n 50 "$work/server.log" >&2
    exit 1
fi
if [ "$status" -ne 0 ]; then
    echo "schemathesis found failures (server log tail below)" >&2
    tail -n 20 "$work/server.log" >&2
fi
exit "$status"
