"""ToolCall: one parsed function call, with its arguments as a JSON object string."""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field


def new_tool_call_id(prefix: str = "call_") -> str:
    return prefix + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI's `function.arguments` carries it
    id: str = field(default_factory=new_tool_call_id)
    complete: bool = True  # False: cut short by the length, `arguments` the text written so far


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400
        raise ValueError(f"{text} is out of a float's range")
    return value


def loads_json(text: str):
    """json.loads without the numbers that are not JSON's: Python's NaN / Infinity / -Infinity (RFC 8259 has none)
    and numbers past a float's range (1e400, read as inf). Arguments that held one could not be written back as JSON
    (a response body refuses them; a client's JSON.parse fails on them)."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def written_json_value(text: str) -> dict:
    """What an object's JSON text cut short holds so far, as a client's partial parser reads it: its open string
    ended, its open arrays and objects closed, a member or item left half-written dropped ({} where nothing is
    whole). Anthropic's tool_use block of a call the length cut short carries it as its input."""
    stack, in_string, escaped = [], False, False
    closers_at = {}  # where the text may be cut (after an opening, before a comma) -> what closes it there

    def closers() -> str:
        return "".join("}" if c == "{" else "]" for c in reversed(stack))

    for i, char in enumerate(text):
        if in_string:
            in_string = escaped or char != '"'
            escaped = not escaped and char == "\\"
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append(char)
            closers_at[i + 1] = closers()
        elif char in "}]" and stack:
            stack.pop()
        elif char == ",":
            closers_at[i] = closers()
    if in_string:  # the open string ends where the text does (a dangling escape left out)
        text = (text[:-1] if escaped else text) + '"'
    if in_string or not text or text[-1] not in "0123456789.eE+-":  # a number at the end may be cut short
        closers_at[len(text)] = closers()
    for cut in sorted(closers_at, reverse=True):
        try:
            value = loads_json(text[:cut] + closers_at[cut])
        except ValueError:
            continue
        return value if isinstance(value, dict) else {}
    return {}
