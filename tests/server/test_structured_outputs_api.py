"""Structured outputs through the OpenAI API of a live server on the demo model: response_format's json_schema
and json_object, and vLLM's structured_outputs (regex, choice, grammar), whole and streamed."""

from __future__ import annotations

import json
import random
import re

import httpx
import openai
import pytest

from deltaserve.server.tool_parsers import written_json_value
from tests.server.conftest import API_KEY, MODEL

pytestmark = pytest.mark.timeout(300)

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=120)


def _ask(name: str, age: int) -> list[dict]:
    return [{"role": "user", "content": f"Describe a person named {name}, aged {age}, as JSON."}]


def test_a_json_schema_answer_parses_and_holds_to_the_schema(client):
    name, age = random.choice(["Ann", "Omar", "Li"]), random.randint(18, 90)
    r = client.chat.completions.create(
        model=MODEL, messages=_ask(name, age), max_tokens=60, temperature=0.7, seed=random.randrange(2**31),
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    value = json.loads(choice.message.content)
    assert set(value) == {"name", "age"} and isinstance(value["name"], str) and len(value["name"]) <= 16
    assert type(value["age"]) is int and 0 <= value["age"] <= 150


def test_a_streamed_json_object_parses_once_joined(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": 'Answer with the JSON object {"ok": true} alone.'}],
        max_tokens=32, temperature=0, stream=True, response_format={"type": "json_object"})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert isinstance(json.loads(text), dict)


def test_completions_hold_to_a_regex_and_to_a_choice(client):
    digits = random.randint(2, 5)
    r = client.completions.create(model=MODEL, prompt="The year the war ended was", max_tokens=12, temperature=1.0,
                                  n=3, extra_body={"structured_outputs": {"regex": f"[0-9]{{{digits}}}"}})
    assert [c.text for c in r.choices if re.fullmatch(f"[0-9]{{{digits}}}", c.text)] == [c.text for c in r.choices]
    assert all(c.finish_reason == "stop" for c in r.choices)
    options = random.sample(["Paris", "Lyon", "Marseille", "Nice", "Lille"], 3)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Capital of France?"}],
                                       max_tokens=12, temperature=0,
                                       extra_body={"structured_outputs": {"choice": options}})
    assert r.choices[0].message.content in options and r.choices[0].finish_reason == "stop"


def test_completions_hold_to_a_gbnf_grammar_and_chat_to_a_lark_one(client):
    words = random.sample(["red", "green", "blue", "black", "white"], 3)
    gbnf = 'root ::= "Colour: " colour "."\ncolour ::= ' + " | ".join(f'"{w}"' for w in words)
    r = client.completions.create(model=MODEL, prompt="My favourite colour", max_tokens=12, temperature=1.0, n=3,
                                  seed=random.randrange(2**31), extra_body={"structured_outputs": {"grammar": gbnf}})
    assert all(re.fullmatch(f"Colour: ({'|'.join(words)})\\.", c.text) for c in r.choices), [c.text for c in r.choices]
    assert all(c.finish_reason == "stop" for c in r.choices)
    lark = 'start: NUMBER (", " NUMBER)~2\nNUMBER: /[1-9][0-9]?/'
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Three numbers, please."}],
                                       max_tokens=16, temperature=0, extra_body={"structured_outputs": {"grammar": lark}})
    assert re.fullmatch(r"[1-9][0-9]?(, [1-9][0-9]?){2}", r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"


def test_compact_json_when_whitespace_is_disabled(client):
    r = client.chat.completions.create(model=MODEL, messages=_ask("Li", random.randint(18, 90)), max_tokens=60,
                                       temperature=0, extra_body={"structured_outputs": {
                                           "json": PERSON, "disable_any_whitespace": True, "disable_fallback": True}})
    text = r.choices[0].message.content
    assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)


def test_a_constrained_request_beside_free_ones_leaves_them_as_they_were(client):
    """Greedy free answers are the same with a constrained request running beside them."""
    import concurrent.futures

    def free():
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0).choices[0].text

    alone = free()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        constrained = pool.submit(client.chat.completions.create, model=MODEL, messages=_ask("Ann", 31), max_tokens=60,
                                  temperature=0, response_format={"type": "json_schema",
                                                                  "json_schema": {"name": "p", "schema": PERSON}})
        beside = [pool.submit(free) for _ in range(3)]
        assert [f.result() for f in beside] == [alone] * 3
        assert set(json.loads(constrained.result().choices[0].message.content)) == {"name", "age"}


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                           "parameters": {"type": "object", "properties": {
                                               "zone": {"enum": ["UTC", "CET", "JST"]}}, "required": ["zone"]}}}]


