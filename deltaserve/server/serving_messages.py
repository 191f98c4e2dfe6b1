"""POST /v1/messages (the Anthropic Messages API) and /v1/messages/count_tokens."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from deltaserve.engine.async_engine import RequestStream
from deltaserve.errors import InvalidSamplingParamsError
from deltaserve.outputs import CompletionOutput, RequestOutput
from deltaserve.sampling_params import SamplingParams, StructuredOutputsParams
from deltaserve.server.anthropic_protocol import (AnthropicMessage, AnthropicOutputConfig, AnthropicThinking,
                                                 AnthropicTool, CountTokensRequest, MessagesRequest)
from deltaserve.server.chat_prompt import (ChatPrompt, check_tool_names, message_content, message_text, render_chat,
                                           tool_schemas)
from deltaserve.server.context import ServerContext, last_output, random_id, read_json_object, until_disconnect
from deltaserve.server.errors import bad_request, from_exception, require_fields
from deltaserve.server.forced_tool_calls import ForcedToolCalls, demanded_call_structure
from deltaserve.server.output_parser import ChoiceDelta, ChoiceParser
from deltaserve.server.reasoning import THINK_CLOSE
from deltaserve.server.sampling import check_structure, resolve_max_tokens
from deltaserve.server.sse import SSE_HEADERS, sse_event
from deltaserve.server.streaming import EngineStreamResponse
from deltaserve.server.tool_parsers import ToolCall, new_tool_call_id, written_json_value
from deltaserve.server.off_loop import off_loop

BILLING_HEADER = "x-anthropic-billing-header"


def anthropic_messages_for_template(system: Any, messages: list[AnthropicMessage]) -> list[dict]:
    """As vLLM converts them: the system blocks' texts joined as one (less a billing header, which a client may
    send with a hash of each request in it, so that a cached prefix would never match), a message's text blocks as
    its parts (the template reads them as chat's: chat_content_format), a tool result's texts joined by newlines."""
    out: list[dict] = []
    if system:
        system_text = system if isinstance(system, str) else "".join(
            part["text"] for part in message_content(system, "system") if not part["text"].startswith(BILLING_HEADER))
        out.append({"role": "system", "content": system_text})
    for i, msg in enumerate(messages):
        if isinstance(msg.content, str):
            out.append({"role": msg.role, "content": msg.content})
            continue
        texts, calls, results, thinking = [], [], [], []
        for j, block in enumerate(msg.content):
            where = f"messages.{i}.content.{j}"
            if block.type == "text":
                texts += message_content([block], where) if block.text != "" else []  # no empty part, as vLLM's
            elif block.type == "tool_use" and msg.role == "assistant":
                require_fields(block, ("id", "name"), f"{block.type} block", where)
                calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": block.input or {}}})
            elif block.type == "tool_result" and msg.role == "user":
                require_fields(block, ("tool_use_id",), f"{block.type} block", where)
                text = message_text(block.content, where)
                results.append({"role": "tool", "tool_call_id": block.tool_use_id,
                                "content": f"Error: {text}" if block.is_error else text})
            elif block.type in ("thinking", "redacted_thinking") and msg.role == "assistant":
                thinking.append(block.thinking or "")
            else:
                article = "an" if msg.role == "assistant" else "a"
                raise bad_request(f"content block of type {block.type!r} is not supported in {article} {msg.role} "
                                  "message", where)
        if msg.role == "user":
            out.extend(results)
            if texts or not results:
                out.append({"role": "user", "content": texts})
        else:
            entry: dict[str, Any] = {"role": "assistant", "content": texts or None}
            if calls:
                entry["tool_calls"] = calls
            if thinking:
                entry["reasoning_content"] = "".join(thinking)
            out.append(entry)
    return out


def anthropic_tools_for_template(tools: list[AnthropicTool] | None, choice: Any,
                                 exclude_when_none: bool = False) -> tuple[list[dict] | None, list[dict] | None]:
    """(the tools the template shows the model, those the reply is read for calls to), as chat's with the
    choice vLLM maps Anthropic's to: "none" reads the reply for none and shows the tools all the same (unless
    --exclude-tools-when-tool-choice-none). Refused, as Anthropic refuses them: a choice without tools, a choice
    of type "tool" without a name or naming no tool given, Anthropic's server tools (they run on its side), two
    tools of one name, and an input schema of a type other than object (one that names none is an object's, as
    vLLM reads it)."""
    _check_tool_choice(tools, choice)
    for i, tool in enumerate(tools or ()):
        _check_tool(tool, f"tools.{i}")
    check_tool_names([t.name for t in tools or ()], "tools.{i}.name")
    if not tools:
        return None, None
    shown = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": {"type": "object", **t.input_schema}}} for t in tools]
    if choice is not None and choice.type == "none":
        return (None if exclude_when_none else shown), None
    return shown, shown


def _check_tool_choice(tools: list[AnthropicTool] | None, choice: Any) -> None:
    if choice is None or choice.type == "none":
        return
    if not tools:
        raise bad_request("tool_choice needs tools", "tool_choice")
    if choice.type != "tool":
        return
    if choice.name is None:
        raise bad_request("tool_choice.name: a tool_choice of type 'tool' needs the name of the tool to use",
                          "tool_choice.name")
    if choice.name not in {t.name for t in tools}:
        raise bad_request(f"tool_choice.name: {choice.name!r} is not among the tools", "tool_choice.name")


def _check_tool(tool: AnthropicTool, where: str) -> None:
    if tool.type not in (None, "custom"):
        raise bad_request(f"{where}.type: tool of type {tool.type!r} is not supported: only tools the client runs "
                          "(custom)", f"{where}.type")
    kind = tool.input_schema.get("type", "object")
    if kind != "object":  # a tool's input is a JSON object (tool_use's input)
        raise bad_request(f"{where}.input_schema.type: must be 'object', not {kind!r}: a tool's input is an object",
                          f"{where}.input_schema.type")


def _thinking_template_kwargs(thinking: AnthropicThinking | None) -> dict | None:
    """Extended thinking "enabled" or "disabled" as the template variable Qwen3's templates open or close their
    think block by; "adaptive" leaves the template's own choice."""
    if thinking is None or thinking.type == "adaptive":
        return None
    return {"enable_thinking": thinking.type == "enabled"}


