#!/usr/bin/env bash
# Create the virtualenv and install eventpipe: with its test tools ("dev", the default),
# or only what running it needs ("run": make run).
set -euo pipefail
venv="${1:-.venv}"
what="${2:-dev}"
python="${PYTHON:-python3}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: eventpipe needs Python 3.11 or newer; $python is $("$python" --version 2>&1)" >&2
    echo "  fix: install python3.11 (apt-get install python3.11 python3.11-venv) and run make PYTHON=python3.11" >&2
    exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -m venv "$venv"; then
        scripts/ensure-apt.sh python3-venv
        "$python" -m venv "$venv"
    fi
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
if [ "$what" = run ]; then
    "$venv/bin/python" -m pip install --quiet -e .
else
    "$venv/bin/python" -m pip install --quiet -e '.[dev]'
fi
