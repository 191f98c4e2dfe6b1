"""POST /v1/responses (OpenAI's Responses API). The request becomes a chat request, checked, rendered and sampled
as /v1/chat/completions' are (ChatCompletions.submit); its reply is shaped as output items (reasoning, a message,
function calls), whole or as the API's stream of events. The server keeps no responses: an earlier one is
named by sending the conversation again as input items, never by its id."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from deltaserve.engine.async_engine import RequestStream
from deltaserve.outputs import CompletionOutput, RequestOutput
from deltaserve.server.context import last_output, read_json_object, until_disconnect
from deltaserve.server.chat_prompt import check_tool_names, message_content, message_text
from deltaserve.server.errors import APIError, bad_request, from_exception, require_fields
from deltaserve.server.message_logprobs import MessageLogprobs, TextFeed
from deltaserve.server.output_parser import AnswerText, ChoiceDelta
from deltaserve.server.protocol import ChatCompletionRequest
from deltaserve.server.reasoning import reasoning_token_count
from deltaserve.server.responses_protocol import InputContent, InputItem, ResponsesRequest
from deltaserve.server.sampling import check_logprobs_field
from deltaserve.server.serving_chat import ChatCompletions, ChatJob
from deltaserve.server.sse import SSE_HEADERS, sse_event
from deltaserve.server.streaming import EngineStreamResponse
from deltaserve.server.tool_parsers import ToolCall

TEXT_PARTS = ("input_text", "output_text", "text")
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # include's name for the output text's logprobs


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# ---- the request, as a chat request ---------------------------------------------------------------------


def _text(content: str | list[InputContent] | None, param: str) -> str:
    return message_text(content, param, TEXT_PARTS)


def _reasoning_text(item: InputItem, where: str) -> str:
    """An earlier reasoning item's text: its reasoning_text parts, or where it has none, as vLLM's, its first
    summary's."""
    if isinstance(item.content, list) and item.content:
        return "".join(part.text or "" for part in item.content if part.type == "reasoning_text")
    if item.content is None and item.summary:
        return item.summary[0].text or ""
    return _text(item.content, f"{where}.content")


def chat_messages(req: ResponsesRequest) -> list[dict]:
    """instructions as the system message, then the input: messages, earlier function calls (joined to the
    assistant turn they belong to), their outputs as tool messages, earlier reasoning on the turn after it."""
    out: list[dict] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}]
    reasoning = None
    for i, item in enumerate(req.input):
        where = f"input.{i}"
        kind = item.type or "message"
        if kind == "message":
            require_fields(item, ("role",), f"{kind} item", where)
            out.append({"role": item.role, "content": message_content(item.content, f"{where}.content", TEXT_PARTS)})
        elif kind == "function_call":
            require_fields(item, ("call_id", "name", "arguments"), f"{kind} item", where)
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            require_fields(item, ("call_id", "output"), f"{kind} item", where)
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, f"{where}.output")})
        elif kind == "reasoning":
            reasoning = _reasoning_text(item, where)
            continue
        else:
            raise bad_request(f"input item of type {kind!r} is not supported: give messages, function_call, "
                              "function_call_output or reasoning items", f"{where}.type", "unsupported_value")
        if reasoning is not None and out[-1]["role"] == "assistant":
            out[-1]["reasoning_content"], reasoning = reasoning, None
    if not any(message["role"] not in ("system", "developer") for message in out):
        raise bad_request("input holds no message: give at least one message or function call", "input")
    return out


