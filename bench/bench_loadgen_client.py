"""The load generator's CPU per ingest post: its lean client against httpx, the anchor, same run.

A hub that keeps up answers every agent every second; at 1,024 agents (plus 64 SDK processes) that
is about 1,100 posts a second from the generator. Both clients post the same 5.6-KB frame to one
local server process that answers ``200`` at once (so the hub's own cost is not in the figure),
from the same number of concurrent streams, on uvloop; the figure is the client process's CPU
per post (``time.process_time``), and the cores 1,100 posts a second would take.

usage: python bench/bench_loadgen_client.py [--posts 3000] [--streams 64]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import time
from collections.abc import Awaitable, Callable

import httpx
import uvloop

from common import print_table
from gpuscope.loadgen.http import HubClient

BODY = b"\x89GSF" + bytes(5_600)
RATE = 1_088  # posts a second: 1,024 agents and 64 SDK processes at 1 Hz


def _server(sock: socket.socket) -> None:
    reply = b'HTTP/1.1 200 OK\r\nContent-Length: 16\r\nContent-Type: application/json\r\n\r\n{"duplicate": 0}'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


async def _drive(post: Callable[[], Awaitable[int]], posts: int, streams: int) -> float:
    left = [posts]

    async def stream() -> None:
        while left[0] > 0:
            left[0] -= 1
            assert await post() == 200

    for _ in range(2 * streams):  # warm the connections
        assert await post() == 200
    cpu = time.process_time()
    await asyncio.gather(*(stream() for _ in range(streams)))
    return (time.process_time() - cpu) / posts


def lean(url: str, posts: int, streams: int) -> float:
    async def main() -> float:
        client = HubClient(
            url, "/api/v1/ingest", {"Content-Type": "application/vnd.gpuscope.frame"}, streams, 10
        )

        async def post() -> int:
            return (await client.post(BODY)).status

        try:
            return await _drive(post, posts, streams)
        finally:
            client.close()

    return uvloop.run(main())


def anchor(url: str, posts: int, streams: int) -> float:
    async def main() -> float:
        limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
        headers = {"Content-Type": "application/vnd.gpuscope.frame"}
        async with httpx.AsyncClient(base_url=url, limits=limits, headers=headers, timeout=10) as client:

            async def post() -> int:
                return (await client.post("/api/v1/ingest", content=BODY)).status_code

            return await _drive(post, posts, streams)

    return uvloop.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--posts", type=int, default=3000)
    ap.add_argument("--streams", type=int, default=64)
    args = ap.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = mp.get_context("fork").Process(target=_server, args=(sock,), daemon=True)
    server.start()
    try:
        load = os.getloadavg()[0]
        runs: dict[str, list[float]] = {"lean": [], "httpx": []}
        for _ in range(2):  # alternate, keep the best of each
            runs["httpx"].append(anchor(url, args.posts, args.streams))
            runs["lean"].append(lean(url, args.posts, args.streams))
    finally:
        server.terminate()
        server.join()
    rows = []
    for name, label in (("httpx", "httpx.AsyncClient (anchor)"), ("lean", "loadgen.http.HubClient")):
        per = min(runs[name])
        rows.append([label, f"{per * 1e6:,.0f}", f"{per * RATE:.3f}"])
    print_table(
        f"client CPU per post, {args.posts} posts × 2, {args.streams} streams, "
        f"load average {load:.1f} → {os.getloadavg()[0]:.1f}",
        ["client", "CPU µs per post", f"cores at {RATE:,} posts/s"],
        rows,
    )


if __name__ == "__main__":
    main()
