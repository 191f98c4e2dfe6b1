"""The Anthropic Messages API of a live server, driven by the official `anthropic` client."""

from __future__ import annotations

import asyncio
import json
import random
import types

import anthropic
import httpx
import pytest

from deltaserve.server.anthropic_protocol import MessagesRequest
from deltaserve.server.chat_prompt import ChatPrompt
from deltaserve.chat_content_format import messages_for_template
from deltaserve.server.serving_messages import (_MessageJob, anthropic_messages_for_template,
                                                anthropic_tools_for_template)
from deltaserve.server.tool_parsers import TAGS
from tests.server.conftest import API_KEY, MODEL, serving
from tests.server.engine_outputs import StreamedOutputs, cut_outputs
from tests.server.live_server import LiveServer

pytestmark = pytest.mark.timeout(300)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # sent as a body field: this client version has no sampling arguments


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


def test_message(client):
    m = client.messages.create(model=MODEL, max_tokens=12, messages=QUESTION, system="You are a geography teacher.",
                               extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 5 and 1 <= m.usage.output_tokens <= 12
    count = client.messages.count_tokens(model=MODEL, messages=QUESTION, system="You are a geography teacher.")
    assert count.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_a_model_that_cannot_think_answers_with_thinking_enabled(client):
    """The demo model's tokenizer has no think tokens: it thinks none, within any budget, and answers as without."""
    budget = random.randint(1, 40)
    plain = client.messages.create(model=MODEL, max_tokens=48, messages=QUESTION, extra_body=GREEDY)
    thinking = client.messages.create(model=MODEL, max_tokens=48, messages=QUESTION, extra_body=GREEDY,
                                      thinking={"type": "enabled", "budget_tokens": budget})
    assert [b.type for b in thinking.content] == ["text"] and thinking.content[0].text == plain.content[0].text
    count = client.messages.count_tokens(model=MODEL, messages=QUESTION,
                                         thinking={"type": "enabled", "budget_tokens": budget})
    assert count.input_tokens == thinking.usage.input_tokens + (thinking.usage.cache_read_input_tokens or 0)


def test_stream_events_build_the_same_message(client):
    whole = client.messages.create(model=MODEL, max_tokens=10, messages=QUESTION, extra_body=GREEDY)
    events = []
    with client.messages.stream(model=MODEL, max_tokens=10, messages=QUESTION, extra_body=GREEDY) as stream:
        for event in stream:
            events.append(event.type)
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "content_block_stop" in events and "message_delta" in events


def test_stop_sequence(client):
    free = client.messages.create(model=MODEL, max_tokens=12, messages=QUESTION, extra_body=GREEDY).content[0].text
    stop = free[len(free) // 2: len(free) // 2 + 3]
    assert stop.strip()
    m = client.messages.create(model=MODEL, max_tokens=12, messages=QUESTION, extra_body=GREEDY, stop_sequences=[stop])
    assert m.content[0].text == free[: free.index(stop)]
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop


def test_output_config_holds_the_reply_to_its_schema(client, server):
    """vLLM's output_config.format: the reply is JSON of the schema, whole and streamed."""
    key = random.choice(["city", "answer", "name"])
    schema = {"type": "object", "properties": {key: {"type": "string", "maxLength": 12}}, "required": [key],
              "additionalProperties": False}
    ask = dict(model=MODEL, max_tokens=40, messages=QUESTION, extra_body={
        **GREEDY, "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    whole = client.messages.create(**ask)
    assert list(json.loads(whole.content[0].text)) == [key] and whole.stop_reason == "end_turn", whole
    with client.messages.stream(**ask) as stream:
        assert stream.get_final_message().content[0].text == whole.content[0].text
    bad = _post(server, {"messages": QUESTION, "output_config": {"format": {"type": "json_schema",
                                                                            "schema": {"type": "nonsense"}}}})
    assert bad.status_code == 400 and "output_config.format.schema" in bad.json()["error"]["message"], bad.text
    forced = _post(server, {"messages": QUESTION,
                            "output_config": {"format": {"type": "json_schema", "schema": schema}},
                            "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}})
    assert forced.status_code == 400 and "output_config.format" in forced.json()["error"]["message"], forced.text


def test_multi_turn_with_tool_use_blocks(client):
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}]},
    ]
    m = client.messages.create(model=MODEL, max_tokens=6, messages=messages, tools=tools)
    assert m.usage.output_tokens >= 1


def test_errors_use_the_anthropic_shape(client, server):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=4, messages=QUESTION)
    r = httpx.post(server.url + "/v1/messages", json={"model": MODEL, "messages": QUESTION},
                   headers={"x-api-key": API_KEY}, timeout=30)
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    assert client.messages.create(model=MODEL, max_tokens=2, messages=QUESTION).usage.output_tokens >= 1


def _post(server, body, headers=None):
    return httpx.post(server.url + "/v1/messages", json={"model": MODEL, "max_tokens": 4, **body},
                      headers=headers or {"x-api-key": API_KEY}, timeout=60)


def test_a_null_stream_is_a_whole_reply(server):
    r = _post(server, {"messages": QUESTION, "stream": None})
    assert r.status_code == 200 and r.json()["type"] == "message", r.text


def test_a_final_assistant_message_is_a_prefill_the_reply_goes_on_from(client, server):
    """The reply continues the assistant's text: the prompt is the conversation with that turn left open."""
    free = client.messages.create(model=MODEL, max_tokens=8, messages=QUESTION, extra_body=GREEDY).content[0].text
    words = free.split(" ")
    assert len(words) > 2
    head = " ".join(words[:2])
    prefilled = client.messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY,
                                       messages=QUESTION + [{"role": "assistant", "content": head}])
    opened = httpx.post(server.url + "/tokenize", json={"messages": QUESTION}, headers=server.headers,
                        timeout=30).json()["count"]
    head_tokens = httpx.post(server.url + "/tokenize", json={"prompt": head, "add_special_tokens": False},
                             headers=server.headers, timeout=30).json()["count"]
    assert prefilled.usage.input_tokens + (prefilled.usage.cache_read_input_tokens or 0) == opened + head_tokens
    # the model wrote head itself, so it goes on as it did (the prompt holds head's tokens as it sampled them)
    assert free.startswith(head + prefilled.content[0].text)


