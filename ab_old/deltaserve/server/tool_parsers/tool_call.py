"""ToolCall: one parsed function call, with its arguments as a JSON object string."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


def new_tool_call_id(prefix: str = "call_") -> str:
    return prefix + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI's `function.arguments` carries it
    id: str = field(default_factory=new_tool_call_id)
