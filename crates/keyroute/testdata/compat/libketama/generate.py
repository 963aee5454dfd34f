#!/usr/bin/env python3
"""Golden vectors for keyroute::compat::libketama, from the real libketama.

    pip install ketama==0.1.1        # PyPI's build of RJ/ketama's libketama/ketama.c (needs a C compiler)
    python3 crates/keyroute/testdata/compat/libketama/generate.py

Writes golden.tsv beside this script: `case ADDR:WEIGHT,...` lines, each followed by
`hex(key) TAB server` for every key, as `Ketama(file).get_server(key)` answers.
"""
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def keys():
    rng = random.Random(3)
    ks = [b"a", b"\x00", "héllo".encode(), b"x" * 250, b"\xff\xfe"]
    ks += [f"user:{rng.randrange(10**7)}".encode() for _ in range(1500)]
    ks += [f"/thumb/img-{rng.randrange(1000)}.jpg?w=160".encode() for _ in range(1000)]
    ks += [bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 30))) for _ in range(495)]
    return ks


def cases():
    ip = lambda n: [f"127.0.0.1:{21001 + i}" for i in range(n)]
    cs = [[(a, 1) for a in ip(n)] for n in (3, 7, 8, 25, 31)]
    cs.append(list(zip(ip(8), [1, 2, 3, 1, 1, 2, 3, 5])))
    cs.append([(a, 1 + i % 5) for i, a in enumerate(ip(31))])
    cs.append([(f"127.0.0.{2 + i}:11211", 100 * (i + 1)) for i in range(3)])
    return cs


def one_case(i):
    """Prints one case. One continuum per process: several in one process crash this build."""
    import ketama

    servers = cases()[i]
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
        f.write("".join(f"{a}\t{w}\n" for a, w in servers))
        path = f.name
    try:
        k = ketama.Ketama(path)
        out = ["case " + ",".join(f"{a}:{w}" for a, w in servers)]
        out += [f"{key.hex()}\t{k.get_server(key)[1]}" for key in keys()]
        sys.stdout.write("\n".join(out) + "\n")
    finally:
        os.unlink(path)


def main():
    with open(os.path.join(HERE, "golden.tsv"), "w") as out:
        out.write("# PyPI ketama 0.1.1 (RJ/ketama libketama/ketama.c); Ketama(file).get_server(key)\n")
        for i in range(len(cases())):
            r = subprocess.run([sys.executable, __file__, "--case", str(i)], capture_output=True, text=True, check=True)
            out.write(r.stdout)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        one_case(int(sys.argv[2]))
    else:
        main()
