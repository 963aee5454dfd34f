#!/usr/bin/env bash
# `keyroute move` of KEYS Redis keys, 4 servers -> 5 (issue 22's target): the plan, the move, and
# the check that nothing was lost and nothing is extra.
#
# 5 redis-servers on loopback; keyroute serve (Redis listener, ring, [pool.handoff]) over the
# first 4; KEYS keys of VALUE_BYTES bytes written through it (redis-cli --pipe); the fifth server
# joins through the admin API (the proxy switches first); then:
#   keyroute move --dry-run         the plan: keys and bytes per pair of servers
#   keyroute move --admin ...       the move (the proxy is asked that it uses the new members)
# and the servers' DBSIZEs: their sum must still be KEYS (0 lost), the fifth must hold the plan's
# keys, and the move's own verification must find 0 keys on a server that does not own them.
#
# Usage:  bench/move.sh
#         KEYS=1000000 VALUE_BYTES=100 BATCH=1000 RATE= bench/move.sh
# Needs redis-server and redis-tools (installed with apt-get when missing, as root). Starts every
# process itself on 127.0.0.1 and kills them by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

KEYS=${KEYS:-1000000}
VALUE_BYTES=${VALUE_BYTES:-100}
BATCH=${BATCH:-1000}
RATE=${RATE:-}
BASE_PORT=${BASE_PORT:-23791}

log() { echo "[move.sh] $*" >&2; }
die() { log "error: $*"; exit 1; }

PIDS=()
TMP=$(mktemp -d /tmp/keyroute-move-bench.XXXXXX)
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT

for tool in redis-server redis-cli; do
    if ! command -v "$tool" >/dev/null; then
        [[ $(id -u) == 0 ]] || die "$tool missing; run as root so apt-get can install it"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
    fi
done

log "building keyroute (release)"
cargo build --release -q -p keyroute-cli
KEYROUTE=$ROOT/target/release/keyroute

SERVERS=()
for i in 0 1 2 3 4; do
    port=$((BASE_PORT + i))
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    PIDS+=($!)
    SERVERS+=("127.0.0.1:$port")
done
for s in "${SERVERS[@]}"; do
    for _ in $(seq 100); do redis-cli -p "${s#*:}" ping >/dev/null 2>&1 && break; sleep 0.05; done
done

PROXY=127.0.0.1:$((BASE_PORT + 10))
ADMIN=127.0.0.1:$((BASE_PORT + 11))
config() { # $1 = number of servers, $2 = extra pool lines
    printf '[admin]\nlisten = "%s"\n\n[[listener]]\nlisten = "%s"\nprotocol = "redis"\npool = "store"\n\n' "$ADMIN" "$PROXY"
    printf '[[pool]]\nname = "store"\nstrategy = "ring"\n%b\n' "$2"
    for i in $(seq 0 $(($1 - 1))); do
        printf '[[pool.worker]]\nname = "r%d"\naddress = "%s"\n' $((i + 1)) "${SERVERS[$i]}"
    done
}
config 4 '[pool.handoff]\nwindow_ms = 3600000' >"$TMP/old.toml"
config 5 '' >"$TMP/new.toml"

"$KEYROUTE" serve -c "$TMP/old.toml" --threads 1 --log warn &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "${PROXY#*:}" ping >/dev/null 2>&1 && break; sleep 0.05; done

log "writing $KEYS keys of $VALUE_BYTES bytes through the proxy (4 servers)"
python3 - "$KEYS" "$VALUE_BYTES" >"$TMP/load.resp" <<'EOF'
import sys
n, size = int(sys.argv[1]), int(sys.argv[2])
out = sys.stdout.buffer
value = b"v" * size
for i in range(n):
    key = b"key:%d" % i
    out.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, size, value))
EOF
redis-cli -p "${PROXY#*:}" --pipe <"$TMP/load.resp" | tail -1 >&2
sizes() { for s in "${SERVERS[@]}"; do redis-cli -p "${s#*:}" dbsize; done | paste -sd' '; }
log "keys per server before: $(sizes)"

log "r5 joins through the admin API (the proxy switches first)"
curl -fsS -X POST -H 'content-type: application/json' \
    -d "{\"name\": \"r5\", \"address\": \"${SERVERS[4]}\"}" "http://$ADMIN/workers" >/dev/null

log "the plan"
rate=()
[[ -n $RATE ]] && rate=(--rate "$RATE")
"$KEYROUTE" move --from "$TMP/old.toml" --to "$TMP/new.toml" --dry-run --batch "$BATCH" "${rate[@]}" | tee "$TMP/plan.txt"
planned=$(awk '/^scanned/ { print $6 }' "$TMP/plan.txt")

log "the move"
"$KEYROUTE" move --from "$TMP/old.toml" --to "$TMP/new.toml" --admin "$ADMIN" --batch "$BATCH" "${rate[@]}" \
    --state "$TMP/state.json" | tee "$TMP/report.txt"
moved=$(awk '/^moved/ { print $2 }' "$TMP/report.txt")

after=$(sizes)
log "keys per server after: $after"
total=$(echo "$after" | tr ' ' '\n' | paste -sd+ | bc)
fifth=$(echo "$after" | awk '{ print $5 }')
echo "planned $planned, moved $moved, on r5 $fifth; total $total of $KEYS (lost $((KEYS - total)))"
[[ $moved == "$planned" && $fifth == "$planned" && $total == "$KEYS" ]] || die "the move is not the plan"
