#!/bin/sh
# Golden vectors for keyroute::compat::groupcache, from the real golang/groupcache package.
#   sh crates/keyroute/testdata/compat/groupcache/generate.sh
# Needs Debian's golang-go and golang-github-golang-groupcache-dev (the package's sources in
# /usr/share/gocode). Writes golden.tsv beside this script.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import random, sys
work = sys.argv[1]
rng = random.Random(8)
keys = [b"", b"a", b"\x00", "héllo".encode(), b"x" * 500, b"\xff\xfe"]
keys += [f"user:{rng.randrange(10**7)}".encode() for _ in range(1500)]
keys += [f"/thumb/img-{rng.randrange(1000)}.jpg?w=160".encode() for _ in range(1500)]
keys += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 30))) for _ in range(994)]
open(f"{work}/keys.hex", "w").write("".join(k.hex() + "\n" for k in keys))
names8 = [f"cache-{c}" for c in "abcdefgh"]
ips = lambda n: [f"127.0.0.1:{21001 + i}" for i in range(n)]
cases = [(50, names8), (3, names8), (50, ips(3)), (50, ips(31)), (1, ips(7)), (500, ips(25))]
open(f"{work}/cases.txt", "w").write("".join(f"{r}\t{','.join(n)}\n" for r, n in cases))
PY
cp "$here/main.go" "$work/main.go"
(cd "$work" && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$work/cache" go build -o gen main.go)
{
  echo "# $(go version); golang-github-golang-groupcache-dev $(dpkg-query -W -f '${Version}' golang-github-golang-groupcache-dev)"
  "$work/gen" "$work/cases.txt" "$work/keys.hex"
} > "$here/golden.tsv"
