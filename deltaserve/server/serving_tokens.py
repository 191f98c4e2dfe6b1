"""POST /inference/v1/generate: vLLM's tokens in, tokens out. The body names the prompt's token ids and vLLM's
SamplingParams field by field; the reply gives each choice's token ids, and their logprobs named "token_id:ID".
No text is written or parsed: a client that renders its own prompts (the render routes) and reads its own
tokens (a reinforcement-learning trainer) gets the engine's tokens as they are."""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from deltaserve.engine.async_engine import RequestStream
from deltaserve.outputs import CompletionOutput, Logprob, RequestOutput
from deltaserve.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from deltaserve.server.context import (ServerContext, last_output, random_id, read_json_object, stream_usage,
                                       until_disconnect, usage_dict)
from deltaserve.server.errors import bad_request, from_exception
from deltaserve.server.logprobs import TokenText, prompt_logprobs_json
from deltaserve.server.protocol import GenerateRequest
from deltaserve.server.sampling import resolve_max_tokens
from deltaserve.server.sse import DONE, SSE_HEADERS, sse_data
from deltaserve.server.streaming import EngineStreamResponse

# vLLM's SamplingParams fields that say how its own engine carries a request (what its render routes write out):
# taken and dropped, since this engine asks nothing of them
_CARRIAGE = {"output_kind", "skip_clone", "output_text_buffer_length", "_eos_token_id", "_all_stop_token_ids",
             "_bad_words_token_ids", "routed_experts_prompt_start"}
_FIELDS = {f.name for f in dataclasses.fields(SamplingParams) if f.init} - _CARRIAGE


def sampling_params_from_json(fields: dict[str, Any]) -> SamplingParams:
    """vLLM's SamplingParams as JSON: its fields by name, null for a default, logit_bias keyed by token id
    strings, top_k 0 for none. A field deltaserve does not know is refused by name."""
    unknown = sorted(set(fields) - _FIELDS - _CARRIAGE)
    if unknown:
        raise bad_request(f"sampling_params.{unknown[0]} is not one of vLLM's sampling parameters that deltaserve "
                          "takes", f"sampling_params.{unknown[0]}", "invalid_value")
    kwargs = {name: value for name, value in fields.items() if name in _FIELDS}
    if kwargs.get("top_k") == 0:
        kwargs["top_k"] = -1
    structure = kwargs.get("structured_outputs")
    if isinstance(structure, dict):
        kwargs["structured_outputs"] = _structure(structure)
    return SamplingParams.from_optional(**kwargs)


def sampling_params_json(params: SamplingParams) -> dict[str, Any]:
    """The other way, for the render routes: every field a request sets, as vLLM writes them out."""
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(SamplingParams) if f.init}
    fields["output_kind"] = int(params.output_kind)
    fields["top_k"] = max(params.top_k, 0)  # vLLM writes 0 for none
    if params.structured_outputs is not None:
        fields["structured_outputs"] = {f.name: getattr(params.structured_outputs, f.name)
                                        for f in dataclasses.fields(StructuredOutputsParams) if f.init}
    if params.repetition_detection is not None:
        fields["repetition_detection"] = dataclasses.asdict(params.repetition_detection)
    return fields


def _structure(fields: dict[str, Any]) -> StructuredOutputsParams:
    known = {f.name for f in dataclasses.fields(StructuredOutputsParams) if f.init}
    unknown = sorted(set(fields) - known - {"_backend", "_backend_was_auto"})  # vLLM's own bookkeeping
    if unknown:
        raise bad_request(f"sampling_params.structured_outputs.{unknown[0]} is not supported",
                          f"sampling_params.structured_outputs.{unknown[0]}", "invalid_value")
    return StructuredOutputsParams(**{k: v for k, v in fields.items() if k in known and v is not None})