def _thinking_budget(thinking: AnthropicThinking | None, max_tokens: int, engine: Any) -> int | None:
    """The thinking_token_budget that "enabled" thinking asks, checked as Anthropic checks it: a budget that
    max_tokens, which counts the thinking too, exceeds. A model without think tokens thinks none, within any
    budget, so it takes none."""
    if thinking is None or thinking.type != "enabled":
        return None
    budget = thinking.budget_tokens
    if budget is None:
        raise bad_request("thinking.budget_tokens: thinking of type 'enabled' needs a budget of thinking tokens",
                          "thinking.budget_tokens")
    if not 0 <= budget < max_tokens:
        raise bad_request(f"thinking.budget_tokens: {budget} must be at least 0 and less than max_tokens "
                          f"({max_tokens}), which counts the thinking too", "thinking.budget_tokens")
    return budget if getattr(engine, "think_tags", None) is not None else None


def _output_structure(config: AnthropicOutputConfig | None, opens_reasoning: bool) -> StructuredOutputsParams | None:
    """output_config.format: the reply held to its JSON schema (after the reasoning, where the prompt opens it)."""
    if config is None or config.format is None:
        return None
    try:
        return StructuredOutputsParams(json=config.format.schema_, start_after=THINK_CLOSE if opens_reasoning else None)
    except InvalidSamplingParamsError as exc:
        raise bad_request(str(exc), "output_config.format.schema") from None


def _demanded_call(choice: Any) -> tuple[bool, str | None]:
    """(whether tool_choice demands a tool call, the tool it names or None for any)."""
    if choice is None or choice.type not in ("any", "tool"):
        return False, None
    return True, choice.name if choice.type == "tool" else None


def _call_cap(choice: Any) -> int | None:
    """disable_parallel_tool_use: at most one tool use ("auto"), exactly one ("any", "tool": the grammar's)."""
    return 1 if choice is not None and choice.disable_parallel_tool_use else None


def _stop_reason(o: CompletionOutput, stop_sequences: list[str], used_tools: bool) -> tuple[str, str | None]:
    if o.finish_reason == "length":  # a tool call cut short too: the client is to ask again with more
        return "max_tokens", None
    if used_tools:
        return "tool_use", None
    if isinstance(o.stop_reason, str) and o.stop_reason in stop_sequences:
        return "stop_sequence", o.stop_reason
    return "end_turn", None


