#!/usr/bin/env python3
"""A model of twemproxy's ketama placement (src/hashkit/nc_ketama.c, src/nc_server.c), checked
against golden.tsv, which generate.py records from the real nutcracker.

    python3 crates/keyroute/testdata/compat/twemproxy/model.py

Prints, per case, how many keys the model places on another server than nutcracker did, and, for
the hash_tag case, how alternative readings of the tag rule would fare. Exits 1 on any mismatch.

The model:
- a server's label is its name if the line has one, else `host` when the port is 11211 (libmemcached's
  habit), else `host:port`;
- with N live servers and T the sum of their weights, a server of weight w gets
  floorf(f32(pct * 160 / 4 * N) + 1e-10) groups of 4 points, pct = f32(w) / f32(T), all in float32
  (the + 1e-10 is a double addition whose result floorf rounds back to float32);
- group k's points are the four little-endian u32 words of md5(label + "-" + k);
- points are sorted by value; a key goes to the first point >= u32le(md5(key)[0:4]), else the first;
- hash_tag "XY": find the first X in the key, then the first Y after it; if both exist and the bytes
  between them are not empty, only those bytes are hashed, else the whole key is;
- an ejected server (auto_eject_hosts) gets no points, and N and T count live servers only.
"""
import bisect
import hashlib
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def label(line):
    addr, _, name = line.partition(" ")
    if name:
        return name.encode()
    host, port, _weight = addr.rsplit(":", 2)
    return (host if port == "11211" else f"{host}:{port}").encode()


def weight(line):
    return int(line.partition(" ")[0].rsplit(":", 1)[1])


def continuum(lines, dead=()):
    live = [i for i in range(len(lines)) if lines[i] not in dead]
    n = len(live)
    total = sum(weight(lines[i]) for i in live)
    points = []
    for i in live:
        pct = f32(f32(weight(lines[i])) / f32(total))
        x = f32(f32(f32(pct * 160) / 4) * f32(n))
        groups = int(f32(x + 1e-10) // 1)
        for k in range(groups):
            d = hashlib.md5(label(lines[i]) + b"-%d" % k).digest()
            points += [(v, i) for v in struct.unpack("<4I", d)]
    points.sort(key=lambda p: p[0])  # stable; nutcracker's qsort is not, which matters only on ties
    return points


def tag_twemproxy(key, tag):
    a = key.find(tag[0])
    if a >= 0:
        b = key.find(tag[1], a + 1)
        if b >= 0 and b - a > 1:
            return key[a + 1: b]
    return key


# Alternative readings of the tag rule, to show which the real program rules out.
def tag_empty_hashes_empty(key, tag):
    a = key.find(tag[0])
    if a >= 0:
        b = key.find(tag[1], a + 1)
        if b >= 0:
            return key[a + 1: b]
    return key


def tag_unclosed_hashes_rest(key, tag):
    a = key.find(tag[0])
    if a >= 0:
        b = key.find(tag[1], a + 1)
        if b < 0:
            return key[a + 1:]
        if b - a > 1:
            return key[a + 1: b]
    return key


def tag_redis_like_next_pair(key, tag):
    """Like twemproxy, but on an empty tag looks for the next pair further on."""
    start = 0
    while True:
        a = key.find(tag[0], start)
        if a < 0:
            return key
        b = key.find(tag[1], a + 1)
        if b < 0:
            return key
        if b - a > 1:
            return key[a + 1: b]
        start = b + 1


def place(points, key):
    if not key:
        return points[0][1]  # nutcracker hashes an empty key to 0 (memcached has none)
    h = struct.unpack("<I", hashlib.md5(key).digest()[:4])[0]
    values = [p[0] for p in points]
    j = bisect.bisect_left(values, h)
    return points[j if j < len(points) else 0][1]


def read_golden(path):
    cases = []
    for raw in open(path, encoding="utf-8"):
        raw = raw.rstrip("\n")
        if not raw or raw.startswith("#"):
            continue
        if raw.startswith("case "):
            rest = raw[5:]
            opts = {}
            while rest.startswith(("hash_tag=", "eject=")):
                tok, _, rest = rest.partition(" ")
                k, _, v = tok.partition("=")
                opts[k] = v
            cases.append({"lines": rest.split(","), "opts": opts, "keys": []})
        else:
            hexkey, server = raw.split("\t")
            cases[-1]["keys"].append((bytes.fromhex(hexkey), server))
    return cases


def check(case, tag_rule=tag_twemproxy):
    lines, opts = case["lines"], case["opts"]
    dead = {opts["eject"]} if "eject" in opts else set()
    points = continuum(lines, dead)
    tag = opts.get("hash_tag")
    bad = []
    for key, want in case["keys"]:
        k = tag_rule(key, tag.encode()) if tag else key
        got = lines[place(points, k)] if len(lines) - len(dead) > 1 else next(l for l in lines if l not in dead)
        if got != want:
            bad.append((key, want, got))
    return bad


def main():
    cases = read_golden(os.path.join(HERE, "golden.tsv"))
    failed = 0
    for c in cases:
        bad = check(c)
        failed += len(bad)
        name = " ".join(f"{k}={v}" for k, v in c["opts"].items())
        print(f"{len(c['lines'])} servers {name}: {len(c['keys'])} keys, {len(bad)} misplaced by the model")
        for key, want, got in bad[:10]:
            print(f"  {key.hex()}: nutcracker {want}, model {got}")
        if "hash_tag" in c["opts"]:
            for rule in (tag_empty_hashes_empty, tag_unclosed_hashes_rest, tag_redis_like_next_pair,
                         lambda k, t: k):
                n = len(check(c, rule))
                print(f"  tag rule {getattr(rule, '__name__', 'none')}: {n} misplaced")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
