#!/usr/bin/env python3
"""A model of nginx's `hash KEY consistent` placement, checked against golden.tsv.

    python3 crates/keyroute/testdata/compat/nginx/model.py [golden.tsv]

This is the spec that keyroute implements (ngx_http_upstream_hash_module.c, `consistent`):

- each peer, in directive order, is named by its `server` address TEXT (as written, not as resolved);
  TEXT is split into HOST and PORT: a "unix:" prefix gives HOST = the rest, PORT = ""; otherwise
  TEXT is scanned from its end over ASCII digits, and if a ':' is reached HOST is the text before it
  and PORT the digits after it, else HOST = TEXT and PORT = "" (so "127.0.0.2" hashes an EMPTY
  port, not "80");
- the peer gets weight * 160 points: point = crc32(HOST, "\\0", PORT, prev as 4 bytes little
  endian), where prev starts at 0 and is the previous point of the same peer;
- all points are sorted by value (a stable sort: on a tie the earlier peer comes first) and a
  point equal to the one before it is dropped;
- a key goes to the first point >= crc32(key), wrapping to the first point.

Prints, per case, how many keys the model places on another server than nginx did; exits 1 if any.
"""
import bisect
import os
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def split_text(text):
    """(host, port) as nginx's ngx_http_upstream_update_chash() splits a server's address text."""
    if text[:5].lower() == b"unix:":
        return text[5:], b""
    j = len(text)
    while j > 0 and text[j - 1:j].isdigit():
        j -= 1
    if j > 0 and text[j - 1:j] == b":":
        return text[:j - 1], text[j:]
    return text, b""


def continuum(peers):
    """peers: [(text bytes, weight)] in directive order -> (sorted point values, their texts)."""
    points = []
    for order, (text, weight) in enumerate(peers):
        host, port = split_text(text)
        base = zlib.crc32(host + b"\0" + port)
        prev = 0
        for _ in range(weight * 160):
            prev = zlib.crc32(prev.to_bytes(4, "little"), base)
            points.append((prev, order, text))
    points.sort()  # by value, then directive order: what a stable sort of the values gives
    values, texts = [], []
    for value, _, text in points:
        if values and values[-1] == value:
            continue
        values.append(value)
        texts.append(text)
    return values, texts


def place(cont, key):
    values, texts = cont
    i = bisect.bisect_left(values, zlib.crc32(key))
    return texts[i % len(values)]


def ties(peers):
    """Point values shared by two different peers (where the tie rule matters)."""
    seen, out = {}, 0
    for text, weight in peers:
        host, port = split_text(text)
        base, prev = zlib.crc32(host + b"\0" + port), 0
        for _ in range(weight * 160):
            prev = zlib.crc32(prev.to_bytes(4, "little"), base)
            if seen.setdefault(prev, text) != text:
                out += 1
    return out


def read_golden(path):
    """[(case peers [(text, weight)], [(key, text)])] from a golden.tsv."""
    cases = []
    with open(path, "rb") as f:
        for line in f:
            line = line.rstrip(b"\n")
            if not line or line.startswith(b"#"):
                continue
            if line.startswith(b"case "):
                peers = [tuple(e.rsplit(b"=", 1)) for e in line[5:].split(b" ")]
                cases.append(([(t, int(w)) for t, w in peers], []))
            else:
                key, text = line.split(b"\t")
                cases[-1][1].append((bytes.fromhex(key.decode()), text))
    return cases


def check(path):
    """{case line: (mismatches, keys, ties)}; prints a line per case."""
    bad = 0
    for peers, rows in read_golden(path):
        cont = continuum(peers)
        miss = sum(place(cont, key) != text for key, text in rows)
        bad += miss
        name = b" ".join(b"%s=%d" % p for p in peers).decode()
        print(f"model: {miss} of {len(rows)} keys misplaced, {ties(peers)} tied points: {name[:70]}")
    return bad


if __name__ == "__main__":
    sys.exit(1 if check(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "golden.tsv")) else 0)
