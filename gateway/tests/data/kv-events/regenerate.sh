#!/bin/sh
# Re-generate the KV event fixtures beside this script: one command, no state in the clone.
# msgspec and pyzmq (PyPI) go into a virtual environment cached outside the clone, made once.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv="${ROUTELAB_PY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/routelab}/venv-kv-events"
if ! "$venv/bin/python" -c 'import msgspec, zmq' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet 'msgspec==0.19.*' 'pyzmq==27.*'
fi
exec "$venv/bin/python" "$here/generate.py"
