"""POST /v1/completions: string or token-id prompts, one or many, with echo and logprobs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from deltaserve.engine.async_engine import AsyncEngine, RequestStream
from deltaserve.engine.queue_together import queue_together
from deltaserve.outputs import CompletionOutput, RequestOutput
from deltaserve.sampling_params import SamplingParams
from deltaserve.server.beam_search import start_beam_searches
from deltaserve.server.context import (
    ServerContext,
    last_output,
    merge_streams,
    random_id,
    read_json_object,
    stream_usage,
    until_disconnect,
    usage_dict,
)
from deltaserve.server.envelope import ChunkEvents, completion_envelope
from deltaserve.server.errors import bad_request, from_exception
from deltaserve.server.logprobs import TokenText, completion_logprobs, prompt_logprobs_json, token_label
from deltaserve.server.protocol import CompletionRequest
from deltaserve.server.sampling import (build_sampling_params, check_logprobs_field, check_structure,
                                       kept_prompt_tokens, refuse_unsupported, requested_structure,
                                       resolve_max_tokens, truncated_tokens)
from deltaserve.server.sse import DONE, SSE_HEADERS, sse_data
from deltaserve.server.streaming import EngineStreamResponse
from deltaserve.server.off_loop import off_loop


@dataclass
class _Prompt:
    text: str | None  # as given, for strings; None for token ids (decoded only for echo)
    token_ids: list[int]


def _split_prompts(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt", "invalid_prompt")
    if isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def _prompt_logprobs_asked(req: CompletionRequest) -> int | None:
    """The top prompt logprobs the engine computes: vLLM's prompt_logprobs, and echo's (its logprobs) with it."""
    asked = [k for k in (req.prompt_logprobs, req.logprobs if req.echo else None) if k is not None]
    return (-1 if -1 in asked else max(asked)) if asked else None  # -1: the whole vocabulary


class Completions:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.token_text = TokenText(ctx.tokenizer)

    def _tokenize(self, prompt: str | list[int], add_special_tokens: bool) -> _Prompt:
        if isinstance(prompt, str):
            if not prompt:
                raise bad_request("prompt must not be an empty string", "prompt", "invalid_prompt")
            return _Prompt(prompt, self.ctx.tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
        if not prompt:
            raise bad_request("a token-id prompt must not be empty", "prompt", "invalid_prompt")
        return _Prompt(None, list(prompt))

    def _prompts(self, prompt, add_special_tokens: bool) -> list[_Prompt]:
        """The request's prompts as token ids (off the event loop, as a chat's template: a long prompt's tokens
        take a while, and every stream would wait), their ids checked against the vocabulary."""
        prompts = [self._tokenize(p, add_special_tokens) for p in _split_prompts(prompt)]
        _check_vocabulary(prompts, self.ctx.engine)
        return prompts

    def _text_ids(self, prompt: _Prompt, specials: bool) -> list[int] | None:
        """A text prompt's own tokens where special tokens were added around them (truncated_tokens keeps those)."""
        if prompt.text is None or not specials:
            return None
        return self.ctx.tokenizer.encode(prompt.text, add_special_tokens=False)

    async def __call__(self, request: Request):
        req = CompletionRequest.model_validate(await read_json_object(request))
        model, prompts, params = await self.prepare(req)
        base_id = random_id("cmpl-")
        if req.use_beam_search:
            started = start_beam_searches(self.ctx.engine, base_id, prompts, params, req)
        else:
            started = submit_prompts(self.ctx.engine, base_id, prompts, params, req.cache_salt, req.priority)
        streams = await until_disconnect(request, started)
        job = _CompletionJob(self, req, model, base_id, prompts)
        if req.stream:
            return EngineStreamResponse(job.stream(streams), streams, headers=SSE_HEADERS)
        finals = await until_disconnect(request, asyncio.gather(*(last_output(s) for s in streams)))
        return JSONResponse(job.response(finals))

    async def prepare(self, req: CompletionRequest) -> tuple[str, list[_Prompt], list[SamplingParams]]:
        """Checks and tokenizes a completion request: the model's name, each prompt and its sampling params (what
        the render route returns, and the route queues)."""
        model = self.ctx.check_model(req.model)
        refuse_unsupported(req, self.ctx.engine)
        if req.logprobs is not None:
            check_logprobs_field("logprobs", req.logprobs, self.ctx.engine)
        self.ctx.admit()
        # checked before any is queued: one bad id refuses them all at once
        # vLLM's default: a completion's prompt string gets the tokenizer's special tokens (a BOS)
        prompts = await off_loop(self.ctx.engine, self._prompts, req.prompt, req.add_special_tokens is not False)
        keep = kept_prompt_tokens(req.truncate_prompt_tokens, self.ctx.max_model_len, req.max_tokens)
        # a truncated prompt's text is what its kept tokens decode to (for echo)
        prompts = [p if len(p.token_ids) <= (keep or len(p.token_ids))
                   else _Prompt(None, truncated_tokens(p.token_ids, keep, req.truncation_side,
                                                       self._text_ids(p, req.add_special_tokens is not False)))
                   for p in prompts]
        # echo with max_tokens 0 scores the prompt (its logprobs) and generates nothing: the engine samples one
        # token, which the response leaves out
        requested = 1 if _scores_only(req) else req.max_tokens
        structure = requested_structure(req)
        await check_structure(self.ctx.engine, structure,
                              "structured_outputs" if req.structured_outputs is not None else "response_format")
        params = []
        for p in prompts:
            max_tokens = resolve_max_tokens(requested, len(p.token_ids), self.ctx.max_model_len, "prompt",
                                            cap=self.ctx.engine.max_tokens_cap)
            params.append(build_sampling_params(req, max_tokens=max_tokens, logprobs=req.logprobs,
                                                prompt_logprobs=_prompt_logprobs_asked(req),
                                                defaults=self.ctx.engine.sampling_defaults))
            params[-1].structured_outputs = structure
        return model, prompts, params


