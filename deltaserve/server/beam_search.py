"""vLLM's `use_beam_search` on chat and completions: the request's n beams (engine/beam_search.py) in place of its
n samples. A beam ranks the model's own logprobs, so the fields that shape a draw (temperature, top_p, top_k,
min_p, seed) are taken and do nothing, as in vLLM; those that would change which tokens a beam may take, and that
it does not apply, are refused by name where the request sets them."""

from __future__ import annotations

from typing import Any

from deltaserve.engine.async_engine import AsyncEngine
from deltaserve.engine.beam_search_stream import BeamSearchStream
from deltaserve.errors import InvalidSamplingParamsError
from deltaserve.sampling_params import BeamSearchParams, SamplingParams
from deltaserve.server.errors import bad_request

# (field, its neutral value): what a beam does not apply; set to anything else, the request is refused
_NOT_APPLIED = (("stop", None), ("logit_bias", None), ("presence_penalty", None), ("frequency_penalty", None),
                ("repetition_penalty", None), ("allowed_token_ids", None), ("bad_words", None),
                ("structured_outputs", None), ("response_format", None), ("prompt_logprobs", None),
                ("thinking_token_budget", None), ("repetition_detection", None))


def beam_search_params(req: Any, params: SamplingParams) -> BeamSearchParams:
    """The request's beam search from its sampling params (n the width); refuses the fields beams do not apply."""
    for name, neutral in _NOT_APPLIED:
        value = getattr(req, name, neutral)
        if value not in (neutral, [], {}) and not (name == "response_format" and value.type == "text"):
            raise bad_request(f"{name} is not applied by beam search (use_beam_search): leave it out, or sample",
                              name, "unsupported_value")
    if params.prompt_logprobs is not None:  # echo's logprobs: the prompt's, which no beam's request computes
        name = "echo" if getattr(req, "echo", False) else "prompt_logprobs"
        raise bad_request(f"{name}: the prompt's logprobs are not given by beam search (use_beam_search): leave "
                          "out echo's logprobs, or sample", name, "unsupported_value")
    if params.structured_outputs is not None:  # a tool choice's grammar
        raise bad_request("tool_choice: a required or named tool call takes a grammar, which beam search "
                          "(use_beam_search) does not apply", "tool_choice", "unsupported_value")
    try:
        return BeamSearchParams(beam_width=params.n, max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
                                temperature=params.temperature, length_penalty=req.length_penalty,
                                include_stop_str_in_output=params.include_stop_str_in_output,
                                stop_token_ids=params.stop_token_ids, min_tokens=params.min_tokens)
    except InvalidSamplingParamsError as exc:
        raise bad_request(str(exc), "length_penalty", "invalid_value") from None


async def start_beam_search(engine: AsyncEngine, request_id: str, prompt: list[int], prompt_text: str | None,
                            params: SamplingParams, beams: BeamSearchParams,
                            cache_salt: str | None, priority: int = 0) -> BeamSearchStream:
    """The search's stream; a width the engine's max_logprobs cannot serve is a 400 naming n."""
    tokenizer = engine.tokenizer
    skip = params.skip_special_tokens
    try:
        return await engine.beam_search(request_id, prompt, beams, prompt_text=prompt_text,
                                        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=skip),
                                        top_logprobs=params.logprobs, cache_salt=cache_salt, priority=priority)
    except InvalidSamplingParamsError as exc:
        param = "n" if str(exc).startswith("beam_width") else None
        raise bad_request(str(exc), param, "invalid_value") from None


async def start_beam_searches(engine: AsyncEngine, base_id: str, prompts: list, params: list[SamplingParams],
                              req: Any) -> list[BeamSearchStream]:
    """A completion's searches, one a prompt (each with its .token_ids and .text), named as submit_prompts names
    their requests; where one is refused, those started are cancelled."""
    streams: list[BeamSearchStream] = []
    try:
        for k, (prompt, sp) in enumerate(zip(prompts, params)):
            streams.append(await start_beam_search(engine, f"{base_id}-{k}", prompt.token_ids, prompt.text, sp,
                                                   beam_search_params(req, sp), req.cache_salt, req.priority))
    except BaseException:
        for stream in streams:
            stream.close()
        raise
    return streams
