#!/usr/bin/env python3
"""Golden vectors for HAProxy's `balance hdr(X-Key)` + `hash-type consistent`, from the real haproxy.

    apt-get install haproxy       # Debian bookworm: 2.6.12-1+deb12u*; never started as a service
    python3 crates/keyroute/testdata/compat/haproxy/generate.py

Writes golden.tsv beside this script:
    # comments (version, exclusion rules, probes)
    case FUNCTION AVALANCHE ID:WEIGHT,...           FUNCTION sdbm|djb2|wt6|crc32, AVALANCHE avalanche|plain
    hex(header value sent) TAB id of the server that answered
A `# next case: hash-type consistent (no function keyword)` comment precedes the cases configured
with the bare `hash-type consistent` (written with the function and modifier that it resolves to).
`case first-value ...` sends `a, b`-style values: HAProxy hashes the first comma-separated element.

One haproxy process (foreground, `-db`, temporary directory, stopped by its pid) holds:
- one "server" frontend per server id, answering `200` with the id as its body;
- per case, a frontend on its own port whose backend balances over those server frontends.
Each answer's body is checked against the `srv_id` sample fetch (the id HAProxy itself chose),
which also confirms that servers without an `id` keyword are numbered 1..N.
Keys are sent pipelined over HTTP/1.1 keep-alive connections on raw sockets.
"""
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"

# ---------------------------------------------------------------------------------------------
# Cases: (name, [(explicit id or None, weight)]). Without `id`, HAProxy numbers servers 1..N.

CASES = [
    ("ip3", [(None, 1)] * 3),
    ("ip7", [(None, 1)] * 7),
    ("ip8", [(None, 1)] * 8),
    ("ip25", [(None, 1)] * 25),
    ("ip31", [(None, 1)] * 31),
    ("ip8w", [(None, w) for w in (1, 2, 3, 1, 1, 2, 3, 5)]),
    ("ip31w", [(None, i % 5 + 1) for i in range(31)]),
    ("ids", [(i, 1) for i in (5, 9, 2, 30, 11, 7, 100, 3)]),
    # Large weights (256 is HAProxy's maximum) and a weight-0 server (id 3): it must get no key.
    ("bigw", [(None, 10), (None, 256), (None, 0), (None, 1), (None, 100)]),
]

# (hash-type arguments after `consistent`, resolved function, avalanche).
# The bare `hash-type consistent` is sdbm + avalanche (src/cfgparse-listen.c); the generator
# checks that claim: its answers must equal those of `consistent sdbm avalanche`.
DEFAULT = ("", "sdbm", True)
VARIANTS = [
    ("sdbm", "sdbm", False),
    ("sdbm avalanche", "sdbm", True),
    ("djb2", "djb2", False),
    ("wt6", "wt6", False),
    ("crc32", "crc32", False),
    ("crc32 avalanche", "crc32", True),
]
# The explicit variants run on these cases with VARIANT_KEYS (to keep golden.tsv small) ...
VARIANT_CASES = ("ip8", "ip8w", "ids")
# ... and on every other case with SMALL_KEYS.


def case_ids(servers):
    return [sid if sid is not None else i + 1 for i, (sid, _) in enumerate(servers)]


def case_spec(servers):
    return ",".join(f"{sid}:{w}" for sid, (_, w) in zip(case_ids(servers), servers))


# ---------------------------------------------------------------------------------------------
# Keys. Exclusion rules (also written to golden.tsv's header):
# - no empty or whitespace-only value: HAProxy round-robins those (probed below);
# - no leading/trailing SP or HT: HAProxy trims them before hashing (see the first-value case);
# - no ',' in the main keys: hdr() hashes the first comma-separated element only;
# - no CR or LF (they end the header line). The other control bytes (NUL included) are accepted
#   by HAProxy's H1 parser in a value (probed below) and hashed like any byte: the keys have them
#   inside and at the edges (only SP/HT are trimmed).

