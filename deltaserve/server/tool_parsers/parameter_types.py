"""Typing a raw parameter value of an XML tool call by its JSON schema, as vLLM's qwen3_coder parser does.

The types a schema allows are read from its `type` (a name or a list of names), the values of its `enum`,
and the branches of its `anyOf` / `oneOf` / `allOf`; a schema that names none, or no schema at all (a
parameter the tool does not declare), allows only a string. The value is then read as the first type
allowed, in the order null, integer, number, boolean, object, array, string, that reads it; where none
does, it is read as JSON, or kept as the text it is.
"""

from __future__ import annotations

import math
from typing import Any

from deltaserve.server.tool_parsers.tool_call import loads_json

_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")
_ALIASES = {"str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
            "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
            "uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer",
            "float": "number", "float32": "number", "float64": "number", "double": "number",
            "bool": "boolean", "dict": "object", "arr": "array", "list": "array", "sequence": "array"}


def schema_types(schema: Any) -> set[str]:
    """The JSON types a parameter's schema allows; {"string"} where it names none."""
    types = _named_types(schema)
    return types or {"string"}


def _named_types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    declared = schema.get("type")
    names = declared if isinstance(declared, list) else [declared]
    types = {_ALIASES.get(n.strip().lower(), n.strip().lower()) for n in names if isinstance(n, str)}
    enum = schema.get("enum")
    if isinstance(enum, list):
        types.update(_type_of(value) for value in enum)
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                types |= _named_types(branch)
    return types


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "string"


def typed_value(value: str, types: set[str]) -> Any:
    """The value read as the first of `types` (in _ORDER) that reads it, else as JSON, else the text."""
    text = value.strip()
    for kind in _ORDER:
        if kind not in types:
            continue
        if kind == "string":
            return value
        read = _READERS[kind](text)
        if read is not _NO:
            return read
    read = _json(text)
    return value if read is _NO else read


_NO = object()  # a reader's "does not read it"


def _null(text: str):
    return None if text.lower() == "null" else _NO


def _integer(text: str):
    try:
        return int(text)
    except ValueError:
        return _NO


def _number(text: str):
    try:
        number = float(text)
    except ValueError:
        return _NO
    if not math.isfinite(number):  # no JSON number: kept as text
        return _NO
    return int(number) if number.is_integer() else number


def _boolean(text: str):
    return {"true": True, "1": True, "false": False, "0": False}.get(text.lower(), _NO)


def _json(text: str):
    try:
        return loads_json(text)  # refuses NaN, Infinity and numbers past a float's range
    except ValueError:
        return _NO


_READERS = {"null": _null, "integer": _integer, "number": _number, "boolean": _boolean, "object": _json,
            "array": _json}
