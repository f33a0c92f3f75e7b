#!/usr/bin/env bash
# The field's real routers, as their projects publish them on PyPI (Rust binaries inside
# wheels, no torch): SGLang's model gateway (`sglang-router`, command `smg`) and vLLM's router
# (`vllm-router`), pinned, into a venv cached outside the clone. `routelab h2h` runs them from
# there (docs/head-to-head.md).
#
#   deploy/field-routers/install.sh [install]   # installs once; prints the venv's path
#   deploy/field-routers/install.sh path        # prints the venv's path (installed or not)
#   deploy/field-routers/install.sh check       # exit 0 when installed as pinned, else 1
#   deploy/field-routers/install.sh start --run-dir DIR NAME sglang|vllm ARGS...
#       # starts one router on loopback, its output in DIR/NAME.log; prints its process id
#   deploy/field-routers/install.sh stop --run-dir DIR NAME   # stops exactly that process id
#   deploy/field-routers/install.sh lock        # re-writes requirements.txt for this Python
#
# Sourced, it only defines the functions (field_routers_install, field_router_start,
# field_router_stop, ...).
#
# Every package comes from requirements.txt, pinned with its sha256 (`pip install
# --require-hashes`): the two routers and everything their launchers import. The venv is
# $ROUTELAB_FIELD_ROUTERS/venv (default ${XDG_CACHE_HOME:-$HOME/.cache}/routelab/field-routers),
# re-made only when requirements.txt changes. A router started here binds 127.0.0.1 only (its
# Prometheus port too) and has HF_ENDPOINT pointed at a closed loopback port, so it fetches
# nothing from a model hub.
set -euo pipefail

FR_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FR_REQUIREMENTS=$FR_HERE/requirements.txt
SGLANG_ROUTER_VERSION=0.3.2
SGLANG_ROUTER_SHA256=ba5a24951e5e0357fe390782fcd1abd861448a87216832dbf2e501a1dd1548eb
VLLM_ROUTER_VERSION=0.1.17
VLLM_ROUTER_SHA256=85c96bea4d573a49b5a8ae4c72ee3dfe733aba26b6f1ff1256e6142f1f42694d
FR_BASE=${ROUTELAB_FIELD_ROUTERS:-${XDG_CACHE_HOME:-$HOME/.cache}/routelab/field-routers}
FR_VENV=$FR_BASE/venv
# Where a router looks for a model hub: a loopback port nothing listens on.
FR_HUB_ENDPOINT=http://127.0.0.1:9
FR_START_TIMEOUT_S=${ROUTELAB_FIELD_ROUTER_START_TIMEOUT_S:-60}

fr_die() { echo "field-routers: error: $*" >&2; exit 2; }
fr_say() { echo "field-routers: $*" >&2; }

fr_python() {
  command -v python3 >/dev/null || fr_die "python3 is missing (apt-get install python3 python3-venv)"
  echo python3
}

# sha256 of the lock: the venv records the one it was made from.
fr_lock_sha() { sha256sum "$FR_REQUIREMENTS" | cut -d' ' -f1; }

field_routers_installed() {
  [ -x "$FR_VENV/bin/smg" ] && [ -x "$FR_VENV/bin/vllm-router" ] \
    && [ "$(cat "$FR_VENV/.routelab-lock" 2>/dev/null)" = "$(fr_lock_sha)" ]
}

# Install once (idempotent); prints the venv's path.
field_routers_install() {
  if field_routers_installed; then echo "$FR_VENV"; return 0; fi
  local py; py=$(fr_python)
  grep -q "^sglang-router==$SGLANG_ROUTER_VERSION --hash=sha256:$SGLANG_ROUTER_SHA256\$" "$FR_REQUIREMENTS" \
    && grep -q "^vllm-router==$VLLM_ROUTER_VERSION --hash=sha256:$VLLM_ROUTER_SHA256\$" "$FR_REQUIREMENTS" \
    || fr_die "$FR_REQUIREMENTS does not pin sglang-router $SGLANG_ROUTER_VERSION and vllm-router $VLLM_ROUTER_VERSION at their hashes"
  fr_say "installing sglang-router $SGLANG_ROUTER_VERSION and vllm-router $VLLM_ROUTER_VERSION into $FR_VENV"
  rm -rf "$FR_VENV"
  mkdir -p "$FR_BASE"
  "$py" -m venv "$FR_VENV" >&2 || fr_die "could not create a venv (apt-get install python3-venv)"
  "$FR_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
      --require-hashes --only-binary :all: -r "$FR_REQUIREMENTS" >&2 \
    || { rm -rf "$FR_VENV"; fr_die "pip could not install $FR_REQUIREMENTS (pinned for CPython 3.11 on x86_64 Linux; '$0 lock' re-pins for this Python)"; }
  "$FR_VENV/bin/smg" --version >/dev/null 2>&1 || { rm -rf "$FR_VENV"; fr_die "smg does not run"; }
  "$FR_VENV/bin/vllm-router" --help >/dev/null 2>&1 || { rm -rf "$FR_VENV"; fr_die "vllm-router does not run"; }
  fr_lock_sha >"$FR_VENV/.routelab-lock"
  echo "$FR_VENV"
}

