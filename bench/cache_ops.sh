#!/usr/bin/env bash
# Issue 35's cache benchmarks, peers in the same run (memcached; keyroute serve --threads 1):
#
#   MODE=replicated  a replicated pool (copies = 2) over 4 memcached servers, a write load
#                    (MC_SETS=1): keyroute's CPU per client write (each to both copies) against
#                    two writes through nutcracker (two pools of 2 servers, the client writing
#                    each key to both: what a twemproxy user does for two copies).
#   MODE=shadow      2 memcached servers, open loop (RATE commands/s, 1 SET in 16): keyroute
#                    without a shadow, and keyroute shadowing 10% of keys to a pool whose one
#                    server is paused (SIGSTOP: every copy waits out its timeout, then the queue
#                    fills and copies are dropped; SHADOW_PAUSED=0: a live one): CPU per op and
#                    the client's p50/p99.
#
# Usage: MODE=replicated ROUNDS=3 SECONDS_PER_RUN=6 CONNECTIONS=8 DEPTH=16 bench/cache_ops.sh
#        MODE=shadow ROUNDS=3 SECONDS_PER_RUN=6 RATE=40000 bench/cache_ops.sh
# Starts every process itself on 127.0.0.1 and kills them by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
MODE=${MODE:-replicated}
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-6}
CONNECTIONS=${CONNECTIONS:-8}
DEPTH=${DEPTH:-16}
RATE=${RATE:-40000}
VALUE_BYTES=${VALUE_BYTES:-100}
KEYS=${KEYS:-10000}
BASE_PORT=${BASE_PORT:-23211}
log() { echo "[cache_ops.sh] $*" >&2; }