def _tools(req: ResponsesRequest) -> list[dict] | None:
    """The function tools as chat's; none where tool_choice is "none", as vLLM's Responses route hides them."""
    if req.tools is None:
        return None
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise bad_request(f"tool of type {tool.type!r} is not supported: only function tools, which the client "
                              "runs", f"tools.{i}.type", "unsupported_value")
        if not tool.name:
            raise bad_request("a function tool needs its name", f"tools.{i}.name")
        tools.append({"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                       "parameters": tool.parameters}})
    check_tool_names([tool.name for tool in req.tools], "tools.{i}.name")
    if req.tool_choice == "none":
        return None
    return tools or None  # the Responses API takes an empty list for none


def _tool_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    if choice.type != "function" or choice.name is None:
        raise bad_request(f"tool_choice of type {choice.type!r} is not supported: give none, auto, required or "
                          "a function by name", "tool_choice", "unsupported_value")
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(req: ResponsesRequest) -> dict | None:
    form = req.text.format if req.text is not None else None
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return {"type": "json_object"}
    if form.type == "json_schema":
        if form.schema_ is None:
            raise bad_request("text.format of type 'json_schema' needs its schema", "text.format.schema")
        return {"type": "json_schema", "json_schema": {"name": form.name, "schema": form.schema_}}
    raise bad_request(f"text.format of type {form.type!r} is not supported: give text, json_object or json_schema",
                      "text.format.type", "unsupported_value")


def _refuse_unhonoured(req: ResponsesRequest) -> None:
    for name in ("previous_response_id", "conversation"):
        if getattr(req, name) is not None:
            raise bad_request(f"{name} is not supported: this server keeps no responses; send the conversation as "
                              "input items", name, "unsupported_value")
    if req.background:
        raise bad_request("background is not supported: a response is answered on its request", "background",
                          "unsupported_value")
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise bad_request(f"max_output_tokens={req.max_output_tokens}: must be at least 1", "max_output_tokens",
                          "invalid_value")
    if not req.input:
        raise bad_request("input must not be empty", "input")
    if req.truncation == "auto":
        raise bad_request("truncation 'auto' is not supported: the input is never cut to fit the context (an input "
                          "past it is refused); give 'disabled'", "truncation", "unsupported_value")
    if req.max_tool_calls is not None and req.max_tool_calls < 1:
        raise bad_request(f"max_tool_calls={req.max_tool_calls}: must be at least 1 (tool_choice 'none' asks for no "
                          "calls)", "max_tool_calls", "invalid_value")


def _continues_last_message(req: ResponsesRequest) -> bool:
    """Whether the input ends with an assistant message cut short (status incomplete or in progress)."""
    last = req.input[-1] if isinstance(req.input, list) and req.input else None
    return (last is not None and (last.type or "message") == "message" and last.role == "assistant"
            and last.status in ("incomplete", "in_progress"))


def wants_logprobs(req: ResponsesRequest) -> bool:
    return LOGPROBS_INCLUDE in (req.include or ())


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that asks what `req` asks. reasoning.effort is its reasoning_effort (to the chat template,
    as chat's: ServerContext.template_kwargs); a template that reads neither it nor enable_thinking thinks as it
    always does."""
    _refuse_unhonoured(req)
    body = {"model": req.model, "messages": chat_messages(req), "max_completion_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "tools": _tools(req), "tool_choice": _tool_choice(req),
            "parallel_tool_calls": req.parallel_tool_calls, "response_format": _response_format(req),
            "chat_template_kwargs": req.chat_template_kwargs, "priority": req.priority,
            "reasoning_effort": req.reasoning.effort if req.reasoning is not None else None}
    if _continues_last_message(req):  # the reply goes on writing it, as vLLM's (and Anthropic's prefill)
        body.update(continue_final_message=True, add_generation_prompt=False)
    if wants_logprobs(req):  # OpenAI's rule: top_logprobs alone brings none
        body.update(logprobs=True, top_logprobs=req.top_logprobs or 0)
    return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})


# ---- the reply, as output items -------------------------------------------------------------------------


def _reasoning_item(item_id: str, text: str, status: str) -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []}


def _output_text(text: str, logprobs: list[dict] | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _message_item(item_id: str, text: str, status: str, logprobs: list[dict] | None = None) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [_output_text(text, logprobs)] if status != "in_progress" else []}


def _call_item(item_id: str, call: ToolCall, status: str) -> dict:
    """A call's item; one the length cut short is incomplete once done, its arguments as far as they came."""
    status = "incomplete" if status == "completed" and not call.complete else status
    return {"id": item_id, "type": "function_call", "call_id": call.id, "name": call.name,
            "arguments": call.arguments if status != "in_progress" else "", "status": status}


# the chat request's fields that a Responses request spells its own way (chat_request), for the errors they name
_FIELDS = {"messages": "input", "response_format": "text.format", "max_completion_tokens": "max_output_tokens",
           "reasoning_effort": "reasoning.effort"}


def _in_responses_terms(exc: APIError) -> APIError:
    """A chat request's error as the Responses request's: the field it names under the request's own name."""
    param = exc.param or ""
    head = next((f for f in _FIELDS if param == f or param.startswith(f + ".")), None)
    if head is not None:
        exc.param = _FIELDS[head] + param[len(head):]
    if exc.code == "context_length_exceeded":
        exc.message = exc.message.replace("max_tokens", "max_output_tokens")
        exc.args = (exc.message,)
    return exc


class Responses:
    def __init__(self, chat: ChatCompletions):
        self.chat = chat

    async def __call__(self, request: Request):
        req = ResponsesRequest.model_validate(await read_json_object(request))
        try:
            if req.top_logprobs is not None:  # within the engine's bound, whether include asks for them or not
                check_logprobs_field("top_logprobs", req.top_logprobs, self.chat.ctx.engine)
            job, stream = await self.chat.submit(chat_request(req), "resp_", req.max_tool_calls)
        except APIError as exc:
            raise _in_responses_terms(exc) from None
        response = _ResponseJob(req, job)
        if req.stream:
            return EngineStreamResponse(response.stream(stream), stream, headers=SSE_HEADERS)
        final = await until_disconnect(request, last_output(stream))
        return JSONResponse(response.whole(final))

    async def kept(self, request: Request):
        """GET or DELETE /v1/responses/{id}, and its cancel: no response is kept to answer them."""
        response_id = request.path_params["response_id"]
        raise APIError(404, f"response {response_id!r} is not kept: this server stores no responses (send the "
                            "conversation as input items)", param="response_id", code="response_not_found")


class _ResponseJob:
    """One response's shaping: the envelope, its items, its usage."""

    def __init__(self, req: ResponsesRequest, chat: ChatJob):
        self.req = req
        self.chat = chat
        self.created = int(time.time())

    def envelope(self, status: str, output: list[dict], usage: dict | None) -> dict:
        req = self.req
        form = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else None
        return {
            "id": self.chat.request_id, "object": "response", "created_at": self.created, "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": self.chat.model,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "store": False, "temperature": req.temperature, "top_p": req.top_p,
            "text": {"format": form or {"type": "text"}},
            "tool_choice": req.tool_choice.model_dump(exclude_none=True) if hasattr(req.tool_choice, "model_dump")
            else req.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
            "truncation": req.truncation or "disabled", "max_tool_calls": req.max_tool_calls,
            "top_logprobs": req.top_logprobs, "usage": usage, "user": req.user, "metadata": req.metadata or {},
        }

    def usage(self, output: RequestOutput, reasoning: str) -> dict:
        prompt, generated = len(output.prompt_token_ids), len(output.outputs[0].token_ids)
        tags = getattr(self.chat.api.ctx.engine, "think_tags", None)
        if not reasoning:
            thought = 0
        elif tags is not None:  # the tokens within the think block
            thought = reasoning_token_count(output.outputs[0].token_ids, tags, self.chat.prompt.opens_reasoning)
        else:  # tags of several tokens: the reasoning's text encoded again
            thought = len(self.chat.api.ctx.tokenizer.encode(reasoning, add_special_tokens=False))
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": output.num_cached_tokens},
                "output_tokens": generated, "output_tokens_details": {"reasoning_tokens": min(thought, generated)},
                "total_tokens": prompt + generated}

    @staticmethod
    def status(output: RequestOutput) -> str:
        return "incomplete" if output.outputs[0].finish_reason == "length" else "completed"

    def _reader(self) -> MessageLogprobs | TextFeed:
        """The output read as it comes: with the message text's logprobs where include asks for them."""
        chat = self.chat
        if not wants_logprobs(self.req):
            return TextFeed(chat.parser())
        return MessageLogprobs(chat.parser(), self._logprobs, chat.api.ctx.tokenizer, chat.prompt.token_ids,
                               chat.req.skip_special_tokens)

    def _logprobs(self, o: CompletionOutput, start: int, end: int) -> list[dict]:
        """Tokens start:end's logprobs, as chat's content entries: each token's text, logprob, bytes and top ones."""
        return (self.chat.logprobs(o, start, end) or {"content": []})["content"]

    def whole(self, output: RequestOutput) -> dict:
        """The reply's items as its stream would close them: in the order written."""
        parsed, _ = self._reader().feed(output.outputs[0])
        status = self.status(output)
        items = _EventWriter()
        items.write(parsed)
        items.close(status)
        return self.envelope(status, items.items, self.usage(output, parsed.reasoning))

    async def stream(self, stream: RequestStream) -> AsyncIterator[str]:
        events = _EventWriter()
        reader = self._reader()
        last = None
        try:
            yield events.emit("response.created", response=self.envelope("in_progress", [], None))
            yield events.emit("response.in_progress", response=self.envelope("in_progress", [], None))
            async for output in stream:
                last = output
                delta, _ = reader.feed(output.outputs[0])
                for event in events.write(delta):
                    yield event
            status = self.status(last)
            for event in events.close(status):
                yield event
            usage = self.usage(last, events.reasoning)
            yield events.emit(f"response.{status}", response=self.envelope(status, events.items, usage))
        except Exception as exc:  # engine gone or server stopping: end the stream with an error event
            error = from_exception(exc)
            yield events.emit("error", code=error.code or error.type, message=error.message, param=error.param)
        finally:
            stream.close()


class _EventWriter:
    """Parsed deltas as the Responses stream's events: each output item added, its content part added, its
    deltas, then its parts and itself done, one item at a time, every event numbered."""

    def __init__(self):
        self.sequence = 0
        self.items: list[dict] = []  # the finished items, in order
        self.reasoning = ""  # all of it, for the usage
        self._open: dict | None = None  # the item being written: its kind, id and text so far

    def emit(self, kind: str, **fields) -> str:
        event = sse_event(kind, {"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        return event

    def _where(self) -> dict:
        return {"item_id": self._open["id"], "output_index": len(self.items)}

    def _begin(self, kind: str, item: dict, part: dict | None) -> list[str]:
        events = self.close_open("completed")
        self._open = {"kind": kind, "id": item["id"], "text": "", "logprobs": []}
        events.append(self.emit("response.output_item.added", output_index=len(self.items), item=item))
        if part is not None:
            events.append(self.emit("response.content_part.added", **self._where(), content_index=0, part=part))
        return events

    def write(self, delta: ChoiceDelta) -> list[str]:
        """The delta's reasoning, then its text and calls in the order written; a text's logprobs are those the
        reader placed with it, where the request asks for them."""
        events: list[str] = []
        if delta.reasoning:
            self.reasoning += delta.reasoning
            if self._open is None or self._open["kind"] != "reasoning":
                events += self._begin("reasoning", _reasoning_item(_item_id("rs"), "", "in_progress"),
                                      {"type": "reasoning_text", "text": ""})
            self._open["text"] += delta.reasoning
            events.append(self.emit("response.reasoning_text.delta", **self._where(), content_index=0,
                                    delta=delta.reasoning))
        for piece in delta.answer:
            events += self._write_text(piece) if isinstance(piece, AnswerText) else self._write_call(piece)
        return events

    def _write_text(self, text: AnswerText) -> list[str]:
        events: list[str] = []
        if not text.text:
            return events
        if self._open is None or self._open["kind"] != "message":
            events += self._begin("message", _message_item(_item_id("msg"), "", "in_progress"), _output_text(""))
        self._open["text"] += text.text
        self._open["logprobs"] += text.logprobs
        events.append(self.emit("response.output_text.delta", **self._where(), content_index=0, delta=text.text,
                                logprobs=text.logprobs))
        return events

    def _write_call(self, call: ToolCall) -> list[str]:
        """A call comes whole from the parser: its arguments in one delta."""
        events = self._begin("function_call", _call_item(_item_id("fc"), call, "in_progress"), None)
        events.append(self.emit("response.function_call_arguments.delta", **self._where(), delta=call.arguments))
        events.append(self.emit("response.function_call_arguments.done", **self._where(), name=call.name,
                                arguments=call.arguments))
        self._open["call"] = call
        return events

    def close(self, status: str) -> list[str]:
        """The end of the reply: the open item done (an empty message if nothing came)."""
        events = []
        if self._open is None and not self.items:
            events += self._begin("message", _message_item(_item_id("msg"), "", "in_progress"), _output_text(""))
        return events + self.close_open(status)

    def close_open(self, status: str) -> list[str]:
        """The open item's parts and itself done; `status` is a message's (a reply cut by max_output_tokens is
        incomplete), the others' completed."""
        item = self._open
        if item is None:
            return []
        where, events = self._where(), []
        if item["kind"] == "reasoning":
            done = _reasoning_item(item["id"], item["text"], "completed")
            events.append(self.emit("response.reasoning_text.done", **where, content_index=0, text=item["text"]))
            events.append(self.emit("response.content_part.done", **where, content_index=0, part=done["content"][0]))
        elif item["kind"] == "message":
            done = _message_item(item["id"], item["text"], status, item["logprobs"])
            events.append(self.emit("response.output_text.done", **where, content_index=0, text=item["text"],
                                    logprobs=item["logprobs"]))
            events.append(self.emit("response.content_part.done", **where, content_index=0, part=done["content"][0]))
        else:
            done = _call_item(item["id"], item["call"], "completed")
        events.append(self.emit("response.output_item.done", output_index=where["output_index"], item=done))
        self.items.append(done)
        self._open = None
        return events
