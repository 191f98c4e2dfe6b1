"""EngineStreamResponse: an SSE response that aborts its requests however the response ends.

Starlette cancels the body iterator when the client disconnects, and may do so before the
iterator ever started (then its own `finally` never runs); closing the request streams here
covers that case too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from deltaserve.engine.async_engine import RequestStream


class EngineStreamResponse(StreamingResponse):
    def __init__(self, content: AsyncIterator[str], streams: RequestStream | list[RequestStream], **kwargs):
        super().__init__(content, media_type="text/event-stream", **kwargs)
        self._streams = streams if isinstance(streams, list) else [streams]

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for stream in self._streams:
                stream.close()
