"""Qwen3.5 / Qwen3-Next tool-call body (the Qwen3-Coder XML form):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are raw text, typed by the tool's JSON schema as vLLM's qwen3_coder parser types them
(parameter_types.py); a body may hold several `<function=...>` blocks, each a call.
"""

from __future__ import annotations

import json
import re

from deltaserve.server.tool_parsers.parameter_types import schema_types, typed_value
from deltaserve.server.tool_parsers.tool_call import ToolCall

FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?=</parameter>|<parameter=|</function>|\Z)", re.DOTALL)


def looks_like_xml_call(body: str) -> bool:
    return body.lstrip().startswith(FUNCTION_OPEN)


def parse_xml_tool_calls(body: str, schemas: dict[str, dict] | None = None) -> list[ToolCall] | None:
    """Each `<function=...>` block of the text between the tags, in order; None where it holds none, or one
    without a name."""
    calls = []
    for match in _FUNCTION.finditer(body):
        name = match.group(1).strip()
        if not name:
            return None
        properties = _properties(schemas, name)
        arguments = {}
        for param in _PARAMETER.finditer(match.group(2)):
            key = param.group(1).strip()
            value = _strip_one_newline(param.group(2))
            arguments[key] = typed_value(value, schema_types(properties.get(key)))
        calls.append(ToolCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
    return calls or None


def _strip_one_newline(value: str) -> str:
    """The template writes a value between two newlines; any other whitespace is the value's own (a file's
    indentation, its last newline)."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _properties(schemas: dict[str, dict] | None, name: str) -> dict:
    schema = (schemas or {}).get(name) or {}
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}
