#!/usr/bin/env python3
"""Golden vectors for twemproxy's (nutcracker's) ketama placement, from the real program.

    apt-get install nutcracker memcached          # Debian; the services need not run
    python3 crates/keyroute/testdata/compat/twemproxy/generate.py

In a temporary directory this starts memcached instances on loopback addresses (127.0.0.1 on free
ports from 21001 up, and 127.0.0.2-4 on port 11211) and one nutcracker with one pool per case
(`hash: md5`, `distribution: ketama`). For every case it `set`s every key through that pool, with a
value unique to the case and the key, then asks every memcached of the pool directly which one holds
it. Every process it starts is stopped by its pid at the end, also on error.

Writes golden.tsv beside this script:

    # comments
    case [hash_tag=XY ][eject=LINE ]LINE,LINE,...
    hex(key) TAB LINE

where LINE is a server line exactly as in the pool's YAML (`host:port:weight` or
`host:port:weight name`). `eject=LINE` marks the pool with `auto_eject_hosts: true` whose server
LINE was killed and ejected by nutcracker before the keys were placed. model.py beside this script
checks a model of the continuum against the file.
"""
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20240611
BATCH = 256  # commands pipelined per round trip


# ---------------------------------------------------------------------------------------------
# Keys


def valid_key(k):
    """memcached's text protocol: 1..250 bytes, no space, no control byte (<= 0x20) and no DEL."""
    return 1 <= len(k) <= 250 and all(b > 0x20 and b != 0x7F for b in k)


def candidate_keys():
    rng = random.Random(SEED)
    printable = bytes(range(0x21, 0x7F))
    high = bytes(range(0x80, 0x100))
    alphabet = printable + high  # every byte memcached accepts in a key
    ks = [
        # plain, UTF-8 and invalid-UTF-8 edge cases
        b"a", b"0", b"~", b"user:1", b"somekey", "héllo".encode(), "日本語".encode(), "ключ".encode(),
        "🔑:emoji".encode(), b"\x80", b"\xff", b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"caf\xe9",
        b"x" * 250, b"\xff" * 250, "é".encode() * 125,
        # hash-tag edge cases (only the `hashtag` case gives them a meaning)
        b"{user1}.following", b"{user1}.followers", b"a{b}c", b"{b}", b"b", b"{}x", b"x{}", b"{}",
        b"x{", b"x}", b"{", b"}", b"{a", b"a}", b"}{a}", b"}a{", b"{}{a}", b"{a}{b}", b"a{b}c{d}",
        b"{{a}}", b"{{}", b"{}}", b"{{}}", b"abc{tag}", b"tag", b"{tag}abc", b"x{y}", b"y", b"{x}{",
        b"pre{}post", b"pre{post", b"pre}post", b"{\xff\xfe}", "日本{語}".encode(), "語".encode(),
        b"{" + b"t" * 248 + b"}", b"{" * 250, b"}" * 250, b"{}" * 125,
        # candidates memcached refuses: they show the exclusion rule at work
        b"", b"with space", b"tab\tkey", b"nul\x00", b"del\x7f", b"cr\rlf\n", b"k" * 251,
    ]
    for _ in range(1900):
        ks.append(f"user:{rng.randrange(10**6)}".encode())
    for _ in range(700):
        ks.append(f"/thumb/img-{rng.randrange(1000)}.jpg?w={rng.choice([96, 160, 320])}".encode())
    utf8_ranges = [(0xA1, 0x17F), (0x391, 0x3C9), (0x410, 0x44F), (0x4E00, 0x4FFF), (0x1F600, 0x1F64F)]
    for _ in range(500):
        n = rng.randrange(1, 8)
        s = "".join(chr(rng.randrange(*rng.choice(utf8_ranges))) for _ in range(n))
        ks.append((rng.choice(["", "k:", "名前/"]) + s).encode())
    for _ in range(600):  # arbitrary bytes: mostly invalid UTF-8
        ks.append(bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 16))))
    for _ in range(300):  # bytes >= 0x80 only: no ASCII, mostly invalid UTF-8
        ks.append(bytes(rng.choice(high) for _ in range(rng.randrange(1, 10))))
    for _ in range(40):  # long keys, up to memcached's 250 bytes
        ks.append(bytes(rng.choice(alphabet) for _ in range(rng.randrange(100, 251))))
    # hash-tag keys: the same tags in several keys, empty tags, tags at the ends, unclosed tags
    for _ in range(500):
        ks.append(f"{{user{rng.randrange(200)}}}.{rng.choice(['following', 'followers', 'cart'])}".encode())
    for _ in range(500):
        tag = "".join(rng.choice("abcdefgh0123") for _ in range(rng.randrange(0, 4)))
        pre = "".join(rng.choice("xyz{}") for _ in range(rng.randrange(0, 3)))
        post = "".join(rng.choice("xyz{}") for _ in range(rng.randrange(0, 4)))
        shape = rng.randrange(4)
        if shape == 0:
            ks.append(f"{pre}{{{tag}}}{post}".encode())  # one tag, possibly empty
        elif shape == 1:
            ks.append(f"{pre}{{{tag}".encode())  # no closing brace
        elif shape == 2:
            ks.append(f"{pre}}}{tag}{{{post}".encode())  # closing brace first
        else:
            ks.append(f"{pre}{{{tag}}}{{{post}}}".encode())  # two tags
    for _ in range(200):  # bytes around braces, the tag holding arbitrary bytes
        inner = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 6)))
        ks.append(bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 4))) + b"{" + inner + b"}" +
                  bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 4))))
    return ks


