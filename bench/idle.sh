#!/usr/bin/env bash
# Memory per idle client connection: keyroute's memcached (or Redis) listener against nutcracker,
# or (PROTOCOL=http) keyroute's HTTP listener against nginx as a reverse proxy, in one run.
#
# http: 4 backends (one nginx, 4 listeners answering "ok"), nginx (worker_processes 1, upstream
# keep-alive, `hash $arg_k consistent`) and keyroute serve --threads 1 (rendezvous on {query.k})
# in front of them; each client sends one keep-alive `GET /?k=N`, reads the answer and stays
# open. nginx's figure is its worker's resident memory (its master holds no connection).
# TLS=1 (with PROTOCOL=http): the clients speak HTTPS (a self-signed P-256 certificate made with
# openssl; TLS 1.3), to nginx `listen ... ssl` and to keyroute's [[listener.tls.certificate]].
# WS=1 (with PROTOCOL=http): each client opens a WebSocket (an `Upgrade: websocket` GET, answered
# 101 by the backend: 4 Python listeners that accept the handshake and hold the connection) and
# leaves the tunnel idle; nginx proxies it with `proxy_set_header Upgrade/Connection`, keyroute
# by its default route (`upgrades = ["websocket"]`). A proxy then holds two sockets per client.
#
# 4 servers, nutcracker and keyroute serve --threads 1 in front of them (as bench/memcache.sh sets
# them up). For each proxy: its resident memory (VmRSS) with no client, then with CLIENTS client
# connections open and idle, each after one GET (so that each proxy holds whatever a client that
# has been served holds: its buffers and, for keyroute, its connection to that key's server), then
# the difference over CLIENTS. The server side is reported too: the connections the servers hold
# for the proxy (memcached's `curr_connections`, Redis's `connected_clients`).
#
# Usage:  bench/idle.sh
#         CLIENTS=5000 PROTOCOL=redis SETTLE=5 bench/idle.sh
#         KEYROUTE=/path/to/another/keyroute bench/idle.sh   (no build; another binary)
# Starts every process itself on 127.0.0.1 and kills them by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/nutcracker.sh
. bench/nutcracker.sh
ROOT=$(pwd)

CLIENTS=${CLIENTS:-5000}
PROTOCOL=${PROTOCOL:-memcached}
BASE_PORT=${BASE_PORT:-24211}
# How long the clients are idle before the proxy's memory is read: keyroute's threads give freed
# pages back every 2 s (mimalloc purges pages freed more than 1 s before).
SETTLE=${SETTLE:-5}
TLS=${TLS:-0}
WS=${WS:-0}
[[ $TLS == 0 || $PROTOCOL == http ]] || { echo "TLS=1 needs PROTOCOL=http" >&2; exit 64; }
[[ $WS == 0 || $PROTOCOL == http ]] || { echo "WS=1 needs PROTOCOL=http" >&2; exit 64; }
[[ $PROTOCOL == memcached || $PROTOCOL == redis || $PROTOCOL == http ]] || { echo "PROTOCOL is memcached, redis or http" >&2; exit 64; }
ulimit -n "$(ulimit -Hn)"

log() { echo "[idle.sh] $*" >&2; }
PIDS=()
TMP=$(mktemp -d /tmp/keyroute-idle-bench.XXXXXX)
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT

if [[ -z "${KEYROUTE:-}" ]]; then
    log "building keyroute (release)"
    cargo build --release -q -p keyroute-cli
    KEYROUTE=$ROOT/target/release/keyroute
fi
NUTCRACKER=$(command -v nutcracker || echo /usr/sbin/nutcracker)
user=()
[[ $(id -u) == 0 ]] && user=(-u root)

SERVERS=()
NUT_PORT=$((BASE_PORT + 10))
KR_PORT=$((BASE_PORT + 11))
PEER=nutcracker
if [[ $PROTOCOL == http ]]; then
    PEER=nginx
    mkdir -p "$TMP/backends" "$TMP/nginx"
    nginx_conf() { # $1 = instance dir; the http block's contents on stdin
        printf 'worker_processes 1;\npid %s/nginx.pid;\nerror_log %s/error.log warn;\nworker_rlimit_nofile 40000;\n' "$1" "$1"
        printf 'events { worker_connections 20000; }\nhttp {\n    access_log off;\n    keepalive_timeout 3600;\n    keepalive_requests 1000000;\n'
        for t in client_body proxy fastcgi uwsgi scgi; do printf '    %s_temp_path %s/%s;\n' "$t" "$1" "$t"; done
        cat
        printf '}\n'
    }
    for i in 0 1 2 3; do SERVERS+=("127.0.0.1:$((BASE_PORT + i))"); done
    LISTEN_EXTRA=""
    if [[ $TLS == 1 ]]; then
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench.test \
            -addext subjectAltName=DNS:bench.test -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>/dev/null
        LISTEN_EXTRA=" ssl"
    fi
    if [[ $WS == 1 ]]; then
        # WebSocket backends: answer the handshake (RFC 6455 section 4.2.2) and hold the connection.
        python3 - "${SERVERS[@]}" <<'PY' &
