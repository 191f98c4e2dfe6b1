"""PythonicToolParser: tool calls written as a Python list of calls (vLLM's pythonic and llama4_pythonic parsers:
Llama 3.2's and Llama 4's pythonic templates), `[get_weather(city="Paris"), add(x=1, y=2)]`, inside
`<|python_start|>` ... `<|python_end|>` where the reply keeps Llama 4's special tokens. An answer that opens with
"[" or that tag is read as calls (whole_answer.py). The list is read as data, never run: each item a call of a
name (dotted or not) with keyword arguments whose values are literals (strings, numbers, booleans, None, lists,
tuples and dicts of them; JSON's true, false and null are read too).
"""

from __future__ import annotations

import ast
import json
import math

from deltaserve.server.tool_parsers.tool_call import ToolCall
from deltaserve.server.tool_parsers.whole_answer import WholeAnswerToolParser

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
_JSON_NAMES = {"true": True, "false": False, "null": None}


class NotACall(ValueError):
    pass


def parse_pythonic_tool_calls(text: str) -> list[ToolCall] | None:
    """The calls of an answer that opens with "[" or the tag; None where it is not a list of calls alone."""
    body = text.strip()
    if body.startswith(PYTHON_START):
        body = body[len(PYTHON_START):].removesuffix(PYTHON_END).strip()
    try:
        tree = ast.parse(body, mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            raise NotACall("not a list of calls")
        return [_call(item) for item in tree.elts]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _call(node: ast.expr) -> ToolCall:
    if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
        raise NotACall("a call takes keyword arguments only")
    arguments = {k.arg: _value(k.value) for k in node.keywords}
    return ToolCall(name=_name(node.func), arguments=json.dumps(arguments, ensure_ascii=False, allow_nan=False))


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    raise NotACall("a call names a function")


def _value(node: ast.expr):
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, bool, int, float))):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise NotACall("not a JSON number")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise NotACall("a sign before a number only")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        if not all(isinstance(key, ast.Constant) and isinstance(key.value, str) for key in node.keys):
            raise NotACall("a dict's keys are strings")
        return {key.value: _value(value) for key, value in zip(node.keys, node.values)}
    raise NotACall("an argument is a literal")


class PythonicToolParser(WholeAnswerToolParser):
    def __init__(self, schemas: dict[str, dict] | None = None):  # the arguments are the model's literals
        super().__init__(("[", PYTHON_START), parse_pythonic_tool_calls)
