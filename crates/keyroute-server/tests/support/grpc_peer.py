#!/usr/bin/env python3
"""A real gRPC peer (grpcio) for keyroute's tests: a server or a client of one small service.

No generated code: the service is registered as generic handlers over raw bytes, so no protoc
is needed. Messages are UTF-8 text.

    grpc_peer.py serve NAME          serves on 127.0.0.1:<free port>, prints "listening PORT"
    grpc_peer.py client TARGET WHAT  runs a scenario against TARGET, prints one JSON line

Methods of /keyroute.test.Echo/:
    Unary         -> "NAME:<request>"
    ServerStream  "<n>" -> "NAME:0" .. "NAME:<n-1>"
    ClientStream  a, b, c -> "NAME:a,b,c"
    Bidi          each request x -> "NAME:x", in order
    Slow          "<seconds>" -> sleeps, then "NAME:slept"
    Forever       a message every 50 ms until cancelled

and grpc.health.v1.Health/Check: SERVING, or NOT_SERVING while the file that
GRPC_PEER_DOWN_FILE names exists.
"""

import json
import os
import sys
import time
from concurrent import futures

import grpc

SERVICE = "keyroute.test.Echo"


def serve(name):
    def unary(req, ctx):
        return f"{name}:{req.decode()}".encode()

    def server_stream(req, ctx):
        for i in range(int(req.decode())):
            yield f"{name}:{i}".encode()

    def client_stream(reqs, ctx):
        return (f"{name}:" + ",".join(r.decode() for r in reqs)).encode()

    def bidi(reqs, ctx):
        for r in reqs:
            yield f"{name}:{r.decode()}".encode()

    def slow(req, ctx):
        time.sleep(float(req.decode()))
        return f"{name}:slept".encode()

    def forever(req, ctx):
        i = 0
        while ctx.is_active():
            yield f"{name}:{i}".encode()
            i += 1
            time.sleep(0.05)

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
        "Forever": grpc.unary_stream_rpc_method_handler(forever),
    }
    down_file = os.environ.get("GRPC_PEER_DOWN_FILE", "")

    def health(req, ctx):
        # HealthCheckResponse { status = 1 }: 1 SERVING, 2 NOT_SERVING.
        return b"\x08\x02" if down_file and os.path.exists(down_file) else b"\x08\x01"

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(SERVICE, handlers),
            grpc.method_handlers_generic_handler(
                "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(health)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening {port}", flush=True)
    server.wait_for_termination()


def method(channel, kind, name):
    path = f"/{SERVICE}/{name}"
    return getattr(channel, kind)(path)


def status_of(e):
    return {"code": e.code().name, "details": e.details() or ""}


def client(target, what):
    channel = grpc.insecure_channel(target)
    out = {}
    if what.startswith("unary:"):
        # unary:USERS:REPEAT -- each user's calls carry x-user-id; which server answered each.
        users, repeat = (int(x) for x in what.split(":")[1:])
        call = method(channel, "unary_unary", "Unary")
        for u in range(users):
            names = []
            for r in range(repeat):
                reply = call(f"u{u}-{r}".encode(), metadata=(("x-user-id", f"user-{u}"),), timeout=10).decode()
                server, _, echoed = reply.partition(":")
                assert echoed == f"u{u}-{r}", reply
                names.append(server)
            out[f"user-{u}"] = names
    elif what == "streams":
        md = (("x-user-id", "user-streams"),)
        out["server"] = [m.decode() for m in method(channel, "unary_stream", "ServerStream")(b"20", metadata=md, timeout=10)]
        sent = [str(i) for i in range(20)]
        out["client"] = method(channel, "stream_unary", "ClientStream")(
            (s.encode() for s in sent), metadata=md, timeout=10
        ).decode()
        out["bidi"] = [
            m.decode() for m in method(channel, "stream_stream", "Bidi")((s.encode() for s in sent), metadata=md, timeout=10)
        ]
    elif what == "failure":
        # One call that fails: its status, as a gRPC client reads it.
        try:
            method(channel, "unary_unary", "Unary")(b"x", metadata=(("x-user-id", "user-1"),), timeout=10)
            out = {"code": "OK", "details": ""}
        except grpc.RpcError as e:
            out = status_of(e)
    elif what.startswith("midstream:"):
        # Reads a few messages, says "streaming", then reads until the stream ends: its status.
        user = what.split(":")[1]
        started = time.monotonic()
        stream = method(channel, "unary_stream", "Forever")(b"", metadata=(("x-user-id", user),), timeout=30)
        seen = []
        try:
            for m in stream:
                seen.append(m.decode())
                if len(seen) == 3:
                    print("streaming " + seen[0].partition(":")[0], flush=True)
            out = {"code": "OK", "details": ""}
        except grpc.RpcError as e:
            out = status_of(e)
        out["seen"] = len(seen)
        out["seconds"] = time.monotonic() - started
    else:
        raise SystemExit(f"unknown scenario {what}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[2], sys.argv[3])
