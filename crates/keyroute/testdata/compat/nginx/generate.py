#!/usr/bin/env python3
"""Golden vectors for keyroute::compat::nginx, from the real nginx (`hash $http_x_key consistent;`).

    python3 crates/keyroute/testdata/compat/nginx/generate.py     # needs Debian's nginx; run as root

Writes golden.tsv beside this script:
    # comment lines (versions, the key rules, the probes' results)
    case TEXT=W TEXT=W ...       one line per upstream, its `server` lines in directive order
    hex(key) TAB TEXT            every key, and the TEXT of the server nginx sent it to

How: one nginx (no daemon, no master process, everything in a temporary directory, stopped by its
pid) runs one "backend" server per peer address, answering `<its address> <the X-Key it got>`, and
per case an upstream with `hash $http_x_key consistent;` and a front server proxying to it with
`proxy_next_upstream off` (a failed peer shows as an error instead of a silent retry). Every key
is sent as an `X-Key` header to every front over keep-alive HTTP/1.1, and the answering address is
mapped back to the case's server TEXT. The backend's echo of the key proves nginx hashed exactly
the bytes sent. Ports are random and free, so the TEXTs change from run to run.

Afterwards model.py's spec is checked against the new file (it should misplace no key).
"""
import bisect
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model  # noqa: E402

NGINX = os.environ.get("NGINX", "/usr/sbin/nginx")
OUT = os.path.join(HERE, "golden.tsv")

# A key must survive being an HTTP header value. The probes below check these rules on the real
# nginx, and the generator stops if nginx behaves otherwise.
RULES = [
    "no NUL, CR or LF byte (nginx rejects NUL and a lone CR with 400; an LF ends the header line)",
    "no leading or trailing space 0x20 (nginx trims spaces around a header value; it keeps tabs,"
    " so keys with leading or trailing tabs are included)",
    "not empty (nginx places an empty key by round robin, not by hash: see the probe below)",
]


def transport_ok(key):
    return (key != b"" and not any(b in key for b in b"\0\r\n")
            and key[:1] != b" " and key[-1:] != b" ")