class Messages:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx

    async def _prompt(self, req: MessagesRequest | CountTokensRequest, tools: list[dict] | None) -> ChatPrompt:
        """A final assistant message is a prefill: the reply goes on from its text, as Anthropic's does. The
        template's variables: thinking's, the request's own chat_template_kwargs over them, and the output's
        effort (ServerContext.template_kwargs)."""
        converted = anthropic_messages_for_template(req.system, req.messages)
        prefill = req.messages[-1].role == "assistant"
        own = {**(_thinking_template_kwargs(req.thinking) or {}), **(req.chat_template_kwargs or {})}
        effort = req.output_config.effort if req.output_config is not None else None
        return await off_loop(self.ctx.engine, functools.partial(
            render_chat, self.ctx.tokenizer, converted, tools, self.ctx.template_kwargs(own or None, effort),
            continue_final=prefill))

    async def count_tokens(self, request: Request):
        req = CountTokensRequest.model_validate(await read_json_object(request))
        self.ctx.check_model(req.model)
        shown, _ = anthropic_tools_for_template(req.tools, req.tool_choice,
                                                self.ctx.exclude_tools_when_tool_choice_none)
        prompt = await self._prompt(req, shown)
        return JSONResponse({"input_tokens": len(prompt.token_ids)})

    async def __call__(self, request: Request):
        req = MessagesRequest.model_validate(await read_json_object(request))
        model = self.ctx.check_model(req.model)
        self.ctx.admit()
        shown, tools = anthropic_tools_for_template(req.tools, req.tool_choice,
                                                    self.ctx.exclude_tools_when_tool_choice_none)
        budget = _thinking_budget(req.thinking, req.max_tokens, self.ctx.engine)
        prompt = await self._prompt(req, shown)
        max_tokens = resolve_max_tokens(req.max_tokens, len(prompt.token_ids), self.ctx.max_model_len, "messages",
                                        cap=self.ctx.engine.max_tokens_cap)
        if any(not s for s in req.stop_sequences or ()):
            raise bad_request("stop_sequences must be non-empty strings", "stop_sequences")
        defaults = self.ctx.engine.sampling_defaults  # the checkpoint's, for what the request leaves unset
        params = SamplingParams(
            temperature=defaults.get("temperature", 1.0) if req.temperature is None else req.temperature,
            top_p=defaults.get("top_p", 1.0) if req.top_p is None else req.top_p,
            top_k=defaults.get("top_k", -1) if req.top_k is None else req.top_k or -1,
            min_p=defaults.get("min_p", 0.0),
            repetition_penalty=defaults.get("repetition_penalty", 1.0),
            max_tokens=max_tokens,
            stop=req.stop_sequences or None,
            thinking_token_budget=budget,
        )
        demanded, name = _demanded_call(req.tool_choice)
        structure = _output_structure(req.output_config, prompt.opens_reasoning)
        if demanded:  # the answer is held to the calls' JSON (forced_tool_calls.py)
            if structure is not None:
                raise bad_request("output_config.format and a tool_choice that demands a tool use each hold the "
                                  "reply to a form: give one", "output_config.format")
            params.structured_outputs = demanded_call_structure(
                tool_schemas(tools), name, not req.tool_choice.disable_parallel_tool_use, prompt.opens_reasoning)
            await check_structure(self.ctx.engine, params.structured_outputs, "tool_choice")
        elif structure is not None:
            params.structured_outputs = structure
            await check_structure(self.ctx.engine, structure, "output_config.format.schema")
        request_id = random_id("msg_")
        stream = await self.ctx.engine.generate(
            request_id, prompt.token_ids, params, prompt_text=prompt.text, capture_points=prompt.capture_points
        )
        job = _MessageJob(self.ctx, req, model, request_id, prompt, tools)
        if req.stream:
            return EngineStreamResponse(job.stream(stream), stream, headers=SSE_HEADERS)
        final = await until_disconnect(request, last_output(stream))
        return JSONResponse(job.response(final))


