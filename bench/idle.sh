#!/usr/bin/env bash
# Memory per idle keep-alive client connection: keyroute vs nginx vs haproxy, in one run.
#
# For each proxy (one thread/worker each, in front of one nginx backend answering "ok") and each
# count N in COUNTS: start the proxy, read its resident memory (VmRSS, summed over its processes),
# open N connections that each send one GET, read the response and then stay open
# (bench/gateway/idle.py, from source addresses 127.0.0.2...), read the memory again, and report
# (after - before) / N. The proxies run with an open-file limit of 200,000 (prlimit) where the
# machine allows raising it; otherwise at the hard limit, and counts that do not fit under it
# (N + 1,000 descriptors) are skipped with a note.
#
# Usage:  bench/idle.sh                 (COUNTS="5000 10000 50000")
#         COUNTS="10000" bench/idle.sh
#         MODE=tls bench/idle.sh  the connections are TLS (a self-signed certificate made with
#                                 openssl; TLS 1.3, the proxies' defaults otherwise)
#         MODE=ws bench/idle.sh   each connection is a WebSocket tunnel: the GET asks for an
#                                 upgrade, a Python backend (bench/gateway/ws_backend.py) answers
#                                 101 and holds it; the figure includes each tunnel's upstream
#                                 socket, for every proxy alike
#         FLOOR=1 bench/idle.sh   also the do-nothing proxy of keyroute's own HTTP/1 design
#                                 (crates/keyroute-bench/examples/floor_own.rs, issue 20's spike),
#                                 as "floor-own"; it holds one upstream connection per client, so
#                                 its figure includes that second socket
# Installs nginx/haproxy with apt-get if missing (as root).
# Starts everything itself on 127.0.0.1, in a temp dir, and kills it by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
COUNTS=${COUNTS:-5000 10000 50000}
MODE=${MODE:-plain}
BACKEND=18181
PORT=18100
LIMIT=200000
PIDS=()
log() { printf '[idle.sh] %s\n' "$*" >&2; }
cleanup() {
    set +e
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    [[ -n "${TMP:-}" ]] && rm -rf "$TMP"
}
trap cleanup EXIT
for tool in nginx haproxy python3 prlimit; do command -v "$tool" >/dev/null || { apt-get update && apt-get install -y nginx haproxy; break; }; done
cargo build --release -p keyroute-cli >&2
FLOOR=${FLOOR:-0}
PROXIES=(keyroute nginx haproxy)
if [[ "$FLOOR" == 1 ]]; then
    cargo build --release -p keyroute-bench --example floor_own >&2
    PROXIES+=(floor-own)
fi
TMP=$(mktemp -d /tmp/keyroute-idle.XXXXXX)
chmod 755 "$TMP"
mkdir -p "$TMP"/{b,n}/{logs,tmp}
LISTEN_NGINX="127.0.0.1:$PORT"
BIND_HAPROXY="127.0.0.1:$PORT"
TLS_KEYROUTE=""
NGINX_EXTRA=""
if [[ $MODE == tls ]]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench.test \
        -addext subjectAltName=DNS:bench.test -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>/dev/null
    cat "$TMP/cert.pem" "$TMP/key.pem" >"$TMP/combined.pem"
    LISTEN_NGINX="$LISTEN_NGINX ssl"
    NGINX_EXTRA="ssl_certificate $TMP/cert.pem; ssl_certificate_key $TMP/key.pem;"
    BIND_HAPROXY="$BIND_HAPROXY ssl crt $TMP/combined.pem alpn http/1.1"
    TLS_KEYROUTE=$(printf '[[listener.tls.certificate]]\ncert = "%s"\nkey = "%s"\n' "$TMP/cert.pem" "$TMP/key.pem")
fi
if [[ $MODE == ws ]]; then
    NGINX_EXTRA="map \$http_upgrade \$conn_up { default upgrade; '' ''; }"
fi

common() { # $1 dir
    cat <<EOF
worker_processes 1;
worker_rlimit_nofile $LIMIT;
pid $TMP/$1/nginx.pid;
error_log $TMP/$1/logs/error.log warn;
events { worker_connections 120000; }
EOF
}
{ common b; echo "http { access_log off; client_body_temp_path $TMP/b/tmp/b; proxy_temp_path $TMP/b/tmp/p;"
  echo "  server { listen 127.0.0.1:$BACKEND; keepalive_requests 1000000; location / { return 200 \"ok\\n\"; } } }"; } >"$TMP/backend.conf"
{ common n; echo "http { access_log off; keepalive_timeout 600; client_body_temp_path $TMP/n/tmp/b; proxy_temp_path $TMP/n/tmp/p;"
  echo "  upstream be { hash \$arg_k consistent; server 127.0.0.1:$BACKEND; keepalive 64; }"
  echo "  $NGINX_EXTRA"
  if [[ $MODE == ws ]]; then
      echo "  server { listen $LISTEN_NGINX; location / { proxy_pass http://be; proxy_http_version 1.1; proxy_read_timeout 600s; proxy_set_header Upgrade \$http_upgrade; proxy_set_header Connection \$conn_up; } } }"
  else
      echo "  server { listen $LISTEN_NGINX; location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection \"\"; } } }"
  fi; } >"$TMP/nginx.conf"