def test_bad_tool_choices_and_bodies_are_refused_by_name(server):
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}]
    for body, where in (({"tool_choice": {"type": "auto"}}, "tool_choice needs tools"),
                        ({"tools": tools, "tool_choice": {"type": "tool", "name": "get_time"}}, "get_time"),
                        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
                        ({"stop_sequences": ["a", ""]}, "stop_sequences"),
                        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "needs its text"),
                        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
                        ({"messages": QUESTION + [{"role": "assistant", "content": [{"type": "image"}]}]},
                         "in an assistant message")):
        r = _post(server, {"messages": QUESTION, **body})
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error" and where in r.json()["error"]["message"], r.text
    r = httpx.get(server.url + "/v1/messages", headers={"x-api-key": API_KEY}, timeout=30)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    assert _post(server, {"messages": QUESTION, "tools": tools, "tool_choice": {"type": "none"}}).status_code == 200


def test_either_header_may_carry_the_key(server):
    for headers in ({"x-api-key": API_KEY, "authorization": "Bearer other"},
                    {"x-api-key": "other", "authorization": f"Bearer {API_KEY}"}):
        assert _post(server, {"messages": QUESTION}, headers).status_code == 200
    assert _post(server, {"messages": QUESTION}, {"x-api-key": "other", "authorization": "Bearer x"}).status_code == 401


def test_streamed_usage_agrees_from_start_to_end_on_a_cache_hit(client):
    long_question = [{"role": "user", "content": "Name the capital of France, and tell me about it. " * 4}]
    client.messages.create(model=MODEL, max_tokens=2, messages=long_question, extra_body=GREEDY)  # fills the cache
    starts, deltas = [], []
    with client.messages.stream(model=MODEL, max_tokens=3, messages=long_question, extra_body=GREEDY) as stream:
        for event in stream:
            if event.type == "message_start":
                starts.append(event.message.usage)
            elif event.type == "message_delta":
                deltas.append(event.usage)
    assert len(starts) == len(deltas) == 1
    assert deltas[0].cache_read_input_tokens and deltas[0].cache_read_input_tokens > 0
    assert (starts[0].input_tokens, starts[0].cache_read_input_tokens) == (
        deltas[0].input_tokens, deltas[0].cache_read_input_tokens)


