#!/usr/bin/env python3
"""Golden vectors for keyroute::compat::redis, from the real redis-server and redis-cli.

    python3 crates/keyroute/testdata/compat/redis/generate.py      # needs redis-server, redis-cli (Debian)

Writes, beside this script:
- keyslots.tsv: hex(key) TAB slot, as `CLUSTER KEYSLOT` answers over RESP (binary keys included);
- layouts.tsv: the node list given to `redis-cli --cluster create --cluster-replicas 0` (in order),
  TAB, each node's slot ranges as `CLUSTER NODES` reports them after the creation.

Every server runs on 127.0.0.x loopback addresses and free ports, in a temporary directory, and is
stopped by its pid.
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


def free_port(host):
    """A port free on `host` whose cluster bus port (port + 10000) is free and valid too."""
    rng = random.Random()
    while True:
        p = rng.randrange(20000, 50000)
        try:
            for q in (p, p + 10000):
                s = socket.socket()
                s.bind((host, q))
                s.close()
            return p
        except OSError:
            continue


class Server:
    def __init__(self, host, workdir):
        self.host, self.port = host, free_port(host)
        d = os.path.join(workdir, f"{host}-{self.port}")
        os.makedirs(d)
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", host, "--port", str(self.port), "--cluster-enabled", "yes",
             "--cluster-config-file", "nodes.conf", "--dir", d, "--save", "", "--appendonly", "no",
             "--protected-mode", "no", "--cluster-announce-ip", host],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection((host, self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on {host}:{self.port} did not start")

    @property
    def addr(self):
        return f"{self.host}:{self.port}"

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def resp_command(sock_file, sock, *args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    sock.sendall(out)
    return read_reply(sock_file)


def read_reply(f):
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b":":
        return int(rest)
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2]
    raise RuntimeError(f"unexpected reply {line!r}")


def keys():
    rng = random.Random(11)
    ks = [b"", b"123456789", b"somekey", b"{user1}.following", b"{user1}.followers", b"{}{a}", b"foo{}{bar}",
          b"a{b}c{d}", b"{{a}}", b"}{a}", b"{a", b"a}", b"{", b"}", b"{}", b"\x00", b"\n", b"\t{x}\t",
          b"{\xff\xfe}", b"\xff{tag}\x00", "héllo".encode(), "日本{語}".encode(), b"x" * 1000]
    for i in range(1500):
        ks.append(f"user:{rng.randrange(10**7)}".encode())
    for i in range(1500):
        ks.append(f"/thumb/img-{rng.randrange(1000)}.jpg?w={rng.choice([96, 160, 320])}&h=120".encode())
    for i in range(1000):
        tag = rng.randrange(100)
        ks.append(f"{{user{tag}}}:{rng.choice(['cart', 'session', 'feed'])}:{i}".encode())
    for i in range(1000):
        ks.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))))
    return ks


def main():
    for tool in ("redis-server", "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (apt-get install redis-server)")
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="keyroute-redis-")
    servers = []
    try:
        s = Server("127.0.0.1", work)
        servers.append(s)
        sock = socket.create_connection((s.host, s.port))
        f = sock.makefile("rb")
        with open(os.path.join(HERE, "keyslots.tsv"), "w") as out:
            out.write(f"# {version}; CLUSTER KEYSLOT over RESP\n")
            for k in keys():
                out.write(f"{k.hex()}\t{resp_command(f, sock, b'CLUSTER', b'KEYSLOT', k)}\n")
        sock.close()
        s.stop()
        servers.clear()
        # Layouts: (hosts of the nodes, in the order given to redis-cli).
        cases = [["127.0.0.1"] * m for m in (3, 4, 5, 7, 8, 16, 31)]
        cases.append(["127.0.0.1"] * 3 + ["127.0.0.2"] * 3)
        cases.append(["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.2", "127.0.0.1", "127.0.0.3"])
        with open(os.path.join(HERE, "layouts.tsv"), "w") as out:
            out.write(f"# {version}; redis-cli --cluster create --cluster-replicas 0; nodes in the order given, TAB, each node's slots\n")
            for hosts in cases:
                nodes = [Server(h, work) for h in hosts]
                servers.extend(nodes)
                subprocess.run(["redis-cli", "--cluster", "create", *[n.addr for n in nodes], "--cluster-replicas", "0",
                                "--cluster-yes"], check=True, capture_output=True, timeout=60)
                sock = socket.create_connection((nodes[0].host, nodes[0].port))
                f = sock.makefile("rb")
                text = resp_command(f, sock, b"CLUSTER", b"NODES").decode()
                sock.close()
                slots = {}
                for line in text.strip().splitlines():
                    parts = line.split()
                    addr = parts[1].split("@")[0]
                    slots[addr] = ",".join(parts[8:])
                # Node names use 127.0.0.N:PORT; the real port numbers are arbitrary, so the file
                # names nodes by host and position.
                names = [f"{n.host}:{7000 + i}" for i, n in enumerate(nodes)]
                out.write("\t".join([",".join(names), ";".join(slots[n.addr] for n in nodes)]) + "\n")
                for n in nodes:
                    n.stop()
                servers.clear()
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
