"""The load generator's lean HTTP client against a real socket server: keep-alive, status, body,
Retry-After, and a server that goes away mid-answer."""

from __future__ import annotations

import asyncio

import pytest

from gpuscope.loadgen.http import HubClient, RequestError


async def serve(answers: list[bytes], seen: list[bytes], connections: list[int]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            seen.append(head + await reader.readexactly(length))
            answer = answers.pop(0)
            writer.write(answer)
            await writer.drain()
            if not answer.endswith(b"}"):  # a cut answer: the server goes away
                break
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def reply(status: int, body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


def test_posts_keep_one_connection_and_read_status_body_and_retry_after() -> None:
    async def main() -> None:
        answers = [
            reply(200, b'{"ok":1}'),
            reply(503, b'{"e":1}', b"Retry-After: 1.5\r\n"),
            reply(200, b"{}"),
        ]
        seen: list[bytes] = []
        conns: list[int] = []
        server = await serve(answers, seen, conns)
        port = server.sockets[0].getsockname()[1]
        client = HubClient(f"http://127.0.0.1:{port}", "/api/v1/ingest", {"Content-Type": "x/y"}, 4, 5.0)
        first = await client.post(b"abc")
        assert (first.status, first.content, first.retry_after) == (200, b'{"ok":1}', None)
        second = await client.post(b"de")
        assert (second.status, second.retry_after) == (503, 1.5)
        assert (await client.post(b"")).status == 200
        assert len(conns) == 1  # kept alive
        assert seen[0].startswith(b"POST /api/v1/ingest HTTP/1.1\r\n") and seen[0].endswith(b"\r\n\r\nabc")
        assert b"Content-Type: x/y\r\n" in seen[0] and b"Content-Length: 2\r\n" in seen[1]
        client.close()
        server.close()

    asyncio.run(main())


def test_a_cut_answer_or_no_server_is_a_request_error_and_the_next_post_reconnects() -> None:
    async def main() -> None:
        answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{", reply(200, b"{}")]
        conns: list[int] = []
        server = await serve(answers, [], conns)
        port = server.sockets[0].getsockname()[1]
        client = HubClient(f"http://127.0.0.1:{port}", "/p", {}, 1, 5.0)
        with pytest.raises(RequestError):
            await client.post(b"x")
        assert (await client.post(b"y")).status == 200
        assert len(conns) == 2
        client.close()
        server.close()
        await server.wait_closed()
        with pytest.raises(RequestError):
            await HubClient(f"http://127.0.0.1:{port}", "/p", {}, 1, 5.0).post(b"z")

    asyncio.run(main())


async def serve_in_order(seen: list[bytes]) -> asyncio.Server:
    """A server answering each request at once, noting whose it was (its ``X-Stream`` header)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                stream = next(line for line in head.split(b"\r\n") if line.startswith(b"X-Stream:"))
                seen.append(stream.split(b":")[1].strip())
                writer.write(reply(200, b"{}"))
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def streams_posting(connections: int, streams: int, posts: int) -> list[bytes]:
    """``streams`` in-order streams, each posting ``posts`` times back to back through one client
    of ``connections`` connections, started in order; the streams in the order the server served them."""

    async def main() -> list[bytes]:
        seen: list[bytes] = []
        server = await serve_in_order(seen)
        port = server.sockets[0].getsockname()[1]
        client = HubClient(f"http://127.0.0.1:{port}", "/p", {}, connections, 5.0)

        async def stream(name: bytes) -> None:
            for _ in range(posts):
                assert (await client.post(b"x", b"X-Stream: " + name + b"\r\n")).status == 200

        tasks = [asyncio.create_task(stream(b"s%d" % i)) for i in range(streams)]
        await asyncio.gather(*tasks)
        client.close()
        server.close()
        return seen

    return asyncio.run(main())


def test_a_connection_goes_to_the_stream_that_waited_longest_so_none_starves() -> None:
    # one connection, five streams always wanting it: served strictly in turn, in order of arrival
    # (a stream that just got its answer and posts again waits behind the others)
    seen = streams_posting(connections=1, streams=5, posts=4)
    assert seen == [b"s%d" % i for i in range(5)] * 4


def test_many_streams_on_a_small_pool_all_progress_together() -> None:
    seen = streams_posting(connections=3, streams=40, posts=10)
    served: dict[bytes, int] = {}
    for name in seen:
        served[name] = served.get(name, 0) + 1
        # no stream runs ahead: when one is served for the n-th time, every other stream has
        # been served at least n - 2 times (in flight on another connection at worst)
        assert min(served.get(b"s%d" % i, 0) for i in range(40)) >= served[name] - 2
    assert served == {b"s%d" % i: 10 for i in range(40)}
