#!/usr/bin/env bash
# A memcached server joins under load: the reads lost to misses in the first RUN_SECONDS seconds, with
# and without the warm-up route ([pool.handoff]), in one run (RUN_SECONDS, 10 by default).
#
# 5 memcached servers; keyroute serve --threads 1 (memcached listener, rendezvous) over the first
# 4; KEYS keys written through it; then, for each mode, mc_load reads them open-loop (RATE
# commands/s, one SET in 16, the rest GETs) for RUN_SECONDS seconds while the fifth server joins
# through the admin API one second in. The loader never refills a miss (a cache client would):
# every miss is a read the join cost. The fifth server is flushed and the keys written again
# before each mode.
#
# Usage:  bench/join.sh
#         KEYS=20000 RATE=20000 RUN_SECONDS=10 bench/join.sh
# Starts every process itself on 127.0.0.1 and kills them by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

KEYS=${KEYS:-20000}
RATE=${RATE:-20000}
SECONDS_RUN=${RUN_SECONDS:-10}
BASE_PORT=${BASE_PORT:-25211}

log() { echo "[join.sh] $*" >&2; }
PIDS=()
TMP=$(mktemp -d /tmp/keyroute-join-bench.XXXXXX)
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT

log "building keyroute and the load generator (release)"
cargo build --release -q -p keyroute-cli
cargo build --release -q -p keyroute-bench --example mc_load
KEYROUTE=$ROOT/target/release/keyroute
LOAD=$ROOT/target/release/examples/mc_load
user=()
[[ $(id -u) == 0 ]] && user=(-u root)

SERVERS=()
for i in 0 1 2 3 4; do
    port=$((BASE_PORT + i))
    memcached -l 127.0.0.1 -p "$port" -U 0 -t 1 -m 256 -c 4096 "${user[@]}" &
    PIDS+=($!)
    SERVERS+=("127.0.0.1:$port")
done
PROXY=127.0.0.1:$((BASE_PORT + 10))
ADMIN=127.0.0.1:$((BASE_PORT + 11))
mc() { # $1 = host:port, $2 = command
    timeout 2 bash -c "exec 3<>/dev/tcp/${1%:*}/${1#*:}; printf '%s\r\nquit\r\n' '$2' >&3; cat <&3"
}

echo "# a memcached server joins under load"
echo
echo "- command: \`KEYS=$KEYS RATE=$RATE RUN_SECONDS=$SECONDS_RUN bench/join.sh\`; 4 memcached servers, a fifth joins 1 s into each run"
echo "- load: examples/mc_load, open loop, $RATE commands/s over 2 connections, GETs of one key uniform over $KEYS keys (1 SET in 16), no refill on a miss"
echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); keyroute $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (+ uncommitted changes)')"
echo
echo "| mode | reads | misses in ${SECONDS_RUN} s | share | warm fills |"
echo "|---|---:|---:|---:|---:|"
for mode in without with; do
    handoff=""
    [[ $mode == with ]] && handoff='[pool.handoff]\nwindow_ms = 60000\n'
    {
        printf '[admin]\nlisten = "%s"\n\n[[listener]]\nlisten = "%s"\nprotocol = "memcached"\npool = "cache"\n\n' "$ADMIN" "$PROXY"
        printf '[[pool]]\nname = "cache"\nstrategy = "rendezvous"\n%b' "$handoff"
        for i in 0 1 2 3; do printf '[[pool.worker]]\nname = "m%d"\naddress = "%s"\n' $((i + 1)) "${SERVERS[$i]}"; done
    } >"$TMP/keyroute.toml"
    for s in "${SERVERS[@]}"; do mc "$s" flush_all >/dev/null || true; done
    "$KEYROUTE" serve --threads 1 --log warn --config "$TMP/keyroute.toml" >"$TMP/keyroute.log" 2>&1 &
    kr=$!
    PIDS+=("$kr")
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/${PROXY%:*}/${PROXY#*:}") 2>/dev/null && break; sleep 0.05; done
    # mc_load writes every key first (through the proxy, on the four), then reads.
    (sleep 1.5 && curl -fsS -X POST -H 'content-type: application/json' \
        -d "{\"name\": \"m5\", \"address\": \"${SERVERS[4]}\"}" "http://$ADMIN/workers" >/dev/null) &
    out=$(MC_RATE=$RATE "$LOAD" "$PROXY" 2 1 "$SECONDS_RUN" 100 "$KEYS")
    fills=$(curl -fsS "http://$ADMIN/metrics" | awk '/^keyroute_pool_warm_fills_total/ { print $2 }')
    reads=$(sed -E 's/.*ops=([0-9]+) .*/\1/' <<<"$out")
    misses=$(sed -E 's/.*misses=([0-9]+).*/\1/' <<<"$out")
    share=$(awk -v m="$misses" -v r="$reads" 'BEGIN { printf "%.2f%%", 100 * m / r }')
    log "$mode warm-up: $out fills=${fills:-0}"
    echo "| $mode warm-up | $reads | $misses | $share | ${fills:-0} |"
    kill "$kr"
    wait "$kr" 2>/dev/null || true
done
