"""Tool-call and reasoning parsers on model outputs, whole and streamed in chunks cut anywhere."""

from __future__ import annotations

import json
import random

import pytest

from deltaserve.server.output_parser import ChoiceDelta, ChoiceParser
from deltaserve.server.reasoning import ReasoningSplitter, prompt_opens_reasoning, reasoning_token_count
from deltaserve.server.tool_parsers import ToolCallParser, parse_tool_call_body, written_json_value
from deltaserve.server.tool_parsers.tags import held_suffix_len

WEATHER_SCHEMA = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "zip": {"type": "string"},
            "options": {"type": "object"},
        },
    },
    "get_time": {"type": "object", "properties": {"tz": {"type": "string"}}},
}

# What Qwen3 writes: text, then one JSON object per <tool_call> block.
QWEN3_OUTPUT = (
    "I'll look that up for you.\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "options": {"units": "°C"}}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n'
    "</tool_call>"
)

# What Qwen3.5 / Qwen3-Next write: reasoning, then the XML form.
QWEN35_OUTPUT = (
    "<think>\nThe user wants the weather in Paris; get_weather takes a city and a day count.\n</think>\n\n"
    "<tool_call>\n"
    "<function=get_weather>\n"
    "<parameter=city>\nSaint-Étienne < Lyon\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n"
    "<parameter=metric>\ntrue\n</parameter>\n"
    "<parameter=zip>\n01234\n</parameter>\n"
    '<parameter=options>\n{"units": "metric"}\n</parameter>\n'
    "</function>\n"
    "</tool_call>"
)


def _collect(parser, chunks):
    out = ChoiceDelta()
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    out.extend(parser.finish())
    return out


def _chunkings(text: str, seed: int = 0):
    """Whole, one character at a time, every single cut, and random cuts."""
    yield [text]
    yield list(text)
    for cut in range(1, len(text)):
        yield [text[:cut], text[cut:]]
    rng = random.Random(seed)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(2, 12))))
        bounds = [0, *cuts, len(text)]
        yield [text[a:b] for a, b in zip(bounds, bounds[1:])]


def test_held_suffix_len():
    assert held_suffix_len("abc<tool_", "<tool_call>") == 6
    assert held_suffix_len("abc<", "<tool_call>") == 1
    assert held_suffix_len("abc", "<tool_call>") == 0
    assert held_suffix_len("<tool_call>", "<tool_call>") == 0  # a whole tag is not held, it is found


def test_qwen3_json_calls_in_every_chunking():
    for chunks in _chunkings(QWEN3_OUTPUT):
        got = _collect(ChoiceParser(tool_schemas=WEATHER_SCHEMA), chunks)
        assert got.content == "I'll look that up for you.\n", chunks
        assert got.reasoning == ""
        assert [c.name for c in got.tool_calls] == ["get_weather", "get_time"]
        assert json.loads(got.tool_calls[0].arguments) == {"city": "Paris", "days": 3, "options": {"units": "°C"}}
        assert json.loads(got.tool_calls[1].arguments) == {"tz": "Europe/Paris"}


def test_qwen35_xml_call_with_reasoning_in_every_chunking():
    for chunks in _chunkings(QWEN35_OUTPUT, seed=1):
        got = _collect(ChoiceParser(reasoning=True, tool_schemas=WEATHER_SCHEMA), chunks)
        assert got.reasoning == "\nThe user wants the weather in Paris; get_weather takes a city and a day count.\n"
        assert got.content == ""
        assert len(got.tool_calls) == 1
        call = got.tool_calls[0]
        assert call.name == "get_weather"
        assert json.loads(call.arguments) == {
            "city": "Saint-Étienne < Lyon",  # a string stays as written, '<' included
            "days": 3,
            "metric": True,
            "zip": "01234",  # typed string by the schema: not read as a number
            "options": {"units": "metric"},
        }


def test_calls_are_emitted_as_soon_as_they_close():
    parser = ToolCallParser(WEATHER_SCHEMA)
    first_close = QWEN3_OUTPUT.index("</tool_call>") + len("</tool_call>")
    delta = parser.feed(QWEN3_OUTPUT[:first_close])
    assert delta.text == "I'll look that up for you.\n"
    assert [c.name for c in delta.tool_calls] == ["get_weather"]
    rest = parser.feed(QWEN3_OUTPUT[first_close:])
    assert [c.name for c in rest.tool_calls] == ["get_time"]
    assert rest.text == ""  # the newline between calls is layout, not content


