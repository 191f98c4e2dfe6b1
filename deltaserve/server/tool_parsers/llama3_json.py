"""Llama3JsonToolParser: the tool calls of Llama 3.x and 4 (vLLM's llama3_json and llama4_json parsers).

Such a model calls tools by answering with JSON alone: `{"name": ..., "parameters": {...}}` ("arguments" is read
too), several calls separated by ";", after the `<|python_tag|>` token where the reply keeps special tokens. So
the answer's first characters decide: one that opens with "{" or the tag is held to its end and read as calls,
given back whole as text where any part of it is not a call; any other answer streams as text.
"""

from __future__ import annotations

import json

from deltaserve.server.tool_parsers.parser import ParsedDelta
from deltaserve.server.tool_parsers.qwen3_json import parse_json_tool_call
from deltaserve.server.tool_parsers.tool_call import ToolCall

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


def parse_llama_tool_calls(text: str) -> list[ToolCall] | None:
    """The calls that `text` (an answer that opens with "{" or the tag) is made of; None where it is not calls
    alone."""
    rest = text.strip().removeprefix(PYTHON_TAG)
    calls = []
    while True:
        rest = rest.lstrip()
        if not rest:
            return calls or None
        try:
            _, end = _DECODER.raw_decode(rest)
        except ValueError:
            return None
        call = parse_json_tool_call(rest[:end])  # with its checks: a name, arguments an object, JSON's numbers
        if call is None:
            return None
        calls.append(call)
        rest = rest[end:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:]
        elif rest:
            return None


class Llama3JsonToolParser:
    """Feed text chunks in order; each feed returns the text and the calls now complete (ToolCallParser's
    interface)."""

    def __init__(self, schemas: dict[str, dict] | None = None):
        self.schemas = schemas or {}  # the arguments are the model's JSON: no schema retypes them
        self.calls: list[ToolCall] = []
        self._held = ""  # the answer so far, while it may be (or is) calls
        self._calling: bool | None = None  # None: its first characters have not decided yet

    def feed(self, chunk: str) -> ParsedDelta:
        if self._calling is False:
            return ParsedDelta(text=chunk)
        self._held += chunk
        if self._calling is None:
            opening = self._held.lstrip()
            if not opening or PYTHON_TAG.startswith(opening):
                return ParsedDelta()  # blank so far, or the tag's first characters
            self._calling = opening.startswith(("{", PYTHON_TAG))
            if not self._calling:
                text, self._held = self._held, ""
                return ParsedDelta(text=text)
        return ParsedDelta()

    def finish(self) -> ParsedDelta:
        text, self._held = self._held, ""
        calls = parse_llama_tool_calls(text) if self._calling else None
        if calls is None:
            return ParsedDelta(text=text)
        self.calls.extend(calls)
        return ParsedDelta(tool_calls=calls)
