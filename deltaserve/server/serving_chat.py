"""POST /v1/chat/completions."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from deltaserve.engine.async_engine import AsyncEngine, RequestStream
from deltaserve.outputs import CompletionOutput, RequestOutput
from deltaserve.sampling_params import SamplingParams, StructuredOutputsParams
from deltaserve.server.beam_search import beam_search_params, start_beam_search
from deltaserve.server.chat_prompt import (
    ChatPrompt,
    check_rendering_fields,
    check_roles,
    check_tool_names,
    message_text,
    openai_messages_for_template,
    openai_tools_for_template,
    render_chat,
    tool_schemas,
)
from deltaserve.server.context import (ServerContext, last_output, random_id, read_json_object, stream_usage,
                                      until_disconnect, usage_dict)
from deltaserve.server.envelope import ChunkEvents, completion_envelope
from deltaserve.server.errors import bad_request, from_exception
from deltaserve.server.forced_tool_calls import ForcedToolCalls, demanded_call_structure
from deltaserve.server.logprobs import TokenText, chat_logprobs, prompt_logprobs_json
from deltaserve.server.output_parser import ChoiceDelta, ChoiceParser
from deltaserve.server.protocol import ChatCompletionRequest
from deltaserve.server.sampling import (build_sampling_params, check_logprobs_field, check_structure,
                                       kept_prompt_tokens, refuse_unsupported, requested_structure,
                                       resolve_max_tokens, truncated_tokens)
from deltaserve.server.sse import DONE, SSE_HEADERS, sse_data
from deltaserve.server.streaming import EngineStreamResponse
from deltaserve.server.tool_parsers import ToolCall
from deltaserve.server.off_loop import off_loop


def _select_tools(req: ChatCompletionRequest, exclude_when_none: bool) -> tuple[list[dict] | None, list[dict] | None]:
    """(the tools the template shows the model, those the reply is read for calls to). tool_choice "none" reads
    the reply for none; the template shows them all the same, as vLLM's does unless its
    --exclude-tools-when-tool-choice-none. A template that never reads them drops them: the model then calls
    none, as "auto" allows (a demanded call is held to their schemas all the same)."""
    tools = openai_tools_for_template(req.tools)
    if req.tool_choice != "none":
        return tools, tools
    return (None if exclude_when_none else tools), None


def call_cap(parallel_tool_calls: bool | None, max_tool_calls: int | None = None) -> int | None:
    """The most tool calls a reply may make: one where parallel calls are off (OpenAI's parallel_tool_calls
    false), at most Responses' max_tool_calls, else any number (None)."""
    caps = [cap for cap in (1 if parallel_tool_calls is False else None, max_tool_calls) if cap is not None]
    return min(caps, default=None)


def _demanded_call(req: ChatCompletionRequest) -> tuple[bool, str | None]:
    """(whether the request demands a tool call, the function it names or None for any)."""
    choice = req.tool_choice
    if choice is None or choice in ("none", "auto"):
        return False, None
    return True, None if choice == "required" else choice.function.name


def _response_role(req: ChatCompletionRequest, default: str) -> str:
    """vLLM's rule: the server's response role (--response-role) where the prompt opens a new turn, else the
    role of the last message, which the reply goes on writing."""
    return default if req.add_generation_prompt else req.messages[-1].role


def _echoed(req: ChatCompletionRequest, role: str) -> str:
    """With echo, the text the reply starts with: the last message's, where it is of the reply's role (vLLM's
    rule), as the prompt holds it."""
    last = req.messages[-1]
    if not req.echo or last.role != role:
        return ""
    return message_text(last.content, f"messages.{len(req.messages) - 1}.content", ("text", "refusal"))


def _prompt_logprobs(req: ChatCompletionRequest) -> int | None:
    """The prompt logprobs a reply carries: its own prompt_logprobs, or with echo (vLLM's rule) as many a token
    as top_logprobs asks. A stream carries none."""
    if req.prompt_logprobs is not None or not req.echo or req.stream:
        return req.prompt_logprobs
    return req.top_logprobs


def _output_structure(req: ChatCompletionRequest, tools: list[dict], opens_reasoning: bool, max_calls: int | None
                      ) -> tuple[StructuredOutputsParams | None, str]:
    """What the output must match, and the request field that asks it: a demanded tool call
    (forced_tool_calls.py; its array of one call where max_calls is 1, the calls past a larger cap dropped as
    they are read), response_format or structured_outputs, one of them."""
    given = requested_structure(req, opens_reasoning)
    demanded, name = _demanded_call(req)
    if not demanded:
        return given, "structured_outputs" if req.structured_outputs is not None else "response_format"
    if given is not None:
        raise bad_request("a demanded tool call constrains the output, as response_format and structured_outputs "
                          "do: give one", "tool_choice", "invalid_value")
    return demanded_call_structure(tool_schemas(tools), name, max_calls != 1, opens_reasoning), "tool_choice"


