#!/usr/bin/env python3
"""Regenerates keyroute's golden vectors from an independent implementation of the placement contract.

Nothing here calls keyroute: the hashes come from Python's `xxhash` (the C reference library) and
`hashlib`, CRC16 from `binascii.crc_hqx`, and the strategies are re-implemented from their documented
definitions (crates/keyroute/src/{hash,rendezvous,ring,maglev}.rs). Jump hash vectors come from the
paper's C++ reference code (jump.cc, compiled by this script). If keyroute and this file disagree, one
of them does not follow the contract.

Usage: pip install xxhash && python3 crates/keyroute/testdata/generate.py
"""
import binascii, bisect, hashlib, math, os, struct, subprocess, sys, tempfile
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
MASK = (1 << 64) - 1
NODE_SEED = 0x6B65_7972_6F75_7465
M = 0xD6E8_FEB8_6659_FD93


def xxh3(b, seed=0):
    return xxhash.xxh3_64_intdigest(b, seed)


def md5_64(b):
    return int.from_bytes(hashlib.md5(b).digest()[:8], "big")


def mix64(x):
    x ^= x >> 32
    x = (x * M) & MASK
    x ^= x >> 29
    x = (x * M) & MASK
    x ^= x >> 32
    return x


def ln_portable(x):
    """keyroute's portable natural log: the same IEEE operations in the same order."""
    bits = struct.unpack("<Q", struct.pack("<d", x))[0]
    exponent = (bits >> 52) & 0x7FF
    mant = bits & ((1 << 52) - 1)
    if exponent == 0:
        shift = (64 - mant.bit_length()) - 11
        mant = (mant << shift) & ((1 << 52) - 1)
        exponent = 1 - shift
    e = exponent - 1023
    m = struct.unpack("<d", struct.pack("<Q", mant | (1023 << 52)))[0]
    if m > 1.4142135623730951:
        m *= 0.5
        e += 1
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    poly = 1.0 / 21.0
    for k in [19.0, 17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0]:
        poly = poly * s2 + 1.0 / k
    poly = poly * s2 + 1.0
    LN2_HI = 6.9314718036912381649e-1
    LN2_LO = 1.9082149292705877000e-10
    ef = float(e)
    return ef * LN2_HI + (2.0 * s * poly + ef * LN2_LO)


def exp_key(score):
    u = (float(score >> 11) + 0.5) * (1.0 / float(1 << 53))
    return -ln_portable(u)


def parse_nodes(spec):
    nodes = []
    for tok in spec.split(","):
        name, weight, zone = tok, 1, None
        while ":" in name:
            head, attr = name.rsplit(":", 1)
            if attr.startswith("weight="):
                weight = int(attr[7:])
            elif attr.startswith("zone="):
                zone = attr[5:]
            else:
                break
            name = head
        nodes.append((name, weight, zone))
    return nodes


def name_ranks(nodes):
    order = sorted(range(len(nodes)), key=lambda i: nodes[i][0].encode())
    ranks = [0] * len(nodes)
    for r, i in enumerate(order):
        ranks[i] = r
    return ranks


def rendezvous_ranking(nodes, h):
    ranks = name_ranks(nodes)
    seeds = [xxh3(n[0].encode(), NODE_SEED) for n in nodes]
    groups = {}
    for i, (_, w, _) in enumerate(nodes):
        if w > 0:
            groups.setdefault(w, []).append(i)
    for w in groups:
        groups[w].sort(key=lambda i: (-mix64(h ^ seeds[i]), ranks[i]))
    if len(groups) == 1:
        return next(iter(groups.values()))
    out = []
    while any(groups.values()):
        best = None
        for w, q in groups.items():
            if not q:
                continue
            i = q[0]
            s = mix64(h ^ seeds[i])
            k = exp_key(s) * (1.0 / float(w))
            cand = (k, -s, ranks[i], w)
            if best is None or cand < best:
                best = cand
        out.append(groups[best[3]].pop(0))
    return out


def ring_points(nodes, vnodes, scheme):
    ranks = name_ranks(nodes)
    pts = []
    for i, (name, w, _) in enumerate(nodes):
        for v in range(vnodes * w):
            label = f"{name}#{v}".encode()
            p = xxh3(label) if scheme == "xxh3" else md5_64(label) ^ (1 << 63)
            pts.append((p, ranks[i], i))
    pts.sort()
    return pts


def ring_ranking(nodes, pts, h):
    if not pts:
        return []
    at = bisect.bisect_left(pts, (h, -1, -1))
    out, seen = [], set()
    live = sum(1 for n in nodes if n[1] > 0)
    for k in range(len(pts)):
        i = pts[(at + k) % len(pts)][2]
        if i not in seen:
            seen.add(i)
            out.append(i)
            if len(out) == live:
                break
    return out


