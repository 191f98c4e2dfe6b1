"""The bench's HTTP/1.1 client against a server written out here byte by byte: chunked event streams
cut at random places, error bodies, kept-alive and closed connections, a response left unread."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from deltaserve.bench.http_stream import Connection, HTTPStreamError, sse_data
from deltaserve.bench.serve import send_request


class RawServer:
    """Answers each request on a connection with the next of `replies` ((pieces, close[, pause]): the
    bytes written in those pieces, `pause` seconds apart (or the list's seconds after each piece), then the
    connection closed or kept); records
    the requests and the connections it accepted."""

    def __init__(self, replies: list):
        self.replies = list(replies)
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/completions"

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                self.requests.append((head, await reader.readexactly(length)))
                pieces, close, *pause = self.replies.pop(0)
                for i, piece in enumerate(pieces):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(pause[0][i] if pause and isinstance(pause[0], list) else
                                        pause[0] if pause else 0)
                if close:
                    break
        except asyncio.IncompleteReadError:
            pass
        writer.close()


def chunked(payloads: list[bytes]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    events = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads)
    return head + events + b"0\r\n\r\n"


def cut(data: bytes, rng: random.Random) -> list[bytes]:
    """data in pieces cut at random places, as TCP may deliver them."""
    points = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 30))))
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


def events(rng: random.Random, n: int) -> list[str]:
    texts = ["".join(rng.choice("ab\u00e9\u4e2d ") for _ in range(rng.randint(1, 9))) for _ in range(n)]
    return [json.dumps({"choices": [{"text": text}]}) for text in texts] + ["[DONE]"]


async def read_all(conn: Connection, body: bytes = b"{}") -> tuple[int, list[str]]:
    status, response = await conn.post(body, {"authorization": "Bearer k"})
    return status, [data async for data in sse_data(response)]


def test_streamed_events_arrive_whole_and_in_order_however_the_bytes_are_cut():
    rng = random.Random()
    sent = [events(rng, rng.randint(1, 40)) for _ in range(3)]
    replies = [(cut(chunked([f"data: {e}\n\n".encode() for e in evs]), rng), False) for evs in sent]

    async def run():
        async with RawServer(replies) as url:
            conn = Connection(url, timeout=10)
            got = [await read_all(conn, json.dumps({"n": i}).encode()) for i in range(3)]
            conn.close()
            return got

    assert asyncio.run(run()) == [(200, evs) for evs in sent]


def test_one_kept_alive_connection_carries_every_request_and_its_headers():
    rng = random.Random()
    replies = [([chunked([b"data: [DONE]\n\n"])], False) for _ in range(4)]
    server = RawServer(replies)

    async def run():
        async with server as url:
            conn = Connection(url, timeout=10)
            for i in range(4):
                assert await read_all(conn, json.dumps({"i": i, "r": rng.random()}).encode()) == (200, ["[DONE]"])
            conn.close()

    asyncio.run(run())
    assert server.connections == 1
    head, body = server.requests[2]
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n") and b"authorization: Bearer k" in head
    assert json.loads(body)["i"] == 2


def test_an_error_status_comes_back_with_its_body():
    message = json.dumps({"error": {"message": "max_tokens must be at least 1", "type": "invalid_value"}}).encode()
    reply = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(message), message)

    async def run():
        async with RawServer([([reply], False)]) as url:
            conn = Connection(url, timeout=10)
            status, response = await conn.post(b"{}", {})
            return status, b"".join([part async for part in response])

    assert asyncio.run(run()) == (400, message)


def test_a_connection_the_server_closed_is_opened_again():
    # The first reply closes the connection after it (as an idle keep-alive times out); the second
    # request finds it closed and goes out on a fresh one. A body that runs to the close is read whole.
    to_close = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\ndata: [DONE]\n\n"
    replies = [([chunked([b"data: 1\n\n", b"data: [DONE]\n\n"])], True), ([to_close], True),
               ([chunked([b"data: 3\n\n"])], False)]
    server = RawServer(replies)

    async def run():
        async with server as url:
            conn = Connection(url, timeout=10)
            got = [await read_all(conn) for _ in range(3)]
            conn.close()
            return got

    assert asyncio.run(run()) == [(200, ["1", "[DONE]"]), (200, ["[DONE]"]), (200, ["3"])]
    assert server.connections == 3


def test_a_response_left_unread_does_not_garble_the_next():
    # The first reply in 20 pieces 10 ms apart: the reader has the first when it stops, the rest still to come.
    first = chunked([b"data: %d\n\n" % i for i in range(20)])
    pieces = [first[:len(first) // 2]] + cut(first[len(first) // 2:], random.Random())[:19]
    pieces.append(first[len(b"".join(pieces)):])
    replies = [(pieces, False, 0.01), ([chunked([b"data: next\n\n"])], False)]
    server = RawServer(replies)

    async def run():
        async with server as url:
            conn = Connection(url, timeout=10)
            status, response = await conn.post(b"{}", {})
            first = await response.__anext__()  # the reader stops after its first piece
            assert status == 200 and first.startswith(b"data: 0")
            got = await read_all(conn)
            conn.close()
            return got

    assert asyncio.run(run()) == (200, ["next"])
    assert len(server.requests) == 2 and server.connections == 2  # sent once, on a fresh connection


def test_a_server_that_never_answers_times_out_and_a_garbled_one_is_named():
    async def silent(reader, writer):
        await reader.read(1 << 16)
        await asyncio.sleep(5)

    async def run_silent():
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        conn = Connection(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/", timeout=0.2)
        try:
            await conn.post(b"{}", {})
        finally:
            server.close()

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(run_silent())

    async def run_garbled():
        async with RawServer([([b"SMTP ready\r\n\r\n"], True)]) as url:
            await Connection(url, timeout=10).post(b"{}", {})

    with pytest.raises(HTTPStreamError, match="unreadable HTTP response"):
        asyncio.run(run_garbled())
    with pytest.raises(ValueError, match="http and https"):
        Connection("ftp://h/x", timeout=1)


def test_a_requests_latency_ends_at_its_last_token_not_at_the_usage_after_it():
    # as vLLM's client: every chunk with choices is a token's (its text may be empty), and the latency runs to
    # the last of them, not to the usage chunk or [DONE] that may come later
    rng = random.Random()
    tokens = [json.dumps({"choices": [{"text": rng.choice(["a", "", " b"])}]}).encode() for _ in range(rng.randint(3, 8))]
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens)}}).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    pieces = [head] + [b"%x\r\ndata: %s\n\n\r\n" % (len(t) + 8, t) for t in [*tokens, usage, b"[DONE]"]] + [b"0\r\n\r\n"]
    late = 0.5
    pauses = [0.0] + [0.01] * (len(tokens) - 1) + [late, 0.0, 0.0, 0.0]
    server = RawServer([(pieces, True, pauses)])

    async def run():
        async with server as url:
            conn = Connection(url, timeout=10)
            result = await send_request(conn, "m", [1, 2, 3], len(tokens), {})
            conn.close()
            return result

    result = asyncio.run(run())
    assert result.ok and result.output_tokens == len(tokens) and len(result.itls) == len(tokens) - 1
    assert abs(result.latency - (result.ttft + sum(result.itls))) < 1e-6
    assert result.latency < late
