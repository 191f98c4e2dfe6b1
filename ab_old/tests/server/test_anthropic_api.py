"""The Anthropic Messages API of a live server, driven by the official `anthropic` client."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.server.conftest import API_KEY, MODEL

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