def maglev_table(nodes, size):
    live = sorted([i for i, n in enumerate(nodes) if n[1] > 0], key=lambda i: nodes[i][0].encode())
    if not live:
        return []
    wmax = max(nodes[i][1] for i in live)
    turns = []
    for i in live:
        name = nodes[i][0].encode()
        turns.append([i, xxh3(name, 0xA) % size, xxh3(name, 0xB) % (size - 1) + 1, 0.0, nodes[i][1] / wmax])
    table = [None] * size
    filled = 0
    while True:
        for t in turns:
            t[3] += t[4]
            while t[3] >= 1.0:
                t[3] -= 1.0
                while table[t[1]] is not None:
                    t[1] += t[2]
                    if t[1] >= size:
                        t[1] -= size
                table[t[1]] = t[0]
                filled += 1
                if filled == size:
                    return table


def jump_values(pairs):
    src = os.path.join(HERE, "jump.cc")
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "jump")
        subprocess.run(["g++", "-O2", "-o", exe, src], check=True)
        inp = "".join(f"{k} {b}\n" for k, b in pairs)
        out = subprocess.run([exe], input=inp, capture_output=True, text=True, check=True).stdout.split()
    return [int(x) for x in out]


SETS = [
    "a,b,c",
    "w1,w2,w3,w4,w5,w6,w7,w8",
    "x,y:weight=2,z:weight=5,q:weight=0,r:weight=2",
    "ñodo,节点,node-3:zone=eu,10.0.0.1:8080",
]
KEYS = [b"", b"a", b"cat.jpg", b"dog.jpg", b"owl.jpg", "clé-ü-節".encode(), b"k" * 1000] + [
    f"user:{i}".encode() for i in range(60)
]


def large_set(n, weighted):
    """A set of `n` nodes for the vectorised rendezvous path (16 or more nodes in a weight group).

    Mixed name forms, listed in a scrambled order (so listing order, name order and group order all
    differ); with `weighted`, weights 0, 1, 2, 3 and 5 drawn from a hash of the position, which gives
    weight groups of sizes that are not multiples of 8 (the vector pass's partial last block).
    """
    step = 13 if n == 32 else 77  # coprime with n: a permutation
    tag = "w" if weighted else "u"
    forms = [
        lambda i: f"{tag}{n}-{i}",
        lambda i: f"10.{n % 256}.{i // 100}.{i % 100}:11211",
        lambda i: f"cache-{i:03d}.{tag}",
        lambda i: f"节点-{tag}-{i}",
    ]
    out = []
    for k in range(n):
        i = (k * step) % n
        tok = forms[i % 4](i)
        if weighted:
            # 32 nodes: 19 of weight 1 (two blocks of 8 and 3 more), the rest in small groups.
            weights = [1, 1, 1, 2, 3, 0] if n == 32 else [1, 1, 2, 3, 5, 0]
            tok += f":weight={weights[xxh3(f'weight-{n}-{i}'.encode()) % 6]}"
        out.append(tok)
    return ",".join(out)


LARGE_SETS = [(f"{'weighted' if w else 'equal'}-{n}", large_set(n, w)) for n in (32, 200) for w in (False, True)]
PICK_KEYS = [f"obj/{i}.jpg".encode() for i in range(300)]


SLOT_COUNT = 16384
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def slot_table(nodes):
    """SlotTable::new: each slot to its top rendezvous node (key hash mix64(slot)); no node above
    ceil(s + 3 sqrt(s)) for its exact share s; a capped node keeps its highest-scoring slots (ties by
    slot), and the others, in slot order, go to the first node of their ranking under its cap."""
    owners = [None] * SLOT_COUNT
    total = sum(n[1] for n in nodes)
    if not any(n[1] > 0 for n in nodes):
        return owners, 0
    caps = []
    for _, w, _ in nodes:
        share = float(SLOT_COUNT) * float(w) / float(total)
        caps.append(0 if w == 0 else min(math.ceil(share + 3.0 * math.sqrt(share)), SLOT_COUNT))
    seeds = [xxh3(n[0].encode(), NODE_SEED) for n in nodes]
    equal = len({n[1] for n in nodes if n[1] > 0}) == 1
    ranks = name_ranks(nodes)
    live = [i for i, n in enumerate(nodes) if n[1] > 0]
    for slot in range(SLOT_COUNT):
        h = mix64(slot)
        if equal:
            owners[slot] = max(live, key=lambda i: (mix64(h ^ seeds[i]), -ranks[i]))
        else:
            owners[slot] = rendezvous_ranking(nodes, h)[0]
    counts = [0] * len(nodes)
    for o in owners:
        counts[o] += 1
    bumped = []
    for i in range(len(nodes)):
        if counts[i] > caps[i]:
            mine = sorted((s for s in range(SLOT_COUNT) if owners[s] == i), key=lambda s: (-mix64(mix64(s) ^ seeds[i]), s))
            for s in mine[caps[i]:]:
                owners[s] = None
                bumped.append(s)
            counts[i] = caps[i]
    for s in sorted(bumped):
        for i in rendezvous_ranking(nodes, mix64(s)):
            if counts[i] < caps[i]:
                owners[s] = i
                counts[i] += 1
                break
    return owners, sum(1 for _ in bumped)