def keys():
    """About 5,000 deterministic keys; the header-transport rules drop a few random ones."""
    rng = random.Random(22)
    ks = [b"a", b"0", b"user:1", b"somekey", "é".encode(), "héllo".encode(), "日本語".encode(),
          "🎉".encode(), "ключ:42".encode(), "a😀b".encode(), "\u00ff".encode(), "\ufeffbom".encode(),
          b"{user1}.following", b"{user1}.followers", b"{}", b"{", b"}", b"{{a}}", b"foo{}{bar}",
          b"a b", b"a\tb", b"a  \t  b", b"\t", b"\t\t", b"\ta", b"a\t", b"\t a \t", b"\x0bv\x0c", b"a,b", b",", b",,", b"a, b", b"\x7f", b"a\x01b", b"\x1b[0m",
          b"\xc3", b"\xc3(", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xff\xfe", b"\xfe\xff"]
    ks += [bytes([b]) for b in range(0x21, 0x7f)]           # every printable ASCII byte
    ks += [bytes([b]) for b in range(0x80, 0x100)]          # every lone high byte (invalid UTF-8)
    ks += [b"x" * n for n in (2, 3, 255, 256)]
    ks += [f"user:{rng.randrange(10**7)}".encode() for _ in range(1500)]
    for _ in range(1300):
        w = rng.choice([64, 96, 160, 320, 640])
        ks.append(f"/thumb/img-{rng.randrange(1000)}.{rng.choice(['jpg', 'png', 'webp'])}"
                  f"?w={w}&h={w * 9 // 16}".encode())
    pool = "aé日本語ñßø€中文한국어😀🎉𝄞 ,{}:/-_.0123456789"
    for _ in range(400):                                    # valid UTF-8, mostly non-ASCII
        ks.append("".join(rng.choice(pool) for _ in range(rng.randrange(1, 16))).encode())
    for i in range(400):                                    # Redis-style hash tags
        tag = rng.choice([f"user{rng.randrange(100)}", "", "a}b", "{x"])
        ks.append(f"{{{tag}}}.{rng.choice(['following', 'followers', 'cart'])}:{i}".encode())
    for i in range(300):                                    # inner spaces and tabs
        sep = rng.choice([" ", "\t", "  ", " \t "])
        ks.append(f"hello{sep}world{sep}{i}".encode())
    for i in range(300):                                    # commas (nginx joins repeated headers with ", ")
        ks.append(f"a,b{rng.choice([',', ', ', ',,'])}{i}".encode())
    binary = 0
    while binary < 1000:                                    # random bytes, filtered by the rules
        k = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        if transport_ok(k):
            ks.append(k)
            binary += 1
    for n, count in ((1000, 6), (4000, 2)):                 # long keys, printable and UTF-8
        for _ in range(count):
            k = b""
            while len(k) < n:
                c = rng.choice("abcdefghij0123456789:/é日").encode()
                k += c if len(k) + len(c) <= n else b"a"
            ks.append(k)
    out, seen = [], set()
    for k in ks:
        if transport_ok(k) and k not in seen:
            seen.add(k)
            out.append(k)
    return out


def port_free(port, ip="127.0.0.1"):
    """Whether nginx could listen on ip:port (it sets SO_REUSEADDR too, so TIME_WAIT is no obstacle)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((ip, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_ports(count, avoid):
    """A random base port such that base .. base+count-1 are free on 127.0.0.1 and not in avoid."""
    rng = random.Random()
    while True:
        base = rng.randrange(20000, 60000 - count)
        if all(p not in avoid and port_free(p) for p in range(base, base + count)):
            return base


def tie_pair():
    """Two free ports P < Q such that 127.0.0.1:P and 127.0.0.1:Q (weight 1) share a point value.

    nginx keeps one point per value, so a tie decides which server owns that arc of the ring: the
    tie case lists Q before P, so directive order and text order disagree. Deterministic: of the
    tied pairs of free ports in 30000..39999, the one whose tied point owns the longest arc (so
    that many keys land on it). Returns (P, Q, value).
    """
    owner, pairs = {}, []
    for port in range(30000, 40000):
        prev, base = 0, zlib.crc32(b"127.0.0.1\0%d" % port)
        for _ in range(160):
            prev = zlib.crc32(prev.to_bytes(4, "little"), base)
            other = owner.setdefault(prev, port)
            if other != port:
                pairs.append((other, port, prev))
    best = None
    for p, q, value in pairs:
        values, _ = model.continuum([(b"127.0.0.1:%d" % q, 1), (b"127.0.0.1:%d" % p, 1)])
        at = values.index(value)
        arc = (value - values[at - 1]) % 2**32  # the keys in (previous point, value] go to value
        if (best is None or arc > best[0]) and port_free(p) and port_free(q):
            best = (arc, p, q, value)
    if best is None:
        raise RuntimeError("no free tied pair of ports")
    return best[1:]


def cases(base, tie):
    """[(name, [(TEXT, weight, (ip, port) it listens on)])]."""
    ip = lambda n, weights=None: [(f"127.0.0.1:{base + i}", weights[i] if weights else 1,
                                   ("127.0.0.1", base + i)) for i in range(n)]
    out = [(f"ip{n}", ip(n)) for n in (3, 7, 8, 25, 31)]
    out.append(("ip8w", ip(8, [1, 2, 3, 1, 1, 2, 3, 5])))
    out.append(("ip31w", ip(31, [i % 5 + 1 for i in range(31)])))
    out.append(("noport", [(f"127.0.0.{i + 2}", w, (f"127.0.0.{i + 2}", 80))
                           for i, w in enumerate([1, 1, 2, 1, 3])]))
    # localhost:PORT (hashed as the text "localhost" + port) mixed with 127.0.0.1:PORT peers.
    mixed = [("localhost", 1), ("127.0.0.1", 2), ("localhost", 1), ("127.0.0.1", 1), ("localhost", 3),
             ("127.0.0.1", 1)]
    out.append(("mixed", [(f"{h}:{base + i}", w, ("127.0.0.1", base + i)) for i, (h, w) in enumerate(mixed)]))
    # Two servers sharing a point value, the higher port first (see tie_pair()).
    out.append(("tie", [(f"127.0.0.1:{p}", 1, ("127.0.0.1", p)) for p in (tie[1], tie[0])]))
    return out


def localhost_ok():
    """The mixed case needs `localhost` to resolve to 127.0.0.1 only (else nginx makes 2 peers)."""
    addrs = {a[4][0] for a in socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)}
    return addrs == {"127.0.0.1"}


def config(work, cs, fronts):
    listens = sorted({addr for _, peers in cs for _, _, addr in peers})
    c = [f"daemon off;\nmaster_process off;\npid {work}/nginx.pid;\nerror_log {work}/error.log warn;",
         "events { worker_connections 1024; }",
         "http {",
         "  access_log off;",
         f"  client_body_temp_path {work}/body; proxy_temp_path {work}/proxy;",
         f"  fastcgi_temp_path {work}/fcgi; uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;",
         "  keepalive_requests 1000000; large_client_header_buffers 4 16k; default_type text/plain;"]
    for ip, port in listens:
        c.append(f'  server {{ listen {ip}:{port}; location / {{ return 200 "$server_addr:$server_port $http_x_key"; }} }}')
    # Upstream keepalive only reuses connections to the peer the hash chose (it changes no
    # placement); without it ~50,000 proxied requests would run out of ephemeral ports.
    for (name, peers), port in zip(cs, fronts):
        c.append(f"  upstream {name} {{\n    hash $http_x_key consistent;")
        c += [f"    server {text} weight={w};" for text, w, _ in peers]
        c.append("    keepalive 8;\n  }")
        c.append(f"  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://{name}; "
                 "proxy_next_upstream off; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }")
    c.append("}")
    return "\n".join(c) + "\n"


class Client:
    """Keep-alive HTTP/1.1 over a raw socket, requests pipelined in batches."""

    def __init__(self, port):
        self.port = port
        self.sock, self.buf = None, b""

    def close(self):
        if self.sock:
            self.sock.close()
        self.sock, self.buf = None, b""

    def _read(self):
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("connection closed")
        self.buf += data

    def _response(self):
        while b"\r\n\r\n" not in self.buf:
            self._read()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
        if not m:
            raise RuntimeError(f"no Content-Length in {head!r}")
        n = int(m.group(1))
        while len(self.buf) < n:
            self._read()
        body, self.buf = self.buf[:n], self.buf[n:]
        if re.search(rb"\r\nconnection: *close", head, re.I):
            self.close()
        return status, body

    def batch(self, key_values):
        """[(status, body)] for `X-Key: value` requests, or None for a request without the header."""
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        req = b"".join(b"GET / HTTP/1.1\r\nHost: keyroute\r\n" +
                       (b"" if v is None else b"X-Key: " + v + b"\r\n") + b"\r\n" for v in key_values)
        self.sock.sendall(req)
        return [self._response() for _ in key_values]

    def one(self, raw_value):
        """(status, body) on a fresh connection, so a 400 cannot lose other requests."""
        self.close()
        try:
            return self.batch([raw_value])[0]
        finally:
            self.close()


def answer(status, body):
    """(backend address, key the backend saw) from a 200 answer."""
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
    addr, seen = body.split(b" ", 1)
    ip, port = addr.decode().rsplit(":", 1)
    return (ip, int(port)), seen


def probes(client):
    """Check the header-transport rules on the real nginx; comment lines for the header."""
    lines = []
    odd = []
    for b in range(256):  # every byte inside a value: echoed as sent, except NUL, CR, LF
        status, body = client.one(b"a" + bytes([b]) + b"z")
        ok = status == 200 and answer(status, body)[1] == b"a" + bytes([b]) + b"z"
        if ok != (b not in b"\0\r\n"):
            sys.exit(f"nginx treats byte {b:#04x} in a header value unexpectedly: HTTP {status} {body[:80]!r}")
        if not ok:
            odd.append(f"{b:#04x}: HTTP {status}" + (f" echo {answer(status, body)[1]!r}" if status == 200 else ""))
    lines.append("probe: 'a' BYTE 'z' for all 256 bytes: echoed unchanged except " + "; ".join(odd))
    trims = []  # spaces around a value are trimmed, tabs are not
    for v, want in ((b" a", b"a"), (b"a ", b"a"), (b"  a  ", b"a"), (b"\ta", b"\ta"), (b"a\t", b"a\t"),
                    (b" \t a \t ", b"\t a \t")):
        status, body = client.one(v)
        seen = answer(status, body)[1]
        if seen != want:
            sys.exit(f"nginx made {v!r} into {seen!r}, not {want!r}")
        trims.append(f"{v!r} -> {seen!r}")
    lines.append(f"probe: value trimming: {', '.join(trims)}")
    return lines


def tie_note(peers, value, ks, got):
    """A header line: which server nginx gave the keys that land on the tied point."""
    values, _ = model.continuum([(t.encode(), w) for t, w, _ in peers])
    at = values.index(value)
    on = [k for k in ks if bisect.bisect_left(values, zlib.crc32(k)) % len(values) == at]
    owners = sorted({got[k] for k in on})
    return (f"tie: {peers[0][0]} (listed first) and {peers[1][0]} both have point {value}; nginx gave "
            f"all {len(on)} keys that land on it to {', '.join(owners)}")


def main():
    if not os.path.exists(NGINX):
        sys.exit(f"{NGINX} not found (apt-get install nginx)")
    version = subprocess.run([NGINX, "-v"], capture_output=True, text=True).stderr.strip()
    version = version.replace("nginx version: nginx/", "nginx ")
    # The Debian package that holds the binary (nginx in bookworm, nginx-core before it).
    owner = subprocess.run(["dpkg-query", "-S", os.path.realpath(NGINX)], capture_output=True, text=True)
    name = owner.stdout.split(":", 1)[0].strip() if owner.returncode == 0 else ""
    ver = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", name], capture_output=True,
                         text=True).stdout.strip() if name else ""
    pkg = f"Debian {ver}, package {name}" if ver else "not from a Debian package"
    if not localhost_ok():
        sys.exit("localhost does not resolve to 127.0.0.1 only: the mixed case would get two peers per text")

    ks = keys()
    tie = tie_pair()
    cs = cases(0, tie)
    base = free_ports(31 + len(cs), set(tie[:2]))
    cs = cases(base, tie)
    fronts = [base + 31 + i for i in range(len(cs))]
    for i in range(2, 7):  # the noport peers
        if not port_free(80, f"127.0.0.{i}"):
            sys.exit(f"127.0.0.{i}:80 is taken (or this is not root)")

    work = tempfile.mkdtemp(prefix="keyroute-nginx-")
    proc = None
    try:
        for d in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
            os.mkdir(os.path.join(work, d))
        conf = os.path.join(work, "nginx.conf")
        with open(conf, "w") as f:
            f.write(config(work, cs, fronts))
        subprocess.run([NGINX, "-t", "-q", "-p", work, "-e", f"{work}/error.log", "-c", conf], check=True)
        proc = subprocess.Popen([NGINX, "-p", work, "-e", f"{work}/error.log", "-c", conf],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in fronts:
            for _ in range(200):
                if proc.poll() is not None:
                    raise RuntimeError("nginx exited: " + open(f"{work}/error.log").read()[-2000:])
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                raise RuntimeError(f"nginx does not listen on {port}")

        ip8 = Client(fronts[[n for n, _ in cs].index("ip8")])
        header = probes(ip8)
        empty = ip8.batch([b""] * 16)
        empty_addrs = [answer(*r)[0] for r in empty]
        header.append(f"probe: the empty key sent 16 times to case ip8 was answered by "
                      f"{len(set(empty_addrs))} distinct backends (round robin, not hashed)")
        absent = [answer(*r)[0] for r in ip8.batch([None] * 16)]
        header.append(f"probe: no X-Key header, 16 times to case ip8: {len(set(absent))} distinct backends")
        ip8.close()

        sections = []
        for (name, peers), port in zip(cs, fronts):
            by_addr = {addr: text for text, _, addr in peers}
            client, rows, got = Client(port), [], {}
            for i in range(0, len(ks), 100):
                chunk = ks[i:i + 100]
                for key, r in zip(chunk, client.batch(chunk)):
                    addr, seen = answer(*r)
                    if seen != key:
                        raise RuntimeError(f"{name}: sent {key!r}, the backend saw {seen!r}")
                    rows.append(f"{key.hex()}\t{by_addr[addr]}\n")
                    got[key] = by_addr[addr]
            client.close()
            sections.append("case " + " ".join(f"{t}={w}" for t, w, _ in peers) + "\n" + "".join(rows))
            print(f"{name}: {len(rows)} keys")
            if name == "tie":
                header.append(tie_note(peers, tie[2], ks, got))
        errors = open(f"{work}/error.log").read()
        if "[error]" in errors or "[crit]" in errors or "[alert]" in errors:
            raise RuntimeError("nginx logged errors:\n" + errors[-2000:])
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)

    with open(OUT, "w", encoding="ascii") as f:
        f.write(f"# {version} ({pkg}) hash $http_x_key consistent; generated by generate.py\n")
        f.write(f"# {len(cs)} cases ({', '.join(n for n, _ in cs)}), each followed by the same "
                f"{len(ks)} keys as hex(key) TAB server text; the ports are random free ones\n")
        f.write("# key rules forced by the X-Key header transport: " + "; ".join(RULES) + "\n")
        f.writelines(f"# {line}\n" for line in header)
        f.writelines(sections)
    print(f"wrote {OUT}: {len(cs)} cases x {len(ks)} keys")
    return model.check(OUT)


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
