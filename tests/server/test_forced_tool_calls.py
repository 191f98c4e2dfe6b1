"""forced_tool_calls: the schema of a demanded call, and its answer read back as calls; tools whose parameters
refer to their own nodes, through the grammar and through a live server's three routes."""

import json
import random

import httpx
import pytest
from pydantic import BaseModel, Field

from deltaserve.server.forced_tool_calls import (
    ANY_OBJECT,
    ForcedToolCalls,
    demanded_call_structure,
    forced_tool_schema,
)
from tests.server.conftest import MODEL
from tests.server.test_relocated_schema import resolve_ref

SCHEMAS = {"a": {"type": "object", "properties": {"x": {"type": "integer"}}}, "b": {}}


def test_a_named_call_is_its_parameters_schema_and_reads_back_whole():
    assert forced_tool_schema(SCHEMAS, "a") == SCHEMAS["a"] and forced_tool_schema(SCHEMAS, "b") == ANY_OBJECT
    x = random.randint(-99, 99)
    forced = ForcedToolCalls("a")
    text = json.dumps({"x": x}, indent=random.choice([None, 2]))
    cut = random.randrange(len(text))
    forced.feed(text[:cut])
    forced.feed(text[cut:])
    content, calls = forced.finish()
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": x})]


def test_required_calls_are_an_array_of_named_calls():
    schema = forced_tool_schema(SCHEMAS, None, parallel=False)
    assert schema["maxItems"] == 1 and "maxItems" not in forced_tool_schema(SCHEMAS, None)
    assert [s["properties"]["name"]["const"] for s in schema["items"]["anyOf"]] == ["a", "b"]
    assert [resolve_ref(schema, s["properties"]["parameters"]["$ref"]) for s in schema["items"]["anyOf"]] == [
        SCHEMAS["a"], ANY_OBJECT]
    values = [{"name": random.choice("ab"), "parameters": {"x": random.randint(0, 9)}} for _ in range(3)]
    forced = ForcedToolCalls(None)
    forced.feed(json.dumps(values))
    content, calls = forced.finish()
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [
        (v["name"], v["parameters"]) for v in values]
    assert len({c.id for c in calls}) == 3


def _calls(forced: ForcedToolCalls) -> tuple[str, list[tuple[str, str, bool]]]:
    content, calls = forced.finish()
    return content, [(c.name, c.arguments, c.complete) for c in calls]


def test_calls_cut_short_are_the_calls_as_far_as_they_were_written():
    """OpenAI's way with a demanded call the length cut short: the calls whose names came, the last one's
    arguments the text written so far; where no name came, none (and no text)."""
    values = [{"name": random.choice("ab"), "parameters": {"x": random.randint(0, 999), "y": "z" * 9}}
              for _ in range(random.randint(1, 3))]
    items = [json.dumps(v) for v in values]
    text = "[" + ", ".join(items) + "]"
    cut = random.randrange(1, len(text) - 1)
    expected, start = [], 1
    for value, item in zip(values, items):
        end = start + len(item)
        if end <= cut:
            expected.append((value["name"], json.dumps(value["parameters"]), True))
        else:
            name_end = start + item.index('", "parameters"') + 1
            arguments_at = start + item.index('"parameters": ') + len('"parameters": ')
            if name_end <= cut:
                expected.append((value["name"], text[arguments_at:cut].strip(), False))
            break
        start = end + 2
    forced = ForcedToolCalls(None)
    forced.feed(text[:cut])
    assert _calls(forced) == ("", expected)  # no text either way: the JSON around the calls is the grammar's
    named = ForcedToolCalls("a")
    arguments = json.dumps(values[0]["parameters"])
    cut = random.randrange(1, len(arguments))
    named.feed(arguments[:cut])
    assert _calls(named) == ("", [("a", arguments[:cut].strip(), False)])


def test_arguments_that_json_cannot_write_back_stay_text():
    """1e400 is JSON the grammar lets by, but as a float it is inf, which no JSON carries: the answer stays text."""
    text = random.choice(['{"x": 1e400}', '[{"name": "a", "parameters": {"x": -1e999}}]'])
    forced = ForcedToolCalls("a" if text.startswith("{") else None)
    forced.feed(text)
    assert forced.finish() == (text, [])


# Tools whose parameters refer to their own nodes: pydantic's nested model ("#/$defs/Item"), draft 7's
# "definitions", and the parameters' root itself ("#"). Held in a demanded call's schema, each must resolve
# within its own tool's parameters.
class Item(BaseModel):
    sku: str = Field(max_length=6)
    qty: int = Field(ge=1, le=9)


