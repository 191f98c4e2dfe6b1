"""A lean HTTP/1.1 client for the bench: POST a JSON body on a kept-alive connection and read the
response's server-sent events as they arrive, with httptools (the server's own C parser) for the
framing.

Why not httpx: a client in Python pays per request and per streamed chunk, on the same CPU as the
server it measures. Over benchmarks/server_host_path.py's server (an engine that only waits, 2 cores),
httpx took 79-136 us of the client's CPU a token at 32 to 128 streams and this client 37-50, and the
batches streamed 2%, 8% and 0-2% more tokens a second at 32, 64 and 128 (bench_client_host_path_cpu.json).
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.parse
from collections.abc import AsyncIterator

import httptools


class HTTPStreamError(Exception):
    """The connection broke, or the response was not HTTP the parser could read."""


class _Response:
    """httptools callbacks: the status, and the body as it comes (chunked framing already removed)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status: int | None = None
        self.body = bytearray()
        self.complete = False
        self.keep_alive = True
        self.framed = False  # a content-length or chunked body; else the body runs to the connection's close

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


class Connection:
    """One kept-alive connection to `url`'s host, opened on first use and again whenever the server has
    closed it. One request at a time: each bench worker holds its own."""

    def __init__(self, url: str, timeout: float):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"the bench speaks http and https, not {parts.scheme!r} ({url})")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = parts.scheme == "https"
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._unread = False  # a response whose body was not read to its end

    async def _open(self) -> None:
        context = ssl.create_default_context() if self.tls else None
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=context), self.timeout)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
        self._unread = False

    def _request(self, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [f"POST {self.path} HTTP/1.1", f"host: {self.host}:{self.port}", "content-type: application/json",
                 "accept: text/event-stream", f"content-length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    async def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, AsyncIterator[bytes]]:
        """Sends the request; returns the status and an iterator over the body's bytes as they arrive.
        The iterator must be run to its end before the next post (or the connection closed)."""
        if self._unread:  # what is left of the last response would read as the start of this one
            self.close()
        kept = self._writer is not None
        try:
            return await self._send(body, headers)
        except (ConnectionError, HTTPStreamError):
            if not kept:
                raise
        return await self._send(body, headers)  # the server closed the kept-alive connection meanwhile

    async def _send(self, body: bytes, headers: dict[str, str]) -> tuple[int, AsyncIterator[bytes]]:
        if self._writer is None:
            await self._open()
        response = _Response()
        try:
            self._writer.write(self._request(body, headers))
            await self._writer.drain()
            while response.status is None:
                await self._feed(response)
        except BaseException:
            self.close()  # a request sent and not answered must not share the connection with the next
            raise
        self._unread = True
        return response.status, self._body(response)

    async def _feed(self, response: _Response) -> None:
        data = await asyncio.wait_for(self._reader.read(65536), self.timeout)
        if not data:
            if response.status is not None and not response.framed:
                response.complete, response.keep_alive = True, False  # its body ends here
                return
            raise HTTPStreamError("the server closed the connection" if response.status is None
                                  else "the connection closed inside the response")
        try:
            response.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise HTTPStreamError(f"unreadable HTTP response: {exc}") from None

    async def _body(self, response: _Response) -> AsyncIterator[bytes]:
        try:
            while True:
                if response.body:
                    chunk, response.body = bytes(response.body), bytearray()
                    yield chunk
                if response.complete:
                    break
                await self._feed(response)
        except BaseException:
            self.close()
            raise
        self._unread = False
        if not response.keep_alive:
            self.close()


async def sse_data(body: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent event stream, one per event line, as text."""
    pending = b""
    async for chunk in body:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                yield line[5:].strip().decode()
    if pending.startswith(b"data:"):
        yield pending[5:].strip().decode()
