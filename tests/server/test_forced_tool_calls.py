"""forced_tool_calls: the schema of a demanded call, and its answer read back as calls."""

import json
import random

from deltaserve.server.forced_tool_calls import ANY_OBJECT, ForcedToolCalls, forced_tool_schema

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
    assert [s["properties"]["parameters"] for s in schema["items"]["anyOf"]] == [SCHEMAS["a"], ANY_OBJECT]
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
