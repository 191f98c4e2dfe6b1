"""Tool calls written as a Python list of calls (vLLM's pythonic and llama4_pythonic): read as data, never run,
whatever the stream cuts; anything but a list of calls with literal keyword arguments is text."""

import json
import random

import pytest

from deltaserve.server.tool_parsers import PYTHONIC, PythonicToolParser, tool_call_parser, tool_format_of

NAMES = ["get_weather", "search", "tools.add", "lookup_user"]


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(6 if depth < 2 else 4)
    if kind == 0:
        return rng.randint(-10**6, 10**6)
    if kind == 1:
        return rng.choice(["Paris", "it's \"quoted\"", "日本", "a, b]", "x)", ""])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return round(rng.uniform(-100, 100), 3)
    if kind == 4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def _cut(text: str, rng: random.Random) -> list[str]:
    pieces, at = [], 0
    while at < len(text):
        step = rng.randint(1, 7)
        pieces.append(text[at:at + step])
        at += step
    return pieces


def _feed_all(parser, pieces):
    text, calls = "", []
    for piece in pieces:
        out = parser.feed(piece)
        text, calls = text + out.text, calls + out.tool_calls
    out = parser.finish()
    return text + out.text, calls + out.tool_calls


def test_a_list_of_calls_is_read_whatever_the_stream_cuts():
    rng = random.Random()
    for _ in range(50):
        wanted = [(rng.choice(NAMES), {f"p{i}": _random_value(rng) for i in range(rng.randint(0, 4))})
                  for _ in range(rng.randint(1, 3))]
        # Python's repr of the values, or JSON's true / false / null where a model writes those
        writer = repr if rng.random() < 0.7 else json.dumps
        body = "[" + ", ".join(f"{n}({', '.join(f'{k}={writer(v)}' for k, v in a.items())})" for n, a in wanted) + "]"
        text = rng.choice(["", " ", "\n"]) + (f"<|python_start|>{body}<|python_end|>" if rng.random() < 0.3 else body)
        answer, calls = _feed_all(PythonicToolParser(), _cut(text, rng))
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
    answer, calls = _feed_all(parser, _cut(text, random.Random()))
    assert answer == text and calls == [] and parser.calls == []


def test_the_flags_name_the_pythonic_format():
    assert tool_format_of("pythonic", None) == tool_format_of("llama4_pythonic", "<tool_call>") == PYTHONIC
    assert isinstance(tool_call_parser(PYTHONIC, {"f": {}}), PythonicToolParser)