def test_text_between_calls_is_the_same_in_every_chunking():
    """Random text and whitespace around and between calls: each stretch between calls that holds text comes
    back whole, its whitespace included, and a stretch of whitespace alone is dropped (before the first call too,
    as vLLM's reply has no content of whitespace alone beside its calls), however it is cut."""
    rng = random.Random()
    call = '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'
    for _ in range(20):
        stretches = ["".join(rng.choice([" ", "\n", "a", "b."]) for _ in range(rng.randint(0, 6)))
                     for _ in range(rng.randint(2, 4))]
        text = call.join(stretches)
        calls = len(stretches) - 1
        expected = "".join(s for s in stretches if s.strip())
        for chunks in _chunkings(text, seed=rng.randrange(1000)):
            got = _collect(ChoiceParser(tool_schemas=WEATHER_SCHEMA), chunks)
            assert (got.content, len(got.tool_calls)) == (expected, calls), chunks


def test_text_without_calls_passes_through_and_lookalikes_survive():
    text = "Use <b>bold</b> or a <tool> tag; 3 < 4 and <tool_calls> is not ours."
    for chunks in _chunkings(text):
        got = _collect(ChoiceParser(tool_schemas=WEATHER_SCHEMA), chunks)
        assert got.content == text
        assert got.tool_calls == []


def test_malformed_call_is_returned_as_text():
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call> done'
    for chunks in _chunkings(text):
        got = _collect(ChoiceParser(tool_schemas=WEATHER_SCHEMA), chunks)
        assert got.content == text
        assert got.tool_calls == []


def test_unclosed_call_at_the_end():
    complete = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n'
    got = _collect(ChoiceParser(tool_schemas=WEATHER_SCHEMA), [complete])
    assert [c.name for c in got.tool_calls] == ["get_time"]  # cut off by max_tokens after a full body
    cut = '<tool_call>\n{"name": "get_time", "argu'
    got = _collect(ChoiceParser(tool_schemas=WEATHER_SCHEMA), [cut])
    assert got.tool_calls == [] and got.content == cut


def test_xml_without_schema_keeps_strings_and_reads_missing_close_tags():
    # as vLLM's qwen3_coder parser: a parameter no schema declares is the text written
    body = "\n<function=set_volume>\n<parameter=level>\n7\n<parameter=label>\nloud music\n</function>\n"
    [call] = parse_tool_call_body(body)
    assert call.name == "set_volume"
    assert json.loads(call.arguments) == {"level": "7", "label": "loud music"}


def test_json_call_with_string_arguments_and_parameters_key():
    [call] = parse_tool_call_body('{"name": "f", "arguments": "{\\"x\\": 1}"}')
    assert json.loads(call.arguments) == {"x": 1}
    [call] = parse_tool_call_body('{"name": "g", "parameters": {"y": [1, 2]}}')
    assert json.loads(call.arguments) == {"y": [1, 2]}
    assert parse_tool_call_body('["not", "a", "call"]') is None


def test_tool_calls_not_parsed_without_tools():
    got = _collect(ChoiceParser(tool_schemas=None), [QWEN3_OUTPUT])
    assert got.content == QWEN3_OUTPUT and got.tool_calls == []


REASONING_OUTPUT = "<think>\nFirst, 2+2.\nThat is 4.\n</think>\n\nThe answer is 4."


@pytest.mark.parametrize("start_in_reasoning", [False, True])
def test_reasoning_split_in_every_chunking(start_in_reasoning):
    text = REASONING_OUTPUT
    if start_in_reasoning:  # the template opened the block in the prompt
        text = text[len("<think>"):]
    for chunks in _chunkings(text, seed=2):
        splitter = ReasoningSplitter(start_in_reasoning)
        reasoning = content = ""
        for chunk in chunks:
            d = splitter.feed(chunk)
            reasoning += d.reasoning
            content += d.content
        d = splitter.finish()
        reasoning += d.reasoning
        content += d.content
        assert reasoning == "\nFirst, 2+2.\nThat is 4.\n", chunks
        assert content == "The answer is 4."