cat >"$TMP/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 120000
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 600s
    timeout server 30s
    timeout http-keep-alive 600s
    timeout tunnel 600s
frontend fe
    bind $BIND_HAPROXY
    default_backend be
backend be
    balance url_param k
    hash-type consistent
    server b1 127.0.0.1:$BACKEND
EOF
cat >"$TMP/keyroute.toml" <<EOF
[admin]
listen = "127.0.0.1:19191"
[[listener]]
listen = "127.0.0.1:$PORT"
header_timeout_ms = 600000
tunnel_idle_timeout_ms = 600000
max_connections = 19500
$TLS_KEYROUTE
[[pool]]
name = "p"
key = "{query.k}"
[[pool.worker]]
name = "b1"
address = "127.0.0.1:$BACKEND"
EOF

RUN=(prlimit --nofile=$LIMIT:$LIMIT)
if ! prlimit --nofile=$LIMIT:$LIMIT true 2>/dev/null; then
    LIMIT=$(ulimit -Hn)
    RUN=()
    log "cannot raise the open-file limit here; running at the hard limit, $LIMIT"
fi
# Each proxy's connection limit as the open-file limit allows (haproxy needs two descriptors per
# connection it can hold).
HAPROXY_MAX=$(((LIMIT - 200) / 2))
sed -i "s/worker_rlimit_nofile [0-9]*;/worker_rlimit_nofile $LIMIT;/; s/worker_connections [0-9]*;/worker_connections $((LIMIT - 100));/" "$TMP/backend.conf" "$TMP/nginx.conf"
sed -i "s/maxconn [0-9]*/maxconn $HAPROXY_MAX/" "$TMP/haproxy.cfg"
if [[ $MODE == ws ]]; then
    "${RUN[@]}" python3 "$ROOT/bench/gateway/ws_backend.py" "$BACKEND" &
else
    "${RUN[@]}" nginx -p "$TMP/b" -c "$TMP/backend.conf" -g 'daemon off;' &
fi
PIDS+=($!)
sleep 0.5

rss_kb() { # PIDs -> summed VmRSS in kB
    local total=0 pid v
    for pid in "$@"; do
        v=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
        total=$((total + v))
    done
    echo "$total"
}
procs() { echo "$1" $(pgrep -P "$1" || true); }

echo "mode: $MODE"
echo
echo "| proxy | connections | RSS before (MB) | RSS with them (MB) | per connection (KB) |"
echo "|---|---:|---:|---:|---:|"
for n in $COUNTS; do
    if ((n + 1000 > LIMIT)); then
        echo "| (all) | $n | - | - | skipped: needs $((n + 1000)) open files, the limit here is $LIMIT |"
        continue
    fi
    for p in "${PROXIES[@]}"; do
        if [[ $p == haproxy ]] && ((n > HAPROXY_MAX)); then
            echo "| haproxy | $n | - | - | skipped: its maxconn can be at most $HAPROXY_MAX under $LIMIT open files |"
            continue
        fi
        case $p in
        keyroute) "${RUN[@]}" "$ROOT/target/release/keyroute" serve --threads 1 --log warn --config "$TMP/keyroute.toml" >"$TMP/k.out" 2>&1 & ;;
        nginx) "${RUN[@]}" nginx -p "$TMP/n" -c "$TMP/nginx.conf" -g 'daemon off;' >"$TMP/n.out" 2>&1 & ;;
        haproxy) "${RUN[@]}" haproxy -db -f "$TMP/haproxy.cfg" >"$TMP/h.out" 2>&1 & ;;
        floor-own) "${RUN[@]}" "$ROOT/target/release/examples/floor_own" "127.0.0.1:$PORT" "127.0.0.1:$BACKEND" >"$TMP/f.out" 2>&1 & ;;
        esac
        pid=$!
        PIDS+=("$pid")
        for _ in $(seq 50); do python3 "$ROOT/bench/gateway/idle.py" "$PORT" 1 "$MODE" </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
        # Warm: a few connections first, then measure.
        python3 "$ROOT/bench/gateway/idle.py" "$PORT" 20 "$MODE" </dev/null >/dev/null
        sleep 0.5
        before=$(rss_kb $(procs "$pid"))
        coproc HOLD { exec "${RUN[@]}" python3 "$ROOT/bench/gateway/idle.py" "$PORT" "$n" "$MODE"; }
        read -r line <&"${HOLD[0]}"
        [[ "$line" == "held $n" ]] || { log "$p: idle.py said '$line'"; exit 1; }
        sleep 1
        after=$(rss_kb $(procs "$pid"))
        awk -v p="$p" -v n="$n" -v b="$before" -v a="$after" 'BEGIN { printf "| %s | %d | %.1f | %.1f | %.2f |\n", p, n, b/1024, a/1024, (a-b)/n }'
        eval "exec ${HOLD[1]}>&-"
        wait "$HOLD_PID" 2>/dev/null || true
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        sleep 0.5
    done
done