class _MessageJob:
    def __init__(self, ctx: ServerContext, req: MessagesRequest, model: str, request_id: str, prompt: ChatPrompt,
                 tools: list[dict] | None):
        self.ctx = ctx
        self.req = req
        self.model = model
        self.request_id = request_id
        self.prompt = prompt
        demanded, name = _demanded_call(req.tool_choice)
        self.parser = ChoiceParser(
            reasoning=bool(ctx.reasoning), start_in_reasoning=prompt.opens_reasoning, tool_schemas=tool_schemas(tools),
            forced=ForcedToolCalls(name) if demanded else None, max_calls=_call_cap(req.tool_choice),
            tool_format=ctx.tool_format,
        )

    def _usage(self, output: RequestOutput, output_tokens: int) -> dict:
        cached = output.num_cached_tokens
        return {
            "input_tokens": len(output.prompt_token_ids) - cached,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        }

    def response(self, output: RequestOutput) -> dict:
        o = output.outputs[0]
        parsed = self.parser.feed(o.text)
        parsed.extend(self.parser.finish())
        content: list[dict] = []
        if parsed.reasoning:
            content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
        for piece in parsed.answer:  # text and calls in the order written, as the stream's blocks
            if isinstance(piece, ToolCall):  # a call the length cut short: its input as far as it was written
                written = json.loads(piece.arguments) if piece.complete else written_json_value(piece.arguments)
                content.append({"type": "tool_use", "id": "toolu_" + piece.id[5:], "name": piece.name,
                                "input": written})
            elif piece.text:  # Anthropic sends no empty text block: a reply with nothing at all has no content
                content.append({"type": "text", "text": piece.text})
        stop_reason, stop_sequence = _stop_reason(o, self.req.stop_sequences or [], bool(parsed.tool_calls))
        return {
            "id": self.request_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": self._usage(output, len(o.token_ids)),
        }

    async def stream(self, stream: RequestStream) -> AsyncIterator[str]:
        blocks = _BlockWriter()
        sent = 0
        last = None
        try:
            async for output in stream:
                if last is None:  # the first output knows the prompt tokens the cache held: the usage agrees
                    yield sse_event("message_start", {"type": "message_start", "message": {  # with message_delta's
                        "id": self.request_id, "type": "message", "role": "assistant", "model": self.model,
                        "content": [], "stop_reason": None, "stop_sequence": None, "usage": self._usage(output, 0)}})
                    yield sse_event("ping", {"type": "ping"})
                last = output
                o = output.outputs[0]
                delta = self.parser.feed(o.text[sent:])
                sent = len(o.text)
                if o.finish_reason is not None:
                    delta.extend(self.parser.finish())
                for event in blocks.write(delta):
                    yield event
            for event in blocks.close():
                yield event
            o = last.outputs[0]
            stop_reason, stop_sequence = _stop_reason(o, self.req.stop_sequences or [], blocks.used_tools)
            usage = self._usage(last, len(o.token_ids))
            yield sse_event("message_delta", {"type": "message_delta",
                                              "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                              "usage": usage})
            yield sse_event("message_stop", {"type": "message_stop"})
        except Exception as exc:
            yield sse_event("error", from_exception(exc).anthropic_body())
        finally:
            stream.close()


class _BlockWriter:
    """Turns parsed deltas into content_block_start / _delta / _stop events, one block at a time."""

    def __init__(self):
        self.index = -1
        self.open_kind: str | None = None
        self.used_tools = False

    def _switch(self, kind: str, start_block: dict) -> list[str]:
        events = self._close_open()
        self.index += 1
        self.open_kind = kind
        events.append(sse_event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                        "content_block": start_block}))
        return events

    def _delta(self, delta: dict) -> str:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def write(self, delta: ChoiceDelta) -> list[str]:
        events: list[str] = []
        if delta.reasoning:
            if self.open_kind != "thinking":
                events += self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning}))
        for piece in delta.answer:  # text and calls in the order written
            if isinstance(piece, ToolCall):
                self.used_tools = True
                events += self._switch("tool_use", {"type": "tool_use", "id": "toolu_" + new_tool_call_id("")[:24],
                                                    "name": piece.name, "input": {}})
                events.append(self._delta({"type": "input_json_delta", "partial_json": piece.arguments}))
            elif piece.text:
                if self.open_kind != "text":
                    events += self._switch("text", {"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": piece.text}))
        return events

    def close(self) -> list[str]:
        """End of the message: close the open block. A reply with nothing at all has no block, as Anthropic's."""
        return self._close_open()

    def _close_open(self) -> list[str]:
        events = []
        if self.open_kind is not None:
            if self.open_kind == "thinking":
                events.append(self._delta({"type": "signature_delta", "signature": ""}))
            events.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": self.index}))
            self.open_kind = None
        return events
