#!/usr/bin/env bash
# keyroute's memcached listener vs nutcracker (twemproxy), with direct-to-server as the floor, in one run.
#
# 4 memcached servers (1 thread each) on loopback; nutcracker with one pool over them (ketama, md5);
# keyroute serve --threads 1 with the configuration `keyroute from-nutcracker` makes of the same
# YAML (so both place every key alike). The same load through each, rounds alternated:
# crates/keyroute-bench/examples/mc_load.rs, CONNECTIONS connections each writing DEPTH commands at
# once (one SET in sixteen, the rest single-key GETs, VALUE_BYTES-byte values, KEYS keys written first).
# "direct" sends the same load to one memcached server (no proxy: the floor).
# For each: ops/s, and the proxy's CPU time per operation (user+sys from /proc/PID/stat over the
# run, over the operations completed).
#
# Usage:  bench/memcache.sh
#         ROUNDS=3 SECONDS_PER_RUN=8 CONNECTIONS=8 DEPTH=16 VALUE_BYTES=100 bench/memcache.sh
#         PROTOCOL=redis bench/memcache.sh   4 redis-servers, nutcracker with redis: true, keyroute's
#                                            Redis listener (twemproxy placement); the load is
#                                            redis-benchmark -t set,get -P DEPTH -c CONNECTIONS
#                                            -d VALUE_BYTES -r KEYS for REQUESTS requests
#         PROTOCOL=redis REDIS_TESTS=mset bench/memcache.sh   redis-benchmark's tests to run
#                                            (default set,get; mset: MSET of 10 keys, one op each)
#         SERVERS_N=8 MULTI=100 bench/memcache.sh   8 servers; every GET a multi-get of 100 keys
#                                            (MGET for redis, through mc_load)
#         RATE=20000 bench/memcache.sh       open loop: 20,000 commands/s, latency p50/p99/p999
#                                            taken from each command's due time (mc_load; RESP
#                                            too with PROTOCOL=redis)
#         BASELINE=FILE bench/memcache.sh   also a keyroute binary to compare with in the same run (for
#                                            example one built from an earlier commit), as target
#                                            "baseline", on the same configuration and servers
# Needs memcached and nutcracker (installed with apt-get when missing, as root). Starts every process
# itself on 127.0.0.1 and kills them by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/nutcracker.sh
. bench/nutcracker.sh
ROOT=$(pwd)

ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-8}
CONNECTIONS=${CONNECTIONS:-8}
DEPTH=${DEPTH:-16}
VALUE_BYTES=${VALUE_BYTES:-100}
KEYS=${KEYS:-10000}
BASE_PORT=${BASE_PORT:-21211}
PROTOCOL=${PROTOCOL:-memcached}
REQUESTS=${REQUESTS:-400000}
REDIS_TESTS=${REDIS_TESTS:-set,get}
REDIS_TEST_COUNT=$(tr "," "\n" <<<"$REDIS_TESTS" | grep -c .)
SERVERS_N=${SERVERS_N:-4}
MULTI=${MULTI:-1}
RATE=${RATE:-}
[[ $PROTOCOL == memcached || $PROTOCOL == redis ]] || { echo "PROTOCOL is memcached or redis" >&2; exit 64; }

log() { echo "[memcache.sh] $*" >&2; }
die() { log "error: $*"; exit 1; }

PIDS=()
TMP=$(mktemp -d /tmp/keyroute-memcache-bench.XXXXXX)
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT

tools=(memcached nutcracker)
[[ $PROTOCOL == redis ]] && tools=(redis-server redis-benchmark nutcracker)
for tool in "${tools[@]}"; do
    if ! command -v "$tool" >/dev/null && [[ ! -x /usr/sbin/$tool ]]; then
        [[ $(id -u) == 0 ]] || die "$tool missing; run as root so apt-get can install it"
        pkg=$tool
        [[ $tool == redis-benchmark ]] && pkg=redis-tools
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
    fi
done
NUTCRACKER=$(command -v nutcracker || echo /usr/sbin/nutcracker)

log "building keyroute and the load generator (release)"
cargo build --release -q -p keyroute-cli
cargo build --release -q -p keyroute-bench --example mc_load
KEYROUTE=$ROOT/target/release/keyroute
LOAD=$ROOT/target/release/examples/mc_load

