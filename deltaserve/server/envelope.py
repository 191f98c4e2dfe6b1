"""The envelope every OpenAI completion-style response and stream chunk shares."""

from __future__ import annotations

from typing import Any

from deltaserve.server.sse import encode_json


def completion_envelope(job: Any, kind: str, choices: list[dict], usage: dict | None = None) -> dict[str, Any]:
    """`job` carries request_id, created and model; `kind` is the OpenAI `object` name."""
    payload: dict[str, Any] = {"id": job.request_id, "object": kind, "created": job.created, "model": job.model,
                               "choices": choices}
    if usage is not None:
        payload["usage"] = usage
    return payload


class ChunkEvents:
    """The SSE events of one streamed response: `sse_data(completion_envelope(...))`, byte for byte,
    with the envelope's fixed fields encoded once instead of once per token."""

    def __init__(self, job: Any, kind: str):
        fixed = encode_json({"id": job.request_id, "object": kind, "created": job.created, "model": job.model})
        self._head = f'data: {fixed[:-1]},"choices":'

    def __call__(self, choices: list[dict], usage: dict | None = None, extra: dict | None = None) -> str:
        """extra: top-level fields after the choices (a chat's first chunk's prompt_token_ids)."""
        tail = "" if usage is None else f',"usage":{encode_json(usage)}'
        if extra:
            tail = f",{encode_json(extra)[1:-1]}{tail}"
        return f"{self._head}{encode_json(choices)}{tail}}}\n\n"