async def submit_prompts(engine: AsyncEngine, base_id: str, prompts: list[_Prompt], params: list,
                         cache_salt: str | None, priority: int = 0) -> list[RequestStream]:
    """Queues every prompt of a completion at once (async_engine.queue_together), the queue checked once for the
    request, not once per prompt."""
    engine.check_admission()
    return await queue_together(engine, [(f"{base_id}-{k}", p.token_ids, sp,
                                          dict(prompt_text=p.text, cache_salt=cache_salt, priority=priority))
                                         for k, (p, sp) in enumerate(zip(prompts, params))])


def _check_vocabulary(prompts: list[_Prompt], engine: AsyncEngine) -> None:
    """Token-id prompts hold ids of the vocabulary (the engine checks each as it takes it, by which time the
    others of the request are queued and running)."""
    vocab = getattr(getattr(getattr(engine, "engine", None), "model_config", None), "vocab_size", None)
    for p in prompts:
        if p.text is None and vocab is not None:
            low, high = min(p.token_ids), max(p.token_ids)
            if low < 0 or high >= vocab:
                raise bad_request(f"token id {low if low < 0 else high} is outside the vocabulary [0, {vocab})",
                                  "prompt", "invalid_prompt")


def _scores_only(req: CompletionRequest) -> bool:
    return req.echo and req.max_tokens == 0