user=()
[[ $(id -u) == 0 ]] && user=(-u root)
SERVERS=()
server() { # $1 = port
    if [[ $PROTOCOL == redis ]]; then
        redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    else
        memcached -l 127.0.0.1 -p "$1" -U 0 -t 1 -m 256 -c 4096 "${user[@]}" &
    fi
    PIDS+=($!)
}
for i in $(seq 0 $((SERVERS_N - 1))); do
    port=$((BASE_PORT + i))
    server "$port"
    SERVERS+=("127.0.0.1:$port")
done
DIRECT_PORT=$((BASE_PORT + 20))
server "$DIRECT_PORT"
NUT_PORT=$((BASE_PORT + 21))
KR_PORT=$((BASE_PORT + 22))
nutcracker_yml "$NUT_PORT" "$PROTOCOL" "${SERVERS[@]}" >"$TMP/nutcracker.yml"
"$NUTCRACKER" -c "$TMP/nutcracker.yml" -s $((BASE_PORT + 23)) -a 127.0.0.1 -o "$TMP/nutcracker.log" &
NUT_PID=$!
PIDS+=("$NUT_PID")
if [[ $PROTOCOL == redis ]]; then
    # from-nutcracker converts memcached pools only: the same placement, written out.
    {
        printf '[admin]\nlisten = "127.0.0.1:%s"\n\n[[listener]]\nlisten = "127.0.0.1:%s"\nprotocol = "redis"\npool = "bench"\n\n' $((BASE_PORT + 24)) "$KR_PORT"
        printf '[[pool]]\nname = "bench"\nstrategy = "twemproxy"\n[pool.retry]\nper_try_timeout_ms = 1000\n'
        for s in "${SERVERS[@]}"; do printf '[[pool.worker]]\nname = "%s"\naddress = "%s"\n' "$s" "$s"; done
    } >"$TMP/keyroute.toml"
else
    "$KEYROUTE" from-nutcracker "$TMP/nutcracker.yml" --admin "127.0.0.1:$((BASE_PORT + 24))" |
        sed "s/127.0.0.1:$NUT_PORT/127.0.0.1:$KR_PORT/" >"$TMP/keyroute.toml"
fi
"$KEYROUTE" serve --threads 1 --log warn --config "$TMP/keyroute.toml" >"$TMP/keyroute.log" 2>&1 &
KR_PID=$!
PIDS+=("$KR_PID")
TARGETS=(direct nutcracker keyroute)
BASE_PID=0
BASE_KR_PORT=$((BASE_PORT + 25))
if [[ -n ${BASELINE:-} ]]; then
    sed -e "s/127.0.0.1:$KR_PORT/127.0.0.1:$BASE_KR_PORT/" -e "s/127.0.0.1:$((BASE_PORT + 24))/127.0.0.1:$((BASE_PORT + 26))/" \
        "$TMP/keyroute.toml" >"$TMP/baseline.toml"
    "$BASELINE" serve --threads 1 --log warn --config "$TMP/baseline.toml" >"$TMP/baseline.log" 2>&1 &
    BASE_PID=$!
    PIDS+=("$BASE_PID")
    TARGETS+=(baseline)