EXCLUDED = [
    "empty and whitespace-only values (HAProxy falls back to round robin, see the probe below)",
    "leading/trailing SP/HT (trimmed by HAProxy before hashing)",
    "',' in the main keys (hdr() hashes the first comma-separated element; see the first-value case)",
    "CR and LF (they end the header line); every byte value but CR, LF and ',' appears in the keys",
]


def utf8_word(rng):
    pools = ["éèàüöñçß", "αβγδεζηθλμπσω", "жзийклмнпрст", "日本語中文字東京", "한국어", "😀🚀🎉🍕", "ﬁ٣ئ"]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randrange(1, 12)))


def invalid_utf8(rng):
    """Printable ASCII and bytes >= 0x80 (no ',', no edge space) that do not decode as UTF-8."""
    alphabet = [b for b in range(0x21, 0x7F) if b != 0x2C] + list(range(0x80, 0x100))
    while True:
        k = bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        if any(c >= 0x80 for c in k):
            try:
                k.decode("utf-8")
            except UnicodeDecodeError:
                return k


def keys():
    rng = random.Random(2604)
    ks = [b"a", b"0", b"user:1", b"\x80", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf5\x80\x80\x80",
          "é".encode(), "€".encode(), "😀".encode(), b"\xc3\xa9\xff", b"{user1}.following",
          b"{user1}.followers", b"{}", b"{}{a}", b"a{b}c{d}", b"\"quoted\"", b"a\tb", b"a b",
          b"/thumb/img-12.jpg?w=160&h=90"]
    ks += [f"user:{i}".encode() for i in range(200)]
    ks += [f"user:{rng.randrange(10**7)}".encode() for _ in range(1600)]
    for _ in range(1200):
        w, h = rng.choice([(96, 54), (160, 90), (320, 180), (640, 360), (1280, 720)])
        ks.append(f"/thumb/img-{rng.randrange(10000)}.jpg?w={w}&h={h}".encode())
    ks += [utf8_word(rng).encode() for _ in range(450)]
    ks += [invalid_utf8(rng) for _ in range(400)]
    ks += [f"{{user{rng.randrange(1000)}}}.{rng.choice(['following', 'followers', 'feed', 'cart'])}".encode()
           for _ in range(300)]
    words = ["hello", "world", "key", "value", "a", "thumb", "user", "日本", "x"]
    for _ in range(300):
        sep = rng.choice([" ", "  ", " ", "\t", " \t "])
        ks.append(sep.join(rng.choice(words) for _ in range(rng.randrange(2, 5))).encode())
    printable = [chr(c) for c in range(0x21, 0x7F) if c != 0x2C]
    for _ in range(400):
        s = "".join(rng.choice(printable + [" "]) for _ in range(rng.randrange(1, 40)))
        ks.append(s.strip(" ").encode() or b"z")
    # Control bytes (NUL, DEL, ...) inside and at the edges (not SP/HT: those are trimmed).
    controls = [c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)] + [0x7F]
    ks += [bytes([c]) for c in controls]
    for _ in range(150):
        body = [rng.choice(printable) for _ in range(rng.randrange(1, 20))]
        for _ in range(rng.randrange(1, 4)):
            body.insert(rng.randrange(len(body) + 1), chr(rng.choice(controls)))
        ks.append("".join(body).encode())
    # 1,000-byte keys: ASCII, random printable, UTF-8 and invalid UTF-8 content.
    for i in range(16):
        if i % 4 == 0:
            k = (b"%d-" % i) * 1000
        elif i % 4 == 1:
            k = "".join(rng.choice(printable) for _ in range(1000)).encode()
        elif i % 4 == 2:
            k = (utf8_word(rng) * 1000).encode()
        else:
            k = bytes(rng.choice(list(range(0x21, 0x2C)) + list(range(0x80, 0x100))) for _ in range(1000))
        ks.append(k[:1000])
    out, seen = [], set()
    for k in ks:
        k = k.strip(b" \t")  # whole-value edge whitespace would be trimmed: keep keys as hashed
        assert k and b"," not in k and b"\r" not in k and b"\n" not in k, k
        if k not in seen:
            seen.add(k)
            out.append(k)
    return out


