#!/usr/bin/env python3
"""A WebSocket backend for bench/idle.sh MODE=ws: answers every request on 127.0.0.1:PORT with
101 Switching Protocols and then holds the connection, reading and dropping whatever comes.

Usage: ws_backend.py PORT
"""
import asyncio
import resource
import sys


async def serve(reader, writer):
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await reader.read(4096)
        if not chunk:
            writer.close()
            return
        head += chunk
    writer.write(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
    )
    await writer.drain()
    while await reader.read(4096):
        pass
    writer.close()


async def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
