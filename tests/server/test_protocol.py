"""Request validation, error mapping, message conversion and event framing, without a model."""

from __future__ import annotations

import json
import random
import types

import pytest
from pydantic import ValidationError

from deltaserve.chat_content_format import messages_for_template
from deltaserve.engine.async_engine import QueueFullError, RequestTiming, ServerShuttingDownError
from deltaserve.errors import EngineDeadError, InvalidPromptError, InvalidSamplingParamsError, PromptTooLongError
from deltaserve.server.anthropic_protocol import MessagesRequest
from deltaserve.server.chat_prompt import openai_messages_for_template
from deltaserve.server.envelope import ChunkEvents, completion_envelope
from deltaserve.server.errors import APIError, context_length_error, from_exception
from deltaserve.server.metrics import ServerMetrics
from deltaserve.server.output_parser import ChoiceDelta
from deltaserve.server.protocol import ChatCompletionRequest, CompletionRequest
from deltaserve.server.serving_messages import _BlockWriter, anthropic_messages_for_template
from deltaserve.server.sse import sse_data, sse_event
from deltaserve.server.tool_parsers import ToolCall


def _param_of(model, body) -> str | None:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    error = from_exception(info.value)
    assert error.status == 400
    return error.param


def test_validation_errors_name_the_field():
    msgs = [{"role": "user", "content": "hi"}]
    assert _param_of(ChatCompletionRequest, {"model": "m"}) == "messages"
    assert _param_of(ChatCompletionRequest, {"messages": msgs, "temperature": "hot"}) == "temperature"
    assert _param_of(ChatCompletionRequest, {"messages": msgs, "max_tokens": 2.5}) == "max_tokens"
    assert _param_of(ChatCompletionRequest, {"messages": msgs, "stream": "yes"}) == "stream"
    assert _param_of(ChatCompletionRequest, {"messages": [{"role": "user", "content": 3}]}) == "messages.0.content"
    assert _param_of(CompletionRequest, {"prompt": [1, "a"]}) == "prompt"
    assert _param_of(MessagesRequest, {"model": "m", "messages": msgs}) == "max_tokens"
    blocks = [{"role": "user", "content": [{"text": "x"}]}]  # a block without its type
    assert _param_of(MessagesRequest, {"model": "m", "max_tokens": 3, "messages": blocks}) == "messages.0.content.0.type"
    # a value that took a union member's shape is wrong inside it: the error names where
    word = random.choice(["hi", "x", "what"])
    parts = [{"type": "text", "text": "a"}] * random.randint(0, 3)
    assert _param_of(ChatCompletionRequest, {"messages": [{"role": "user", "content": parts + [word]}]}) == \
        f"messages.0.content.{len(parts)}"
    assert _param_of(ChatCompletionRequest, {"messages": [{"role": "user", "content": parts + [
        {"type": "text", "text": 5}]}]}) == f"messages.0.content.{len(parts)}.text"
    ids = [random.randrange(100) for _ in range(random.randint(0, 3))]
    assert _param_of(CompletionRequest, {"prompt": [[1, 2], ids + [word]]}) == f"prompt.1.{len(ids)}"
    assert _param_of(ChatCompletionRequest, {"messages": msgs, "stop": ["a", 5]}) == "stop.1"


def test_a_union_field_names_every_type_it_takes():
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": "a", "temperature": "0.5"})
    assert from_exception(info.value).message.endswith("Input should be a valid integer or a valid number")
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": "a", "stop": 3})
    assert from_exception(info.value).message.endswith("Input should be a valid string or a valid list")


def test_requests_accept_unknown_fields_and_numbers():
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "temperature": 1,
                                                "frobnicate": True, "top_p": 0.5})
    assert req.temperature == 1 and req.top_p == 0.5