def _check_call(call, name=None):
    assert call.type == "function" and call.id
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(arguments) == {"city"} and isinstance(arguments["city"], str) and len(arguments["city"]) <= 12
    else:
        assert call.function.name == "get_time" and arguments in ({"zone": z} for z in ("UTC", "CET", "JST"))
    assert name is None or call.function.name == name


@pytest.mark.parametrize("parallel", [True, False])
def test_a_required_tool_call_is_made_and_reads_back_as_calls(client, parallel):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What's the weather in Paris, and the time in Tokyo?"}],
        max_tokens=96, temperature=random.choice([0, 0.8]), seed=random.randrange(2**31), tools=TOOLS,
        tool_choice="required", parallel_tool_calls=parallel)
    choice = r.choices[0]
    if parallel and choice.finish_reason == "length":  # a small model may go on listing calls: those written come
        assert choice.message.tool_calls and not choice.message.content
        for call in choice.message.tool_calls[:-1]:  # the last may be cut short
            _check_call(call)
        return
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    calls = choice.message.tool_calls
    assert len(calls) >= 1 and (parallel or len(calls) == 1)
    for call in calls:
        _check_call(call)


def test_a_named_function_is_called_whole_and_streamed(client):
    name = random.choice(["get_weather", "get_time"])
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Help me plan a trip to Japan."}],
                  max_tokens=64, temperature=0, tools=TOOLS,
                  tool_choice={"type": "function", "function": {"name": name}})
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "stop" and len(whole.message.tool_calls) == 1  # OpenAI's reason for a named call
    _check_call(whole.message.tool_calls[0], name)
    chunks = [c for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
    calls = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
    assert [(t.index, t.function.name, t.function.arguments) for t in calls] == [
        (0, name, whole.message.tool_calls[0].function.arguments)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]


def test_a_demanded_call_cut_short_comes_back_as_far_as_it_was_written(client, server):
    """As OpenAI's: a demanded call that the length cuts short is still a call, its arguments the text written so
    far, with finish_reason "length"; Anthropic's route gives its tool_use block the input written so far and
    stop_reason "max_tokens". Greedy, the cut call's arguments begin the whole call's."""
    name = random.choice(["get_weather", "get_time"])
    salt = f"cut-{random.randrange(10**9)}"  # cold runs, the same path for the cut and the whole one
    messages = [{"role": "user", "content": "Help me plan a trip to Japan."}]
    kwargs = dict(model=MODEL, messages=messages, temperature=0, tools=TOOLS,
                  tool_choice={"type": "function", "function": {"name": name}}, extra_body={"cache_salt": salt})
    whole = client.chat.completions.create(**kwargs, max_tokens=64).choices[0].message.tool_calls[0]
    cut = client.chat.completions.create(**kwargs, max_tokens=random.randint(2, 4)).choices[0]
    assert cut.finish_reason == "length" and [c.function.name for c in cut.message.tool_calls] == [name]
    written = written_json_value(cut.message.tool_calls[0].function.arguments)
    keys, full = list(written), json.loads(whole.function.arguments)
    assert keys == list(full)[: len(keys)] and all(written[k] == full[k] for k in keys[:-1])
    streamed = [c.choices[0] for c in client.chat.completions.create(**kwargs, max_tokens=random.randint(2, 4),
                                                                     stream=True) if c.choices]
    assert [c.finish_reason for c in streamed if c.finish_reason] == ["length"]
    assert [t.function.name for c in streamed for t in (c.delta.tool_calls or [])] == [name]
    body = {"model": MODEL, "max_tokens": random.randint(2, 4), "messages": messages, "temperature": 0,
            "tool_choice": {"type": "tool", "name": name},
            "tools": [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]}
    r = httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=120).json()
    assert r["stop_reason"] == "max_tokens", r
    uses = [b for b in r["content"] if b["type"] == "tool_use"]
    assert [u["name"] for u in uses] == [name] and isinstance(uses[0]["input"], dict)
