"""Llama 3.x / 4 tool calls (vLLM's llama3_json): an answer of bare JSON calls, however the stream cuts it, is read
back as those calls; any other answer is text, streamed as it comes; the format follows the flag or the template."""

import json
import random

import pytest

from deltaserve.server.output_parser import ChoiceParser
from deltaserve.server.tool_parsers import LLAMA_JSON, TAGS, Llama3JsonToolParser, tool_format_of
from tests.server.tool_call_text import cut, feed_all, random_calls

NAMES = ["get_weather", "search", "add", "lookup_user"]
STRINGS = ["Paris", "a \"quoted\" word", "日本", "x; y", "{not json}", ""]


def test_bare_json_calls_are_read_whatever_the_stream_cuts():
    rng = random.Random()
    for _ in range(50):
        wanted = random_calls(rng, NAMES, STRINGS)
        key = rng.choice(["parameters", "arguments"])
        body = rng.choice([";", "; ", " ;\n"]).join(json.dumps({"name": n, key: a}, ensure_ascii=rng.random() < 0.5)
                                                    for n, a in wanted)
        text = rng.choice(["", " ", "\n"]) + rng.choice(["", "<|python_tag|>"]) + body + rng.choice(["", "\n"])
        answer, calls = feed_all(Llama3JsonToolParser(), cut(text, rng))
        assert answer == "", text
        assert [(c.name, json.loads(c.arguments)) for c in calls] == wanted, text


def test_other_answers_are_text_streamed_as_they_come():
    rng = random.Random()
    for text in ("The weather in Paris is fine.", "  I'll call {a tool} later", "<|python_start|> not the tag"):
        parser, pieces, shown = Llama3JsonToolParser(), cut(text, rng), ""
        for k, piece in enumerate(pieces):
            shown += parser.feed(piece).text
            if len(shown.strip()) >= len("<|python_tag|>"):  # decided: what came has gone out
                assert shown == "".join(pieces[:k + 1])
        assert shown + parser.finish().text == text and not parser.calls


@pytest.mark.parametrize("text", [
    '{"city": "Paris"}',  # JSON, but no call: no name
    '{"name": "get_weather", "parameters": {"city": "Paris"}} and then some words',
    '{"name": "get_weather", "parameters": {"city": "Par',  # cut short by the length
    '{"name": "get_weather", "parameters": [1, 2]}',  # arguments not an object
    '{"name": "add", "parameters": {"x": NaN}}',  # not JSON's numbers
    '<|python_tag|>print("hello")',  # the tag before code, not a call
])
def test_an_answer_that_is_not_calls_alone_is_given_back_as_text(text):
    parser = Llama3JsonToolParser()
    answer, calls = feed_all(parser, cut(text, random.Random()))
    assert answer == text and calls == [] and parser.calls == []


def test_the_format_follows_the_flag_else_the_template():
    llama_template = "{% if builtin_tools %}<|python_tag|>{% endif %}{{ '{\"name\": function name' }}"
    qwen_template = "<tool_call>\n{{ tool_call | tojson }}\n</tool_call>"
    assert tool_format_of(None, llama_template) == LLAMA_JSON
    assert tool_format_of(None, qwen_template) == TAGS
    assert tool_format_of(None, None) == TAGS
    assert tool_format_of("llama3_json", qwen_template) == LLAMA_JSON
    assert tool_format_of("llama4_json", None) == LLAMA_JSON
    assert tool_format_of("hermes", llama_template) == TAGS


def test_a_choice_reads_llama_calls_after_its_reasoning():
    parser = ChoiceParser(reasoning=True, tool_schemas={"get_weather": {}}, tool_format=LLAMA_JSON)
    out = parser.feed('<think>which tool?</think>\n\n{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    out.extend(parser.finish())
    assert out.reasoning == "which tool?" and out.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("get_weather", {"city": "Oslo"})]
