#!/usr/bin/env bash
# keyroute gateway vs nginx vs haproxy, on this machine, in one run.
#
# 8 trivial HTTP backends on loopback (one nginx instance, 1 worker, 8 listeners answering "ok");
# the same wrk load (random ?k=1..100000 per request) through each proxy:
#   keyroute  rendezvous on {query.k}, --threads 1
#   nginx     hash $arg_k consistent, worker_processes 1
#   haproxy   balance url_param k + hash-type consistent, nbthread 1
# all with access logging off and upstream keep-alive, same threads/connections/duration,
# alternated round by round. For each: req/s, p99, and the proxy's own CPU time per request
# (user+sys of all its processes over the requests wrk completed).
#
# Usage:  bench/gateway.sh
#         DURATION=10s CONNECTIONS=32 THREADS=1 ROUNDS=3 WARMUP=2s bench/gateway.sh
# Modes:  PROXY_THREADS=2   keyroute --threads 2, nginx worker_processes 2, haproxy nbthread 2
#         TLS=1             HTTP/1.1 over TLS (a self-signed certificate made with openssl):
#                           keyroute [[listener.tls.certificate]], nginx `listen ... ssl`,
#                           haproxy `bind ... ssl crt`; wrk over https
#         FLOOR=1           also a do-nothing hyper proxy (crates/keyroute-bench/examples/floor_proxy.rs,
#                           plain HTTP/1.1 only): what tokio and hyper cost by themselves; and the
#                           same do-nothing proxy on httparse and readiness alone, the design of
#                           issue 20 (examples/floor_own.rs), as proxy "floor-own" on FLOOR_PORT+1
#         URING=1           also floor-own on io_uring (examples/floor_uring.rs: multishot accept and
#                           receive, a provided buffer ring, batched submission), as proxy
#                           "floor-uring" on FLOOR_PORT+2, beside floor-own (implies FLOOR=1)
#         BASELINE=FILE     also a keyroute binary to compare with in the same run (for example one
#                           built from the commit before a change), as proxy "baseline" on
#                           BASELINE_PORT=18040 with the same configuration
#         VIEWERS=N         with BASELINE: N dashboard subscribers (curl -N .../events) on the
#                           baseline gateway, none on keyroute; with BASELINE=target/release/keyroute
#                           this measures what watching the dashboard costs, in one run
#         UPSTREAM_TLS=1    HTTPS to the backends (keep-alive, sessions resumed): the backends
#                           serve TLS with a certificate for bench.test from a CA made here
#                           (openssl); keyroute [pool.upstream] tls = true, ca_file, server_name;
#                           nginx proxy_pass https:// with proxy_ssl_verify and
#                           proxy_ssl_session_reuse; haproxy `ssl verify required ca-file`
#         H2=1              HTTP/2 over TLS (ALPN h2 on all three); load by h2load (package
#                           nghttp2-client) over the same 100,000 URIs, STREAMS=10 per connection
# Ports (override if taken): BACKEND_PORT=18081 (..+7) KEYROUTE_PORT=18000 NGINX_PORT=18010
#         HAPROXY_PORT=18020 ADMIN_PORT=19901
# KEEP_TMP=1 keeps the temp dir (configs, logs, raw wrk output).
# Installs nginx, haproxy and wrk with apt-get if missing (needs root). Starts every process
# itself, in a temp dir, on 127.0.0.1, and kills them by PID on exit.
# Writes the report to stdout and to bench/results/gateway-<timestamp>.md.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)

DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-1}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2s}
BACKEND_PORT=${BACKEND_PORT:-18081}
KEYROUTE_PORT=${KEYROUTE_PORT:-18000}
NGINX_PORT=${NGINX_PORT:-18010}
HAPROXY_PORT=${HAPROXY_PORT:-18020}
ADMIN_PORT=${ADMIN_PORT:-19901}
NBACKENDS=8
PROXIES=(keyroute nginx haproxy)
URING=${URING:-0}
FLOOR=${FLOOR:-$URING}
FLOOR_PORT=${FLOOR_PORT:-18030}
[[ "$FLOOR" == 1 ]] && PROXIES+=(floor floor-own)
[[ "$URING" == 1 ]] && PROXIES+=(floor-uring)
BASELINE=${BASELINE:-}
BASELINE_PORT=${BASELINE_PORT:-18040}
VIEWERS=${VIEWERS:-0}
[[ -n "$BASELINE" ]] && PROXIES+=(baseline)
PROXY_THREADS=${PROXY_THREADS:-1}
H2=${H2:-0}
TLS=${TLS:-$H2}
STREAMS=${STREAMS:-10}
UPSTREAM_TLS=${UPSTREAM_TLS:-0}
[[ "$UPSTREAM_TLS" == 1 && "$FLOOR" == 1 ]] && { echo "UPSTREAM_TLS=1 does not go with FLOOR=1 (the floor proxies speak plain HTTP)" >&2; exit 64; }
CMDLINE="DURATION=$DURATION CONNECTIONS=$CONNECTIONS THREADS=$THREADS ROUNDS=$ROUNDS WARMUP=$WARMUP PROXY_THREADS=$PROXY_THREADS TLS=$TLS H2=$H2 UPSTREAM_TLS=$UPSTREAM_TLS FLOOR=$FLOOR URING=$URING $0${*:+ $*}"
SCHEME=http
[[ "$TLS" == 1 ]] && SCHEME=https