class GenerateTokens:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.token_text = TokenText(ctx.tokenizer)

    async def __call__(self, request: Request):
        req = GenerateRequest.model_validate(await read_json_object(request))
        self.ctx.check_model(req.model)
        self._refuse_what_is_not_taken(req)
        params = self._params(req)
        self.ctx.admit()
        request_id = "generate-tokens-" + (request.headers.get("x-request-id") or req.request_id
                                           or random_id(""))
        stream = await until_disconnect(request, self.ctx.engine.generate(
            request_id, list(req.token_ids), params, cache_salt=req.cache_salt, priority=req.priority))
        if req.stream:
            return EngineStreamResponse(self._stream(req, request_id, stream, params), stream, headers=SSE_HEADERS)
        final = await until_disconnect(request, last_output(stream))
        return JSONResponse(self._response(request_id, final, params))

    def _refuse_what_is_not_taken(self, req: GenerateRequest) -> None:
        for name in ("features", "kv_transfer_params"):
            if getattr(req, name):
                raise bad_request(f"{name}: deltaserve takes text prompts alone on one engine (no multimodal "
                                  "features, no disaggregated prefill)", name, "unsupported_value")
        if req.priority != 0 and getattr(self.ctx.engine, "scheduling_policy", "fcfs") != "priority":
            raise bad_request(f"priority={req.priority}: priority scheduling is not enabled (only 0 is taken): start "
                              "the server with --scheduling-policy priority", "priority", "unsupported_value")
        vocab = self.ctx.engine.vocab_size
        for i, token in enumerate(req.token_ids):
            if not 0 <= token < vocab:
                raise bad_request(f"token_ids[{i}]={token} is outside the vocabulary [0, {vocab})", "token_ids",
                                  "invalid_prompt")

    def _params(self, req: GenerateRequest) -> SamplingParams:
        params = sampling_params_from_json(req.sampling_params)
        engine = self.ctx.engine
        if engine.max_num_seqs is not None and params.n > engine.max_num_seqs:
            raise bad_request(f"sampling_params.n={params.n}: at most the server's max_num_seqs "
                              f"({engine.max_num_seqs})", "sampling_params.n", "invalid_value")
        asked = req.sampling_params.get("max_tokens")  # left out or null: what the context leaves, as vLLM's
        params.max_tokens = resolve_max_tokens(asked, len(req.token_ids), self.ctx.max_model_len, "token_ids",
                                               engine.sampling_defaults.get("max_tokens"), engine.max_tokens_cap)
        params.output_kind = RequestOutputKind.CUMULATIVE  # the stream's deltas are cut here
        return params

    def _response(self, request_id: str, final: RequestOutput, params: SamplingParams) -> dict[str, Any]:
        choices = [{"index": o.index, "logprobs": self._logprobs(o.token_ids, o.logprobs, params),
                    "finish_reason": o.finish_reason or "stop", "token_ids": list(o.token_ids),
                    "routed_experts": None} for o in final.outputs]
        return {"request_id": request_id, "choices": choices,
                "prompt_logprobs": prompt_logprobs_json(final.prompt_logprobs, self.token_text),
                "kv_transfer_params": None}

    def _logprobs(self, token_ids: list[int], entries: list[dict[int, Logprob]] | None,
                  params: SamplingParams) -> dict[str, Any] | None:
        """vLLM's chat shape with every token named by its id: each position's chosen token, and its first
        max(logprobs, 1) entries (the chosen one first, then the top ones) as its top_logprobs."""
        if params.logprobs is None or entries is None:
            return None
        shown = max(params.logprobs, 1)
        content = []
        for token, entry in zip(token_ids, entries):
            chosen = entry.get(token)
            if chosen is None:
                content.append({"token": f"token_id:{token}", "logprob": -9999.0, "bytes": None, "top_logprobs": []})
                continue
            top = [{"token": f"token_id:{tid}", "logprob": max(lp.logprob, -9999.0), "bytes": None}
                   for tid, lp in list(entry.items())[:shown]]
            content.append({"token": f"token_id:{token}", "logprob": max(chosen.logprob, -9999.0), "bytes": None,
                            "top_logprobs": top})
        return {"content": content}

    async def _stream(self, req: GenerateRequest, request_id: str, stream: RequestStream,
                      params: SamplingParams) -> AsyncIterator[str]:
        """A chunk for each step that gave a choice new tokens (its finish reason on its last); then the usage,
        where stream_options asks for it."""
        include_usage, continuous = stream_usage(req.stream_options, self.ctx.force_include_usage)
        sent: dict[int, int] = {}
        last = None
        try:
            async for output in stream:
                last = output
                for o in output.outputs:
                    chunk = self._chunk(request_id, o, sent.get(o.index, 0), params)
                    if chunk is None:
                        continue
                    sent[o.index] = len(o.token_ids)
                    if continuous:
                        chunk["usage"] = usage_dict(len(req.token_ids), len(o.token_ids), 0)
                    yield sse_data(chunk)
            if include_usage and last is not None:
                generated = sum(len(o.token_ids) for o in last.outputs)
                yield sse_data({"request_id": request_id, "choices": [],
                                "usage": usage_dict(len(req.token_ids), generated, last.num_cached_tokens)})
        except Exception as exc:  # engine gone or server stopping: end the stream with an error event
            yield sse_data(from_exception(exc).openai_body())
        finally:
            stream.close()
        yield DONE

    def _chunk(self, request_id: str, o: CompletionOutput, sent: int, params: SamplingParams) -> dict | None:
        new = list(o.token_ids[sent:])
        if not new:
            return None
        logprobs = self._logprobs(new, o.logprobs[sent:] if o.logprobs is not None else None, params)
        return {"request_id": request_id,
                "choices": [{"index": o.index, "logprobs": logprobs, "finish_reason": o.finish_reason,
                             "token_ids": new, "routed_experts": None}], "usage": None}