class Order(BaseModel):
    items: list[Item] = Field(min_length=1, max_length=2)


REFERRING = {
    "place_order": Order.model_json_schema(),
    "ship": {"type": "object", "properties": {"to": {"$ref": "#/definitions/Address"}}, "required": ["to"],
             "definitions": {"Address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                                         "required": ["city"]}}},
    "note_tree": {"type": "object", "properties": {"text": {"type": "string", "maxLength": 8}, "reply": {"$ref": "#"}},
                  "required": ["text"]},
}


def _refs_in(node, path=()):
    """(path, reference) of each $ref in a schema."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield path, value
            else:
                yield from _refs_in(value, path + (key,))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _refs_in(item, path + (i,))


def _at(node, path):
    for key in path:
        node = node[key]
    return node


def test_each_tools_references_resolve_within_its_own_parameters():
    schema = forced_tool_schema(REFERRING, None)
    for call in schema["items"]["anyOf"]:
        tool = call["properties"]["name"]["const"]
        own = resolve_ref(schema, call["properties"]["parameters"]["$ref"])
        refs = list(_refs_in(REFERRING[tool]))
        assert refs and [path for path, _ in _refs_in(own)] == [path for path, _ in refs]
        for path, ref in refs:
            assert resolve_ref(schema, _at(own, path)["$ref"]) is resolve_ref(own, ref)


@pytest.fixture(scope="module")
def demo_grammars():
    """The engine's grammar compiler over the demo model's vocabulary."""
    pytest.importorskip("llguidance")
    from deltaserve.engine.grammar import GrammarCompiler
    from deltaserve.models.gguf_loader import demo_model_path
    from deltaserve.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(demo_model_path())
    return GrammarCompiler(tokenizer.hf, len(tokenizer.hf), [tokenizer.hf.eos_token_id],
                           lambda text: tokenizer.encode(text, add_special_tokens=False))


def _takes(grammars, name: str | None, answer) -> bool:
    """Whether the grammar of a demanded call takes `answer` whole."""
    params = demanded_call_structure(REFERRING, name, parallel=True, opens_reasoning=False)
    matcher = grammars.matcher(params, grammars.compile(params)).matcher
    matcher.consume_tokens(grammars.ll_tokenizer().tokenize_str(json.dumps(answer)))
    return not matcher.is_error() and matcher.is_accepting()


VALID_ARGUMENTS = {"place_order": {"items": [{"sku": "APL", "qty": 2}]}, "ship": {"to": {"city": "Oslo"}},
                   "note_tree": {"text": "hi", "reply": {"text": "yo", "reply": {"text": "ok"}}}}


def test_the_grammar_of_demanded_calls_reads_references_in_their_own_parameters(demo_grammars):
    for tool, arguments in VALID_ARGUMENTS.items():
        _check_arguments(arguments, REFERRING[tool])
        assert _takes(demo_grammars, None, [{"name": tool, "parameters": arguments}])
        assert _takes(demo_grammars, tool, arguments)
    # "#" is the note's schema, not the answer's array of calls; the nested model's bounds hold
    reply_as_calls = {"text": "hi", "reply": [{"name": "ship", "parameters": VALID_ARGUMENTS["ship"]}]}
    past_its_bounds = {"items": [{"sku": "APL", "qty": 10}]}
    for tool, arguments in (("note_tree", reply_as_calls), ("place_order", past_its_bounds)):
        with pytest.raises(AssertionError):
            _check_arguments(arguments, REFERRING[tool])
        assert not _takes(demo_grammars, None, [{"name": tool, "parameters": arguments}])


# What the validator below reads of a schema; anything else fails the check rather than pass unread.
_ANNOTATIONS = {"title", "description", "$defs", "definitions"}
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _check_arguments(value, schema: dict, root: dict | None = None, where: str = "$") -> None:
    """Asserts that `value` meets `schema`, for the keywords these tests' schemas use."""
    root = schema if root is None else root
    unread = set(schema) - _ANNOTATIONS - {"$ref", "type", "properties", "required", "additionalProperties",
                                           "items", "minItems", "maxItems", "maxLength", "minimum", "maximum"}
    assert not unread, f"the test's validator does not read {unread}"
    if "$ref" in schema:
        _check_arguments(value, resolve_ref(root, schema["$ref"]), root, where)
    if "type" in schema:
        assert _is_of_type(value, schema["type"]), f"{where}: {value!r} is not of type {schema['type']}"
    if isinstance(value, dict):
        _check_object(value, schema, root, where)
    if isinstance(value, list):
        assert schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)), where
        for i, item in enumerate(value):
            _check_arguments(item, schema.get("items", {}), root, f"{where}[{i}]")
    if isinstance(value, str):
        assert len(value) <= schema.get("maxLength", len(value)), where
    if _is_of_type(value, "integer"):
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), where


