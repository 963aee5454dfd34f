#!/usr/bin/env bash
# A Redis Cluster behind keyroute's Redis listener against redis-benchmark --cluster straight to the
# cluster (the floor), in one run (issue 35's first benchmark).
#
# Three masters (redis-server --cluster-enabled yes, no replicas) made by redis-cli --cluster
# create; keyroute serve --threads 1 with [pool.cluster] and one seed. The load: redis-benchmark
# -t set,get -P DEPTH -c CONNECTIONS -d VALUE_BYTES -r KEYS -n REQUESTS, with --cluster straight to
# the cluster, and as a plain client through keyroute. For each: ops/s; for keyroute, its CPU per
# operation (user+sys from /proc/PID/stat over the run).
#
# Usage: ROUNDS=3 REQUESTS=400000 DEPTH=16 CONNECTIONS=8 bench/redis_cluster.sh
# Starts every process itself on 127.0.0.1 and kills them by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-400000}
DEPTH=${DEPTH:-16}
CONNECTIONS=${CONNECTIONS:-8}
VALUE_BYTES=${VALUE_BYTES:-100}
KEYS=${KEYS:-10000}
BASE_PORT=${BASE_PORT:-24211}
log() { echo "[redis_cluster.sh] $*" >&2; }
PIDS=()
TMP=$(mktemp -d /tmp/keyroute-redis-cluster.XXXXXX)
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
log "building keyroute (release)"
cargo build --release -q -p keyroute-cli
KEYROUTE=$ROOT/target/release/keyroute
NODES=()
for i in 0 1 2; do
    port=$((BASE_PORT + i))
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --cluster-enabled yes \
        --cluster-port $((BASE_PORT + 100 + i)) --cluster-config-file "nodes-$port.conf" --dir "$TMP" >/dev/null &
    PIDS+=($!)
    NODES+=("127.0.0.1:$port")
done
for i in 0 1 2; do
    for _ in $(seq 50); do redis-cli -p $((BASE_PORT + i)) ping >/dev/null 2>&1 && break; sleep 0.1; done
done
redis-cli --cluster create "${NODES[@]}" --cluster-yes >/dev/null
for _ in $(seq 100); do
    redis-cli -p "$BASE_PORT" cluster info | grep -q cluster_state:ok && break
    sleep 0.2
done
KR_PORT=$((BASE_PORT + 10))
{ printf '[admin]\nlisten = "127.0.0.1:%s"\n[[listener]]\nlisten = "127.0.0.1:%s"\nprotocol = "redis"\npool = "c"\n' $((BASE_PORT + 11)) "$KR_PORT"
  printf '[[pool]]\nname = "c"\nstrategy = "rendezvous"\n[pool.cluster]\nrefresh_ms = 5000\n[pool.retry]\nper_try_timeout_ms = 1000\n'
  printf '[[pool.worker]]\nname = "%s"\naddress = "%s"\n' "${NODES[0]}" "${NODES[0]}"; } >"$TMP/keyroute.toml"
"$KEYROUTE" serve --threads 1 --log warn --config "$TMP/keyroute.toml" >"$TMP/keyroute.log" 2>&1 &
KR_PID=$!
PIDS+=("$KR_PID")
for _ in $(seq 50); do redis-cli -p "$KR_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
bench() { # $@: redis-benchmark's target arguments; prints ops seconds
    local start end out
    start=$(date +%s.%N)
    out=$(redis-benchmark "$@" -t set,get -P "$DEPTH" -c "$CONNECTIONS" -d "$VALUE_BYTES" -r "$KEYS" -n "$REQUESTS" -q 2>&1 | tr '\r' '\n' | grep -cE '^(SET|GET): .*requests per second' || true)
    end=$(date +%s.%N)
    echo "$out $(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f", e - s }')"
}
RESULTS=$TMP/results.tsv
: >"$RESULTS"
# Warm both (and keyroute's slot map) once.
bench -h 127.0.0.1 -p "$KR_PORT" >/dev/null
for round in $(seq "$ROUNDS"); do
    read -r ok secs <<<"$(bench --cluster -h 127.0.0.1 -p "$BASE_PORT")"
    [[ $ok == 2 ]] || log "round $round direct: a test did not finish"
    printf '%s\tdirect (redis-benchmark --cluster)\t%s\t-\n' "$round" "$(awk -v n=$((2 * REQUESTS)) -v s="$secs" 'BEGIN { printf "%.0f", n / s }')" >>"$RESULTS"
    b=$(cpu_ticks "$KR_PID")
    read -r ok secs <<<"$(bench -h 127.0.0.1 -p "$KR_PORT")"
    a=$(cpu_ticks "$KR_PID")
    [[ $ok == 2 ]] || log "round $round keyroute: a test did not finish"
    printf '%s\tkeyroute\t%s\t%s\n' "$round" "$(awk -v n=$((2 * REQUESTS)) -v s="$secs" 'BEGIN { printf "%.0f", n / s }')" \
        "$(awk -v t=$((a - b)) -v n=$((2 * REQUESTS)) -v hz="$TICK" 'BEGIN { printf "%.3f", t / hz * 1e6 / n }')" >>"$RESULTS"
    log "round $round done"
done
echo "# A Redis Cluster through keyroute against redis-benchmark --cluster"
echo
echo "- command: \`ROUNDS=$ROUNDS REQUESTS=$REQUESTS DEPTH=$DEPTH CONNECTIONS=$CONNECTIONS VALUE_BYTES=$VALUE_BYTES KEYS=$KEYS bench/redis_cluster.sh\`"
echo "- three masters (no replicas) on loopback; redis-benchmark -t set,get -P $DEPTH -c $CONNECTIONS -d $VALUE_BYTES -r $KEYS -n $REQUESTS (ops/s over both tests, wall time including its connections)"
echo "- redirections followed by keyroute over the run: $(curl -s "127.0.0.1:$((BASE_PORT + 11))/metrics" | grep '^keyroute_pool_cluster_redirections_total' | awk '{s+=$2} END {print s+0}')"
echo
echo "| round | target | ops/s | keyroute CPU us/op |"
echo "|---:|---|---:|---:|"
awk -F'\t' '{printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}' "$RESULTS"
