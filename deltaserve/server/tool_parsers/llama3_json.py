"""Llama3JsonToolParser: the tool calls of Llama 3.x and 4 (vLLM's llama3_json and llama4_json parsers).

Such a model calls tools by answering with JSON alone: `{"name": ..., "parameters": {...}}` ("arguments" is read
too), several calls separated by ";", after the `<|python_tag|>` token where the reply keeps special tokens: an
answer that opens with "{" or the tag is read as calls (whole_answer.py).
"""

from __future__ import annotations

import json

from deltaserve.server.tool_parsers.qwen3_json import parse_json_tool_call
from deltaserve.server.tool_parsers.tool_call import ToolCall
from deltaserve.server.tool_parsers.whole_answer import WholeAnswerToolParser

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


class Llama3JsonToolParser(WholeAnswerToolParser):
    def __init__(self, schemas: dict[str, dict] | None = None):  # the arguments are the model's JSON: no retyping
        super().__init__(("{", PYTHON_TAG), parse_llama_tool_calls)