def test_engine_errors_map_to_statuses():
    assert from_exception(InvalidSamplingParamsError("top_p=2: must be in (0, 1]")).param == "top_p"
    assert from_exception(InvalidPromptError("empty")).status == 400
    too_long = from_exception(PromptTooLongError("too long", 5000, 4096))
    assert too_long.status == 400 and too_long.code == "context_length_exceeded"
    full = from_exception(QueueFullError("full"))
    assert full.status == 503 and full.headers == {"Retry-After": "1"}
    assert from_exception(ServerShuttingDownError("bye")).status == 503
    assert from_exception(EngineDeadError("dead")).status == 503
    assert from_exception(RuntimeError("boom")).status == 500
    message = context_length_error(1000, 100, 1024).message
    assert "1024" in message and "1100" in message and "1000" in message and "100 " in message
    assert from_exception(QueueFullError("full")).anthropic_body()["error"]["type"] == "overloaded_error"


def test_openai_tool_call_arguments_become_a_mapping_for_the_template():
    req = ChatCompletionRequest.model_validate({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
    ]})
    out = openai_messages_for_template(req.messages)
    assert out[0] == {"role": "developer", "content": "be brief"}  # a system's where the template knows none
    assert out[1]["content"] is None and out[1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert out[2] == {"role": "tool", "content": [{"type": "text", "text": "42"}], "tool_call_id": "c1"}
    # as a template that reads text is given them: no text "", a tool result's parts their text
    shaped = messages_for_template(out, "string")
    assert shaped[1]["content"] == "" and shaped[2]["content"] == "42"


def test_an_earlier_turns_reasoning_reaches_the_template_under_either_name():
    # as vLLM's: an assistant's reasoning under both names, `reasoning` where the two differ; another role's none
    thought = "".join(random.choices("abc xyz", k=random.randint(1, 30)))
    for names in (["reasoning"], ["reasoning_content"], ["reasoning", "reasoning_content"]):
        req = ChatCompletionRequest.model_validate({"messages": [
            {"role": "user", "content": "q", **dict.fromkeys(names, "not the user's")},
            {"role": "assistant", "content": "a", **dict.fromkeys(names, thought)}]})
        out = openai_messages_for_template(req.messages)
        assert out[0] == {"role": "user", "content": "q"}, names
        assert out[1] == {"role": "assistant", "content": "a", "reasoning": thought, "reasoning_content": thought}
    req = ChatCompletionRequest.model_validate({"messages": [
        {"role": "assistant", "content": "a", "reasoning": thought, "reasoning_content": thought + "!"}]})
    assert openai_messages_for_template(req.messages)[0]["reasoning_content"] == thought


@pytest.mark.parametrize("arguments,given", [("", {}), ("null", {}), ('{"x": [1]}', {"x": [1]}),
                                             ("[1, 2]", [1, 2]), ('{"x": 1', '{"x": 1')])
def test_tool_call_arguments_reach_the_template_as_vllm_gives_them(arguments, given):
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]}]})
    assert openai_messages_for_template(req.messages)[0]["tool_calls"][0]["function"]["arguments"] == given


def test_developer_messages_are_systems_where_the_template_knows_no_developer():
    from deltaserve.server.chat_prompt import developer_as_system

    words = ["".join(random.choices("abc", k=random.randint(1, 5))) for _ in range(3)]
    messages = [{"role": "system", "content": words[0]}, {"role": "user", "content": "q"},
                {"role": "developer", "content": [{"type": "text", "text": words[1]}, {"type": "text", "text": words[2]}]}]
    # as vLLM's: the system messages then one, first, their texts joined by blank lines
    assert developer_as_system(messages, "{{ messages }}") == [
        {"role": "system", "content": f"{words[0]}\n\n{words[1]}\n{words[2]}"}, {"role": "user", "content": "q"}]
    knows = "{% if m.role == 'developer' %}{% endif %}"
    assert developer_as_system(messages, knows) == messages
    first = [{"role": "developer", "content": words[0]}, {"role": "user", "content": "q"}]
    assert developer_as_system(first, None) == [{"role": "system", "content": words[0]}, first[1]]


