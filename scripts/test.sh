#!/usr/bin/env bash
# The test command (README, .ci/run): installs the Debian packages the tests use when they are
# missing, then runs every test of the workspace. Extra arguments go to `cargo test`.
#
#   curl: keyroute-server/tests/protocols.rs checks h2c with `curl --http2-prior-knowledge`.
#   promtool (package prometheus): the gateway's /metrics is checked with `promtool check metrics`.
#   etcd (package etcd-server): membership tests run a real etcd (started by the tests themselves
#   on free loopback ports, in a temporary directory, and killed by pid when they end).
#   nginx, haproxy, redis-server (and its redis-tools, for redis-cli): the live differential tests
#   of the compatibility modes (keyroute-server/tests/compat_live.rs) run the real programs the
#   same way, and compare their placements with keyroute's.
#   memcached, nutcracker: the memcached listener's tests (keyroute-server/tests/memcache.rs)
#   start real memcached servers, and real twemproxy beside keyroute on the same servers.
#   memccapable (package libmemcached-tools): libmemcached's conformance suite, run through
#   keyroute against memcached (keyroute-server/tests/cache_ops.rs).
#   nghttpd (package nghttp2-server): keyroute-server/tests/upstream.rs uses it as an HTTP/2 worker.
#   dnsmasq (package dnsmasq-base: the program, no service): keyroute-server/tests/dns.rs serves
#   the SRV and address records a DNS-backed pool follows, on a loopback port.
#   grpcio (from PyPI, for python3): keyroute-server/tests/grpc.rs runs real gRPC servers and
#   clients (tests/support/grpc_peer.py) through the gateway.
#   chromium, chromium-driver (and a font): the dashboard's browser test
#   (keyroute-server/tests/dashboard.rs) drives headless Chromium through ChromeDriver on
#   127.0.0.1, both started by the test and stopped by pid.
#
# Nothing is started: packages are installed with services disabled (policy-rc.d), and the tests
# start what they need themselves, on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v curl >/dev/null 2>&1 || need+=(curl)
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
have nginx || need+=(nginx)
have haproxy || need+=(haproxy)
{ have redis-server && have redis-cli; } || need+=(redis-server)
{ have chromium && have chromedriver; } || need+=(chromium chromium-driver)
have memcached || need+=(memcached)
have nutcracker || need+=(nutcracker)
have memccapable || need+=(libmemcached-tools)
have dnsmasq || need+=(dnsmasq-base)
have nghttpd || need+=(nghttp2-server)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)

if ((${#need[@]})); then
    echo "scripts/test.sh: installing ${need[*]} (Debian packages the tests use)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [ ! -e "$policy" ]; then
        # Exit status 101: "action forbidden", so no package starts its daemon on install.
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod +x "$policy"
        created_policy=1
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    if [ "$created_policy" -eq 1 ]; then
        $sudo rm -f "$policy"
    fi
fi

if ! python3 -c "import grpc" >/dev/null 2>&1; then
    echo "scripts/test.sh: installing grpcio (PyPI: the gRPC tests' real peers)" >&2
    python3 -m pip install --quiet --disable-pip-version-check grpcio \
        || python3 -m pip install --quiet --disable-pip-version-check --user grpcio
fi

# The rendezvous kernels' tests cannot run a vector level the CPU lacks. This says which level
# this machine has (from /proc/cpuinfo, unless set already), so that a test that would skip it,
# or a detection that misses it, fails instead (crates/keyroute/src/rendezvous/kernel.rs).
if [ -z "${KEYROUTE_EXPECT_SIMD:-}" ]; then
    flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true) "
    case "$(uname -m)" in
        x86_64)
            if [[ $flags == *" avx512f "* && $flags == *" avx512dq "* ]]; then
                KEYROUTE_EXPECT_SIMD=avx512
            elif [[ $flags == *" avx2 "* ]]; then
                KEYROUTE_EXPECT_SIMD=avx2
            else
                KEYROUTE_EXPECT_SIMD=scalar
            fi
            ;;
        *) KEYROUTE_EXPECT_SIMD=scalar ;;
    esac
    export KEYROUTE_EXPECT_SIMD
fi
echo "scripts/test.sh: rendezvous kernels tested up to $KEYROUTE_EXPECT_SIMD (KEYROUTE_EXPECT_SIMD)" >&2

exec cargo test --workspace "$@"