PIDS=()
TMP=$(mktemp -d /tmp/keyroute-cache-ops.XXXXXX)
cleanup() {
    for pid in "${PIDS[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
NUTCRACKER=$(command -v nutcracker || echo /usr/sbin/nutcracker)
log "building keyroute and the load generator (release)"
cargo build --release -q -p keyroute-cli
cargo build --release -q -p keyroute-bench --example mc_load
KEYROUTE=$ROOT/target/release/keyroute
LOAD=$ROOT/target/release/examples/mc_load
user=()
[[ $(id -u) == 0 ]] && user=(-u root)
memcached_on() { memcached -l 127.0.0.1 -p "$1" -U 0 -t 1 -m 256 -c 4096 "${user[@]}" & PIDS+=($!); }
workers() { for s in "$@"; do printf '[[pool.worker]]\nname = "%s"\naddress = "%s"\n' "$s" "$s"; done; }
keyroute_on() { # $1 = name, $2 = config file: starts it, sets PID_$1
    "$KEYROUTE" serve --threads 1 --log warn --config "$2" >"$TMP/$1.log" 2>&1 &
    PIDS+=($!)
    eval "PID_$1=$!"
}
wait_port() { for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.1; done; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
field() { sed -E "s/.*$1=([0-9]+).*/\\1/" <<<"$2"; }

S=()
for i in 0 1 2 3 4; do memcached_on $((BASE_PORT + i)); S+=("127.0.0.1:$((BASE_PORT + i))"); done
RESULTS=$TMP/results.tsv
: >"$RESULTS"
if [[ $MODE == replicated ]]; then
    { printf '[admin]\nlisten = "127.0.0.1:%s"\n[[listener]]\nlisten = "127.0.0.1:%s"\nprotocol = "memcached"\npool = "p"\n' $((BASE_PORT + 30)) $((BASE_PORT + 10))
      printf '[[pool]]\nname = "p"\nstrategy = "rendezvous"\n[pool.replication]\ncopies = 2\n'
      workers "${S[@]:0:4}"; } >"$TMP/replicated.toml"
    keyroute_on keyroute "$TMP/replicated.toml"
    { for pool in a b; do
        port=$((BASE_PORT + 11)); servers=("${S[@]:0:2}")
        [[ $pool == b ]] && { port=$((BASE_PORT + 12)); servers=("${S[@]:2:2}"); }
        printf '%s:\n  listen: 127.0.0.1:%s\n  hash: md5\n  distribution: ketama\n  timeout: 1000\n  servers:\n' "$pool" "$port"
        for s in "${servers[@]}"; do echo "   - $s:1"; done
      done; } >"$TMP/nutcracker.yml"
    "$NUTCRACKER" -c "$TMP/nutcracker.yml" -s $((BASE_PORT + 13)) -a 127.0.0.1 -o "$TMP/nutcracker.log" &
    PIDS+=($!); PID_nutcracker=$!
    for p in 10 11 12; do wait_port $((BASE_PORT + p)); done
    for round in $(seq "$ROUNDS"); do
        b=$(cpu_ticks "$PID_keyroute")
        out=$(MC_SETS=1 "$LOAD" "127.0.0.1:$((BASE_PORT + 10))" "$CONNECTIONS" "$DEPTH" "$SECONDS_PER_RUN" "$VALUE_BYTES" "$KEYS")
        a=$(cpu_ticks "$PID_keyroute")
        writes=$(field ops "$out")
        printf '%s\tkeyroute r=2\t%s\t%s\n' "$round" "$(awk -v w="$writes" -v s="$SECONDS_PER_RUN" 'BEGIN{printf "%.0f", w/s}')" \
            "$(awk -v t=$((a - b)) -v w="$writes" -v hz="$TICK" 'BEGIN{printf "%.3f", t/hz*1e6/w}')" >>"$RESULTS"
        log "round $round keyroute: $out"
        # Two writes a key through nutcracker: half the connections on each pool, the same keys.
        b=$(cpu_ticks "$PID_nutcracker")
        MC_SETS=1 "$LOAD" "127.0.0.1:$((BASE_PORT + 11))" $((CONNECTIONS / 2)) "$DEPTH" "$SECONDS_PER_RUN" "$VALUE_BYTES" "$KEYS" >"$TMP/a.out" &
        la=$!
        MC_SETS=1 "$LOAD" "127.0.0.1:$((BASE_PORT + 12))" $((CONNECTIONS / 2)) "$DEPTH" "$SECONDS_PER_RUN" "$VALUE_BYTES" "$KEYS" >"$TMP/b.out"
        wait "$la"
        a=$(cpu_ticks "$PID_nutcracker")
        ops=$(($(field ops "$(cat "$TMP/a.out")") + $(field ops "$(cat "$TMP/b.out")")))
        writes=$((ops / 2))
        printf '%s\tnutcracker x2\t%s\t%s\n' "$round" "$(awk -v w="$writes" -v s="$SECONDS_PER_RUN" 'BEGIN{printf "%.0f", w/s}')" \
            "$(awk -v t=$((a - b)) -v w="$writes" -v hz="$TICK" 'BEGIN{printf "%.3f", t/hz*1e6/w}')" >>"$RESULTS"
        log "round $round nutcracker: $(cat "$TMP/a.out") + $(cat "$TMP/b.out")"
    done
    echo "# A replicated pool (copies = 2) against two writes through nutcracker"
    echo
    echo "- command: \`MODE=replicated ROUNDS=$ROUNDS SECONDS_PER_RUN=$SECONDS_PER_RUN CONNECTIONS=$CONNECTIONS DEPTH=$DEPTH bench/cache_ops.sh\`"
    echo "- load: examples/mc_load with MC_SETS=1 ($VALUE_BYTES-byte SETs over $KEYS keys, $CONNECTIONS connections x $DEPTH pipelined); a write is one client SET stored on two servers"
    echo
    echo "| round | target | client writes/s | proxy CPU us per client write |"
    echo "|---:|---|---:|---:|"
    awk -F'\t' '{printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}' "$RESULTS"
else
    for name in plain shadowed; do
        port=$((BASE_PORT + 10)); admin=$((BASE_PORT + 30))
        [[ $name == shadowed ]] && { port=$((BASE_PORT + 11)); admin=$((BASE_PORT + 31)); }
        { printf '[admin]\nlisten = "127.0.0.1:%s"\n[[listener]]\nlisten = "127.0.0.1:%s"\nprotocol = "memcached"\npool = "p"\n' "$admin" "$port"
          printf '[[pool]]\nname = "p"\nstrategy = "rendezvous"\n'
          [[ $name == shadowed ]] && printf '[pool.shadow]\npool = "s"\nshare = 0.1\n'
          workers "${S[@]:0:2}"
          printf '[[pool]]\nname = "s"\nstrategy = "rendezvous"\n[pool.retry]\nper_try_timeout_ms = 200\n'
          workers "${S[4]}"; } >"$TMP/$name.toml"
        keyroute_on "$name" "$TMP/$name.toml"
        wait_port "$port"
    done
    PAUSED=${SHADOW_PAUSED:-1}
    [[ $PAUSED == 1 ]] && kill -STOP "${PIDS[4]}"
    for round in $(seq "$ROUNDS"); do
        for name in plain shadowed; do
            port=$((BASE_PORT + 10)); [[ $name == shadowed ]] && port=$((BASE_PORT + 11))
            pid_var=PID_$name; pid=${!pid_var}
            b=$(cpu_ticks "$pid")
            out=$(MC_RATE=$RATE "$LOAD" "127.0.0.1:$port" "$CONNECTIONS" "$DEPTH" "$SECONDS_PER_RUN" "$VALUE_BYTES" "$KEYS")
            a=$(cpu_ticks "$pid")
            ops=$(field ops "$out")
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$name" "$(field ops_per_sec "$out")" \
                "$(awk -v t=$((a - b)) -v o="$ops" -v hz="$TICK" 'BEGIN{printf "%.3f", t/hz*1e6/o}')" \
                "$(field p50_us "$out")" "$(field p99_us "$out")" "$(field errors "$out")" >>"$RESULTS"
            log "round $round $name: $out"
        done
    done
    dropped=$(curl -s "127.0.0.1:$((BASE_PORT + 31))/metrics" | grep 'keyroute_pool_shadow_commands_total{pool="p",outcome="dropped"}' | awk '{print $2}')
    echo "# Shadowing 10% of keys to a $([[ $PAUSED == 1 ]] && echo paused || echo live) pool, against no shadow"
    echo
    echo "- command: \`MODE=shadow SHADOW_PAUSED=$PAUSED ROUNDS=$ROUNDS SECONDS_PER_RUN=$SECONDS_PER_RUN RATE=$RATE CONNECTIONS=$CONNECTIONS bench/cache_ops.sh\`"
    echo "- load: examples/mc_load open loop, $RATE commands/s over $CONNECTIONS connections (1 SET in 16), $VALUE_BYTES-byte values; latency from each command's due time"
    answered=$(curl -s "127.0.0.1:$((BASE_PORT + 31))/metrics" | grep 'keyroute_pool_shadow_commands_total{pool="p",outcome="answered"}' | awk '{print $2}')
    if [[ $PAUSED == 1 ]]; then
        echo "- the shadow pool's one server is SIGSTOPped: copies wait 200 ms, the queue (1,024) fills, the rest are dropped ($dropped dropped, $answered answered over the run)"
    else
        echo "- the shadow pool's one server is live: $answered copies answered, $dropped dropped over the run"
    fi
    echo
    echo "| round | target | ops/s | proxy CPU us/op | p50 us | p99 us | errors |"
    echo "|---:|---|---:|---:|---:|---:|---:|"
    awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7}' "$RESULTS"
fi