def test_a_demanded_tool_is_used_whole_and_streamed(client):
    """tool_choice "tool" (and "any" with parallel use off): one tool_use block of the tool's input schema."""
    import json
    import random

    tools = [{"name": "get_weather", "description": "Weather for a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                               "required": ["city"]}},
             {"name": "get_time", "description": "Time in a zone",
              "input_schema": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                               "required": ["zone"]}}]
    name = random.choice(["get_weather", "get_time"])
    for choice in ({"type": "tool", "name": name}, {"type": "any", "disable_parallel_tool_use": True}):
        kwargs = dict(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Plan my day in Paris."}],
                      tools=tools, tool_choice=choice, extra_body=GREEDY)
        m = client.messages.create(**kwargs)
        assert m.stop_reason == "tool_use" and [b.type for b in m.content if b.type != "text"] == ["tool_use"]
        use = next(b for b in m.content if b.type == "tool_use")
        assert use.name in {"get_weather", "get_time"} and (choice["type"] == "any" or use.name == name)
        assert set(use.input) == ({"city"} if use.name == "get_weather" else {"zone"})
        with client.messages.stream(**kwargs) as stream:
            final = stream.get_final_message()
        assert [(b.name, json.dumps(b.input)) for b in final.content if b.type == "tool_use"] == [
            (use.name, json.dumps(use.input))]
        assert final.stop_reason == "tool_use"


def test_what_anthropic_refuses_in_tools_is_refused_naming_the_field(server):
    tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
    for body, where in (({"tools": [tool, {**tool, "description": "again"}]}, "tools.1.name"),
                        ({"tools": [{**tool, "input_schema": {"type": "string"}}]}, "tools.0.input_schema.type"),
                        ({"tools": [tool], "tool_choice": {"type": "tool"}}, "tool_choice.name")):
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            r = httpx.post(server.url + path, json={"model": MODEL, "max_tokens": 4, "messages": QUESTION, **body},
                           headers={"x-api-key": API_KEY}, timeout=60)
            assert r.status_code == 400, (body, r.text)
            error = r.json()
            assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", r.text
            assert error["error"]["message"].startswith(where + ":"), r.text


# ---- a reply's blocks, whole and streamed, from outputs made up here ---------------------------------------

