"""Qwen3.5 / Qwen3-Next tool-call body (the Qwen3-Coder XML form):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are raw text; the tool's JSON schema says how to type them (a string stays
as written, anything else is read as JSON when it parses).
"""

from __future__ import annotations

import json
import re

from deltaserve.server.tool_parsers.tool_call import ToolCall, loads_json

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?=</parameter>|<parameter=|</function>|\Z)", re.DOTALL)


def looks_like_xml_call(body: str) -> bool:
    return body.lstrip().startswith("<function=")


def parse_xml_tool_call(body: str, schemas: dict[str, dict] | None = None) -> ToolCall | None:
    """Parse the text between the tags; None when it holds no `<function=...>`."""
    match = _FUNCTION.search(body)
    if match is None:
        return None
    name = match.group(1).strip()
    if not name:
        return None
    properties = _properties(schemas, name)
    arguments = {}
    for param in _PARAMETER.finditer(match.group(2)):
        key = param.group(1).strip()
        arguments[key] = _convert(_strip_one_newline(param.group(2)), properties.get(key))
    return ToolCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _properties(schemas: dict[str, dict] | None, name: str) -> dict:
    schema = (schemas or {}).get(name) or {}
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def _convert(value: str, schema: dict | None):
    """Type a raw parameter value by its schema; without one, read JSON where it parses."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    # the schema is the client's: a type that is not a name (or a list of names) types nothing
    kinds = {k for k in (kind if isinstance(kind, list) else [kind]) if isinstance(k, str)}
    if not kinds:
        kind = None
    if "string" in kinds:
        return value
    if value.strip() == "null" and (kind is None or "null" in kinds):
        return None
    try:
        parsed = loads_json(value)
    except ValueError:
        if "boolean" in kinds and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        return value
    if kind is None:
        return parsed
    if "integer" in kinds and isinstance(parsed, float) and parsed.is_integer():
        return int(parsed)
    return parsed