import asyncio, base64, hashlib, sys
async def serve(reader, writer):
    head = await reader.readuntil(b"\r\n\r\n")
    key = b""
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"sec-websocket-key:"):
            key = line.split(b":", 1)[1].strip()
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    await writer.drain()
    await reader.read()
async def main():
    servers = [await asyncio.start_server(serve, a.split(":")[0], int(a.split(":")[1]), backlog=4096) for a in sys.argv[1:]]
    await asyncio.gather(*(s.serve_forever() for s in servers))
asyncio.run(main())
PY
        PIDS+=($!)
    else
        for s in "${SERVERS[@]}"; do printf '    server { listen %s; location / { return 200 "ok\\n"; } }\n' "$s"; done |
            nginx_conf "$TMP/backends" >"$TMP/backends.conf"
        nginx -p "$TMP/backends" -c "$TMP/backends.conf" -g 'daemon off;' &
        PIDS+=($!)
    fi
    {
        printf '    upstream backends {\n        hash $arg_k consistent;\n        keepalive 64;\n'
        for s in "${SERVERS[@]}"; do printf '        server %s;\n' "$s"; done
        printf '    }\n    server {\n        listen 127.0.0.1:%s%s;\n' "$NUT_PORT" "$LISTEN_EXTRA"
        [[ $TLS == 1 ]] && printf '        ssl_certificate %s;\n        ssl_certificate_key %s;\n' "$TMP/cert.pem" "$TMP/key.pem"
        printf '        location / {\n'
        printf '            proxy_pass http://backends;\n            proxy_http_version 1.1;\n'
        if [[ $WS == 1 ]]; then
            printf '            proxy_set_header Upgrade $http_upgrade;\n            proxy_set_header Connection "upgrade";\n            proxy_read_timeout 3600s;\n'
        else
            printf '            proxy_set_header Connection "";\n'
        fi
        printf '        }\n    }\n'
    } | nginx_conf "$TMP/nginx" >"$TMP/nginx.conf"
    nginx -p "$TMP/nginx" -c "$TMP/nginx.conf" -g 'daemon off;' &
    NGINX_MASTER=$!
    PIDS+=("$NGINX_MASTER")
    {
        printf '[admin]\nlisten = "127.0.0.1:%s"\n\n[[listener]]\nlisten = "127.0.0.1:%s"\nheader_timeout_ms = 3600000\ntunnel_idle_timeout_ms = 3600000\n' $((BASE_PORT + 13)) "$KR_PORT"
        [[ $TLS == 1 ]] && printf '[[listener.tls.certificate]]\ncert = "%s"\nkey = "%s"\n' "$TMP/cert.pem" "$TMP/key.pem"
        printf '\n'
        printf '[[pool]]\nname = "bench"\nstrategy = "rendezvous"\nkey = "{query.k}"\n'
        for s in "${SERVERS[@]}"; do printf '[[pool.worker]]\nname = "%s"\naddress = "%s"\n' "$s" "$s"; done
    } >"$TMP/keyroute.toml"
else
    for i in 0 1 2 3; do
        port=$((BASE_PORT + i))
        if [[ $PROTOCOL == redis ]]; then
            redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --maxclients 15000 >/dev/null &
        else
            memcached -l 127.0.0.1 -p "$port" -U 0 -t 1 -m 64 -c 15000 "${user[@]}" &
        fi
        PIDS+=($!)
        SERVERS+=("127.0.0.1:$port")
    done
    nutcracker_yml "$NUT_PORT" "$PROTOCOL" "${SERVERS[@]}" >"$TMP/nutcracker.yml"
    "$NUTCRACKER" -c "$TMP/nutcracker.yml" -s $((BASE_PORT + 12)) -a 127.0.0.1 -o "$TMP/nutcracker.log" &
    NUT_PID=$!
    PIDS+=("$NUT_PID")
    {
        printf '[admin]\nlisten = "127.0.0.1:%s"\n\n[[listener]]\nlisten = "127.0.0.1:%s"\nprotocol = "%s"\npool = "bench"\n\n' $((BASE_PORT + 13)) "$KR_PORT" "$PROTOCOL"
        printf '[[pool]]\nname = "bench"\nstrategy = "twemproxy"\n'
        for s in "${SERVERS[@]}"; do printf '[[pool.worker]]\nname = "%s"\naddress = "%s"\n' "$s" "$s"; done
    } >"$TMP/keyroute.toml"