TWO_TOOLS = [{"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "number"}}}},
             {"name": "g", "input_schema": {"type": "object"}}]


def _job(body: dict, opens_reasoning: bool) -> _MessageJob:
    req = MessagesRequest.model_validate({"model": MODEL, "max_tokens": 64, "messages": QUESTION, **body})
    prompt = ChatPrompt(text="", token_ids=[1, 2], capture_points=None, opens_reasoning=opens_reasoning)
    _, tools = anthropic_tools_for_template(req.tools, req.tool_choice)
    return _MessageJob(types.SimpleNamespace(reasoning=True, tool_format=TAGS), req, MODEL, "msg_1", prompt, tools)


def _streamed_blocks(job: _MessageJob, text: str) -> tuple[list[dict], str]:
    """The blocks the stream's events build, as a client builds them, and its stop reason."""
    async def frames():
        return [frame async for frame in job.stream(StreamedOutputs(cut_outputs(text)))]

    blocks, stop_reason, partial = [], None, {}
    for frame in asyncio.run(frames()):
        event = json.loads(frame.split("data: ", 1)[1])
        if event["type"] == "content_block_start":
            blocks.append(dict(event["content_block"]))
        elif event["type"] == "content_block_delta":
            delta, block = event["delta"], blocks[event["index"]]
            for key, field in (("text_delta", "text"), ("thinking_delta", "thinking")):
                if delta["type"] == key:
                    block[field] += delta[field]
            if delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif event["type"] == "content_block_stop" and event["index"] in partial:
            blocks[event["index"]]["input"] = json.loads(partial[event["index"]])
        elif event["type"] == "message_delta":
            stop_reason = event["delta"]["stop_reason"]
    return blocks, stop_reason


def _without_ids(blocks: list[dict]) -> list[dict]:
    return [{k: v for k, v in block.items() if k != "id"} for block in blocks]


CALL_F = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
CALL_G = '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
CALLS = CALL_F + "\n" + CALL_G


@pytest.mark.parametrize("text, opens_reasoning, body, kinds", [
    ("Let me think about it.", True, {}, ["thinking"]),  # only reasoning: no empty text block
    ("", False, {}, []),  # nothing at all: no block, as Anthropic's empty reply
    ("<think>Hm.</think>\n\nHi!", False, {}, ["thinking", "text"]),
    (CALLS, False, {"tools": TWO_TOOLS}, ["tool_use", "tool_use"]),
    (CALLS, False, {"tools": TWO_TOOLS, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
     ["tool_use"]),  # one tool use at most: the first
    ("Let me look.\n" + CALL_F + " Then the next one.", False, {"tools": TWO_TOOLS}, ["text", "tool_use", "text"]),
    (CALL_F + "\nand\n" + CALL_G, False, {"tools": TWO_TOOLS}, ["tool_use", "text", "tool_use"]),
])
def test_a_replys_blocks_are_the_same_whole_and_streamed(text, opens_reasoning, body, kinds):
    whole = _job(body, opens_reasoning).response(cut_outputs(text)[-1])
    blocks, stop_reason = _streamed_blocks(_job(body, opens_reasoning), text)
    assert [block["type"] for block in whole["content"]] == kinds
    assert _without_ids(blocks) == _without_ids(whole["content"]) and stop_reason == whole["stop_reason"]
    if "tool_use" in kinds:
        uses = [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
        assert uses == [("f", {"x": 1}), ("g", {})][:kinds.count("tool_use")]


@pytest.fixture(scope="module")
def reasoning_server():
    yield from serving(LiveServer("--served-model-name", MODEL, "--reasoning-parser", "deepseek_r1"))


def test_a_reply_of_reasoning_alone_is_one_thinking_block_whole_and_streamed(reasoning_server):
    """A prefill that opens the think block: the reply is reasoning, with no empty text block beside it."""
    client = anthropic.Anthropic(base_url=reasoning_server.url, api_key="none", max_retries=0, timeout=120)
    kwargs = dict(model=MODEL, max_tokens=random.randint(8, 40), extra_body=GREEDY,
                  messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>"}])
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    for m in (whole, streamed):
        assert [block.type for block in m.content] == ["thinking"], m.content
    assert streamed.content[0].thinking == whole.content[0].thinking and streamed.stop_reason == whole.stop_reason


def test_messages_become_the_chat_vllm_makes_of_them():
    """System blocks' texts joined as one, a billing header (a hash of each request) left out so that a prefix
    caches; a message's text blocks its parts (a string template reads them joined by newlines); a tool result's
    texts joined by newlines; a message of tool uses alone has no text."""
    texts = random.sample(["Look it up.", "Be brief.", "Then answer."], 2)
    req = MessagesRequest.model_validate({"model": MODEL, "max_tokens": 8, "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=" + str(random.random())},
        {"type": "text", "text": "You help."}, {"type": "text", "text": " Kindly."}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": t} for t in texts] + [{"type": "text", "text": ""}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "a.txt"}, {"type": "text", "text": "b.txt"}]}]}]})
    converted = messages_for_template(anthropic_messages_for_template(req.system, req.messages), "string")
    assert [(m["role"], m["content"]) for m in converted] == [
        ("system", "You help. Kindly."), ("user", "\n".join(texts)), ("assistant", ""), ("tool", "a.txt\nb.txt")]
    assert converted[2]["tool_calls"][0]["function"]["name"] == "ls"


def test_tools_reach_the_template_as_vllm_gives_them():
    """As vLLM's chat request made from Anthropic's: a description not given is null, an input schema that names
    no type is an object's, and tool_choice "none" reads the reply for no calls but shows the tools (unless
    --exclude-tools-when-tool-choice-none)."""
    properties = {"x": {"type": "number"}}
    req = MessagesRequest.model_validate({"model": MODEL, "max_tokens": 8, "messages": QUESTION, "tools": [
        {"name": "f", "input_schema": {"properties": properties}}], "tool_choice": {"type": "none"}})
    function = {"name": "f", "description": None, "parameters": {"type": "object", "properties": properties}}
    assert anthropic_tools_for_template(req.tools, req.tool_choice) == ([{"type": "function", "function": function}],
                                                                        None)
    assert anthropic_tools_for_template(req.tools, req.tool_choice, exclude_when_none=True) == (None, None)
    auto = anthropic_tools_for_template(req.tools, None)
    assert auto[0] == auto[1] == [{"type": "function", "function": function}]
