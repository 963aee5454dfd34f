#!/usr/bin/env python3
"""Opens N keep-alive connections to a proxy, sends one GET on each, reads its response, and holds
them all open until stdin closes (bench/idle.sh measures the proxy's memory meanwhile).

Usage: idle.py PORT N [plain|tls|ws]
tls: each connection is TLS (certificate not verified). ws: the GET asks for a WebSocket upgrade and
expects 101; the tunnel is then held.
Source addresses 127.A.B.2 are used in turn (10,000 connections each; A from the process id, so
that consecutive runs do not collide with the previous runs' TIME_WAIT ports), so that tens of
thousands of connections to one port do not run out of ephemeral ports.
Prints "held N" once every connection has had its response, then waits.
"""
import os
import resource
import socket
import ssl
import sys


def main():
    port, n = int(sys.argv[1]), int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "plain"
    ctx = None
    if mode == "tls":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" if mode == "ws" else ""
    want_status = b"HTTP/1.1 101" if mode == "ws" else b"HTTP/1.1 200"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(n + 1024, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    conns = []
    per_ip = 10_000
    a = 1 + os.getpid() % 250
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((f"127.{a}.{i // per_ip}.2", 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        if ctx is not None:
            s = ctx.wrap_socket(s, server_hostname="bench.test")
        s.sendall(f"GET /?k={i} HTTP/1.1\r\nHost: bench\r\n{upgrade}\r\n".encode())
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                raise SystemExit(f"connection {i} closed before its response")
            got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v.strip())
        while mode != "ws" and len(body) < length:
            body += s.recv(4096)
        if not head.startswith(want_status):
            raise SystemExit(f"connection {i}: {head[:40]!r}")
        conns.append(s)
    print(f"held {len(conns)}", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