def _check_chat_ranges(req: ChatCompletionRequest, engine: AsyncEngine) -> None:
    """The ranges of chat's own names for what SamplingParams calls max_tokens and logprobs, so that the error
    names the field the request used."""
    if req.max_completion_tokens is not None and req.max_completion_tokens < 1:
        raise bad_request(f"max_completion_tokens={req.max_completion_tokens}: must be at least 1",
                          "max_completion_tokens", "invalid_value")
    if req.top_logprobs is not None:
        check_logprobs_field("top_logprobs", req.top_logprobs, engine)


def _tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    if index is not None:
        out["index"] = index
    return out


class ChatCompletions:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.token_text = TokenText(ctx.tokenizer)

    def _truncated(self, prompt: ChatPrompt, keep: int | None, side: str | None, specials: bool) -> ChatPrompt:
        """The rendered prompt's last `keep` tokens (vLLM's truncate_prompt_tokens), or its first with truncation_side
        "right", its capture points moved with them; the whole prompt where keep is None or covers it. `specials`:
        the tokenizer's special tokens were added around the text (they stay, as truncated_tokens keeps them)."""
        cut = len(prompt.token_ids) - keep if keep is not None else 0
        if cut <= 0:
            return prompt
        text_ids = self.ctx.tokenizer.encode(prompt.text, add_special_tokens=False) if specials else None
        kept = truncated_tokens(prompt.token_ids, keep, side, text_ids)
        if side == "right":  # the same positions: those past the kept tokens go
            points = [p for p in prompt.capture_points or [] if p <= keep]
        else:
            points = [p - cut for p in prompt.capture_points or [] if p > cut]
        return dataclasses.replace(prompt, token_ids=kept, capture_points=points,
                                   text=self.ctx.tokenizer.decode(kept, skip_special_tokens=False))

    async def __call__(self, request: Request):
        body = await read_json_object(request)
        req = ChatCompletionRequest.model_validate(body)
        job, stream = await self.submit(req, "chatcmpl-")
        if req.stream:
            return EngineStreamResponse(job.stream(stream), stream, headers=SSE_HEADERS)
        final = await until_disconnect(request, last_output(stream))
        return JSONResponse(job.response(final))

    async def submit(self, req: ChatCompletionRequest, id_prefix: str, max_tool_calls: int | None = None
                     ) -> tuple[ChatJob, RequestStream]:
        """Checks, renders and queues a chat request (the Responses route's too, translated into one, with its
        max_tool_calls): its output shaping and its stream."""
        job, prompt, params = await self.prepare(req, id_prefix, max_tool_calls)
        if getattr(req, "use_beam_search", False):
            stream = await start_beam_search(self.ctx.engine, job.request_id, prompt.token_ids, prompt.text, params,
                                             beam_search_params(req, params), req.cache_salt, req.priority)
        else:
            stream = await self.ctx.engine.generate(
                job.request_id, prompt.token_ids, params, prompt_text=prompt.text,
                capture_points=prompt.capture_points, cache_salt=req.cache_salt, priority=req.priority
            )
        return job, stream

    async def prepare(self, req: ChatCompletionRequest, id_prefix: str, max_tool_calls: int | None = None
                      ) -> tuple[ChatJob, ChatPrompt, SamplingParams]:
        """Checks and renders a chat request: its output shaping, its prompt and its sampling params (what the
        render route returns, and submit queues)."""
        model = self.ctx.check_model(req.model)
        refuse_unsupported(req, self.ctx.engine)
        check_tool_names([t.function.name for t in req.tools or ()], "tools.{i}.function.name")
        if req.top_logprobs and not req.logprobs:  # OpenAI's rule: the top ones come with the chosen one's
            raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs", "invalid_value")
        _check_chat_ranges(req, self.ctx.engine)
        self.ctx.admit()
        shown, tools = _select_tools(req, self.ctx.exclude_tools_when_tool_choice_none)
        check_roles(req.messages)
        messages = openai_messages_for_template(req.messages)
        check_rendering_fields(self.ctx, req.continue_final_message, req.add_generation_prompt, req.chat_template)
        variables = self.ctx.template_kwargs(req.chat_template_kwargs, req.reasoning_effort)
        if req.documents is not None:  # as vLLM hands them
            variables["documents"] = req.documents
        prompt = await off_loop(self.ctx.engine, functools.partial(
            render_chat, self.ctx.tokenizer, messages, shown, variables, add_generation_prompt=req.add_generation_prompt,
            continue_final=req.continue_final_message, chat_template=req.chat_template))
        if req.add_special_tokens:  # vLLM's: the tokenizer's own on top of what the template writes
            prompt = dataclasses.replace(prompt, capture_points=None,  # the prefix the ids add moves every turn
                                         token_ids=self.ctx.tokenizer.encode(prompt.text, add_special_tokens=True))
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        keep = kept_prompt_tokens(req.truncate_prompt_tokens, self.ctx.max_model_len, requested)
        prompt = self._truncated(prompt, keep, req.truncation_side, req.add_special_tokens)
        defaults = self.ctx.engine.sampling_defaults
        max_tokens = resolve_max_tokens(requested, len(prompt.token_ids), self.ctx.max_model_len, "messages",
                                        defaults.get("max_tokens"), self.ctx.engine.max_tokens_cap)
        top = (req.top_logprobs or 0) if req.logprobs else None
        params = build_sampling_params(req, max_tokens=max_tokens, logprobs=top,
                                       prompt_logprobs=_prompt_logprobs(req), defaults=defaults)
        max_calls = call_cap(req.parallel_tool_calls, max_tool_calls)
        params.structured_outputs, field = _output_structure(req, tools, prompt.opens_reasoning, max_calls)
        await check_structure(self.ctx.engine, params.structured_outputs, field)
        request_id = random_id(id_prefix)
        return ChatJob(self, req, model, request_id, prompt, tools, max_calls), prompt, params


