#!/usr/bin/env bash
# The routers' own cost against an immediate worker (docs/performance.md, "Against an
# immediate worker"): wrk at 1, 16 and 128 connections, straight to the worker and through each
# router in front of it, the routers alternating within each round (direct, ours, sglang, vllm,
# direct, ours, ...). Prints one line per run and, at the end, a markdown table of the medians
# over the rounds with the added p50/p99 (router minus direct at the same connections).
# `nginx` (if installed) is a reference: nginx proxying the same worker over kept-alive
# upstream connections, `worker_processes auto`, access log off. `--before PATH` adds the router
# `before`: another routelab-gateway binary (e.g. an older commit's) with ours' configuration.
#
#   cargo build --release -p routelab-gateway --bins --example immediate
#   deploy/field-routers/install.sh                # for sglang and vllm (else give --routers)
#   gateway/examples/wrk/routers.sh [--rounds 2] [--seconds 10] [--routers direct,ours,nginx,sglang,vllm]
#       [--sglang-policy cache_aware] [--vllm-policy cache_aware] [--dir DIR]
#
# Ours is target/release/routelab-gateway (or $ROUTELAB_GATEWAY_BIN) with its default policy and one worker, no signals
# (exact tokens, KV streams, metrics polls off). The field's routers run from the venv of
# deploy/field-routers/install.sh with their default policy (cache_aware for both, as
# `routelab h2h` runs them), loopback only. Every process this starts is stopped by its
# process id on exit.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
ROUNDS=2 SECONDS_EACH=10 ROUTERS=direct,ours,sglang,vllm BEFORE_BIN=
SGLANG_POLICY=cache_aware VLLM_POLICY=cache_aware
DIR=$(mktemp -d /tmp/routelab-wrk.XXXXXX)
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) ROUNDS=$2 ;;
    --seconds) SECONDS_EACH=$2 ;;
    --routers) ROUTERS=$2 ;;
    --sglang-policy) SGLANG_POLICY=$2 ;;
    --vllm-policy) VLLM_POLICY=$2 ;;
    --dir) DIR=$2; mkdir -p "$DIR" ;;
    --before) BEFORE_BIN=$2 ;;
    *) echo "error: unknown argument $1 (valid: --rounds, --seconds, --routers, --sglang-policy, --vllm-policy, --dir, --before)" >&2; exit 2 ;;
  esac
  shift 2
done
command -v wrk >/dev/null || { echo "error: wrk is missing (apt-get install -y wrk)" >&2; exit 2; }
WORKER_BIN=$ROOT/target/release/examples/immediate
GATEWAY_BIN=${ROUTELAB_GATEWAY_BIN:-$ROOT/target/release/routelab-gateway}
for b in "$WORKER_BIN" "$GATEWAY_BIN"; do
  [ -x "$b" ] || { echo "error: $b is missing (cargo build --release -p routelab-gateway --bins --example immediate)" >&2; exit 2; }
done
# shellcheck source=/dev/null
source "$ROOT/deploy/field-routers/install.sh"

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -f "$DIR/ours.pid" ] && kill "$(cat "$DIR/ours.pid")" 2>/dev/null || true
  [ -f "$DIR/nginx.pid" ] && kill "$(cat "$DIR/nginx.pid")" 2>/dev/null || true
  field_router_stop "$DIR" sglang 2>/dev/null || true
  field_router_stop "$DIR" vllm 2>/dev/null || true
}
trap cleanup EXIT

port_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  local i
  for i in $(seq 1 300); do port_answers "$1" && return 0; sleep 0.1; done
  echo "error: nothing listens on port $1 after 30 s" >&2; exit 1
}

WPORT=18101 GPORT=18102 SPORT=18103 VPORT=18104 NPORT=18105
for p in $WPORT $GPORT $SPORT $VPORT $NPORT; do
  port_answers $p && { echo "error: port $p on 127.0.0.1 is in use" >&2; exit 1; }
done
"$WORKER_BIN" --port $WPORT >"$DIR/worker.log" 2>&1 &
PIDS+=($!)
wait_port $WPORT
WORKER=http://127.0.0.1:$WPORT

cat >"$DIR/gateway.yaml" <<EOF
listen: 127.0.0.1:$GPORT
workers:
  - {name: w0, base_url: "$WORKER", model: m, context_window: 32768}