log() { printf '[gateway.sh] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------------------------------------
# Processes: every PID we start goes in PIDS; on exit each (and its children) is killed by PID.
PIDS=()
TMP=""

children_of() { # PIDs whose parent is $1
    local stat s
    local -a f
    for stat in /proc/[0-9]*/stat; do
        { s=$(<"$stat"); } 2>/dev/null || continue
        s=${s##*) }
        read -r -a f <<<"$s"
        if [[ "${f[1]}" == "$1" ]]; then # f[0] = state (field 3), f[1] = ppid (field 4)
            s=${stat#/proc/}
            echo "${s%/stat}"
        fi
    done
}

cleanup() {
    local rc=$? pid all=() deadline
    trap - EXIT INT TERM
    set +e
    for pid in "${PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null || continue
        all+=("$pid")
        # shellcheck disable=SC2207
        all+=($(children_of "$pid"))
    done
    if ((${#all[@]})); then
        log "stopping PIDs ${all[*]}"
        kill -TERM "${all[@]}" 2>/dev/null || true
        deadline=$((SECONDS + 5))
        while ((SECONDS < deadline)); do
            local alive=0
            for pid in "${all[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
            ((alive)) || break
            sleep 0.1
        done
        for pid in "${all[@]}"; do
            kill -0 "$pid" 2>/dev/null && { log "PID $pid ignored SIGTERM; SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
        done
        for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    fi
    if [[ -n "$TMP" && -d "$TMP" ]]; then
        if [[ "${KEEP_TMP:-0}" == 1 || $rc -ne 0 ]]; then
            log "temp dir kept: $TMP"
        else
            rm -rf "$TMP"
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

# ---------------------------------------------------------------------------------------------
# Tools.
missing=()
tools=(nginx haproxy wrk curl python3 openssl)
[[ "$H2" == 1 ]] && tools+=(h2load)
for tool in "${tools[@]}"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || die "missing ${missing[*]}; run as root (or install them) so apt-get can install them"
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    pkgs=(nginx haproxy wrk)
    for tool in curl python3 openssl; do [[ " ${missing[*]} " == *" $tool "* ]] && pkgs+=("$tool"); done
    [[ " ${missing[*]} " == *" h2load "* ]] && pkgs+=(nghttp2-client)
    apt-get install -y "${pkgs[@]}"
    for tool in "${tools[@]}"; do command -v "$tool" >/dev/null || die "$tool still missing after apt-get install"; done
fi
if pgrep -x nginx >/dev/null 2>&1 || pgrep -x haproxy >/dev/null 2>&1; then
    log "note: nginx/haproxy processes not started by this script are running (left alone):"
    pgrep -a -x nginx >&2 || true
    pgrep -a -x haproxy >&2 || true
fi

CLK_TCK=$(getconf CLK_TCK)

log "building keyroute (cargo build --release -p keyroute-cli)"
cargo build --release -p keyroute-cli
KEYROUTE=$ROOT/target/release/keyroute
[[ -x "$KEYROUTE" ]] || die "$KEYROUTE not built"
if [[ "$FLOOR" == 1 ]]; then
    cargo build --release -p keyroute-bench --example floor_proxy --example floor_own --example floor_uring
fi

# ---------------------------------------------------------------------------------------------
# Ports must be free (something answering a TCP connect means taken).
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
BPORTS=()
for ((i = 0; i < NBACKENDS; i++)); do BPORTS+=($((BACKEND_PORT + i))); done
EXTRA_PORTS=()
[[ -n "$BASELINE" ]] && EXTRA_PORTS=("$BASELINE_PORT" $((ADMIN_PORT + 1)))
for port in "${BPORTS[@]}" "$KEYROUTE_PORT" "$NGINX_PORT" "$HAPROXY_PORT" "$ADMIN_PORT" "${EXTRA_PORTS[@]}"; do
    port_taken "$port" && die "port 127.0.0.1:$port is in use; pick other ports (see the header of $0)"
done

TMP=$(mktemp -d /tmp/keyroute-gateway-bench.XXXXXX)
chmod 755 "$TMP"
log "temp dir: $TMP"
if [[ "$TLS" == 1 ]]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench.test \
        -addext subjectAltName=DNS:bench.test -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>/dev/null
    cat "$TMP/cert.pem" "$TMP/key.pem" >"$TMP/combined.pem"
fi
if [[ "$UPSTREAM_TLS" == 1 ]]; then
    # A CA, and the backends' certificate for bench.test signed by it.
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench-ca \
        -keyout "$TMP/ca.key" -out "$TMP/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=bench.test \
        -keyout "$TMP/up.key" -out "$TMP/up.csr" 2>/dev/null
    printf 'subjectAltName=DNS:bench.test\nbasicConstraints=CA:FALSE\n' >"$TMP/up.ext"
    openssl x509 -req -in "$TMP/up.csr" -CA "$TMP/ca.pem" -CAkey "$TMP/ca.key" -CAcreateserial -days 2 \
        -extfile "$TMP/up.ext" -out "$TMP/up.pem" 2>/dev/null
fi
BACKEND_LISTEN_SUFFIX=""
[[ "$UPSTREAM_TLS" == 1 ]] && BACKEND_LISTEN_SUFFIX=" ssl"
NGINX_LISTEN="127.0.0.1:$NGINX_PORT"
HAPROXY_BIND="127.0.0.1:$HAPROXY_PORT"
if [[ "$TLS" == 1 ]]; then
    NGINX_LISTEN="$NGINX_LISTEN ssl"
    [[ "$H2" == 1 ]] && NGINX_LISTEN="$NGINX_LISTEN http2"
    alpn=http/1.1
    [[ "$H2" == 1 ]] && alpn=h2,http/1.1
    HAPROXY_BIND="$HAPROXY_BIND ssl crt $TMP/combined.pem alpn $alpn"
fi

# ---------------------------------------------------------------------------------------------
# Configs.
nginx_common() { # $1 = instance name, $2 = worker processes (default 1)
    local d="$TMP/$1"
    mkdir -p "$d/logs" "$d/tmp"
    cat <<EOF
worker_processes ${2:-1};
pid $d/nginx.pid;
error_log $d/logs/error.log warn;
events { worker_connections 4096; }
EOF
}
nginx_http_common() { # $1 = instance name
    local d="$TMP/$1"
    cat <<EOF
    access_log off;
    keepalive_timeout 65;
    keepalive_requests 1000000;
    client_body_temp_path $d/tmp/body;
    proxy_temp_path $d/tmp/proxy;
    fastcgi_temp_path $d/tmp/fastcgi;
    uwsgi_temp_path $d/tmp/uwsgi;
    scgi_temp_path $d/tmp/scgi;
EOF
}

{
    nginx_common backends
    echo "http {"
    nginx_http_common backends
    echo "    default_type text/plain;"
    if [[ "$UPSTREAM_TLS" == 1 ]]; then
        echo "    ssl_certificate $TMP/up.pem;"
        echo "    ssl_certificate_key $TMP/up.key;"
        echo "    ssl_session_cache shared:BSSL:1m;"
    fi
    for port in "${BPORTS[@]}"; do
        echo "    server { listen 127.0.0.1:$port$BACKEND_LISTEN_SUFFIX; location / { return 200 \"ok\\n\"; } }"
    done
    echo "}"
} >"$TMP/backends.conf"

{
    nginx_common nginx "$PROXY_THREADS"
    echo "http {"
    nginx_http_common nginx
    if [[ "$TLS" == 1 ]]; then
        echo "    ssl_certificate $TMP/cert.pem;"
        echo "    ssl_certificate_key $TMP/key.pem;"
        echo "    ssl_session_cache shared:SSL:1m;"
    fi
    echo "    upstream backends {"
    echo "        hash \$arg_k consistent;"
    for port in "${BPORTS[@]}"; do echo "        server 127.0.0.1:$port;"; done
    echo "        keepalive 64;"
    echo "        keepalive_requests 1000000;"
    echo "    }"
    echo "    server {"
    echo "        listen $NGINX_LISTEN;"
    echo "        location / {"
    if [[ "$UPSTREAM_TLS" == 1 ]]; then
        echo "            proxy_pass https://backends;"
        echo "            proxy_ssl_verify on;"
        echo "            proxy_ssl_trusted_certificate $TMP/ca.pem;"
        echo "            proxy_ssl_name bench.test;"
        echo "            proxy_ssl_server_name on;"
        echo "            proxy_ssl_session_reuse on;"
    else
        echo "            proxy_pass http://backends;"
    fi
    echo "            proxy_http_version 1.1;"
    echo "            proxy_set_header Connection \"\";"
    # Like for like: the headers keyroute adds to every upstream request.
    echo "            proxy_set_header Host \$http_host;"
    echo "            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;"
    echo "            proxy_set_header X-Forwarded-Proto \$scheme;"
    echo "            proxy_set_header X-Forwarded-Host \$http_host;"
    echo "            proxy_set_header Forwarded \"for=\$remote_addr;proto=\$scheme;host=\\\"\$http_host\\\"\";"
    echo "            proxy_set_header X-Request-Id \$request_id;"
    echo "            proxy_set_header Via \"1.1 nginx\";"
    echo "        }"
    echo "    }"
    echo "}"
} >"$TMP/nginx.conf"

{
    cat <<EOF
global
    nbthread $PROXY_THREADS
    maxconn 4096

defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 60s

frontend fe
    bind $HAPROXY_BIND
    default_backend be

backend be
    balance url_param k
    hash-type consistent
    # Like for like: the headers keyroute adds to every upstream request.
    option forwardfor
    http-request set-header X-Forwarded-Proto http
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    http-request set-header Forwarded "for=%[src];proto=http;host=\\"%[req.hdr(host)]\\""
    http-request set-header X-Request-Id %[uuid]
    http-request add-header Via "1.1 haproxy"
EOF
    server_opts=""
    [[ "$UPSTREAM_TLS" == 1 ]] && server_opts=" ssl verify required ca-file $TMP/ca.pem verifyhost bench.test sni str(bench.test)"
    for ((i = 0; i < NBACKENDS; i++)); do echo "    server b$((i + 1)) 127.0.0.1:${BPORTS[i]}$server_opts"; done
} >"$TMP/haproxy.cfg"

{
    cat <<EOF
shutdown_grace_ms = 1000

[admin]
listen = "127.0.0.1:$ADMIN_PORT"

[[listener]]
listen = "127.0.0.1:$KEYROUTE_PORT"
$([[ "$TLS" == 1 ]] && printf '[[listener.tls.certificate]]\ncert = "%s"\nkey = "%s"\n' "$TMP/cert.pem" "$TMP/key.pem")

[[pool]]
name = "bench"
strategy = "rendezvous"
key = "{query.k}"
on_missing_key = "p2c"

[pool.health]
path = "/"
interval_ms = 5000
$([[ "$UPSTREAM_TLS" == 1 ]] && printf '\n[pool.upstream]\ntls = true\nca_file = "%s"\nserver_name = "bench.test"\n' "$TMP/ca.pem")
EOF
    for ((i = 0; i < NBACKENDS; i++)); do
        printf '\n[[pool.worker]]\nname = "b%d"\naddress = "127.0.0.1:%d"\n' $((i + 1)) "${BPORTS[i]}"
    done
} >"$TMP/keyroute.toml"

log "checking configs"
"$KEYROUTE" serve --config "$TMP/keyroute.toml" --check >&2
NGINX_E=()
nginx_help=$(nginx -h 2>&1 || true)
[[ "$nginx_help" == *"-e filename"* ]] && NGINX_E=(-e "$TMP/nginx-startup-error.log")
nginx "${NGINX_E[@]}" -t -q -p "$TMP/backends" -c "$TMP/backends.conf"
nginx "${NGINX_E[@]}" -t -q -p "$TMP/nginx" -c "$TMP/nginx.conf"
haproxy -c -q -f "$TMP/haproxy.cfg"

# ---------------------------------------------------------------------------------------------
# Start everything. Each runs in the foreground of its own background job, so $! is its PID.
nginx "${NGINX_E[@]}" -p "$TMP/backends" -c "$TMP/backends.conf" -g 'daemon off;' \
    >"$TMP/backends.out" 2>&1 &
BACKENDS_PID=$!
PIDS+=("$BACKENDS_PID")
nginx "${NGINX_E[@]}" -p "$TMP/nginx" -c "$TMP/nginx.conf" -g 'daemon off;' >"$TMP/nginx.out" 2>&1 &
declare -A PID
PID[nginx]=$!
PIDS+=("${PID[nginx]}")
haproxy -db -f "$TMP/haproxy.cfg" >"$TMP/haproxy.out" 2>&1 &
PID[haproxy]=$!
PIDS+=("${PID[haproxy]}")
"$KEYROUTE" serve --threads "$PROXY_THREADS" --log warn --config "$TMP/keyroute.toml" >"$TMP/keyroute.out" 2>&1 &
PID[keyroute]=$!
PIDS+=("${PID[keyroute]}")
declare -A PORT=([keyroute]=$KEYROUTE_PORT [nginx]=$NGINX_PORT [haproxy]=$HAPROXY_PORT [floor]=$FLOOR_PORT [floor-own]=$((FLOOR_PORT + 1)) [floor-uring]=$((FLOOR_PORT + 2)) [baseline]=$BASELINE_PORT)
if [[ -n "$BASELINE" ]]; then
    [[ -x "$BASELINE" ]] || die "BASELINE=$BASELINE is not an executable"
    sed -e "s/127.0.0.1:$KEYROUTE_PORT\"/127.0.0.1:$BASELINE_PORT\"/" -e "s/127.0.0.1:$ADMIN_PORT\"/127.0.0.1:$((ADMIN_PORT + 1))\"/" \
        "$TMP/keyroute.toml" >"$TMP/baseline.toml"
    "$BASELINE" serve --threads "$PROXY_THREADS" --log warn --config "$TMP/baseline.toml" >"$TMP/baseline.out" 2>&1 &
    PID[baseline]=$!
    PIDS+=("${PID[baseline]}")
fi
if [[ "$FLOOR" == 1 ]]; then
    bargs=()
    for port in "${BPORTS[@]}"; do bargs+=("127.0.0.1:$port"); done
    "$ROOT/target/release/examples/floor_proxy" "127.0.0.1:$FLOOR_PORT" "${bargs[@]}" >"$TMP/floor.out" 2>&1 &
    PID[floor]=$!
    PIDS+=("${PID[floor]}")
    "$ROOT/target/release/examples/floor_own" "127.0.0.1:$((FLOOR_PORT + 1))" "${bargs[@]}" >"$TMP/floor-own.out" 2>&1 &
    PID[floor-own]=$!
    PIDS+=("${PID[floor-own]}")
    if [[ "$URING" == 1 ]]; then
        "$ROOT/target/release/examples/floor_uring" "127.0.0.1:$((FLOOR_PORT + 2))" "${bargs[@]}" >"$TMP/floor-uring.out" 2>&1 &
        PID[floor-uring]=$!
        PIDS+=("${PID[floor-uring]}")
    fi
fi

# Sanity: every backend and every proxy answers 200 to ?k=abc (waiting up to 10 s for startup).
expect_200() { # $1 = label, $2 = port, $3 = PID that must stay alive
    local code deadline=$((SECONDS + 10))
    while :; do
        kill -0 "$3" 2>/dev/null || die "$1 (PID $3) exited; see $TMP/$1.out"
        local scheme=http
        [[ "$1" != backends ]] && scheme=$SCHEME
        [[ "$1" == backends && "$UPSTREAM_TLS" == 1 ]] && scheme=https
        code=$(curl -k -s -o /dev/null -w '%{http_code}' --max-time 2 "$scheme://127.0.0.1:$2/?k=abc" || true)
        [[ "$code" == 200 ]] && return 0
        ((SECONDS < deadline)) || die "$1 on 127.0.0.1:$2 answered '$code' instead of 200; see $TMP/$1.out"
        sleep 0.2
    done
}
for port in "${BPORTS[@]}"; do expect_200 backends "$port" "$BACKENDS_PID"; done
for p in "${PROXIES[@]}"; do expect_200 "$p" "${PORT[$p]}" "${PID[$p]}"; done
log "backends and proxies answer 200"
if ((VIEWERS > 0)); then
    [[ -n "$BASELINE" ]] || die "VIEWERS needs BASELINE (the watched gateway)"
    # One source address per viewer (all loopback): the feed takes 8 subscribers per address.
    for ((v = 0; v < VIEWERS; v++)); do
        curl -sN --interface "127.0.0.$((2 + v % 250))" "http://127.0.0.1:$((ADMIN_PORT + 1))/events" >/dev/null 2>&1 &
        PIDS+=($!)
    done
    sleep 2
    viewers=$(curl -s "http://127.0.0.1:$((ADMIN_PORT + 1))/metrics" | awk '$1 == "keyroute_dashboard_viewers" {print $2}')
    [[ "$viewers" == "$VIEWERS" ]] || die "the baseline gateway counts '$viewers' dashboard viewers, not $VIEWERS"
    log "$VIEWERS dashboard viewers on the baseline gateway"
fi

# ---------------------------------------------------------------------------------------------
# CPU accounting: user+sys clock ticks (/proc/PID/stat fields 14 and 15) summed over the
# proxy's main PID and its children (nginx's master and its worker).
proxy_pids() { echo "$1" $(children_of "$1"); }
cpu_ticks() { # PIDs...
    local total=0 user=0 pid s
    local -a f
    for pid in "$@"; do
        s=$(<"/proc/$pid/stat") || die "PID $pid vanished"
        s=${s##*) }
        read -r -a f <<<"$s"
        total=$((total + f[11] + f[12])) # field n is f[n-3]: utime=14, stime=15
        user=$((user + f[11]))
    done
    echo "$total $user"
}

LUA=$ROOT/bench/gateway/random-k.lua
WRK=(wrk -t "$THREADS" -c "$CONNECTIONS" -d "$DURATION" --latency -s "$LUA")
if [[ "$H2" == 1 ]]; then
    # The same keys as the wrk script's: 100,000 URIs, k uniform in 1..100000 (fixed seed).
    python3 -c "import random; random.seed(1); print('\n'.join('$SCHEME://127.0.0.1:PORT/?k=%d' % random.randint(1, 100000) for _ in range(100000)))" >"$TMP/uris.tpl"
    WRK=(h2load -t "$THREADS" -c "$CONNECTIONS" -m "$STREAMS" -D "${DURATION%s}")
fi
load() { # $1 = port, $2 = duration; runs the load against one proxy
    if [[ "$H2" == 1 ]]; then
        sed "s/PORT/$1/" "$TMP/uris.tpl" >"$TMP/uris-$1.txt"
        h2load -t "$THREADS" -c "$CONNECTIONS" -m "$STREAMS" -D "${2%s}" -i "$TMP/uris-$1.txt"
    else
        wrk -t "$THREADS" -c "$CONNECTIONS" -d "$2" --latency -s "$LUA" "$SCHEME://127.0.0.1:$1/"
    fi
}
RUNS=$TMP/runs.tsv
: >"$RUNS"

for p in "${PROXIES[@]}"; do
    log "warm-up: $p ($WARMUP)"
    load "${PORT[$p]}" "$WARMUP" >"$TMP/warmup-$p.txt"
done

for ((round = 1; round <= ROUNDS; round++)); do
    for p in "${PROXIES[@]}"; do
        log "round $round/$ROUNDS: $p"
        pids_before=$(proxy_pids "${PID[$p]}")
        # shellcheck disable=SC2086
        read -r before before_user <<<"$(cpu_ticks $pids_before)"
        out=$TMP/wrk-$round-$p.txt
        load "${PORT[$p]}" "$DURATION" >"$out"
        pids_after=$(proxy_pids "${PID[$p]}")
        # shellcheck disable=SC2086
        read -r after after_user <<<"$(cpu_ticks $pids_after)"
        changed=0
        [[ "$pids_before" == "$pids_after" ]] || { changed=1; log "warning: $p's processes changed during the run ($pids_before -> $pids_after)"; }
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$p" $((after - before)) "$CLK_TCK" "$out" "$changed" >>"$RUNS"
        grep -E 'requests in|Requests/sec|^ +99%|Non-2xx|Socket errors|finished in|^requests:' "$out" | sed 's/^/    /' >&2
        echo "    proxy CPU: $((after - before)) ticks, $((after_user - before_user)) of them user (CLK_TCK=$CLK_TCK)" >&2
    done
done

for p in "${PROXIES[@]}"; do kill -0 "${PID[$p]}" 2>/dev/null || die "$p (PID ${PID[$p]}) died during the benchmark"; done

# ---------------------------------------------------------------------------------------------
# Report.
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$ROOT/bench/results"
REPORT=$ROOT/bench/results/gateway-$STAMP.md
META=$TMP/meta.md
{
    echo "# keyroute gateway vs nginx vs haproxy"
    echo
    echo "- command: \`$CMDLINE\`"
    echo "- load (same for every proxy): \`${WRK[*]/#$ROOT\//} http://127.0.0.1:PORT/\`, requests \`GET /?k=N\`, N uniform in 1..100000; warm-up $WARMUP per proxy; $ROUNDS round(s), alternated keyroute, nginx, haproxy"
    echo "- backends: $NBACKENDS listeners of one nginx instance (1 worker, \`return 200 \"ok\\n\"\`) on 127.0.0.1:${BPORTS[0]}-${BPORTS[NBACKENDS - 1]}"
    echo "- mode: $SCHEME, HTTP/$([[ "$H2" == 1 ]] && echo "2 ($STREAMS streams per connection, h2load)" || echo 1.1) ; proxy threads/workers: $PROXY_THREADS; to the backends: $([[ "$UPSTREAM_TLS" == 1 ]] && echo "HTTPS (TLS verified against a CA made here, name bench.test, sessions resumed)" || echo "plain HTTP/1.1")"
    echo "- keyroute: \`keyroute serve --threads $PROXY_THREADS --log warn\`, rendezvous on \`{query.k}\`, health checks every 5 s (127.0.0.1:$KEYROUTE_PORT)"
    [[ -n "$BASELINE" ]] && echo "- baseline: \`$BASELINE serve\` with the same configuration (127.0.0.1:$BASELINE_PORT)"
    echo "- nginx: worker_processes $PROXY_THREADS, \`hash \$arg_k consistent\`, keepalive 64, keepalive_requests 1000000, access_log off (127.0.0.1:$NGINX_PORT)"
    echo "- haproxy: nbthread $PROXY_THREADS, \`balance url_param k\`, \`hash-type consistent\`, http-keep-alive, http-reuse always, no logging (127.0.0.1:$HAPROXY_PORT)"
    echo "- upstream headers (like for like): all three add X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host, Forwarded (for, proto, host), X-Request-Id and Via, and pass the client's Host"
    echo "- CPU us/request: the proxy's user+sys time (all its processes; nginx = master + worker) during the wrk run, over the requests wrk completed"
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); nproc: $(nproc); kernel: $(uname -r)"
    echo "- versions: keyroute $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- crates Cargo.toml Cargo.lock 2>/dev/null || echo ' (+ uncommitted changes)'); $(nginx -v 2>&1 | sed 's/^nginx version: //'); $(haproxy -v 2>&1 | head -1 | sed 's/ - .*//'); $(wrk -v 2>&1 | head -1 | sed 's/ \[.*//;s/ Copyright.*//')"
} >"$META"
python3 "$ROOT/bench/gateway/report.py" "$RUNS" "$META" >"$REPORT"
cat "$REPORT"
log "report written to ${REPORT#$ROOT/}"
