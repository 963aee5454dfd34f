#!/bin/sh
# Golden vectors for keyroute::compat::guava, from the real Guava.
#   sh crates/keyroute/testdata/compat/guava/generate.sh
# Needs Debian's default-jdk-headless and libguava-java. Writes golden.txt beside this script.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
jar=$(ls /usr/share/java/guava.jar 2>/dev/null || ls /usr/share/java/guava-*.jar | head -1)
python3 - "$work" <<'PY'
import random, sys
work = sys.argv[1]
rng = random.Random(5)
keys = [b"", b"a", b"hello", b"\x00", "héllo".encode(), b"x" * 300, b"\xff\xfe\xfd"]
keys += [f"user:{rng.randrange(10**7)}".encode() for _ in range(300)]
keys += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) for _ in range(200)]
open(f"{work}/keys.hex", "w").write("".join(k.hex() + "\n" for k in keys))
longs = [0, 1, -1, 2**63 - 1, -2**63, 4626093953513826134, 42]
longs += [rng.randrange(-2**63, 2**63) for _ in range(500)]
open(f"{work}/longs.txt", "w").write("".join(f"{x}\n" for x in longs))
PY
cp "$here/Golden.java" "$work/"
(cd "$work" && javac -cp "$jar" Golden.java)
{
  echo "# guava $(dpkg-query -W -f '${Version}' libguava-java); $(java -version 2>&1 | head -1)"
  java -cp "$work:$jar" Golden "$work/keys.hex" "$work/longs.txt"
} > "$here/golden.txt"
