#!/usr/bin/env bash
# Syscalls per request: keyroute, nginx, haproxy and the two floor proxies, each alone under
# `strace -c -f` for one wrk run (1 thread, 32 connections, 4 s, the same random ?k= load), in
# front of the same 8 backends. Counts include each proxy's start-up (a few hundred calls);
# strace slows every proxy down a lot, so the request counts are small and only the ratios and
# the kinds of calls mean anything.
#
# Usage:  KEEP_TMP=1 FLOOR=1 ROUNDS=1 DURATION=2s bench/gateway.sh   (prints its temp dir)
#         bench/syscalls.sh /tmp/keyroute-gateway-bench.XXXXXX
# Needs strace (apt-get install strace). Starts everything itself, on 127.0.0.1, and kills it.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:?the temp dir of a KEEP_TMP=1 FLOOR=1 bench/gateway.sh run}
command -v strace >/dev/null || { echo "needs strace" >&2; exit 1; }
nginx -p "$T/backends" -c "$T/backends.conf" -g 'daemon off;' >/dev/null 2>&1 &
B=$!
trap 'kill $B 2>/dev/null' EXIT
sleep 0.5
BP=()
for p in $(seq 18081 18088); do BP+=("127.0.0.1:$p"); done
echo "| proxy | requests | syscalls | per request | the most made (per request) |"
echo "|---|---:|---:|---:|---|"
run() { # name port command...
    local name=$1 port=$2 out=/tmp/syscalls-$1.txt
    shift 2
    strace -c -f -o "$out" "$@" >/dev/null 2>&1 &
    local s=$!
    sleep 1.5
    curl -s -o /dev/null "http://127.0.0.1:$port/?k=1" || true
    local n
    n=$(wrk -t 1 -c 32 -d 4s -s bench/gateway/random-k.lua "http://127.0.0.1:$port/" 2>&1 | awk '/requests in/ {print $1}')
    kill -INT "$s" 2>/dev/null || true
    sleep 0.5
    pkill -P "$s" 2>/dev/null || true
    wait "$s" 2>/dev/null || true
    sleep 0.3
    awk -v name="$name" -v n="$n" '
        NR > 2 && $1 ~ /^[0-9.]+$/ && $NF != "total" { calls[$NF] = $4 }
        $NF == "total" { total = $4 }
        END {
            top = ""
            for (k = 0; k < 4; k++) {
                best = ""; bn = 0
                for (c in calls) if (calls[c] > bn) { bn = calls[c]; best = c }
                if (best == "") break
                top = top sprintf("%s%s %.2f", (top == "" ? "" : ", "), best, bn / n)
                delete calls[best]
            }
            printf "| %s | %d | %d | %.2f | %s |\n", name, n, total, total / n, top
        }' "$out"
}
run keyroute 18000 target/release/keyroute serve --threads 1 --log warn --config "$T/keyroute.toml"
run nginx 18010 nginx -p "$T/nginx" -c "$T/nginx.conf" -g 'daemon off;'
run haproxy 18020 haproxy -db -f "$T/haproxy.cfg"
run floor 18030 target/release/examples/floor_proxy 127.0.0.1:18030 "${BP[@]}"
run floor-own 18031 target/release/examples/floor_own 127.0.0.1:18031 "${BP[@]}"
