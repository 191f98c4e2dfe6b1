"""Server-sent events framing for OpenAI (`data:` lines, `[DONE]`) and Anthropic (named events)."""

from __future__ import annotations

import json

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = "data: [DONE]\n\n"

# One encoder for every event: json.dumps with options builds a new encoder per call, a
# sizeable share of a one-token chunk's cost.
encode_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sse_data(payload: dict) -> str:
    return f"data: {encode_json(payload)}\n\n"


def sse_event(event: str, payload: dict) -> str:
    return f"event: {event}\ndata: {encode_json(payload)}\n\n"
