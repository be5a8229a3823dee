#!/usr/bin/env bash
# The test command's one Python environment, built from `tests/requirements.lock` alone.
#
#   source tests/pyenv.sh            # make or sync it, then put it first on PATH (tests/all.sh)
#   bash tests/pyenv.sh --compile    # recompile the lock from tests/requirements.in
#
# The environment lives outside the checkout, at $JOADER_PYENV (default
# ${XDG_CACHE_HOME:-~/.cache}/joader/test-env), made by uv from the machine's python3 without
# the system's site-packages (nor the user's), and synced with `uv pip sync --require-hashes`:
# exactly the locked packages, each checked against its hash, anything else removed. The sync
# runs only when the lock (or the interpreter) changed since the last one. Files are hard links
# into uv's cache (UV_LINK_MODE=hardlink): the cache and the environment share their bytes.
# uv itself comes from PyPI, pinned by hash in tests/uv.lock, into a small venv beside it.
# After sourcing: `python3` is the environment's, VIRTUAL_ENV is set, and JOADER_UV names uv
# (dataplane/python/ci.sh installs the joader package with it).

_joader_pyenv() {
    local root base env uvenv uv lock sum py
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    base="${XDG_CACHE_HOME:-$HOME/.cache}/joader"
    env="${JOADER_PYENV:-$base/test-env}"
    lock="$root/tests/requirements.lock"
    uvenv="$base/uv-$(sed -n 's/^uv==\([0-9.]*\).*/\1/p' "$root/tests/uv.lock")"
    uv="$uvenv/bin/uv"
    # Never a Python that uv would download: the machine's python3 (or $JOADER_BASE_PYTHON).
    export UV_PYTHON_DOWNLOADS=never UV_LINK_MODE=hardlink
    if [ "${VIRTUAL_ENV:-}" = "$env" ]; then
        # Sourced twice (ci.sh from all.sh): python3 is already the environment's.
        py="$env/bin/python3"
    else
        py="$(command -v "${JOADER_BASE_PYTHON:-python3}")" || {
            echo "pyenv.sh: no python3 on PATH" >&2
            return 1
        }
    fi

    if [ ! -x "$uv" ] || [ ! -f "$uvenv/.complete" ]; then
        echo "pyenv.sh: installing uv into $uvenv"
        rm -rf "$uvenv"
        "$py" -m venv "$uvenv" || return 1
        "$uvenv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
            --require-hashes -r "$root/tests/uv.lock" || return 1
        touch "$uvenv/.complete"
    fi
    export JOADER_UV="$uv"

    if [ "${1:-}" = "--compile" ]; then
        # For this project's machines (x86_64 Linux, CPython 3.11).
        (cd "$root" && "$uv" pip compile --generate-hashes --python-version 3.11 \
            --python-platform x86_64-unknown-linux-gnu --quiet \
            --custom-compile-command "bash tests/pyenv.sh --compile" \
            tests/requirements.in -o tests/requirements.lock) || return 1
        return 0
    fi

    if [ ! -x "$env/bin/python3" ] || ! "$env/bin/python3" -c "" 2>/dev/null; then
        # New, or left half made, or its interpreter gone: made anew.
        echo "pyenv.sh: creating $env from $py"
        rm -rf "$env"
        "$uv" venv --quiet --python "$py" "$env" || return 1
    fi
    sum="$(cat "$lock" <("$env/bin/python3" -VV) | sha256sum | cut -d' ' -f1)"
    if [ "$(cat "$env/.joader-lock" 2>/dev/null)" != "$sum" ]; then
        echo "pyenv.sh: syncing $env to tests/requirements.lock"
        rm -f "$env/.joader-lock"
        "$uv" pip sync --quiet --require-hashes --python "$env/bin/python3" "$lock" || return 1
        echo "$sum" >"$env/.joader-lock"
        echo "pyenv.sh: the environment takes $(du -sh "$env" | cut -f1) (hard links into" \
            "uv's cache, $(du -sh "$("$uv" cache dir)" 2>/dev/null | cut -f1) with it)"
    fi

    export VIRTUAL_ENV="$env"
    case ":$PATH:" in
        *":$env/bin:"*) ;;
        *) export PATH="$env/bin:$PATH" ;;
    esac
    # Nothing from outside the environment: no PYTHONPATH, no user site-packages.
    unset PYTHONPATH PYTHONHOME
    export PYTHONNOUSERSITE=1
    hash -r
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    _joader_pyenv "$@"
else
    _joader_pyenv || return 1
fi