def encode_owners(owners, n):
    width = 1 if n <= 36 else 2
    out = []
    for o in owners:
        if width == 1:
            out.append(DIGITS[o])
        else:
            out.append(DIGITS[o // 36] + DIGITS[o % 36])
    return "".join(out)


SLOT_SETS = SETS + [
    "a:weight=1,b:weight=1000",
    ",".join(f"c{i}" for i in range(1000)),
]


def main():
    with open(os.path.join(HERE, "hash.tsv"), "w") as f:
        f.write("# key_hex\txxh3_64\txxh3_64(seed=NODE_SEED)\tmd5_64\tmix64(xxh3_64)\n")
        for k in KEYS:
            h = xxh3(k)
            f.write(f"{k.hex()}\t{h:016x}\t{xxh3(k, NODE_SEED):016x}\t{md5_64(k):016x}\t{mix64(h):016x}\n")
    with open(os.path.join(HERE, "slots.tsv"), "w") as f:
        f.write("# key_hex\tcrc16_xmodem(hashed part)\tslot\n")
        for k in KEYS + [b"somekey", b"{user1}.following", b"key", b"foo{}{bar}", b"foo{{bar}}zap", b"foo{bar}{zap}"]:
            part = k
            o = k.find(b"{")
            if o >= 0:
                c = k.find(b"}", o + 1)
                if c > o + 1:
                    part = k[o + 1 : c]
            crc = binascii.crc_hqx(part, 0)
            f.write(f"{k.hex()}\t{crc:04x}\t{crc % 16384}\n")
    with open(os.path.join(HERE, "placement.tsv"), "w") as f:
        f.write("# strategy\tnode spec\tkey_hex\tranking (node names, owner first)\n")
        for spec in SETS:
            nodes = parse_nodes(spec)
            names = [n[0] for n in nodes]
            xring = ring_points(nodes, 160, "xxh3")
            jring = ring_points(nodes, 100, "java-md5")
            mag = maglev_table(nodes, 65537)
            for k in KEYS:
                h = xxh3(k)
                rows = [
                    ("rendezvous", rendezvous_ranking(nodes, h)),
                    ("ring", ring_ranking(nodes, xring, h)),
                    ("ring-java-md5-100", ring_ranking(nodes, jring, md5_64(k) ^ (1 << 63))),
                    ("maglev", [mag[(h * 65537) >> 64]] if mag else []),
                ]
                for strat, r in rows:
                    f.write(f"{strat}\t{spec}\t{k.hex()}\t{','.join(names[i] for i in r)}\n")
    with open(os.path.join(HERE, "placement_large.tsv"), "w") as f:
        f.write("# Sets of 32 and 200 nodes, for the vectorised rendezvous pass. Nodes are named by their position in\n")
        f.write("# the set's listing (0-based). Three kinds of rows:\n")
        f.write("# set\tset name\tnode spec\n")
        f.write("# rendezvous\tset name\tkey_hex\tfull ranking (positions, owner first)\n")
        f.write("# pick\tset name\tkey_hex\trendezvous owner\tring owner (xxh3, 160 vnodes)\tmaglev owner (65537)\n")
        for name, spec in LARGE_SETS:
            f.write(f"set\t{name}\t{spec}\n")
        for name, spec in LARGE_SETS:
            nodes = parse_nodes(spec)
            for k in KEYS:
                r = rendezvous_ranking(nodes, xxh3(k))
                f.write(f"rendezvous\t{name}\t{k.hex()}\t{','.join(str(i) for i in r)}\n")
            xring = ring_points(nodes, 160, "xxh3")
            mag = maglev_table(nodes, 65537)
            for k in PICK_KEYS:
                h = xxh3(k)
                owner = rendezvous_ranking(nodes, h)[0]
                at = bisect.bisect_left(xring, (h, -1, -1))
                ring_owner = xring[at % len(xring)][2]
                f.write(f"pick\t{name}\t{k.hex()}\t{owner}\t{ring_owner}\t{mag[(h * 65537) >> 64]}\n")
    with open(os.path.join(HERE, "slot_table.tsv"), "w") as f:
        f.write("# SlotTable::new over a node set: the owner of every slot, as the owner's position in the listing,\n")
        f.write("# one base-36 digit per slot (two for sets above 36 nodes), slot 0 first.\n")
        f.write("# node spec\tslots bumped by the caps\towners\n")
        for spec in SLOT_SETS:
            nodes = parse_nodes(spec)
            owners, bumped = slot_table(nodes)
            print(f"slot table over {len(nodes)} nodes: {bumped} slots bumped", file=sys.stderr)
            f.write(f"{spec}\t{bumped}\t{encode_owners(owners, len(nodes))}\n")
    pairs = [(0, 1), (1, 2), (256, 1024), (MASK, 1), (MASK, 7)]
    pairs += [(xxh3(f"key-{i}".encode()), b) for i in range(40) for b in (1, 2, 3, 10, 100, 1000, 65536, 2**31 - 1)]
    vals = jump_values(pairs)
    with open(os.path.join(HERE, "jump.tsv"), "w") as f:
        f.write("# key (u64, decimal)\tbuckets\tJumpConsistentHash(key, buckets) by the paper's C++ code\n")
        for (k, b), v in zip(pairs, vals):
            f.write(f"{k}\t{b}\t{v}\n")


if __name__ == "__main__":
    sys.exit(main())
