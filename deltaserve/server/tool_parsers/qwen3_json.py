"""Qwen3's tool-call body: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""

from __future__ import annotations

import json

from deltaserve.server.tool_parsers.tool_call import ToolCall, loads_json


def parse_json_tool_call(body: str) -> ToolCall | None:
    """Parse the text between the tags; None when it is not a well-formed call."""
    try:
        obj = loads_json(body.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = loads_json(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(name=obj["name"], arguments=json.dumps(arguments, ensure_ascii=False))