class _CompletionJob:
    def __init__(self, api: Completions, req: CompletionRequest, model: str, request_id: str, prompts: list[_Prompt]):
        self.api = api
        self.req = req
        self.scores_only = _scores_only(req)
        self.model = model
        self.request_id = request_id
        self.created = int(time.time())
        self._chunk = ChunkEvents(self, "text_completion")
        self.prompts = prompts
        self.as_ids = api.ctx.tokens_as_ids(req)  # its logprobs name tokens "token_id:ID"

    def _echo_text(self, k: int) -> str:
        p = self.prompts[k]
        if p.text is None:
            p.text = self.api.ctx.tokenizer.decode(p.token_ids, skip_special_tokens=False)
        return p.text

    def _logprobs(self, o: CompletionOutput, start: int, end: int, text_offset: int) -> dict | None:
        if self.req.logprobs is None or o.logprobs is None or self.scores_only:
            return None
        return completion_logprobs(o.token_ids[start:end], o.logprobs[start:end], self.req.logprobs,
                                   self.api.token_text, text_offset, self.as_ids)

    def _prompt_logprobs(self, output: RequestOutput) -> dict | None:
        """With echo: the prompt's tokens in the legacy logprobs shape (the first token has none)."""
        if self.req.logprobs is None or not output.prompt_logprobs:
            return None
        ids = output.prompt_token_ids
        first = self.api.token_text(ids[0])
        rest = completion_logprobs(ids[1:], output.prompt_logprobs[1:], self.req.logprobs, self.api.token_text,
                                   len(first), self.as_ids)
        return {"tokens": [token_label(ids[0], first, self.as_ids)] + rest["tokens"],
                "token_logprobs": [None] + rest["token_logprobs"], "top_logprobs": [None] + rest["top_logprobs"],
                "text_offset": [0] + rest["text_offset"]}

    def _prompt_end(self, output: RequestOutput, echoed: dict) -> int:
        """Where the echoed prompt's token texts end (its last offset and last text): a whole reply's output
        offsets go on from there, as vLLM's one run of offsets over the prompt and the output."""
        token, entry = output.prompt_token_ids[-1], output.prompt_logprobs[-1]
        return echoed["text_offset"][-1] + len(self.api.token_text(token, entry.get(token) if entry else None))

    def _usage(self, outputs: list[RequestOutput]) -> dict:
        return usage_dict(
            sum(len(r.prompt_token_ids) for r in outputs),
            0 if self.scores_only else sum(len(o.token_ids) for r in outputs for o in r.outputs),
            sum(r.num_cached_tokens for r in outputs),
        )

    def response(self, finals: list[RequestOutput]) -> dict:
        choices = []
        for k, output in enumerate(finals):
            prefix = self._echo_text(k) if self.req.echo else ""
            echoed = self._prompt_logprobs(output) if self.req.echo else None
            start = self._prompt_end(output, echoed) if echoed is not None else len(prefix)
            for o in sorted(output.outputs, key=lambda o: o.index):
                text, finish_reason, stop_reason = self._generated(o, o.text)
                choices.append(
                    {
                        "index": k * self.req.n + o.index,
                        "text": prefix + text,
                        "logprobs": _joined(echoed, self._logprobs(o, 0, len(o.token_ids), start)),
                        "finish_reason": finish_reason,
                        "stop_reason": stop_reason,
                    }
                )
                if self.req.return_token_ids:  # vLLM's: on each choice, the prompt's ids with the choice's own
                    choices[-1]["prompt_token_ids"] = list(output.prompt_token_ids)
                    choices[-1]["token_ids"] = [] if self.scores_only else list(o.token_ids)
                if self.req.prompt_logprobs is not None:
                    choices[-1]["prompt_logprobs"] = prompt_logprobs_json(output.prompt_logprobs,
                                                                          self.api.token_text)
        return completion_envelope(self, "text_completion", choices, self._usage(finals))

    def _generated(self, o: CompletionOutput, text: str) -> tuple[str, str | None, int | str | None]:
        """A choice's new text, finish reason and stop reason; none of the one token that scoring samples."""
        if self.scores_only:
            return "", None if o.finish_reason is None else "length", None
        return text, o.finish_reason, o.stop_reason

    def _echo_chunks(self, k: int, logprobs: dict | None, text_offset: list[int]) -> list[str]:
        echo, n = self._echo_text(k), self.req.n
        chunks = []
        for i in range(n):
            text_offset[k * n + i] = len(echo)
            chunks.append(self._chunk([{"index": k * n + i, "text": echo, "logprobs": logprobs, "finish_reason": None}]))
        return chunks

    async def stream(self, streams: list[RequestStream]) -> AsyncIterator[str]:
        n = self.req.n
        total = len(streams) * n
        sent_chars = [0] * total
        sent_tokens = [0] * total
        text_offset = [0] * total
        done = [False] * total
        ids_opened = [False] * total  # return_token_ids: whether a choice's prompt ids were sent
        lasts: dict[int, RequestOutput] = {}
        include_usage, continuous = stream_usage(self.req.stream_options, self.api.ctx.force_include_usage)
        try:
            # With logprobs the echo waits for the prefill, which yields the prompt's logprobs.
            echo_first = self.req.echo and self.req.logprobs is None
            if echo_first:
                for k in range(len(streams)):
                    for chunk in self._echo_chunks(k, None, text_offset):
                        yield chunk
            async for k, output in merge_streams(streams):
                if self.req.echo and not echo_first and k not in lasts:
                    for chunk in self._echo_chunks(k, self._prompt_logprobs(output), text_offset):
                        yield chunk
                lasts[k] = output
                for o in output.outputs:
                    c = k * n + o.index
                    if done[c]:
                        continue
                    text, finish_reason, stop_reason = self._generated(o, o.text[sent_chars[c]:])
                    sent_chars[c] = len(o.text)
                    logprobs = self._logprobs(o, sent_tokens[c], len(o.token_ids), text_offset[c])
                    new_ids = [] if self.scores_only else o.token_ids[sent_tokens[c]:]
                    sent_tokens[c] = len(o.token_ids)
                    text_offset[c] += len(text)
                    finished = finish_reason is not None
                    if text or finished or (new_ids and self.req.return_token_ids) or (logprobs and logprobs["tokens"]):
                        # vLLM's continuous usage: the chunk's prompt and its choice's tokens so far
                        usage = usage_dict(len(output.prompt_token_ids), 0 if self.scores_only else len(o.token_ids),
                                           output.num_cached_tokens) if continuous else None
                        choice = {"index": c, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
                                  "stop_reason": stop_reason}
                        if self.req.return_token_ids:  # vLLM's: the prompt's ids with a choice's first chunk
                            if not ids_opened[c]:
                                choice["prompt_token_ids"] = list(output.prompt_token_ids)
                                ids_opened[c] = True
                            choice["token_ids"] = list(new_ids)
                        yield self._chunk([choice], usage=usage)
                    done[c] = finished
            if include_usage and lasts:
                yield self._chunk([], usage=self._usage([lasts[k] for k in sorted(lasts)]))
        except Exception as exc:
            yield sse_data(from_exception(exc).openai_body())
        finally:
            for s in streams:
                s.close()
        yield DONE


def _joined(first: dict | None, second: dict | None) -> dict | None:
    """Two legacy logprobs objects one after the other (the echoed prompt, then the completion)."""
    if first is None or second is None:
        return second if first is None else first
    return {key: first[key] + second[key] for key in first}
