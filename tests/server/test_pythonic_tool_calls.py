"""Tool calls written as a Python list of calls (vLLM's pythonic and llama4_pythonic): read as data, never run,
whatever the stream cuts; anything but a list of calls with literal keyword arguments is text."""

import json
import random

import pytest

from deltaserve.server.tool_parsers import PYTHONIC, PythonicToolParser, tool_call_parser, tool_format_of
from tests.server.tool_call_text import cut, feed_all, random_calls

NAMES = ["get_weather", "search", "tools.add", "lookup_user"]
STRINGS = ["Paris", "it's \"quoted\"", "日本", "a, b]", "x)", ""]


def test_a_list_of_calls_is_read_whatever_the_stream_cuts():
    rng = random.Random()
    for _ in range(50):
        wanted = random_calls(rng, NAMES, STRINGS)
        # Python's repr of the values, or JSON's true / false / null where a model writes those
        writer = repr if rng.random() < 0.7 else json.dumps
        body = "[" + ", ".join(f"{n}({', '.join(f'{k}={writer(v)}' for k, v in a.items())})" for n, a in wanted) + "]"
        text = rng.choice(["", " ", "\n"]) + (f"<|python_start|>{body}<|python_end|>" if rng.random() < 0.3 else body)
        answer, calls = feed_all(PythonicToolParser(), cut(text, rng))
        assert answer == "", text
        assert [(c.name, json.loads(c.arguments)) for c in calls] == wanted, text


@pytest.mark.parametrize("text", [
    "[1, 2, 3]",  # a list, not of calls
    "[]",
    "[get_weather('Paris')]",  # a positional argument names no parameter
    "[get_weather(city=open('/etc/passwd').read())]",  # never run: only literals are arguments
    "[get_weather(**options)]",
    "[add(x=1e999)]",  # not a JSON number
    "[get_weather(city='Paris')] and some words",
    "[get_weather(city='Par",  # cut short by the length
    "(get_weather(city='Paris'))",
    "Sure, I can help with that.",
])
def test_anything_else_is_given_back_as_text(text):
    parser = PythonicToolParser()
    answer, calls = feed_all(parser, cut(text, random.Random()))
    assert answer == text and calls == [] and parser.calls == []


def test_the_flags_name_the_pythonic_format():
    assert tool_format_of("pythonic", None) == tool_format_of("llama4_pythonic", "<tool_call>") == PYTHONIC
    assert isinstance(tool_call_parser(PYTHONIC, {"f": {}}), PythonicToolParser)