def keys():
    """The deduplicated valid keys in order, and how many candidates memcached's rule excluded."""
    seen, out, excluded = set(), [], 0
    for k in candidate_keys():
        if not valid_key(k):
            excluded += 1
        elif k not in seen:
            seen.add(k)
            out.append(k)
    return out, excluded


# ---------------------------------------------------------------------------------------------
# Processes and connections

used_ports = set()


def port_free(host, port):
    """Whether a server can listen on host:port. SO_REUSEADDR as memcached and nutcracker set it:
    connections of an earlier run in TIME_WAIT do not hold the port then, a listener does."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def next_port(host="127.0.0.1"):
    """The lowest port from 21001 up that is free on `host` and not given out yet: the same ports on
    every run where they are free, so a regeneration gives the same file."""
    p = 21001
    while p in used_ports or p == 11211 or not port_free(host, p):
        p += 1
    used_ports.add(p)
    return p


def wait_listening(host, port, proc, what):
    for _ in range(200):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.025)
    raise RuntimeError(f"{what} does not listen on {host}:{port}")


procs = []  # every process started, stopped by pid in main's finally


def start(argv, **kw):
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)
    procs.append(p)
    return p


class Memcached:
    def __init__(self, host, port=None):
        self.host = host
        self.port = port or next_port(host)
        if self.port == 11211 and not port_free(host, 11211):
            raise RuntimeError(f"{host}:11211 is in use: stop whatever listens on port 11211")
        argv = ["memcached", "-l", host, "-p", str(self.port), "-U", "0", "-m", "16"]
        if os.geteuid() == 0:
            argv += ["-u", "root"]  # memcached refuses to run as root without -u
        self.proc = start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(host, self.port, self.proc, f"memcached {host}:{self.port}")
        self.conn = Conn(host, self.port)


class Conn:
    """A memcached text-protocol connection with a read buffer."""

    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.buf = bytearray()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("connection closed")
        self.buf += chunk

    def line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                out = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return out
            self._fill()

    def exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def get_reply(self):
        """The value of one `get KEY` answer, or None."""
        line = self.line()
        if line == b"END":
            return None
        if not line.startswith(b"VALUE "):
            raise RuntimeError(f"unexpected answer to get: {line!r}")
        data = self.exact(int(line.split(b" ")[-1]) + 2)[:-2]
        if self.line() != b"END":
            raise RuntimeError("no END after VALUE")
        return data


def batches(seq):
    for i in range(0, len(seq), BATCH):
        yield seq[i: i + BATCH]


def set_all(conn, items):
    """`set` every (key, value) through `conn`, pipelined; each must be STORED."""
    for chunk in batches(items):
        conn.send(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (k, len(v), v) for k, v in chunk))
        for k, _ in chunk:
            r = conn.line()
            if r != b"STORED":
                raise RuntimeError(f"set {k!r}: {r!r}")


def get_all(conn, ks):
    """`get` every key on `conn`, pipelined: the values, None where missing."""
    out = []
    for chunk in batches(ks):
        conn.send(b"".join(b"get %s\r\n" % k for k in chunk))
        out += [conn.get_reply() for _ in chunk]
    return out


# ---------------------------------------------------------------------------------------------
# Cases


class Case:
    def __init__(self, name, servers, hash_tag=None, eject=False):
        self.name = name
        self.servers = servers  # [(Memcached, weight, name or None)]
        self.hash_tag = hash_tag
        self.eject = eject  # auto_eject_hosts: true, and one server is killed before placing
        self.listen = next_port()
        self.dead = None  # index of the killed server (eject case)

    def line(self, i):
        m, w, name = self.servers[i]
        return f"{m.host}:{m.port}:{w}" + (f" {name}" if name else "")

    def yaml(self):
        out = [f"{self.name}:", f"  listen: 127.0.0.1:{self.listen}", "  hash: md5",
               "  distribution: ketama", "  timeout: 2000"]
        if self.hash_tag:
            out.append(f'  hash_tag: "{self.hash_tag}"')
        if self.eject:
            out += ["  auto_eject_hosts: true", "  server_failure_limit: 1", "  server_retry_timeout: 600000"]
        else:
            out.append("  auto_eject_hosts: false")
        out.append("  servers:")
        out += [f"   - {self.line(i)}" for i in range(len(self.servers))]
        return "\n".join(out) + "\n"

    def header(self):
        tokens = ["case"]
        if self.hash_tag:
            tokens.append(f"hash_tag={self.hash_tag}")
        if self.dead is not None:
            tokens.append(f"eject={self.line(self.dead)}")
        tokens.append(",".join(self.line(i) for i in range(len(self.servers))))
        return " ".join(tokens)


def make_cases(ip):
    """`ip` are the memcached instances on 127.0.0.1 (at least 31)."""
    w8 = [1, 2, 3, 1, 1, 2, 3, 5]
    names = [f"cache-{c}" for c in "abcdefgh"]
    cs = [Case(f"ip{n}", [(m, 1, None) for m in ip[:n]]) for n in (3, 7, 8, 25, 31)]
    cs.append(Case("ip8w", [(m, w, None) for m, w in zip(ip, w8)]))
    cs.append(Case("ip31w", [(m, 1 + i % 5, None) for i, m in enumerate(ip[:31])]))
    cs.append(Case("ip11211", [(Memcached(f"127.0.0.{2 + i}", 11211), 1, None) for i in range(3)]))
    cs.append(Case("names8", [(m, 1, n) for m, n in zip(ip, names)]))
    cs.append(Case("names8w", [(m, w, n) for m, w, n in zip(ip, w8, names)]))
    cs.append(Case("hashtag", [(m, 1, None) for m in ip[:8]], hash_tag="{}"))
    return cs


def place(case, ks, nc):
    """Sets every key through the case's pool; returns each key's server line."""
    live = [i for i in range(len(case.servers)) if i != case.dead]
    for i in live:  # start from empty backends: the values of earlier cases are gone
        c = case.servers[i][0].conn
        c.send(b"flush_all\r\n")
        if c.line() != b"OK":
            raise RuntimeError("flush_all failed")
    values = [b"%s:%d" % (case.name.encode(), j) for j in range(len(ks))]
    set_all(nc, list(zip(ks, values)))
    found = [[] for _ in ks]
    for i in live:
        for j, v in enumerate(get_all(case.servers[i][0].conn, ks)):
            if v == values[j]:
                found[j].append(i)
            elif v is not None:
                raise RuntimeError(f"{case.name}: {ks[j]!r} holds a stale value {v!r}")
    out = []
    for k, f in zip(ks, found):
        if len(f) != 1:
            raise RuntimeError(f"{case.name}: {k!r} held by {len(f)} servers")
        out.append(case.line(f[0]))
    return out


def pool_ejects(stats_port, pool):
    with socket.create_connection(("127.0.0.1", stats_port), timeout=5) as s:
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    return json.loads(data)[pool]["server_ejects"]


def eject(case, nc, ks, stats_port, dead):
    """Kills the memcached of server `dead` and sends gets through the pool until nutcracker has
    ejected it (a refused connection is one failure; server_failure_limit is 1)."""
    m = case.servers[dead][0]
    m.proc.kill()
    m.proc.wait()
    case.dead = dead
    for k in ks:
        nc.send(b"get %s\r\n" % k)
        line = nc.line()  # END, or SERVER_ERROR for the dead server
        if line.startswith(b"VALUE"):
            raise RuntimeError("eject pool holds a value")
        if line.startswith(b"SERVER_ERROR"):
            break
    for _ in range(100):  # stats are aggregated every -i msec
        if pool_ejects(stats_port, case.name) >= 1:
            return
        time.sleep(0.05)
    raise RuntimeError("nutcracker did not eject the killed server")


def versions():
    nc = subprocess.run(["nutcracker", "--version"], capture_output=True, text=True)
    nc = (nc.stdout + nc.stderr).split("\n")[0].replace("This is ", "").replace("-", " ", 1)
    mc = subprocess.run(["memcached", "-V"], capture_output=True, text=True).stdout.strip()

    def deb(pkg):
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True)
        return r.stdout.strip() or "not from dpkg"

    return f"{nc} (Debian nutcracker {deb('nutcracker')}) + {mc} (Debian memcached {deb('memcached')})"


def main():
    for tool in ("nutcracker", "memcached"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (apt-get install nutcracker memcached)")
    ks, excluded = keys()
    work = tempfile.mkdtemp(prefix="keyroute-twemproxy-")
    log = os.path.join(work, "nutcracker.log")
    try:
        ip = [Memcached("127.0.0.1") for _ in range(31)]
        cases = make_cases(ip)
        # The eject pool has memcached instances of its own, so killing one harms no other case.
        ej = Case("eject", [(Memcached("127.0.0.1"), 1, None) for _ in range(8)], eject=True)
        conf = os.path.join(work, "nutcracker.yml")
        with open(conf, "w") as f:
            f.write("".join(c.yaml() for c in cases + [ej]))
        stats = next_port()
        nut = start(["nutcracker", "-c", conf, "-p", os.path.join(work, "nutcracker.pid"), "-o", log,
                     "-s", str(stats), "-a", "127.0.0.1", "-i", "100"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for c in cases + [ej]:
            wait_listening("127.0.0.1", c.listen, nut, "nutcracker")
        out = [
            f"# {versions()}; generated by generate.py",
            "# one nutcracker pool per case (hash: md5, distribution: ketama, timeout: 2000, auto_eject_hosts: false);",
            "# each key is `set` through the pool, then found by `get` on each memcached of the pool",
            f"# keys: {len(ks)} distinct keys from random.Random({SEED}) and fixed edge cases; memcached's rule keeps",
            f"# keys of 1..250 bytes without bytes <= 0x20 or 0x7f: {excluded} candidates excluded by it",
            "# hash_tag=XY: the pool has hash_tag: \"XY\"; eject=LINE: the pool has auto_eject_hosts: true,",
            "# server_failure_limit: 1; LINE's memcached was killed and ejected before the keys were placed",
        ]
        for c in cases:
            nc = Conn("127.0.0.1", c.listen)
            out.append(c.header())
            out += [f"{k.hex()}\t{s}" for k, s in zip(ks, place(c, ks, nc))]
            nc.sock.close()
            print(f"{c.name}: {len(ks)} keys", file=sys.stderr)
        nc = Conn("127.0.0.1", ej.listen)
        eject(ej, nc, ks, stats, dead=2)
        out.append(ej.header())
        out += [f"{k.hex()}\t{s}" for k, s in zip(ks, place(ej, ks, nc))]
        print(f"{ej.name}: {len(ks)} keys after ejecting {ej.line(2)}", file=sys.stderr)
        with open(os.path.join(HERE, "golden.tsv"), "w") as f:
            f.write("\n".join(out) + "\n")
    except Exception:
        if os.path.exists(log):
            sys.stderr.write("nutcracker log:\n" + open(log).read()[-4000:])
        raise
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
