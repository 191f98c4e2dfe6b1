"""The envelope every OpenAI completion-style response and stream chunk shares."""

from __future__ import annotations

from typing import Any


def completion_envelope(job: Any, kind: str, choices: list[dict], usage: dict | None = None) -> dict[str, Any]:
    """`job` carries request_id, created and model; `kind` is the OpenAI `object` name."""
    payload: dict[str, Any] = {"id": job.request_id, "object": kind, "created": job.created, "model": job.model,
                               "choices": choices}
    if usage is not None:
        payload["usage"] = usage
    return payload