def first_value_keys():
    """`pN, qN`-style values for the first-value case; keys column = the whole value sent."""
    rng = random.Random(7)
    ks = []
    for i in range(600):
        p = f"p{rng.randrange(10**6)}"
        q = f"q{rng.randrange(10**6)}"
        form = i % 10
        if form == 0:
            ks.append(f"{p}, {q}")
        elif form == 1:
            ks.append(f"{p},{q}")
        elif form == 2:
            ks.append(f"{p} ,{q}")
        elif form == 3:
            ks.append(f"{p}\t,\t{q}, r{i}")
        elif form == 4:
            ks.append(f"{p},,{q}")
        elif form == 5:
            ks.append(f"{p}, ")
        elif form == 6:
            ks.append(f"  {p}  ,  {q}")           # edge spaces: the whole value is trimmed too
        elif form == 7:
            ks.append(f"{p} x{i}, {q}")            # inner space kept in the first element
        elif form == 8:
            ks.append(f"\"{p},{q}\", r{i}")        # a comma inside double quotes does not split
        else:
            ks.append(f"\"{p}\\\",{q}\",r{i}")     # backslash-escaped quote inside quotes
    ks += ["user:1, user:2", "user:1,user:2", "\"a,b\"", "\"a\\\"b,c\", d", "a\"b,c\"d, e"]
    return [k.encode() for k in ks]


# ---------------------------------------------------------------------------------------------
# HAProxy process and HTTP client.

def free_ports(n):
    """n distinct free ports on 127.0.0.1 (bound together, then released for haproxy)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def config(server_port, case_list):
    """Text of the haproxy config; case_list is [(backend name, frontend port, hash args, servers)]."""
    out = ["global", "    maxconn 2000", "    nbthread 1", "",
           "defaults", "    mode http", "    timeout connect 2s", "    timeout client 60s",
           "    timeout server 60s", "    timeout http-request 60s", "    timeout http-keep-alive 60s", ""]
    for sid, port in sorted(server_port.items()):
        out += [f"frontend server{sid}", f"    bind 127.0.0.1:{port}",
                f"    http-request return status 200 content-type text/plain string \"{sid}\"", ""]
    for name, port, hash_args, servers in case_list:
        out += [f"frontend fe_{name}", f"    bind 127.0.0.1:{port}", f"    default_backend {name}", "",
                f"backend {name}", "    balance hdr(X-Key)",
                f"    hash-type consistent {hash_args}".rstrip(),
                "    http-response set-header X-Srv-Id %[srv_id]"]
        for i, (sid, w) in enumerate(servers):
            real = sid if sid is not None else i + 1
            ident = f" id {sid}" if sid is not None else ""
            out.append(f"    server s{i} 127.0.0.1:{server_port[real]}{ident} weight {w}")
        out.append("")
    return "\n".join(out)


class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body


class Client:
    """One HTTP/1.1 keep-alive connection; requests are pipelined in batches."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""

    def close(self):
        self.sock.close()

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed by haproxy")
        self.buf += data

    def _read(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode()] = v.strip().decode("latin-1")
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            self._fill()
        body, self.buf = self.buf[:n], self.buf[n:]
        return Response(status, headers, body)

    def get(self, values, batch=200):
        """GET / with `X-Key: v` for each v (None: no X-Key header); the responses in order."""
        out = []
        for i in range(0, len(values), batch):
            req = b""
            for v in values[i:i + batch]:
                hdr = b"" if v is None else b"X-Key: " + v + b"\r\n"
                req += b"GET / HTTP/1.1\r\nHost: keyroute\r\n" + hdr + b"\r\n"
            self.sock.sendall(req)
            out += [self._read() for _ in values[i:i + batch]]
        return out


