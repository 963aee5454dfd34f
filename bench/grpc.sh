#!/usr/bin/env bash
# gRPC unary calls through keyroute vs nginx's grpc_pass, to the same servers, in one run.
#
# 4 gRPC servers (crates/keyroute-bench/examples/grpc_echo.rs: HTTP/2, one thread, each call
# answered with its message and grpc-status 0 in the trailers) on loopback; the same load through
# each proxy (examples/grpc_load.rs: CONNECTIONS HTTP/2 connections, STREAMS calls in flight on
# each, POST /bench.Echo/M<k> with k uniform in 0..9999 from a fixed seed, 100-byte messages):
#   keyroute  h2c listener, [pool.upstream] protocol = "h2", rendezvous on {path}, --threads 1
#   nginx     http2 listener, grpc_pass, hash $uri consistent, keepalive 64, worker_processes 1
# rounds alternated. For each: calls/s, p50/p99/p99.9 latency, and the proxy's CPU time per call
# (user+sys of all its processes over the run, over the calls completed).
#
# Usage:  bench/grpc.sh
#         ROUNDS=3 SECONDS_PER_RUN=8 CONNECTIONS=4 STREAMS=8 bench/grpc.sh
# Ports: BASE_PORT=23000 (servers BASE_PORT+1..+4, keyroute +10, its admin +11, nginx +20).
# Needs nginx (installed with apt-get when missing, as root). Starts every process itself on
# 127.0.0.1 and kills them by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-8}
CONNECTIONS=${CONNECTIONS:-4}
STREAMS=${STREAMS:-8}
BASE_PORT=${BASE_PORT:-23000}
CMDLINE="ROUNDS=$ROUNDS SECONDS_PER_RUN=$SECONDS_PER_RUN CONNECTIONS=$CONNECTIONS STREAMS=$STREAMS bench/grpc.sh"

log() { echo "[grpc.sh] $*" >&2; }
die() { log "error: $*"; exit 1; }

PIDS=()
TMP=$(mktemp -d /tmp/keyroute-grpc-bench.XXXXXX)
chmod 755 "$TMP"
cleanup() {
    for pid in "${PIDS[@]}"; do pkill -TERM -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    [[ "${KEEP_TMP:-0}" == 1 ]] || rm -rf "$TMP"
}
trap cleanup EXIT

if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
    [[ $(id -u) == 0 ]] || die "nginx is missing; run as root so apt-get can install it"
    DEBIAN_FRONTEND=noninteractive apt-get install -y nginx >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

log "building (release): keyroute, grpc_echo, grpc_load"
cargo build --release -q -p keyroute-cli
cargo build --release -q -p keyroute-bench --example grpc_echo --example grpc_load
KEYROUTE=$ROOT/target/release/keyroute
ECHO=$ROOT/target/release/examples/grpc_echo
LOAD=$ROOT/target/release/examples/grpc_load

SERVERS=()
for i in 1 2 3 4; do SERVERS+=("127.0.0.1:$((BASE_PORT + i))"); done
KR_PORT=$((BASE_PORT + 10))
NGINX_PORT=$((BASE_PORT + 20))

"$ECHO" "${SERVERS[@]}" >"$TMP/echo.out" 2>&1 &
PIDS+=($!)

{
    printf '[admin]\nlisten = "127.0.0.1:%d"\n\n[[listener]]\nlisten = "127.0.0.1:%d"\nh2c = true\n\n' $((BASE_PORT + 11)) "$KR_PORT"
    printf '[[pool]]\nname = "grpc"\nstrategy = "rendezvous"\nkey = "{path}"\n\n[pool.upstream]\nprotocol = "h2"\n'
    i=0
    for s in "${SERVERS[@]}"; do
        i=$((i + 1))
        printf '\n[[pool.worker]]\nname = "g%d"\naddress = "%s"\n' "$i" "$s"
    done
} >"$TMP/keyroute.toml"
"$KEYROUTE" serve --config "$TMP/keyroute.toml" --check >&2
"$KEYROUTE" serve --threads 1 --log warn --config "$TMP/keyroute.toml" >"$TMP/keyroute.out" 2>&1 &
KR_PID=$!
PIDS+=("$KR_PID")