def test_anthropic_messages_become_chat_messages():
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "sys"}],
                                          "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "P"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                                     {"type": "text", "text": "thanks"}]},
    ]})
    out = anthropic_messages_for_template(req.system, req.messages)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "user"]
    assert out[2]["content"] == [{"type": "text", "text": "Checking."}]  # parts, as chat's
    assert out[2]["tool_calls"][0]["function"] == {"name": "w", "arguments": {"c": "P"}}
    assert out[3] == {"role": "tool", "tool_call_id": "t1", "content": "sunny"}


def _events(frames: list[str]) -> list[tuple[str, dict]]:
    out = []
    for frame in frames:
        name_line, data_line = frame.strip().split("\n")
        out.append((name_line[len("event: "):], json.loads(data_line[len("data: "):])))
    return out


def test_anthropic_blocks_open_and_close_in_order():
    writer = _BlockWriter()
    frames = writer.write(ChoiceDelta(reasoning="hmm"))
    frames += writer.write(ChoiceDelta(reasoning=" ok", content="Hi"))
    frames += writer.write(ChoiceDelta(tool_calls=[ToolCall(name="w", arguments='{"c": "P"}')]))
    frames += writer.close()
    events = _events(frames)
    kinds = [(name, data.get("index"), (data.get("content_block") or data.get("delta") or {}).get("type"))
             for name, data in events]
    assert kinds == [
        ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
    ]
    assert writer.used_tools
    assert _BlockWriter().close() == []  # an empty reply has no block, as Anthropic's: no empty text block


def test_sse_framing():
    assert sse_data({"a": "é"}) == 'data: {"a":"é"}\n\n'
    assert sse_event("ping", {"type": "ping"}) == 'event: ping\ndata: {"type":"ping"}\n\n'


def test_chunk_events_are_the_envelope_framed_byte_for_byte():
    rng = random.Random()
    words = ["", "é", "日本", "🙂", '"quoted"', "back\\slash", "new\nline", "\u0000", " w12"]
    for _ in range(50):
        job = types.SimpleNamespace(request_id=f"cmpl-{rng.getrandbits(64):x}", created=rng.randrange(2**31),
                                    model=rng.choice(["m", "org/Model-7B", "ünï"]))
        kind = rng.choice(["text_completion", "chat.completion.chunk"])
        choices = [{"index": i, "text": "".join(rng.choices(words, k=rng.randint(0, 4))),
                    "logprobs": rng.choice([None, {"tokens": ["a"], "token_logprobs": [-rng.random()]}]),
                    "finish_reason": rng.choice([None, "stop", "length"])} for i in range(rng.randint(0, 3))]
        usage = rng.choice([None, {"prompt_tokens": rng.randrange(100), "completion_tokens": 3}])
        assert ChunkEvents(job, kind)(choices, usage) == sse_data(completion_envelope(job, kind, choices, usage))


def test_metrics_observe_request_timings():
    metrics = ServerMetrics(lambda: None)
    metrics.observe(RequestTiming("r", "length", arrival=0.0, first_token=0.5, finished=1.5, prompt_tokens=10,
                                  generation_tokens=5))
    metrics.observe(RequestTiming("s", "abort", arrival=0.0, first_token=None, finished=0.1, prompt_tokens=3,
                                  generation_tokens=0))
    text = metrics.render().decode()
    assert 'deltaserve_requests_finished_total{reason="length"} 1.0' in text
    assert 'deltaserve_requests_finished_total{reason="abort"} 1.0' in text
    assert "deltaserve_time_to_first_token_seconds_count 1.0" in text
    assert "deltaserve_time_per_output_token_seconds_sum 0.25" in text
    assert "deltaserve_e2e_request_latency_seconds_count 1.0" in text
    assert "deltaserve_prompt_tokens_total 13.0" in text  # counted by the server when the engine has no stats