def answered_id(r):
    """The server id of a 200 response; the body must agree with HAProxy's own srv_id."""
    if r.status != 200:
        raise RuntimeError(f"status {r.status}")
    body = int(r.body)
    if int(r.headers["x-srv-id"]) != body:
        raise RuntimeError(f"body {body} but srv_id {r.headers['x-srv-id']}")
    return body


def probe_one(port, value):
    """Status of a single request carrying `X-Key: value`, on a fresh connection."""
    c = Client(port)
    try:
        return c.get([value])[0].status
    except ConnectionError:
        return "closed"
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------

def byte_ranges(bs):
    """[0, 1, 2, 5] -> '0x00-0x02 0x05'."""
    out, i = [], 0
    while i < len(bs):
        j = i
        while j + 1 < len(bs) and bs[j + 1] == bs[j] + 1:
            j += 1
        out.append(f"0x{bs[i]:02x}" if i == j else f"0x{bs[i]:02x}-0x{bs[j]:02x}")
        i = j + 1
    return " ".join(out)


def run_program(args):
    return subprocess.run(args, capture_output=True, text=True).stdout.strip()


def main():
    if not os.path.exists(HAPROXY):
        sys.exit("haproxy not found (apt-get install haproxy)")
    version = run_program([HAPROXY, "-v"]).splitlines()[0]
    deb = run_program(["dpkg-query", "-W", "-f", "${Package} ${Version} ${Architecture}", "haproxy"])

    main_keys = keys()
    variant_keys = [k for i, k in enumerate(main_keys) if i % 5 in (0, 2)]
    small_keys = [k for i, k in enumerate(main_keys) if i % 25 == 0]
    fv_keys = first_value_keys()

    # Every run: (label, backend name, hash args, function, avalanche, servers, keys, first-value?)
    runs = []
    for name, servers in CASES:
        runs.append((name, "default", DEFAULT, servers, main_keys, False))
    for name, servers in CASES:
        for v in VARIANTS:
            runs.append((name, v[0].replace(" ", "_"), v, servers,
                         variant_keys if name in VARIANT_CASES else small_keys, False))
    ip8 = dict(CASES)["ip8"]
    runs.append(("ip8", "firstvalue", DEFAULT, ip8, fv_keys, True))
    # The same ip8 backend once more, for the probes (it is never written to golden.tsv).
    runs.append(("ip8", "probe", DEFAULT, ip8, [], False))

    ids = sorted({i for _, s in CASES for i in case_ids(s)})
    ports = free_ports(len(ids) + len(runs))
    server_port = dict(zip(ids, ports))
    case_list = []
    for n, (name, tag, v, servers, _, _) in enumerate(runs):
        case_list.append((f"{name}_{tag}", ports[len(ids) + n], v[0], servers))

    work = tempfile.mkdtemp(prefix="keyroute-haproxy-")
    proc = None
    try:
        cfg = os.path.join(work, "haproxy.cfg")
        with open(cfg, "w") as f:
            f.write(config(server_port, case_list))
        subprocess.run([HAPROXY, "-c", "-q", "-f", cfg], check=True)
        proc = subprocess.Popen([HAPROXY, "-db", "-f", cfg], cwd=work,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _, port, _, _ in case_list:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if proc.poll() is not None:
                        raise RuntimeError("haproxy exited")
                    time.sleep(0.05)
            else:
                raise RuntimeError(f"haproxy does not listen on {port}")

        # Probes on the ip8 probe backend.
        probe_port = case_list[-1][1]
        notes = []
        c = Client(probe_port)
        for label, value in [("empty value", b""), ("whitespace-only value", b"   "), ("no X-Key header", None)]:
            got = [answered_id(r) for r in c.get([value] * 16)]
            notes.append(f"probe: {label}, sent 16 times on one connection: {len(set(got))} distinct servers "
                         f"answered ({' '.join(map(str, got))})")
        edge = c.get([b"abc", b"  abc", b"abc \t", b"\tabc  "])
        ids_edge = [answered_id(r) for r in edge]
        notes.append(f"probe: 'abc' with leading/trailing SP/HT lands on the server of 'abc': "
                     f"{'yes' if len(set(ids_edge)) == 1 else 'NO'} ({' '.join(map(str, ids_edge))})")
        c.close()
        # Which bytes HAProxy accepts inside a header value (`a<byte>z`, one request each).
        verdict = {}
        for b in range(256):
            if b not in (0x0A, 0x0D):
                st = probe_one(probe_port, b"a" + bytes([b]) + b"z")
                verdict.setdefault("accepted (200)" if st == 200 else f"rejected ({st})", []).append(b)
        for v, bs in sorted(verdict.items()):
            notes.append(f"probe: bytes inside a value (`a<byte>z`), {v}: {byte_ranges(bs)}")

        results = []
        for (name, tag, v, servers, ks, fv), (_, port, _, _) in zip(runs, case_list):
            if not ks:
                continue
            t0 = time.time()
            c = Client(port)
            got = [answered_id(r) for r in c.get(ks)]
            c.close()
            results.append((name, tag, v, servers, ks, fv, got))
            print(f"{name} {tag}: {len(ks)} keys in {time.time() - t0:.1f}s", file=sys.stderr)

        # Checks: the weight-0 server never answers; the bare `hash-type consistent` answers as
        # `consistent sdbm avalanche` wherever both ran on the same keys.
        by = {(r[0], r[1]): r for r in results}
        for name, tag, v, servers, ks, fv, got in results:
            zero = {sid for sid, (_, w) in zip(case_ids(servers), servers) if w == 0}
            if zero & set(got):
                raise RuntimeError(f"{name} {tag}: a weight-0 server answered")
        for name, _ in CASES:
            d, s = by[(name, "default")], by[(name, "sdbm_avalanche")]
            pos = {k: sid for k, sid in zip(d[4], d[6])}
            if any(pos[k] != sid for k, sid in zip(s[4], s[6])):
                raise RuntimeError(f"{name}: bare consistent differs from sdbm avalanche")
        notes.append("check: bare `hash-type consistent` answered exactly as `hash-type consistent sdbm "
                     "avalanche` on every case (all keys of the variant run)")
        notes.append("check: the weight-0 server (bigw, id 3) answered no key")
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)

    with open(os.path.join(HERE, "golden.tsv"), "w") as out:
        out.write(f"# {version} (Debian package {deb}); generated by generate.py\n")
        out.write("# balance hdr(X-Key); hash-type consistent [FUNCTION [avalanche]]; servers `server sN ADDR "
                  "[id ID] weight W`, no checks; mode http\n")
        out.write("# format: `case FUNCTION AVALANCHE ID:WEIGHT,...` then `hex(X-Key value sent) TAB id of the "
                  "server that answered`\n")
        out.write(f"# keys: {len(main_keys)} for the bare `hash-type consistent` cases, {len(variant_keys)} "
                  f"(a subset) for the explicit functions on {', '.join(VARIANT_CASES)}, {len(small_keys)} on the "
                  f"other cases; {len(fv_keys)} values in the first-value case\n")
        for e in EXCLUDED:
            out.write(f"# excluded: {e}\n")
        out.write("# first-value case: HAProxy hashes the first comma-separated element of the value: leading "
                  "SP/HT skipped, ends at the first ',' outside a double-quoted string (backslash escapes one "
                  "char inside quotes), trailing SP/HT dropped\n")
        for n in notes:
            out.write(f"# {n}\n")
        for name, tag, v, servers, ks, fv, got in results:
            if tag == "default":
                out.write("# next case: hash-type consistent (no function keyword)\n")
            if fv:
                out.write("# next case: hash-type consistent (no function keyword); keys are whole header values\n")
            prefix = "case first-value" if fv else "case"
            out.write(f"{prefix} {v[1]} {'avalanche' if v[2] else 'plain'} {case_spec(servers)}\n")
            for k, sid in zip(ks, got):
                out.write(f"{k.hex()}\t{sid}\n")


if __name__ == "__main__":
    main()