mkdir -p "$TMP/nginx/logs" "$TMP/nginx/tmp"
{
    echo "worker_processes 1;"
    echo "pid $TMP/nginx/nginx.pid;"
    echo "error_log $TMP/nginx/logs/error.log warn;"
    echo "events { worker_connections 4096; }"
    echo "http {"
    echo "    access_log off;"
    echo "    client_body_temp_path $TMP/nginx/tmp/body;"
    echo "    proxy_temp_path $TMP/nginx/tmp/proxy;"
    echo "    fastcgi_temp_path $TMP/nginx/tmp/fastcgi;"
    echo "    uwsgi_temp_path $TMP/nginx/tmp/uwsgi;"
    echo "    scgi_temp_path $TMP/nginx/tmp/scgi;"
    echo "    http2_max_concurrent_streams 128;"
    echo "    keepalive_requests 1000000;"
    echo "    upstream grpcs {"
    echo "        hash \$uri consistent;"
    for s in "${SERVERS[@]}"; do echo "        server $s;"; done
    echo "        keepalive 64;"
    echo "        keepalive_requests 1000000;"
    echo "    }"
    echo "    server {"
    echo "        listen 127.0.0.1:$NGINX_PORT http2;"
    echo "        location / { grpc_pass grpc://grpcs; }"
    echo "    }"
    echo "}"
} >"$TMP/nginx.conf"
"$NGINX" -t -q -p "$TMP/nginx" -c "$TMP/nginx.conf"
"$NGINX" -p "$TMP/nginx" -c "$TMP/nginx.conf" -g 'daemon off;' >"$TMP/nginx.out" 2>&1 &
NG_PID=$!
PIDS+=("$NG_PID")
sleep 1

ticks() { # user+sys clock ticks of a PID and its children
    local total=0 pid s
    local -a f
    for pid in "$1" $(pgrep -P "$1" || true); do
        s=$(<"/proc/$pid/stat") || die "PID $pid vanished"
        s=${s##*) }
        read -r -a f <<<"$s"
        total=$((total + f[11] + f[12]))
    done
    echo "$total"
}

declare -A PORT=([keyroute]=$KR_PORT [nginx]=$NGINX_PORT)
declare -A PID=([keyroute]=$KR_PID [nginx]=$NG_PID)
for p in keyroute nginx; do
    out=$("$LOAD" "127.0.0.1:${PORT[$p]}" 1 1 1)
    [[ "$out" == *" failed=0 "* && "$out" != "calls=0 "* ]] || die "$p does not pass calls: $out"
    "$LOAD" "127.0.0.1:${PORT[$p]}" "$CONNECTIONS" "$STREAMS" 2 >/dev/null
done
log "both pass calls; warmed up"

CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"
for ((round = 1; round <= ROUNDS; round++)); do
    for p in keyroute nginx; do
        before=$(ticks "${PID[$p]}")
        out=$("$LOAD" "127.0.0.1:${PORT[$p]}" "$CONNECTIONS" "$STREAMS" "$SECONDS_PER_RUN")
        after=$(ticks "${PID[$p]}")
        log "round $round $p: $out cpu_ticks=$((after - before))"
        printf '%s\t%s\t%s\t%s\n' "$round" "$p" "$((after - before))" "$out" >>"$RESULTS"
    done
done

python3 - "$RESULTS" "$CLK_TCK" "$CMDLINE" <<'PY'
import sys, statistics
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
tck = int(sys.argv[2])
by = {}
for rnd, p, ticks, out in rows:
    kv = dict(x.split("=") for x in out.split())
    us = int(ticks) / tck * 1e6 / max(1, int(kv["calls"]))
    by.setdefault(p, []).append((us, float(kv["calls_per_s"]), int(kv["p50_us"]), int(kv["p99_us"]), int(kv["p999_us"]), int(kv["failed"])))
print(f"# gRPC unary through keyroute and nginx (grpc_pass)\n\n- command: `{sys.argv[3]}`\n")
print("| proxy | CPU us/call (median) | vs nginx | calls/s | p50 us | p99 us | p99.9 us | failed |")
print("|---|---|---|---|---|---|---|---|")
med = {p: statistics.median(r[0] for r in v) for p, v in by.items()}
for p, v in by.items():
    m = lambda i: statistics.median(r[i] for r in v)
    print(f"| {p} | {med[p]:.2f} | {med[p] / med['nginx']:.3f}x | {m(1):.0f} | {m(2):.0f} | {m(3):.0f} | {m(4):.0f} | {sum(r[5] for r in v)} |")
print("\nper round (CPU us/call):", {p: [round(r[0], 2) for r in v] for p, v in by.items()})
PY