fi
"$KEYROUTE" serve --threads 1 --log warn --config "$TMP/keyroute.toml" >"$TMP/keyroute.log" 2>&1 &
KR_PID=$!
PIDS+=("$KR_PID")
sleep 1
if [[ $PROTOCOL == http ]]; then
    NUT_PID=$(pgrep -P "$NGINX_MASTER" | head -1)
    [[ -n "$NUT_PID" ]] || { log "nginx started no worker"; exit 1; }
fi

rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
server_conns() {
    local total=0 n
    if [[ $PROTOCOL == http ]]; then
        echo 0
        return
    fi
    for s in "${SERVERS[@]}"; do
        if [[ $PROTOCOL == redis ]]; then
            n=$(redis-cli -p "${s#*:}" info clients | awk -F: '/^connected_clients/ { print $2 + 0 }')
        else
            n=$(printf 'stats\r\nquit\r\n' | timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/${s#*:}; cat >&3; cat <&3" | awk '/STAT curr_connections/ { print $3 + 0 }')
        fi
        total=$((total + n))
    done
    echo "$total"
}

echo "# memory per idle client connection ($PROTOCOL)"
echo
echo "- command: \`CLIENTS=$CLIENTS PROTOCOL=$PROTOCOL TLS=$TLS WS=$WS bench/idle.sh\`; 4 servers, each proxy with --threads 1 / one process"
echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); keyroute $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (+ uncommitted changes)')"
echo
echo "| proxy | RSS before (KiB) | RSS with $CLIENTS idle clients (KiB) | per client (bytes) | server-side connections |"
echo "|---|---:|---:|---:|---:|"
for target in $PEER keyroute; do
    port=$NUT_PORT pid=$NUT_PID
    [[ $target == keyroute ]] && port=$KR_PORT pid=$KR_PID
    before=$(rss_kib "$pid")
    conns_before=$(server_conns)
    python3 - "$port" "$CLIENTS" "$PROTOCOL" "$TMP/$target.ready" "$TLS" "$WS" <<'PY' &
import socket, ssl, sys, time, os
port, n, proto, ready, tls = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
ws = sys.argv[6] == "1"
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
socks = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    if tls:
        s = ctx.wrap_socket(s, server_hostname="bench.test")
    key = b"idle:%d" % i
    if proto == "memcached":
        s.sendall(b"get " + key + b"\r\n")
    elif proto == "redis":
        s.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key))
    elif ws:
        s.sendall(b"GET /?k=%d HTTP/1.1\r\nHost: bench\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                  b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n" % i)
    else:
        s.sendall(b"GET /?k=%d HTTP/1.1\r\nHost: bench\r\n\r\n" % i)
    socks.append(s)
for s in socks:
    got = b""
    while not (got.endswith(b"END\r\n") or got.endswith(b"$-1\r\n") or got.endswith(b"\r\n\r\nok\n")
               or (ws and got.startswith(b"HTTP/1.1 101") and got.endswith(b"\r\n\r\n"))):
        chunk = s.recv(4096)
        if not chunk:
            raise SystemExit("closed")
        got += chunk
open(ready, "w").close()
time.sleep(3600)
PY
    py=$!
    PIDS+=("$py")
    for _ in $(seq 600); do [[ -e $TMP/$target.ready ]] && break; sleep 0.1; done
    [[ -e $TMP/$target.ready ]] || { log "the clients of $target did not all connect"; exit 1; }
    sleep "$SETTLE"
    after=$(rss_kib "$pid")
    conns=$(( $(server_conns) - conns_before ))
    per=$(( (after - before) * 1024 / CLIENTS ))
    echo "| $target | $before | $after | $per | $conns |"
    kill "$py" 2>/dev/null || true
    wait "$py" 2>/dev/null || true
    sleep 1
done