# Re-write requirements.txt from `pip download` on this machine (the routers themselves must
# keep the pinned hashes).
field_routers_lock() {
  local py; py=$(fr_python)
  local work; work=$(mktemp -d)
  "$py" -m pip download --quiet --disable-pip-version-check --only-binary :all: -d "$work" \
    "sglang-router==$SGLANG_ROUTER_VERSION" "vllm-router==$VLLM_ROUTER_VERSION" >&2 \
    || { rm -rf "$work"; fr_die "pip download failed"; }
  {
    echo "# The field's routers and every package they import, pinned with their sha256 (pip install"
    echo "# --require-hashes). Wheels for CPython $("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') on $(uname -m) Linux (manylinux): \`install.sh lock\`"
    echo "# re-creates this file for the machine's Python. Written by install.sh lock from"
    echo "# \`pip download sglang-router==$SGLANG_ROUTER_VERSION vllm-router==$VLLM_ROUTER_VERSION\`."
    local f
    for f in "$work"/*.whl; do
      local base name version
      base=$(basename "$f")
      name=$(echo "$base" | cut -d- -f1 | tr _ - | tr '[:upper:]' '[:lower:]')
      version=$(echo "$base" | cut -d- -f2)
      echo "$name==$version --hash=sha256:$(sha256sum "$f" | cut -d' ' -f1)"
    done
  } >"$FR_REQUIREMENTS.tmp"
  rm -rf "$work"
  grep -q "^sglang-router==$SGLANG_ROUTER_VERSION --hash=sha256:$SGLANG_ROUTER_SHA256\$" "$FR_REQUIREMENTS.tmp" \
    && grep -q "^vllm-router==$VLLM_ROUTER_VERSION --hash=sha256:$VLLM_ROUTER_SHA256\$" "$FR_REQUIREMENTS.tmp" \
    || { rm -f "$FR_REQUIREMENTS.tmp"; fr_die "PyPI served router wheels whose sha256 differs from the pins"; }
  mv "$FR_REQUIREMENTS.tmp" "$FR_REQUIREMENTS"
  echo "$FR_REQUIREMENTS"
}

fr_port_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# field_router_start RUN_DIR NAME sglang|vllm ARGS...: start one router (ARGS as its command
# line takes them, e.g. --port 30000 --worker-urls http://127.0.0.1:8001 --policy cache_aware)
# bound to loopback, wait until its port answers, record its process id in RUN_DIR/NAME.pid and
# print it. A router that exits or does not answer in time is stopped and named.
field_router_start() {
  local dir=$1 name=$2 which=$3; shift 3
  field_routers_installed || fr_die "not installed; run $0 install"
  local -a cmd
  case $which in
    sglang) cmd=("$FR_VENV/bin/smg" launch) ;;
    vllm) cmd=("$FR_VENV/bin/vllm-router") ;;
    *) fr_die "router '$which': valid: sglang, vllm" ;;
  esac
  local port="" a prev=""
  for a in "$@"; do
    case $prev in
      --host|--prometheus-host) [ "$a" = 127.0.0.1 ] || fr_die "$prev $a: loopback only (127.0.0.1)" ;;
      --port) port=$a ;;
    esac
    prev=$a
  done
  [ -n "$port" ] || fr_die "give --port"
  fr_port_answers "$port" && fr_die "port $port on 127.0.0.1 is in use"
  mkdir -p "$dir"
  local log=$dir/$name.log
  HF_ENDPOINT=$FR_HUB_ENDPOINT HF_HUB_OFFLINE=1 NO_COLOR=1 \
    "${cmd[@]}" --host 127.0.0.1 --prometheus-host 127.0.0.1 "$@" </dev/null >"$log" 2>&1 &
  local pid=$!
  echo "$pid" >"$dir/$name.pid"
  local waited=0
  while ! fr_port_answers "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$dir/$name.pid"
      tail -5 "$log" >&2 || true
      fr_die "$which router '$name' exited at start (log: $log)"
    fi
    if [ $waited -ge $((FR_START_TIMEOUT_S * 10)) ]; then
      field_router_stop "$dir" "$name"
      fr_die "$which router '$name' did not listen on port $port within ${FR_START_TIMEOUT_S}s (log: $log)"
    fi
    sleep 0.1; waited=$((waited + 1))
  done
  echo "$pid"
}

# field_router_stop RUN_DIR NAME: stop the process id field_router_start recorded (TERM, then
# KILL after 10 s), and forget it.
field_router_stop() {
  local dir=$1 name=$2 pidfile=$1/$2.pid
  [ -f "$pidfile" ] || return 0
  local pid; pid=$(cat "$pidfile")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$pid" 2>/dev/null && [ $waited -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

# Sourced: the functions only.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  return 0
fi

fr_run_dir() {
  [ "${1:-}" = --run-dir ] && [ -n "${2:-}" ] || fr_die "give --run-dir DIR"
  echo "$2"
}

case ${1:-install} in
  install) field_routers_install ;;
  path) echo "$FR_VENV" ;;
  check) field_routers_installed ;;
  lock) field_routers_lock ;;
  start) shift; dir=$(fr_run_dir "$@"); shift 2; field_router_start "$dir" "$@" ;;
  stop) shift; dir=$(fr_run_dir "$@"); shift 2; field_router_stop "$dir" "${1:?give the NAME of the router}" ;;
  *) fr_die "unknown command '$1'; valid: install, path, check, start, stop, lock" ;;
esac
