#!/usr/bin/env bash
# Memory per idle client connection: keyroute's memcached (or Redis) listener against nutcracker,
# in one run.
#
# 4 servers, nutcracker and keyroute serve --threads 1 in front of them (as bench/memcache.sh sets
# them up). For each proxy: its resident memory (VmRSS) with no client, then with CLIENTS client
# connections open and idle, each after one GET (so that each proxy holds whatever a client that
# has been served holds: its buffers and, for keyroute, its connection to that key's server), then
# the difference over CLIENTS. The server side is reported too: the connections the servers hold
# for the proxy (memcached's `curr_connections`, Redis's `connected_clients`).
#
# Usage:  bench/idle.sh
#         CLIENTS=5000 PROTOCOL=redis bench/idle.sh
# Starts every process itself on 127.0.0.1 and kills them by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

CLIENTS=${CLIENTS:-5000}
PROTOCOL=${PROTOCOL:-memcached}
BASE_PORT=${BASE_PORT:-24211}
[[ $PROTOCOL == memcached || $PROTOCOL == redis ]] || { echo "PROTOCOL is memcached or redis" >&2; exit 64; }
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

log "building keyroute (release)"
cargo build --release -q -p keyroute-cli
KEYROUTE=$ROOT/target/release/keyroute
NUTCRACKER=$(command -v nutcracker || echo /usr/sbin/nutcracker)
user=()
[[ $(id -u) == 0 ]] && user=(-u root)

SERVERS=()
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
NUT_PORT=$((BASE_PORT + 10))
KR_PORT=$((BASE_PORT + 11))
{
    echo "bench:"
    echo "  listen: 127.0.0.1:$NUT_PORT"
    echo "  hash: md5"
    echo "  distribution: ketama"
    echo "  timeout: 1000"
    [[ $PROTOCOL == redis ]] && echo "  redis: true"
    echo "  servers:"
    for s in "${SERVERS[@]}"; do echo "   - $s:1"; done
} >"$TMP/nutcracker.yml"
"$NUTCRACKER" -c "$TMP/nutcracker.yml" -s $((BASE_PORT + 12)) -a 127.0.0.1 -o "$TMP/nutcracker.log" &
NUT_PID=$!
PIDS+=("$NUT_PID")
{
    printf '[admin]\nlisten = "127.0.0.1:%s"\n\n[[listener]]\nlisten = "127.0.0.1:%s"\nprotocol = "%s"\npool = "bench"\n\n' $((BASE_PORT + 13)) "$KR_PORT" "$PROTOCOL"
    printf '[[pool]]\nname = "bench"\nstrategy = "twemproxy"\n'
    for s in "${SERVERS[@]}"; do printf '[[pool.worker]]\nname = "%s"\naddress = "%s"\n' "$s" "$s"; done
} >"$TMP/keyroute.toml"
"$KEYROUTE" serve --threads 1 --log warn --config "$TMP/keyroute.toml" >"$TMP/keyroute.log" 2>&1 &
KR_PID=$!
PIDS+=("$KR_PID")
sleep 1

rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
server_conns() {
    local total=0 n
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
echo "- command: \`CLIENTS=$CLIENTS PROTOCOL=$PROTOCOL bench/idle.sh\`; 4 servers, each proxy with --threads 1 / one process"
echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); keyroute $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (+ uncommitted changes)')"
echo
echo "| proxy | RSS before (KiB) | RSS with $CLIENTS idle clients (KiB) | per client (bytes) | server-side connections |"
echo "|---|---:|---:|---:|---:|"
for target in nutcracker keyroute; do
    port=$NUT_PORT pid=$NUT_PID
    [[ $target == keyroute ]] && port=$KR_PORT pid=$KR_PID
    before=$(rss_kib "$pid")
    conns_before=$(server_conns)
    python3 - "$port" "$CLIENTS" "$PROTOCOL" "$TMP/$target.ready" <<'PY' &
import socket, sys, time, os
port, n, proto, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
socks = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    key = b"idle:%d" % i
    s.sendall(b"get " + key + b"\r\n" if proto == "memcached" else b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key))
    socks.append(s)
for s in socks:
    got = b""
    while not (got.endswith(b"END\r\n") or got.endswith(b"$-1\r\n")):
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
    sleep 1
    after=$(rss_kib "$pid")
    conns=$(( $(server_conns) - conns_before ))
    per=$(( (after - before) * 1024 / CLIENTS ))
    echo "| $target | $before | $after | $per | $conns |"
    kill "$py" 2>/dev/null || true
    wait "$py" 2>/dev/null || true
    sleep 1
done
