"""A tool call the request demands (OpenAI's tool_choice "required" or a named function, Anthropic's "any" or
"tool"): the answer is held by structured outputs to JSON that names the calls, and read back as tool calls
instead of through the model's own tool-call format.

- A named function: the answer is that function's arguments, a JSON object of its parameters' schema.
- "required": the answer is a JSON array of one call or more (one where parallel calls are off), each
  {"name": a tool's name, "parameters": that tool's arguments}. The array's schema holds each tool's
  parameters in its $defs, their local references rewritten (relocated_schema.py) to resolve within them.
"""

from __future__ import annotations

import json
import re

from deltaserve.sampling_params import StructuredOutputsParams
from deltaserve.server.reasoning import THINK_CLOSE
from deltaserve.server.relocated_schema import local_ref, pointer_token, relocated
from deltaserve.server.tool_parsers import ToolCall
from deltaserve.server.tool_parsers.tool_call import loads_json

ANY_OBJECT = {"type": "object"}


def forced_tool_schema(schemas: dict[str, dict], name: str | None, parallel: bool = True) -> dict:
    """The JSON schema of the answer: `schemas` maps each tool's name to its parameters' schema; `name` is the
    function demanded, or None for any one of them."""
    if name is not None:
        return schemas[name] or ANY_OBJECT
    # Nested as they are, a tool's "#/$defs/Item" (pydantic's) or "#" would name a node of the array's schema
    places = {tool: "/$defs/" + pointer_token(tool) for tool in schemas}
    defs = {tool: relocated(schema or ANY_OBJECT, places[tool]) for tool, schema in schemas.items()}
    calls = [{"type": "object", "properties": {"name": {"const": tool}, "parameters": {"$ref": local_ref(place)}},
              "required": ["name", "parameters"]} for tool, place in places.items()]
    array = {"type": "array", "minItems": 1, "items": {"anyOf": calls}, "$defs": defs}
    if not parallel:
        array["maxItems"] = 1
    return array


def demanded_call_structure(schemas: dict[str, dict], name: str | None, parallel: bool,
                            opens_reasoning: bool) -> StructuredOutputsParams:
    """The request's structured output for a demanded call: after the think block where the prompt opens one."""
    return StructuredOutputsParams(json=forced_tool_schema(schemas, name, parallel),
                                   start_after=THINK_CLOSE if opens_reasoning else None)


class ForcedToolCalls:
    """One choice's answer text, held until it is complete, then its calls. Where the grammar did not finish it
    (the length ran out), the calls as far as they were written, as OpenAI gives them: each call whose name
    came, its arguments the text written so far, marked incomplete (and no text: the JSON around them is the
    grammar's)."""

    def __init__(self, name: str | None):
        self.name = name
        self._text = ""

    def feed(self, text: str) -> None:
        self._text += text

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(text left as the answer, the calls)."""
        try:
            value = loads_json(self._text)  # a number past a float's range (1e400) is JSON the grammar lets by
        except ValueError:  # whole with a number no JSON carries (which stays text), or cut short
            if _is_json(self._text):
                return self._text, []
            return "", _written_calls(self._text, self.name)  # none where no name came: no grammar's JSON shown
        if self.name is not None:
            return "", [ToolCall(self.name, _arguments(value))]
        return "", [ToolCall(call["name"], _arguments(call["parameters"])) for call in value]


def _arguments(value) -> str:
    return json.dumps(value, ensure_ascii=False)


_NAME = re.compile(r'"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_PARAMETERS = re.compile(r'"parameters"\s*:\s*')


def _written_calls(text: str, name: str | None) -> list[ToolCall]:
    """The calls of an answer cut short: a named function's arguments so far; for "required", the array's whole
    calls, then the last one where its name came (its parameters' text so far, or none)."""
    if name is not None:
        return [ToolCall(name, text.strip(), complete=False)] if text.strip() else []
    calls, decoder, at = [], json.JSONDecoder(), text.find("[") + 1
    while 0 < at < len(text):
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        try:
            call, at = decoder.raw_decode(text, at)
        except ValueError:  # the call being written when the length ran out
            written = _NAME.search(text, at)
            if written:
                parameters = _PARAMETERS.search(text, written.end())
                arguments = text[parameters.end():].strip() if parameters else ""
                calls.append(ToolCall(json.loads(written.group(1)), arguments, complete=False))
            break
        if not _writable(call["parameters"]):  # a number no JSON carries: the answer stays text
            return []
        calls.append(ToolCall(call["name"], _arguments(call["parameters"])))
    return calls


def _is_json(text: str) -> bool:
    """Whether the text is whole JSON (Python's reading: 1e400 is inf)."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _writable(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True
