"""POST /v1/chat/completions/batch (vLLM's): one chat request's fields over several conversations, `messages` a list
of them. Each is checked and rendered as the chat route does it, all are queued at once, and the reply is one chat
completion whose choice i answers conversation i, its usage their sum. As vLLM's: no stream, no tools, no beam
search, one choice a conversation."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from deltaserve.engine.queue_together import queue_together
from deltaserve.server.context import last_output, random_id, read_json_object, until_disconnect
from deltaserve.server.errors import bad_request
from deltaserve.server.protocol import ChatCompletionRequest
from deltaserve.server.serving_chat import ChatCompletions

# vLLM's batch request writes these sampling fields out whatever the request leaves unset, so that there they stand
# over the generation config's defaults (its own protocol's defaults: temperature 0.7, the others neutral)
_BATCH_DEFAULTS = {"temperature": 0.7, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
                   "frequency_penalty": 0.0, "presence_penalty": 0.0}
# (field, what vLLM's batch route takes of it): set otherwise, it is refused by name
_ONE_SHAPE = (("stream", "streamed replies"), ("tools", "tools"), ("use_beam_search", "beam search"))


def _conversations(body: dict[str, Any]) -> list[list]:
    conversations = body.get("messages")
    if not isinstance(conversations, list) or not conversations or not all(
            isinstance(c, list) and c for c in conversations):
        raise bad_request("messages must be a non-empty list of conversations, each a non-empty list of messages",
                          "messages", "invalid_value")
    for name, what in _ONE_SHAPE:
        if body.get(name) not in (None, False, []):
            raise bad_request(f"{name}: the batch route takes no {what} (send each conversation to "
                              "/v1/chat/completions for that)", name, "unsupported_value")
    if body.get("n") not in (None, 1):
        raise bad_request(f"n={body.get('n')}: the batch route gives one choice a conversation", "n",
                          "unsupported_value")
    return conversations


async def batch_chat(chat: ChatCompletions, request: Request) -> JSONResponse:
    body = await read_json_object(request)
    conversations = _conversations(body)
    fields = {**_BATCH_DEFAULTS, **{k: v for k, v in body.items() if v is not None}}
    requests = [ChatCompletionRequest.model_validate({**fields, "messages": c}) for c in conversations]
    prepared = [await chat.prepare(req, "chatcmpl-") for req in requests]  # each checked before any is queued
    engine = chat.ctx.engine
    engine.check_admission()  # once for the client request: its conversations must not wait on each other
    base_id = random_id("chatcmpl-")
    for i, (job, _, _) in enumerate(prepared):
        job.request_id = f"{base_id}-{i}"
    streams = await until_disconnect(request, queue_together(engine, [
        (job.request_id, prompt.token_ids, params, dict(prompt_text=prompt.text, capture_points=prompt.capture_points,
                                                       cache_salt=job.req.cache_salt, priority=job.req.priority))
        for job, prompt, params in prepared]))
    finals = await until_disconnect(request, asyncio.gather(*(last_output(s) for s in streams)))
    return JSONResponse(_joined(base_id, [job.response(final) for (job, _, _), final in zip(prepared, finals)]))


def _joined(base_id: str, replies: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat completion of the conversations' replies: choice i the i-th's, the usage summed."""
    joined = {**replies[0], "id": base_id, "choices": []}
    for i, reply in enumerate(replies):
        joined["choices"].append({**reply["choices"][0], "index": i})
    usage = [reply["usage"] for reply in replies]
    joined["usage"] = {
        "prompt_tokens": sum(u["prompt_tokens"] for u in usage),
        "completion_tokens": sum(u["completion_tokens"] for u in usage),
        "total_tokens": sum(u["total_tokens"] for u in usage),
        "prompt_tokens_details": {"cached_tokens": sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                                                       for u in usage)},
    }
    for key in ("prompt_token_ids", "prompt_logprobs"):  # each conversation's own: on its choice, where asked
        joined.pop(key, None)
        for choice, reply in zip(joined["choices"], replies):
            if key in reply:
                choice[key] = reply[key]
    return joined