class ChatJob:
    """One chat request's output shaping, streamed or whole."""

    def __init__(self, api: ChatCompletions, req: ChatCompletionRequest, model: str, request_id: str,
                 prompt: ChatPrompt, tools: list[dict] | None, max_calls: int | None = None):
        self.api = api
        self.req = req
        self.model = model
        self.request_id = request_id
        self.created = int(time.time())
        self._chunk = ChunkEvents(self, "chat.completion.chunk")
        self.prompt = prompt
        self.schemas = tool_schemas(tools)
        self.top = (req.top_logprobs or 0) if req.logprobs else None
        self.as_ids = api.ctx.tokens_as_ids(req)  # its logprobs name tokens "token_id:ID"
        self.demanded, self.demanded_name = _demanded_call(req)
        self.max_calls = max_calls
        self.role = _response_role(req, api.ctx.response_role)
        self.echoed = _echoed(req, self.role)

    def parser(self) -> ChoiceParser:
        return ChoiceParser(
            reasoning=bool(self.api.ctx.reasoning),
            start_in_reasoning=self.prompt.opens_reasoning,
            tool_schemas=self.schemas,
            forced=ForcedToolCalls(self.demanded_name) if self.demanded else None,
            max_calls=self.max_calls,
            tool_format=self.api.ctx.tool_format,
        )

    def _finish_reason(self, reason: str | None, calls: int) -> str | None:
        """"tool_calls" where the choice called tools, except a named function's call (OpenAI's "stop" there) and a
        call the length cut short ("length")."""
        return "tool_calls" if calls and self.demanded_name is None and reason != "length" else reason

    def _usage(self, output: RequestOutput) -> dict:
        return usage_dict(
            len(output.prompt_token_ids), sum(len(o.token_ids) for o in output.outputs), output.num_cached_tokens
        )

    def logprobs(self, o: CompletionOutput, start: int, end: int) -> dict | None:
        """The chat shape of tokens start:end's logprobs; None where the request asks for none."""
        if self.top is None or o.logprobs is None:
            return None
        return chat_logprobs(o.token_ids[start:end], o.logprobs[start:end], self.top, self.api.token_text,
                             self.as_ids)

    # ---- whole response ---------------------------------------------------------------------

    def parsed(self, text: str) -> ChoiceDelta:
        """A whole reply's text as reasoning, content and tool calls."""
        parser = self.parser()
        parsed = parser.feed(text)
        parsed.extend(parser.finish())
        return parsed

    def response(self, output: RequestOutput) -> dict:
        choices = []
        for o in sorted(output.outputs, key=lambda o: o.index):
            parsed = self.parsed(o.text)
            message: dict[str, Any] = {"role": self.role, "content": self.echoed + parsed.content}
            if parsed.reasoning and self.req.include_reasoning:  # under vLLM's name and DeepSeek's, which clients read
                message["reasoning"] = message["reasoning_content"] = parsed.reasoning
            finish_reason = self._finish_reason(o.finish_reason, len(parsed.tool_calls))
            if parsed.tool_calls:
                message["tool_calls"] = [_tool_call_json(c) for c in parsed.tool_calls]
                message["content"] = self.echoed + parsed.content or None
            choices.append(
                {
                    "index": o.index,
                    "message": message,
                    "logprobs": self.logprobs(o, 0, len(o.token_ids)),
                    "finish_reason": finish_reason,
                    "stop_reason": o.stop_reason,
                }
            )
            if self.req.return_token_ids:  # vLLM's: each choice's ids, the prompt's on the reply
                choices[-1]["token_ids"] = list(o.token_ids)
        payload = completion_envelope(self, "chat.completion", choices, self._usage(output))
        if self.req.return_token_ids:
            payload["prompt_token_ids"] = list(self.prompt.token_ids)
        if _prompt_logprobs(self.req) is not None:
            payload["prompt_logprobs"] = prompt_logprobs_json(output.prompt_logprobs, self.api.token_text)
        return payload

    # ---- streamed response ------------------------------------------------------------------

    def _delta_json(self, delta: ChoiceDelta, tool_index: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if delta.reasoning:
            out["reasoning"] = out["reasoning_content"] = delta.reasoning
        if delta.content:
            out["content"] = delta.content
        if delta.tool_calls:
            out["tool_calls"] = [_tool_call_json(c, tool_index + k) for k, c in enumerate(delta.tool_calls)]
        return out or {"content": ""}  # a chunk of logprobs alone (its text held): vLLM's empty content

    def _add_token_ids(self, choice: dict, o: Any, sent: int) -> int:
        """With return_token_ids, the choice's token ids not sent yet go in this chunk: how many are sent now."""
        if not self.req.return_token_ids:
            return sent
        choice["token_ids"] = list(o.token_ids[sent:])
        return len(o.token_ids)

    async def stream(self, stream: RequestStream) -> AsyncIterator[str]:
        n = self.req.n
        parsers = [self.parser() for _ in range(n)]
        sent_chars = [0] * n
        sent_tokens = [0] * n
        tools_sent = [0] * n
        sent_ids = [0] * n  # return_token_ids: each choice's token ids sent so far
        done = [False] * n
        include_usage, continuous = stream_usage(self.req.stream_options, self.api.ctx.force_include_usage)

        def so_far(tokens: int, cached: int = 0) -> dict | None:
            """vLLM's continuous usage: each chunk counts its choice's tokens so far."""
            return usage_dict(len(self.prompt.token_ids), tokens, cached) if continuous else None

        last = None
        try:
            # vLLM's return_token_ids: the prompt's ids on the first chunk, each choice's new ones on its chunks
            yield self._chunk(
                [{"index": i, "delta": {"role": self.role, "content": ""}, "logprobs": None, "finish_reason": None}
                 for i in range(n)], usage=so_far(0),
                extra={"prompt_token_ids": list(self.prompt.token_ids)} if self.req.return_token_ids else None
            )
            if self.echoed:
                for i in range(n):
                    yield self._chunk([{"index": i, "delta": {"content": self.echoed}, "logprobs": None,
                                        "finish_reason": None}], usage=so_far(0))
            async for output in stream:
                last = output
                for o in output.outputs:
                    i = o.index
                    if done[i]:
                        continue
                    delta = parsers[i].feed(o.text[sent_chars[i]:])
                    sent_chars[i] = len(o.text)
                    logprobs = self.logprobs(o, sent_tokens[i], len(o.token_ids))
                    sent_tokens[i] = len(o.token_ids)
                    if o.finish_reason is not None:
                        delta.extend(parsers[i].finish())
                    # vLLM's include_reasoning false: the reasoning is left out, and a chunk of it alone not sent
                    dropped = not self.req.include_reasoning and bool(delta.reasoning)
                    if dropped:
                        delta.reasoning = ""
                    if delta or (logprobs and logprobs["content"] and not dropped):
                        choice = {"index": i, "delta": self._delta_json(delta, tools_sent[i]), "logprobs": logprobs,
                                  "finish_reason": None}
                        sent_ids[i] = self._add_token_ids(choice, o, sent_ids[i])
                        yield self._chunk([choice], usage=so_far(len(o.token_ids), output.num_cached_tokens))
                        tools_sent[i] += len(delta.tool_calls)
                    if o.finish_reason is not None:
                        done[i] = True
                        reason = self._finish_reason(o.finish_reason, tools_sent[i])
                        choice = {"index": i, "delta": {}, "logprobs": None, "finish_reason": reason,
                                  "stop_reason": o.stop_reason}
                        sent_ids[i] = self._add_token_ids(choice, o, sent_ids[i])  # those no text chunk carried
                        yield self._chunk([choice], usage=so_far(len(o.token_ids), output.num_cached_tokens))
            if include_usage and last is not None:
                yield self._chunk([], usage=self._usage(last))
        except Exception as exc:  # engine gone or server stopping: end the stream with an error event
            yield sse_data(from_exception(exc).openai_body())
        finally:
            stream.close()
        yield DONE
