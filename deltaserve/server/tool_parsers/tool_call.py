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
