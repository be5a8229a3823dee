#!/usr/bin/env bash
# Runs tests again and again, optionally beside a CPU hog on every core, and prints which tests
# failed in which run: the way to show that a test is deterministic (see CODE_STYLE.md).
#
#   bash tests/repeat.sh [--hog] [--py EXPR] N [FILTER...]
#
#   N           how many runs
#   (no filter) each run is the whole test command, `bash tests/all.sh`
#   FILTER...   each run is `cargo test --workspace --exclude joader-python -- FILTER...`
#               (libtest name filters, substrings such as `service::tests` or
#               `metrics_count_what_the_jobs_did`)
#   --py EXPR   each run also runs the Python suites with `pytest -k EXPR`
#               (dataplane/python/tests and tests/python)
#   --hog       keep every core busy with a spinning process for the whole time
#
# Logs go to target/repeat/run-<i>.log. Exit status: 0 when every run passed. There is no
# retry anywhere: a test that fails once in N runs is a flaky test to fix.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# The Python runs and the Rust tests that call python3 use the test command's environment.
source tests/pyenv.sh || exit 1

hog=0
py_expr=""
while [ $# -gt 0 ]; do
    case "$1" in
        --hog) hog=1; shift ;;
        --py) py_expr="${2:?--py needs a pytest -k expression}"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) break ;;
    esac
done
runs="${1:?usage: tests/repeat.sh [--hog] [--py EXPR] N [FILTER...]}"
shift
filters=("$@")
case "$runs" in ''|*[!0-9]*) echo "N must be a whole number, not '$runs'" >&2; exit 2 ;; esac

logs="$CARGO_TARGET_DIR/repeat"
mkdir -p "$logs"

hogs=()
stop_hogs() {
    for p in "${hogs[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap stop_hogs EXIT
if [ "$hog" = 1 ]; then
    for _ in $(seq "$(nproc)"); do
        bash -c 'while :; do :; done' &
        hogs+=("$!")
    done
    echo "repeat: ${#hogs[@]} CPU hogs running"
fi

# One run; its output goes to $1. Returns the run's exit status.
one_run() {
    local log="$1" status=0
    if [ ${#filters[@]} -eq 0 ] && [ -z "$py_expr" ]; then
        bash tests/all.sh >"$log" 2>&1 || status=$?
        return "$status"
    fi
    if [ ${#filters[@]} -gt 0 ]; then
        cargo test --workspace --exclude joader-python -- "${filters[@]}" >>"$log" 2>&1 || status=$?
    fi
    if [ -n "$py_expr" ]; then
        local s=0
        bash dataplane/python/ci.sh -k "$py_expr" >>"$log" 2>&1 || s=$?
        [ "$s" = 5 ] && s=0 # pytest: no test matched in this suite
        [ "$s" != 0 ] && status=$s
        s=0
        JOADER_BIN="$CARGO_TARGET_DIR/debug/joader" python3 -m pytest -q -p no:cacheprovider \
            tests/python -k "$py_expr" >>"$log" 2>&1 || s=$?
        [ "$s" = 5 ] && s=0
        [ "$s" != 0 ] && status=$s
    fi
    return "$status"
}

# Names of the failed tests in a log: libtest's "test X ... FAILED" and pytest's "FAILED X".
failed_tests() {
    grep -E '^test .* \.\.\. FAILED$|^FAILED ' "$1" \
        | sed -E 's/^test (.*) \.\.\. FAILED$/\1/; s/^FAILED ([^ ]*).*/\1/' \
        | sort -u | tr '\n' ' '
}

if [ ${#filters[@]} -gt 0 ] || [ -n "$py_expr" ]; then
    # Build once, outside the runs, so that a run measures the tests and not the compiler.
    cargo test --workspace --exclude joader-python --no-run --quiet || exit 1
    [ -n "$py_expr" ] && cargo build --quiet -p joader-tools --bin joader
fi

failed_runs=0
summary=()
for i in $(seq "$runs"); do
    log="$logs/run-$i.log"
    : >"$log"
    start=$(date +%s)
    if one_run "$log"; then
        line="run $i/$runs: passed ($(( $(date +%s) - start )) s)"
    else
        status=$?
        failed_runs=$((failed_runs + 1))
        names="$(failed_tests "$log")"
        [ -z "$names" ] && names="(no test named: exit $status; see the end of the log)"
        line="run $i/$runs: FAILED ($(( $(date +%s) - start )) s): $names  [$log]"
    fi
    echo "$line"
    summary+=("$line")
done

echo
echo "repeat: $runs runs$([ "$hog" = 1 ] && echo ' beside a CPU hog on every core'), $failed_runs failed"
for l in "${summary[@]}"; do
    case "$l" in *FAILED*) echo "  $l" ;; esac
done
[ "$failed_runs" = 0 ]