def test_reasoning_not_opened_means_plain_content():
    for chunks in _chunkings("  The <think> tag mid-text is content."):
        splitter = ReasoningSplitter(False)
        content = "".join(splitter.feed(c).content for c in chunks) + splitter.finish().content
        assert content == "  The <think> tag mid-text is content."


def test_unfinished_reasoning_stays_reasoning():
    splitter = ReasoningSplitter(False)
    d = splitter.feed("<think>still thinking</thi")
    assert d.reasoning == "still thinking" and d.content == ""
    assert splitter.finish().reasoning == "</thi"


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")


def _random_json(depth: int = 0):
    kinds = ["int", "float", "str", "bool", "null"] + (["list", "dict"] if depth < 3 else [])
    kind = random.choice(kinds)
    if kind == "dict":
        return {"k%d%s" % (i, random.choice(["", ",", '\\"', "{"])): _random_json(depth + 1)
                for i in range(random.randint(0, 4))}
    if kind == "list":
        return [_random_json(depth + 1) for _ in range(random.randint(0, 4))]
    return {"int": lambda: random.randint(-10**6, 10**6), "float": lambda: random.uniform(-1e3, 1e3),
            "str": lambda: "".join(random.choice('ab ,:"\\{}[]é') for _ in range(random.randint(0, 8))),
            "bool": lambda: random.random() < 0.5, "null": lambda: None}[kind]()


def _written_part_of(part, whole) -> bool:
    """Whether `part` is what a prefix of `whole`'s JSON holds: whole members and items, then the last one's
    own written part; a string's prefix; any other value whole."""
    if isinstance(whole, dict):
        keys = list(part) if isinstance(part, dict) else None
        return keys == list(whole)[: len(keys)] and all(part[k] == whole[k] for k in keys[:-1]) and \
            (not keys or _written_part_of(part[keys[-1]], whole[keys[-1]]))
    if isinstance(whole, list):
        n = len(part) if isinstance(part, list) else -1
        return 0 <= n <= len(whole) and (n == 0 or part[:-1] == whole[: n - 1] and _written_part_of(part[-1], whole[n - 1]))
    if isinstance(whole, str):
        return isinstance(part, str) and whole.startswith(part)
    return part == whole


def test_a_json_object_cut_anywhere_reads_as_what_was_written_of_it():
    """Anthropic's input of a tool call the length cut short: at every cut the value is the object's written
    part (never a number cut short, nor a string's escape halved), and the whole text reads back whole."""
    for _ in range(20):
        whole = {f"p{i}": _random_json() for i in range(random.randint(1, 4))}
        text = json.dumps(whole, ensure_ascii=random.random() < 0.5, indent=random.choice([None, 1]))
        assert written_json_value(text) == whole
        for cut in range(len(text)):
            part = written_json_value(text[:cut])
            assert isinstance(part, dict) and _written_part_of(part, whole), (text[:cut], part)


@pytest.mark.parametrize("opens", [False, True])
def test_reasoning_tokens_are_those_within_the_think_block(opens):
    """Counted from the token ids: the tokens between <think> and </think> (or from the output's start where the
    prompt opened the block), the tags not counted, nothing after the block."""
    start, end = 7, 8
    before = [] if opens else [random.randrange(10, 99) for _ in range(random.randint(0, 3))]
    thought = [random.randrange(10, 99) for _ in range(random.randint(0, 12))]
    after = [random.randrange(10, 99) for _ in range(random.randint(0, 6))]
    closed = random.random() < 0.7  # else the output ends inside the block (cut by its length)
    ids = before + ([] if opens else [start]) + thought + ([end] + after if closed else [])
    assert reasoning_token_count(ids, (start, end), opens) == len(thought)
    assert reasoning_token_count(before + after, (start, end), False) == 0


@pytest.mark.parametrize("opens", [False, True])
def test_a_call_made_from_the_reasoning_ends_it(opens):
    """As vLLM's Qwen3 parser: a <tool_call> inside the think block (no </think> before it) ends the reasoning and
    is the answer's call, in every chunking; a </think> that comes first ends it as always."""
    thought = random.choice(["hmm ", "I should call f.\n", ""])
    call = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    text = ("" if opens else "<think>") + thought + call
    for chunks in _chunkings(text, seed=random.randrange(10**6)):
        out = _collect(ChoiceParser(reasoning=True, start_in_reasoning=opens, tool_schemas={"f": {}}), chunks)
        assert out.reasoning == thought and out.content == "", chunks
        assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("f", {"x": 1})], chunks
    closed = _collect(ChoiceParser(reasoning=True, start_in_reasoning=True, tool_schemas={"f": {}}),
                      ["a </think>\n\nb ", call])
    assert (closed.reasoning, closed.content, len(closed.tool_calls)) == ("a ", "b ", 1)