def _check_object(value: dict, schema: dict, root: dict, where: str) -> None:
    properties = schema.get("properties", {})
    assert set(schema.get("required", [])) <= set(value), f"{where}: {value!r} lacks {schema['required']}"
    for name, item in value.items():
        if name in properties:
            _check_arguments(item, properties[name], root, f"{where}.{name}")
        else:
            assert schema.get("additionalProperties", True) is True, f"{where}: {name} is not a property"


def _is_of_type(value, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


PROMPT = "Order two apples, sku APL, and ship them to Oslo."


def _openai_tools(api: str) -> list[dict]:
    if api == "chat":
        return [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in REFERRING.items()]
    return [{"type": "function", "name": n, "parameters": p} for n, p in REFERRING.items()]


def _demanded_calls(server, api: str, tool: str | None) -> tuple[list[tuple[str, object]], bool]:
    """The calls a live server answers a demand with (any tool where `tool` is None), their arguments
    parsed, and whether the answer was whole (where the length cut it off, the last call is left out)."""
    if api == "chat":
        choice = "required" if tool is None else {"type": "function", "function": {"name": tool}}
        body = {"messages": [{"role": "user", "content": PROMPT}], "tools": _openai_tools(api),
                "tool_choice": choice, "max_tokens": 160}
        reply = _post(server, "/v1/chat/completions", body)["choices"][0]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in reply["message"]["tool_calls"]]
        return _parsed(calls, reply["finish_reason"] != "length")
    if api == "messages":
        choice = {"type": "any"} if tool is None else {"type": "tool", "name": tool}
        body = {"messages": [{"role": "user", "content": PROMPT}], "tool_choice": choice, "max_tokens": 160,
                "tools": [{"name": n, "input_schema": p} for n, p in REFERRING.items()]}
        reply = _post(server, "/v1/messages", body)
        calls = [(b["name"], json.dumps(b["input"])) for b in reply["content"] if b["type"] == "tool_use"]
        return _parsed(calls, reply["stop_reason"] == "tool_use")
    choice = "required" if tool is None else {"type": "function", "name": tool}
    body = {"input": PROMPT, "tools": _openai_tools(api), "tool_choice": choice, "max_output_tokens": 160}
    reply = _post(server, "/v1/responses", body)
    calls = [(item["name"], item["arguments"]) for item in reply["output"] if item["type"] == "function_call"]
    return _parsed(calls, reply["status"] == "completed")


def _post(server, route: str, body: dict) -> dict:
    r = httpx.post(server.url + route, json={"model": MODEL, "temperature": 0, **body}, headers=server.headers,
                   timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _parsed(calls: list[tuple[str, str]], whole: bool) -> tuple[list[tuple[str, object]], bool]:
    assert calls
    return [(name, json.loads(arguments)) for name, arguments in (calls if whole else calls[:-1])], whole


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_demanded_calls_of_tools_with_references_are_answered_and_meet_their_parameters(server, api):
    """OpenAI's "required" and a named function, Anthropic's "any" and "tool", the Responses API's "required"
    and a named function: a call that the length did not cut short meets its tool's own parameters."""
    checked = 0
    for tool in (None, *REFERRING):
        calls, _ = _demanded_calls(server, api, tool)
        assert tool is None or {name for name, _ in calls} == {tool}
        for name, arguments in calls:
            _check_arguments(arguments, REFERRING[name])
            checked += 1
    assert checked  # greedy answers here are whole, but a note may nest until the length runs out


def test_a_response_format_with_references_reads_them_from_its_own_root(server):
    """Beside the demanded calls: a response format's schema is not nested in another, so pydantic's references
    already resolve where it was written."""
    schema = REFERRING["place_order"]
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 160,
            "response_format": {"type": "json_schema", "json_schema": {"name": "order", "schema": schema}}}
    reply = _post(server, "/v1/chat/completions", body)["choices"][0]
    assert reply["finish_reason"] == "stop"
    _check_arguments(json.loads(reply["message"]["content"]), schema)
