"""POST /v1/chat/completions/render and /v1/completions/render (vLLM's): a request checked, rendered and
tokenized as its route would, and returned unrun as the body of a tokens-in, tokens-out request
(/inference/v1/generate): the prompt's token ids and the sampling params the route would have queued."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from deltaserve.sampling_params import SamplingParams
from deltaserve.server.context import random_id, read_json_object
from deltaserve.server.errors import bad_request
from deltaserve.server.protocol import ChatCompletionRequest, CompletionRequest
from deltaserve.server.serving_chat import ChatCompletions
from deltaserve.server.serving_completions import Completions
from deltaserve.server.serving_tokens import sampling_params_json


def generate_request(request_id: str, token_ids: list[int], params: SamplingParams, req: Any) -> dict[str, Any]:
    """vLLM's GenerateRequest for one prompt of `req`."""
    return {"request_id": request_id, "token_ids": list(token_ids), "features": None,
            "sampling_params": sampling_params_json(params), "model": req.model, "stream": bool(req.stream),
            "stream_options": req.stream_options.model_dump() if req.stream and req.stream_options else None,
            "cache_salt": req.cache_salt, "priority": req.priority, "kv_transfer_params": None}


def _refuse_beam_search(req: Any) -> None:
    if req.use_beam_search:  # a beam search is many requests, not one to hand on
        raise bad_request("use_beam_search: a beam search is not one generate request, so it is not rendered",
                          "use_beam_search", "unsupported_value")


async def render_chat(chat: ChatCompletions, request: Request) -> dict[str, Any]:
    req = ChatCompletionRequest.model_validate(await read_json_object(request))
    _refuse_beam_search(req)
    job, prompt, params = await chat.prepare(req, "chatcmpl-")
    return generate_request(job.request_id, prompt.token_ids, params, req)


async def render_completion(completions: Completions, request: Request) -> list[dict[str, Any]]:
    req = CompletionRequest.model_validate(await read_json_object(request))
    _refuse_beam_search(req)
    _, prompts, params = await completions.prepare(req)
    return [generate_request(random_id("cmpl-"), p.token_ids, sp, req) for p, sp in zip(prompts, params)]