# vLLM's qwen3_coder typing: the types the schema allows (type, enum values, anyOf / oneOf / allOf; a string where
# it names none), the first that reads the value in the order null, integer, number, boolean, object, array, string
PARAMETER_TYPING = [
    ({"type": "string"}, "  Paris ", "  Paris "),  # a string keeps its own whitespace
    ({"type": "string"}, "null", "null"),
    ({"type": ["string", "null"]}, "null", None),
    ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "123", "123"),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "5", 5),
    ({"oneOf": [{"type": "boolean"}, {"type": "string"}]}, "true", True),
    ({"enum": ["a", "b"]}, "1", "1"),
    ({"enum": [1, 2]}, "2", 2),
    ({"description": "no type"}, "42", "42"),
    (None, '{"a": 1}', '{"a": 1}'),  # a parameter the tool does not declare
    ({"type": "integer"}, "007", 7),
    ({"type": "integer"}, " 5 ", 5),
    ({"type": "integer"}, "2.5", 2.5),  # no integer, read as JSON
    ({"type": "integer"}, "abc", "abc"),
    ({"type": "int"}, "7", 7),  # vLLM's aliases
    ({"type": "number"}, "1e5", 100000),
    ({"type": "number"}, "2.5", 2.5),
    ({"type": "number"}, "NaN", "NaN"),  # no JSON number: the text
    ({"type": "boolean"}, "1", True),
    ({"type": "boolean"}, "False", False),
    ({"type": "object"}, '{"a": [1, null]}', {"a": [1, None]}),
    ({"type": "array"}, "[1, 2]", [1, 2]),
    ({"type": "array"}, "[1, 2", "[1, 2"),
]


@pytest.mark.parametrize("schema,value,typed", PARAMETER_TYPING)
def test_xml_parameters_are_typed_as_vllm_types_them(schema, value, typed):
    properties = {} if schema is None else {"x": schema}
    text = f"<tool_call>\n<function=f>\n<parameter=x>\n{value}\n</parameter>\n</function>\n</tool_call>"
    got = _collect(ChoiceParser(tool_schemas={"f": {"type": "object", "properties": properties}}), [text])
    assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == [("f", {"x": typed})]


def test_every_function_of_one_tool_call_is_a_call_in_every_chunking():
    text = ("Sure.\n<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n"
            "<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")
    for chunks in _chunkings(text):
        got = _collect(ChoiceParser(tool_schemas=WEATHER_SCHEMA), chunks)
        assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == \
            [("get_time", {"tz": "UTC"}), ("get_weather", {"days": 2})], chunks
        assert got.content == "Sure.\n"


def test_a_function_written_without_tool_call_tags_is_a_call_in_every_chunking():
    # as vLLM's qwen3_coder parser: <function=...> outside <tool_call> opens a call, a </tool_call> after it closes
    # nothing, and whitespace alone around the calls is layout
    call = "<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>"
    for text in (f"\n\n{call}\n</tool_call>\n", f"{call}\n{call}", f"{call}\nDone. </tool_call> stays"):
        for chunks in _chunkings(text):
            got = _collect(ChoiceParser(tool_schemas=WEATHER_SCHEMA), chunks)
            assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == \
                [("get_time", {"tz": "UTC"})] * text.count(call), chunks
            assert got.content == ("\nDone. </tool_call> stays" if "Done" in text else ""), chunks
    unclosed = "See <function=get_time> in the docs"  # no </function>: the text as written
    for chunks in _chunkings(unclosed):
        got = _collect(ChoiceParser(tool_schemas=WEATHER_SCHEMA), chunks)
        assert got.tool_calls == [] and got.content == unclosed, chunks


def test_whitespace_alone_is_kept_where_no_call_is_made():
    for text in ("\n\n", " ", "\n \n"):
        for chunks in _chunkings(text):
            got = _collect(ChoiceParser(tool_schemas=WEATHER_SCHEMA), chunks)
            assert got.content == text and got.tool_calls == []