fi
sleep 1
for port in "$NUT_PORT" "$KR_PORT" "$DIRECT_PORT" $([[ $BASE_PID != 0 ]] && echo "$BASE_KR_PORT"); do
    for _ in $(seq 50); do
        (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
        sleep 0.1
    done
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A PORT=([direct]=$DIRECT_PORT [nutcracker]=$NUT_PORT [keyroute]=$KR_PORT [baseline]=$BASE_KR_PORT)
declare -A PID=([direct]=0 [nutcracker]=$NUT_PID [keyroute]=$KR_PID [baseline]=$BASE_PID)
TICK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"
for round in $(seq "$ROUNDS"); do
    for target in "${TARGETS[@]}"; do
        pid=${PID[$target]}
        before=0
        [[ $pid != 0 ]] && before=$(cpu_ticks "$pid")
        if [[ $PROTOCOL == redis && -z $RATE && $MULTI == 1 ]]; then
            start=$(date +%s.%N)
            rb=$(redis-benchmark -h 127.0.0.1 -p "${PORT[$target]}" -t "$REDIS_TESTS" -P "$DEPTH" -c "$CONNECTIONS" \
                -d "$VALUE_BYTES" -r "$KEYS" -n "$REQUESTS" -q 2>&1 | tr '\r' '\n' | grep -E '^(SET|GET|MSET[^:]*):' || true)
            secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }')
            done_ops=$((REDIS_TEST_COUNT * REQUESTS))
            [[ $(grep -c 'requests per second' <<<"$rb") == "$REDIS_TEST_COUNT" ]] || done_ops=0
            out="ops=$done_ops seconds=$secs ops_per_sec=$(awk -v o="$done_ops" -v s="$secs" 'BEGIN { printf "%.0f", o / s }') misses=0 errors=$((done_ops == 0))"
        else
            out=$(MC_PROTOCOL=$PROTOCOL MC_MULTI=$MULTI MC_RATE=$RATE \
                "$LOAD" "127.0.0.1:${PORT[$target]}" "$CONNECTIONS" "$DEPTH" "$SECONDS_PER_RUN" "$VALUE_BYTES" "$KEYS")
        fi
        after=0
        [[ $pid != 0 ]] && after=$(cpu_ticks "$pid")
        ops=$(sed -E 's/.*ops=([0-9]+) .*/\1/' <<<"$out")
        rate=$(sed -E 's/.*ops_per_sec=([0-9]+).*/\1/' <<<"$out")
        errors=$(sed -E 's/.*errors=([0-9]+).*/\1/' <<<"$out")
        misses=$(sed -E 's/.*misses=([0-9]+).*/\1/' <<<"$out")
        us=$(awk -v t=$((after - before)) -v ops="$ops" -v hz="$TICK" 'BEGIN { if (ops > 0) printf "%.3f", t / hz * 1e6 / ops; else print "-" }')
        [[ $target == direct ]] && us="-"
        p99=$(grep -oE 'p99_us=[0-9]+' <<<"$out" | cut -d= -f2 || true)
        p999=$(grep -oE 'p999_us=[0-9]+' <<<"$out" | cut -d= -f2 || true)
        log "round $round $target: $out cpu_us_per_op=$us"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$target" "$rate" "$us" "$errors" "$misses" "${p99:--}" "${p999:--}" >>"$RESULTS"
    done
done

echo "# keyroute $PROTOCOL listener vs nutcracker"
echo
echo "- command: \`PROTOCOL=$PROTOCOL ROUNDS=$ROUNDS SECONDS_PER_RUN=$SECONDS_PER_RUN REQUESTS=$REQUESTS CONNECTIONS=$CONNECTIONS DEPTH=$DEPTH VALUE_BYTES=$VALUE_BYTES KEYS=$KEYS bench/memcache.sh\`"
if [[ -n $RATE ]]; then
    echo "- load: examples/mc_load, open loop: $RATE commands/s over $CONNECTIONS connections (1 SET in 16, GETs of $MULTI key(s)), $VALUE_BYTES-byte values, $KEYS keys"
else
    echo "- load: examples/mc_load (or redis-benchmark): $CONNECTIONS connections x $DEPTH pipelined commands (1 SET in 16, GETs of $MULTI key(s)), $VALUE_BYTES-byte values, $KEYS keys"
fi
echo "- $SERVERS_N $PROTOCOL servers$([[ $PROTOCOL == memcached ]] && echo " (-t 1)") behind nutcracker $("$NUTCRACKER" -V 2>&1 | head -1 | awk '{print $NF}') (ketama, md5) and behind keyroute serve --threads 1 (from-nutcracker); direct: one memcached, no proxy"
echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); nproc: $(nproc); keyroute $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (+ uncommitted changes)')"
echo
echo "| round | target | ops/s | proxy CPU us/op | errors | misses | p99 us | p99.9 us |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|"
awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8 }' "$RESULTS"
echo
echo "Medians:"
echo
echo "| target | ops/s | proxy CPU us/op | p99 us | p99.9 us |"
echo "|---|---:|---:|---:|---:|"
median() { awk -F'\t' -v t="$1" -v c="$2" '$2 == t { print $c }' "$RESULTS" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
for target in "${TARGETS[@]}"; do
    echo "| $target | $(median "$target" 3) | $(median "$target" 4) | $(median "$target" 7) | $(median "$target" 8) |"
done
k=$(awk -F'\t' '$2 == "keyroute" { print $4 }' "$RESULTS" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
n=$(awk -F'\t' '$2 == "nutcracker" { print $4 }' "$RESULTS" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
echo
awk -v k="$k" -v n="$n" 'BEGIN { if (n > 0) printf "CPU per operation, keyroute over nutcracker: %.3f (target <= 0.70)\n", k / n }'
if [[ $BASE_PID != 0 ]]; then
    b=$(awk -F'\t' '$2 == "baseline" { print $4 }' "$RESULTS" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    awk -v k="$k" -v b="$b" 'BEGIN { if (b > 0) printf "CPU per operation, keyroute over the baseline (%s): %.3f\n", ENVIRON["BASELINE"], k / b }'
fi
