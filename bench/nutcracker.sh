# Sourced by bench/memcache.sh and bench/idle.sh: nutcracker's configuration for a bench pool.

# nutcracker_yml PORT PROTOCOL SERVER... : a pool "bench" on 127.0.0.1:PORT, ketama over MD5 (as
# keyroute's `twemproxy` strategy places keys), each SERVER (host:port) of weight 1; PROTOCOL
# memcached or redis. Written to stdout.
nutcracker_yml() {
    local port=$1 protocol=$2 s
    shift 2
    echo "bench:"
    echo "  listen: 127.0.0.1:$port"
    echo "  hash: md5"
    echo "  distribution: ketama"
    echo "  timeout: 1000"
    [[ $protocol == redis ]] && echo "  redis: true"
    echo "  servers:"
    for s in "$@"; do echo "   - $s:1"; done
}
