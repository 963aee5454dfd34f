#!/usr/bin/env python3
"""A Python model of HAProxy 2.6 `balance hdr(<name>)` + `hash-type consistent`, checked against golden.tsv.

    python3 crates/keyroute/testdata/compat/haproxy/model.py   # prints the mismatches per case

It is an executable description of what keyroute must reproduce, written from HAProxy's sources
(v2.6: src/hash.c, src/lb_chash.c, src/backend.c get_server_hh(), src/http_htx.c __http_find_header(),
src/http.c http_find_hdr_value_end(), include/haproxy/tools.h full_hash()).
Every hash function reads the key as `const unsigned char *`: bytes are 0..255, never sign-extended.
"""
import bisect
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
M = 0xFFFFFFFF

SRV_EWGHT_RANGE = 4096  # points of server s are keyed full_hash(s.puid * 4096 + j)
BE_WEIGHT_SCALE = 16    # a server of weight w has w * 16 points (weight 0: none)


def full_hash(a):
    """include/haproxy/tools.h full_hash(): Bob Jenkins' 6-shift integer hash, times 3221225473."""
    a &= M
    a = ((a + 0x7ED55D16) + (a << 12)) & M
    a = ((a ^ 0xC761C23C) ^ (a >> 19)) & M
    a = ((a + 0x165667B1) + (a << 5)) & M
    a = ((a + 0xD3A2646C) ^ (a << 9)) & M
    a = ((a + 0xFD7046C5) + (a << 3)) & M
    a = ((a ^ 0xB55A4F09) ^ (a >> 16)) & M
    return (a * 3221225473) & M


def sdbm(key):
    """hash_sdbm(): h = c + (h << 6) + (h << 16) - h, from h = 0."""
    h = 0
    for c in key:
        h = (c + (h << 6) + (h << 16) - h) & M
    return h


def djb2(key):
    """hash_djb2(): h = h * 33 + c, from h = 5381 (the C code is unrolled 8x; same result)."""
    h = 5381
    for c in key:
        h = (((h << 5) + h) + c) & M
    return h


def wt6(key):
    """hash_wt6(): Willy Tarreau's 6-shift hash with data-dependent rotations."""
    h0, h1 = 0xA53C965A, 0x5CA6953A
    step0, step1 = 6, 18
    for t in key:
        h0 = ~(h0 ^ t) & M
        h1 = ~(h1 + t) & M
        t = ((h1 << step0) | (h1 >> (32 - step0))) & M
        h1 = ((h0 << step1) | (h0 >> (32 - step1))) & M
        h0 = t
        t = ((h0 >> 16) ^ h1) & 0xFFFF
        step0 = t & 0x1F
        step1 = t >> 11
    return (h0 ^ h1) & M


def crc32(key):
    """hash_crc32(): bitwise reflected CRC-32, poly 0xEDB88320, init ~0, final ~ (= zlib.crc32)."""
    h = M
    for c in key:
        h ^= c
        for _ in range(8):
            h = (h >> 1) ^ (0xEDB88320 if h & 1 else 0)
    return ~h & M


FUNCTIONS = {"sdbm": sdbm, "djb2": djb2, "wt6": wt6, "crc32": crc32}


def first_value(value):
    """The value HAProxy hashes for hdr(): the header's first comma-separated element.

    __http_find_header() (not FULL): skip leading SP/HT, end at the first ',' that is not inside
    a double-quoted string (a backslash escapes one char inside quotes), drop trailing SP/HT.
    Returns b"" when that element is empty: HAProxy then falls back to round robin.
    """
    i, n = 0, len(value)
    while i < n and value[i] in b" \t\r\n":
        i += 1
    j, quoted, qdpair = i, False, False
    while j < n:
        c = value[j]
        if qdpair:
            qdpair = False
        elif quoted:
            if c == 0x5C:
                qdpair = True
            elif c == 0x22:
                quoted = False
        elif c == 0x22:
            quoted = True
        elif c == 0x2C:
            break
        j += 1
    v = value[i:j]
    while v and v[-1] in b" \t\r\n":
        v = v[:-1]
    return v


class Ring:
    """lb_chash.c: the tree of a backend's active servers, as a sorted list of (point, server id)."""

    def __init__(self, servers):
        pts = []
        for sid, weight in servers:
            for j in range(weight * BE_WEIGHT_SCALE):
                pts.append((full_hash(sid * SRV_EWGHT_RANGE + j), sid))
        # eb32 keeps duplicate keys in insertion order; sort is stable on the point only.
        pts.sort(key=lambda p: p[0])
        self.keys = [p[0] for p in pts]
        self.ids = [p[1] for p in pts]
        self.duplicates = len(self.keys) - len(set(self.keys))

    def lookup(self, h):
        """chash_get_server_hash(): the closer of the next point >= h and the one before it."""
        n = len(self.keys)
        i = bisect.bisect_left(self.keys, h)
        nxt = i if i < n else 0
        prv = nxt - 1 if nxt > 0 else n - 1
        dp = (h - self.keys[prv]) & M
        dn = (self.keys[nxt] - h) & M
        return self.ids[prv] if dp <= dn else self.ids[nxt]


def place(ring, function, avalanche, value):
    h = FUNCTIONS[function](value)
    if avalanche:
        h = full_hash(h)
    return ring.lookup(h)


def check(path):
    """Compare every line of golden.tsv with the model; returns the total mismatch count."""
    total = 0
    cases = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if line.startswith("case "):
                tok = line.split(" ")
                fv = tok[1] == "first-value"
                if fv:
                    tok = tok[1:]
                servers = [tuple(int(x) for x in s.split(":")) for s in tok[3].split(",")]
                cases.append({"line": line, "fv": fv, "function": tok[1], "aval": tok[2] == "avalanche",
                              "ring": Ring(servers), "n": 0, "bad": []})
                continue
            key_hex, sid = line.split("\t")
            c = cases[-1]
            value = bytes.fromhex(key_hex)
            if c["fv"]:
                value = first_value(value)
            got = place(c["ring"], c["function"], c["aval"], value)
            c["n"] += 1
            if got != int(sid):
                c["bad"].append((key_hex, sid, got))
    for c in cases:
        total += len(c["bad"])
        print(f"{len(c['bad'])} mismatches / {c['n']} keys, {c['ring'].duplicates} duplicate points: {c['line'][:100]}")
        for key_hex, sid, got in c["bad"][:5]:
            print(f"    {key_hex[:60]}: haproxy {sid}, model {got}")
    print(f"total mismatches: {total}")
    return total


if __name__ == "__main__":
    sys.exit(1 if check(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "golden.tsv")) else 0)