EOF
mkdir -p "$DIR/nginx"
cat >"$DIR/nginx.conf" <<EOF
worker_processes auto;
pid $DIR/nginx.pid;
error_log $DIR/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $DIR/nginx/body;
  proxy_temp_path $DIR/nginx/proxy;
  upstream w { server 127.0.0.1:$WPORT; keepalive 256; }
  server {
    listen 127.0.0.1:$NPORT;
    location / { proxy_pass http://w; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
EOF
cat >"$DIR/chat.lua" <<'EOF'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"m","messages":[{"role":"system","content":"You are brief."},{"role":"user","content":"Say ok."}],"max_tokens":16}'
EOF

start_router() {
  case $1 in
    direct) echo "$WORKER" ;;
    ours|before)
      local bin=$GATEWAY_BIN
      if [ "$1" = before ]; then
        [ -x "$BEFORE_BIN" ] || { echo "error: the router 'before' needs --before PATH" >&2; exit 2; }
        bin=$BEFORE_BIN
      fi
      "$bin" --config "$DIR/gateway.yaml" >"$DIR/$1.log" 2>&1 &
      echo $! >"$DIR/ours.pid"
      wait_port $GPORT
      echo "http://127.0.0.1:$GPORT" ;;
    nginx)
      nginx -c "$DIR/nginx.conf" -p "$DIR/nginx" -g 'daemon off;' >"$DIR/nginx.log" 2>&1 &
      wait_port $NPORT
      echo "http://127.0.0.1:$NPORT" ;;
    sglang)
      field_router_start "$DIR" sglang sglang --port $SPORT --prometheus-port 18113 \
        --worker-urls "$WORKER" --policy "$SGLANG_POLICY" >/dev/null
      echo "http://127.0.0.1:$SPORT" ;;
    vllm)
      field_router_start "$DIR" vllm vllm --port $VPORT --prometheus-port 18114 \
        --worker-urls "$WORKER" --policy "$VLLM_POLICY" >/dev/null
      echo "http://127.0.0.1:$VPORT" ;;
    *) echo "error: router '$1' (valid: direct, ours, before, nginx, sglang, vllm)" >&2; exit 2 ;;
  esac
}
stop_router() {
  case $1 in
    ours|before)
      local pid; pid=$(cat "$DIR/ours.pid")
      kill "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
      rm -f "$DIR/ours.pid" ;;
    nginx)
      local pid; pid=$(cat "$DIR/nginx.pid")
      kill "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done ;;
    sglang|vllm) field_router_stop "$DIR" "$1" ;;
  esac
}

# One wrk run: "router conns rps p50_ms p99_ms non2xx errors load1".
one() {
  local name=$1 url=$2 c=$3 out
  out=$(wrk -t 1 -c "$c" -d "${SECONDS_EACH}s" --latency -s "$DIR/chat.lua" "$url/v1/chat/completions")
  echo "$out" >>"$DIR/wrk-$name-$c.txt"
  local rps p50 p99 non2xx errs
  rps=$(echo "$out" | awk '/^Requests\/sec:/ {print $2}')
  ms() { awk -v v="$1" 'BEGIN { if (v ~ /us$/) { sub(/us$/, "", v); print v / 1000 } else if (v ~ /ms$/) { sub(/ms$/, "", v); print v + 0 } else { sub(/s$/, "", v); print v * 1000 } }'; }
  p50=$(ms "$(echo "$out" | awk '$1 == "50%" {print $2}')")
  p99=$(ms "$(echo "$out" | awk '$1 == "99%" {print $2}')")
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
  errs=$(echo "$out" | awk '/Socket errors/ {print $0}' | tr -d ',' | awk '{print $4+$6+$8+$10}')
  echo "$name $c $rps $p50 $p99 ${non2xx:-0} ${errs:-0} $(cut -d' ' -f1 /proc/loadavg)"
}

echo "# $(date -u +%FT%TZ) $(uptime)"
echo "# router conns req/s p50_ms p99_ms non2xx socket_errors load1   (logs and wrk outputs: $DIR)"
: >"$DIR/runs.txt"
for r in $(seq 1 "$ROUNDS"); do
  for name in ${ROUTERS//,/ }; do
    url=$(start_router "$name")
    # A warm-up: connections, the routers' first health checks and caches.
    wrk -t 1 -c 16 -d 2s -s "$DIR/chat.lua" "$url/v1/chat/completions" >/dev/null
    for c in 1 16 128; do
      one "$name" "$url" "$c" | tee -a "$DIR/runs.txt"
    done
    stop_router "$name"
  done
done

# The medians over the rounds, and the added latency against the direct runs.
python3 - "$DIR/runs.txt" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, c, rps, p50, p99, non2xx, errs, load = line.split()
    runs.setdefault((name, int(c)), []).append((float(rps), float(p50), float(p99), int(non2xx), int(errs), float(load)))
med = lambda xs: statistics.median(xs)
print("\n| router | conns | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | non-2xx + errors | load1 |")
print("|---|---|---|---|---|---|---|---|---|")
for (name, c), v in sorted(runs.items(), key=lambda kv: (kv[0][1], ["direct", "ours", "before", "nginx", "sglang", "vllm"].index(kv[0][0]))):
    rps, p50, p99 = med([x[0] for x in v]), med([x[1] for x in v]), med([x[2] for x in v])
    d = runs.get(("direct", c))
    add50 = f"{p50 - med([x[1] for x in d]):.3f}" if d and name != "direct" else "—"
    add99 = f"{p99 - med([x[2] for x in d]):.3f}" if d and name != "direct" else "—"
    bad = sum(x[3] + x[4] for x in v)
    loads = "–".join(f"{x[5]:.1f}" for x in v)
    print(f"| {name} | {c} | {rps:,.0f} | {p50:.3f} | {p99:.3f} | {add50} | {add99} | {bad} | {loads} |")
EOF
