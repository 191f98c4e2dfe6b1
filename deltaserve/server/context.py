"""ServerContext: what every route needs, and the helpers they share."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from deltaserve.engine.async_engine import AsyncEngine, RequestStream
from deltaserve.outputs import RequestOutput
from deltaserve.server.chat_prompt import template_has_reasoning, template_source
from deltaserve.server.errors import APIError, bad_request
from deltaserve.server.metrics import ServerMetrics
from deltaserve.server.tool_parsers import tool_format_of
from deltaserve.tokenizer import LONE_SURROGATE

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


@dataclass
class ServerContext:
    engine: AsyncEngine
    served_model_names: list[str]
    api_keys: list[str] = field(default_factory=list)
    force_include_usage: bool = False
    return_tokens_as_token_ids: bool = False  # vLLM's: the default of a request's own field
    default_chat_template_kwargs: dict = field(default_factory=dict)  # vLLM's: under each request's own
    trust_request_chat_template: bool = False  # vLLM's: a request may bring its own chat_template
    response_role: str = "assistant"  # vLLM's: the role of a chat reply that opens a new turn
    reasoning: bool | None = None  # None: decide from the chat template
    tool_call_parser: str | None = None  # vLLM's --tool-call-parser (None: the chat template's format)
    exclude_tools_when_tool_choice_none: bool = False  # vLLM's: tool_choice "none" renders no tools
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        if self.reasoning is None:
            self.reasoning = template_has_reasoning(self.tokenizer)
        self.tool_format = tool_format_of(self.tool_call_parser, template_source(self.tokenizer))
        self.metrics = ServerMetrics(lambda: self.engine.stats, self.model_name, self.max_model_len,
                                     getattr(self.engine, "cache_config_info", None))
        self.engine.listeners.append(self.metrics.observe)
        if hasattr(self.engine, "add_step_listener"):
            self.engine.add_step_listener(self.metrics.observe_step)
        self.engine.refusal_listeners.append(self.metrics.count_refusal)

    def template_kwargs(self, own: dict | None, reasoning_effort: str | None = None) -> dict:
        """A chat's template variables: the server's defaults (--default-chat-template-kwargs), the request's
        own chat_template_kwargs over them. The request's fields of the same names say how the chat is rendered,
        and the server reads them (a reply's role and echo): as vLLM's, they stand over chat_template_kwargs'.
        reasoning_effort, as vLLM hands it: the variable of that name, and enable_thinking (false for "none")
        where the request's own variables do not set it."""
        kwargs = {**self.default_chat_template_kwargs, **(own or {})}
        for name in ("add_generation_prompt", "continue_final_message"):
            kwargs.pop(name, None)
        if reasoning_effort is not None:
            kwargs["reasoning_effort"] = reasoning_effort
            if "enable_thinking" not in (own or {}):
                kwargs["enable_thinking"] = reasoning_effort != "none"
        return kwargs

    def tokens_as_ids(self, req: Any) -> bool:
        """Whether the request's logprobs name each token "token_id:ID": its own field, else the server's."""
        own = getattr(req, "return_tokens_as_token_ids", None)
        return self.return_tokens_as_token_ids if own is None else own

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, name: str | None) -> str:
        """The name a reply gives its model: the first served name, whichever of them (or none) the request
        asks for, as vLLM's."""
        if not name or name in self.served_model_names:
            return self.model_name
        raise self.not_served(name)

    def not_served(self, name: str) -> APIError:
        return APIError(404, f"The model '{name}' does not exist. This server serves: "
                             f"{', '.join(self.served_model_names)}", type="not_found_error", param="model",
                        code="model_not_found")

    def admit(self) -> None:
        """Refuse early (before tokenizing) when the engine cannot take a request (the engine counts the
        refusal in the metrics). A request admitted here is checked again as it is queued: others may have
        filled the queue while it was tokenized."""
        self.engine.check_admission()


def random_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


async def read_json_object(request: Request) -> dict:
    """The request's JSON object. A body sent as another media type is refused, as vLLM refuses it: a browser
    may send a form or text across sites without asking first, never JSON."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise bad_request(f"Unsupported Media Type: only 'application/json' is allowed (got {media_type or 'none'!r})",
                          code="unsupported_media_type")
    body = await request.body()
    try:
        data = json.loads(body)
        if isinstance(data, dict) and _ESCAPED_SURROGATE.search(body):
            _refuse_lone_surrogates(data, "")
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"Malformed JSON body: {exc}", code="invalid_json") from exc
    except RecursionError as exc:
        raise bad_request("The JSON body nests too deeply", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object", code="invalid_json")
    return data


# JSON may escape a UTF-16 surrogate alone ("\ud800"), which decodes to a string no tokenizer can encode;
# a body without such an escape has none to look for.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(value: Any, path: str) -> None:
    """A 400 naming the first string (a value or a key) that holds half of a surrogate pair."""
    if isinstance(value, str):
        if LONE_SURROGATE.search(value):
            # the path may run through the key at fault: written escaped, the error itself is text
            shown = LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", path)
            raise bad_request(f"'{shown or 'body'}' holds a lone UTF-16 surrogate, which is not text",
                              shown or None, "invalid_value")
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            _refuse_lone_surrogates(key, where)
            _refuse_lone_surrogates(item, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_lone_surrogates(item, f"{path}.{i}" if path else str(i))


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client goes away first (its streams then abort)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except BaseException:
        pass
    raise ClientDisconnected()


async def last_output(stream: RequestStream) -> RequestOutput:
    """Run a request to the end and return its final (cumulative) output."""
    final = None
    try:
        async for output in stream:
            final = output
    finally:
        stream.close()
    assert final is not None
    return final


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several requests' outputs as they come, tagged with the stream's position."""
    if len(streams) == 1:  # the common case: no pump task and queue between the stream and its reader
        try:
            async for output in streams[0]:
                yield 0, output
        finally:
            streams[0].close()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done_marker = object()

    async def pump(k: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                await queue.put((k, output))
        except BaseException as exc:
            await queue.put((k, exc))
            return
        await queue.put((k, done_marker))

    tasks = [asyncio.ensure_future(pump(k, s)) for k, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            k, item = await queue.get()
            if item is done_marker:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield k, item
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            stream.close()


def stream_usage(stream_options: Any, forced: bool) -> tuple[bool, bool]:
    """Whether a stream ends with its usage, and whether every chunk carries it so far (vLLM's continuous usage):
    as its stream_options ask, the first also where the server forces it."""
    include = forced or bool(stream_options and stream_options.include_usage)
    return include, include and bool(stream_options and stream_options.continuous_usage_stats)


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
