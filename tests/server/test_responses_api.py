"""POST /v1/responses through OpenAI's own client: a response says what the chat route says for the same
conversation, streamed or whole; function calls, their outputs and JSON schemas work as in the chat route; what
the server cannot honour is refused by name. Plus the input items' conversion and the stream's events, without
a model."""

from __future__ import annotations

import asyncio
import json
import random
import types

import httpx
import openai
import pydantic
import pytest

from deltaserve.outputs import CompletionOutput
from deltaserve.server.message_logprobs import MessageLogprobs
from deltaserve.server.output_parser import AnswerText, ChoiceDelta, ChoiceParser
from deltaserve.server.responses_protocol import ResponsesRequest
from deltaserve.server.context import ServerContext
from deltaserve.server.serving_responses import _EventWriter, _ResponseJob, chat_messages, chat_request
from deltaserve.server.tool_parsers import ToolCall
from tests.server.conftest import API_KEY, MODEL, serving
from tests.server.engine_outputs import StreamedOutputs, cut_outputs
from tests.server.live_server import LiveServer

pytestmark = pytest.mark.timeout(400)

QUESTIONS = ["What is the capital of France?", "Name three colours.", "Count to five.", "Say hello to Ada."]
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)


def test_a_response_says_what_the_chat_route_says(client):
    question, limit = random.choice(QUESTIONS), random.randint(3, 24)
    system = random.choice([None, "Answer in one short sentence."])
    response = client.responses.create(model=MODEL, input=question, instructions=system, max_output_tokens=limit,
                                       temperature=0)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=limit, temperature=0)
    assert response.output_text == chat.choices[0].message.content
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                                            chat.usage.completion_tokens)
    assert response.model == MODEL and response.id.startswith("resp_") and response.instructions == system


def test_an_assistant_message_cut_short_is_gone_on_with(client):
    """As vLLM's: input that ends with an incomplete assistant message (an earlier reply cut by
    max_output_tokens, sent back) is continued, as chat's continue_final_message continues it."""
    question = random.choice(QUESTIONS)
    first = client.responses.create(model=MODEL, input=question, max_output_tokens=random.randint(3, 6),
                                    temperature=0)
    assert first.status == "incomplete" and first.output[-1].status == "incomplete"
    asked = [{"role": "user", "content": question}, first.output[-1].model_dump(exclude_none=True)]
    more = client.responses.create(model=MODEL, input=asked, max_output_tokens=8, temperature=0)
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": question}, {"role": "assistant", "content": first.output_text}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert more.output_text == chat.choices[0].message.content
    asked[-1]["status"] = "completed"  # a whole one: the reply is a new turn
    new_turn = client.responses.create(model=MODEL, input=asked, max_output_tokens=8, temperature=0)
    assert more.usage.input_tokens < new_turn.usage.input_tokens


def test_a_streamed_response_is_the_whole_one(client):
    question = random.choice(QUESTIONS)
    whole = client.responses.create(model=MODEL, input=question, max_output_tokens=40, temperature=0)
    events = list(client.responses.create(model=MODEL, input=question, max_output_tokens=40, temperature=0,
                                          stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    final = events[-1].response  # completed, or incomplete where the reply ran to max_output_tokens
    assert events[-1].type == f"response.{whole.status}" and final.status == whole.status
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_demanded_function_call_and_its_output(client, stream):
    city = random.choice(["Paris", "Lima", "Oslo", "Kyiv", "Rome", "Cairo"])
    # one call (the demo model, free to make several, lists them past any short limit)
    ask = {"model": MODEL, "input": f"What is the weather in {city}?", "tools": [WEATHER],
           "tool_choice": random.choice(["required", {"type": "function", "name": "get_weather"}]),
           "parallel_tool_calls": False, "max_output_tokens": 100, "temperature": 0}
    if stream:
        with client.responses.stream(**ask) as events:
            response = events.get_final_response()
    else:
        response = client.responses.create(**ask)
    calls = [item for item in response.output if item.type == "function_call"]
    assert response.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather", response
    assert all(isinstance(json.loads(call.arguments)["city"], str) for call in calls)
    follow_up = [{"role": "user", "content": ask["input"]}]
    follow_up += [{"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
                  for c in calls]
    follow_up += [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 21 C"} for c in calls]
    answer = client.responses.create(model=MODEL, input=follow_up, tools=[WEATHER], tool_choice="none",
                                      max_output_tokens=12, temperature=0)
    assert answer.output[0].type == "message" and answer.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_a_demanded_call_cut_short_is_an_incomplete_item(client, stream):
    """The length cuts the demanded call short: the response and its call item are incomplete, the item's
    arguments as far as they came."""
    ask = {"model": MODEL, "input": "What is the weather in Paris?", "tools": [WEATHER],
           "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": random.randint(2, 4),
           "temperature": 0}
    if stream:  # the SDK's final response waits for response.completed: the last event carries it
        events = list(client.responses.create(**ask, stream=True))
        assert events[-1].type == "response.incomplete"
        response = events[-1].response
    else:
        response = client.responses.create(**ask)
    calls = [item for item in response.output if item.type == "function_call"]
    assert response.status == "incomplete" and [(c.name, c.status) for c in calls] == [("get_weather", "incomplete")]
    assert calls[0].arguments.startswith("{"), response


def test_a_json_schema_holds_the_reply(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    response = client.responses.create(
        model=MODEL, input="Give a number.", max_output_tokens=60, temperature=0,
        text={"format": {"type": "json_schema", "name": "number", "schema": schema, "strict": True}})
    assert response.status == "completed"
    assert isinstance(json.loads(response.output_text)["n"], int)
    assert response.text.format.type == "json_schema"


@pytest.mark.parametrize("fields, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input.0.content"),  # the content field, as chat names messages.N.content
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"background": True}, "background"),
    ({"input": []}, "input"),
    ({"input": [{"type": "reasoning", "summary": []}], "instructions": "Be brief."}, "input"),
    ({"input": [{"content": "Hi"}]}, "input.0.role"),
    ({"tool_choice": {"type": "function", "name": "missing"}, "tools": [WEATHER]}, "tool_choice"),
    ({"input": 5}, "input"),
    # the chat request's checks, under the Responses request's own names
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objectx"}}}}, "text.format"),
    ({"input": "Hi " * 9000, "max_output_tokens": 10}, "input"),
    ({"input": [{"role": "tool", "content": "Hi"}]}, "input.0.role"),
    # past the engine's max_logprobs (20), whether include asks for them or not
    ({"top_logprobs": 30}, "top_logprobs"),
    ({"top_logprobs": 30, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
    ({"truncation": "auto"}, "truncation"),
    ({"max_tool_calls": 0, "tools": [WEATHER]}, "max_tool_calls"),
    ({"tools": [WEATHER, {**WEATHER, "description": "again"}]}, "tools.1.name"),
])
def test_what_cannot_be_honoured_is_refused_by_name(server, fields, param):
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 4, **fields}
    r = httpx.post(server.base_url + "/responses", json=body, headers=server.headers, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"], error
    assert "max_tokens" not in error["message"], error  # the chat request's name for max_output_tokens


def test_max_tool_calls_and_parallel_tool_calls_cap_the_calls(client):
    """max_tool_calls keeps the first calls up to it, parallel_tool_calls false the first one, streamed or whole;
    the response echoes both. One of the caps a run (each reply of 120 tokens takes the demo model seconds)."""
    ask = {"model": MODEL, "input": "What is the weather in Paris, Rome, Oslo and Lima?", "tools": [WEATHER],
           "tool_choice": "required", "max_output_tokens": 120, "temperature": 0}
    free = [(c.name, c.arguments) for c in client.responses.create(**ask).output if c.type == "function_call"]
    assert len(free) > 2  # the demo model lists several
    for cap in random.sample([{"max_tool_calls": 2}, {"parallel_tool_calls": False},
                              {"max_tool_calls": 3, "parallel_tool_calls": False}], 1):
        whole = client.responses.create(**ask, **cap)
        streamed = list(client.responses.create(**ask, **cap, stream=True))[-1].response
        for response in (whole, streamed):
            calls = [(c.name, c.arguments) for c in response.output if c.type == "function_call"]
            assert calls == free[:1 if cap.get("parallel_tool_calls") is False else cap["max_tool_calls"]], cap
            assert response.max_tool_calls == cap.get("max_tool_calls")
            assert response.parallel_tool_calls is cap.get("parallel_tool_calls", True)


def test_output_text_logprobs_are_the_message_tokens_whole_and_streamed(client):
    """include "message.output_text.logprobs": each token of the message's text with its logprob, bytes and
    top_logprobs ones, as chat gives them (the end token, no text of the message, left out), streamed on the
    deltas that carry its text."""
    question, limit, top = random.choice(QUESTIONS), random.randint(4, 24), random.randint(0, 5)
    ask = dict(model=MODEL, input=question, max_output_tokens=limit, temperature=0, top_logprobs=top,
               include=["message.output_text.logprobs"])
    whole = client.responses.create(**ask)
    logprobs = [entry.model_dump() for entry in whole.output[0].content[0].logprobs]
    assert "".join(entry["token"] for entry in logprobs) == whole.output_text
    assert all(len(entry["top_logprobs"]) == top for entry in logprobs)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                          max_tokens=limit, temperature=0, logprobs=True, top_logprobs=top)
    assert [e.model_dump() for e in chat.choices[0].logprobs.content][:len(logprobs)] == logprobs
    events = list(client.responses.create(**ask, stream=True))
    deltas = [entry.model_dump() for e in events if e.type == "response.output_text.delta" for entry in e.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert deltas == logprobs == [entry.model_dump() for entry in done.logprobs]
    assert [entry.model_dump() for entry in events[-1].response.output[0].content[0].logprobs] == logprobs
    without = client.responses.create(**{**ask, "include": []})  # OpenAI's rule: top_logprobs alone brings none
    assert without.output_text == whole.output_text and without.output[0].content[0].logprobs == []


def test_a_response_is_not_kept_and_says_so(client, server):
    response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/cancel")):
        r = httpx.request(method, f"{server.base_url}/responses/{response.id}{path}", headers=server.headers,
                          timeout=30)
        assert r.status_code == 404, (method, r.text)
        assert r.json()["error"]["code"] == "response_not_found" and response.id in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="not kept"):
        client.responses.retrieve(response.id)


THINKING_TEMPLATE = (  # the demo model's turns, with the reply opened inside a think block
    "{# a reply closes its thinking with </think> #}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    yield from serving(LiveServer("--served-model-name", MODEL, "--chat-template", str(template)))


def test_reasoning_comes_back_as_a_reasoning_item(thinking_server):
    client = openai.OpenAI(base_url=thinking_server.base_url, api_key="none", max_retries=0)
    question, limit = random.choice(QUESTIONS), random.randint(4, 24)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                          max_tokens=limit, temperature=0).choices[0].message
    thought = chat.model_extra["reasoning"]
    assert thought  # the prompt opened the think block, so the reply starts inside it
    ask = dict(model=MODEL, input=question, max_output_tokens=limit, temperature=0,
               include=["message.output_text.logprobs"])
    whole = client.responses.create(**ask)
    events = list(client.responses.create(**ask, stream=True))
    streamed = events[-1].response
    # a reply that is only reasoning has no message item, streamed or whole, as OpenAI's
    kinds = ["reasoning"] + (["message"] if chat.content else [])
    for response in (whole, streamed):
        assert [item.type for item in response.output] == kinds, response.output
        assert response.output[0].content[0].text == thought
        assert response.output_text == (chat.content or "")
        assert 0 < response.usage.output_tokens_details.reasoning_tokens <= response.usage.output_tokens
        # the message's logprobs are its own text's tokens, none of the reasoning's
        logprobs = [entry.token for item in response.output[1:] for entry in item.content[0].logprobs]
        assert "".join(logprobs) == response.output_text
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == thought


def test_reasoning_effort_reaches_the_template_as_vllm_hands_it():
    """reasoning.effort as reasoning_effort, and enable_thinking (false for "none") unless the request's own
    chat_template_kwargs set it."""
    effort = random.choice(["low", "medium", "high"])
    cases = [({"reasoning": {"effort": effort}}, {"reasoning_effort": effort, "enable_thinking": True}),
             ({"reasoning": {"effort": "none"}}, {"reasoning_effort": "none", "enable_thinking": False}),
             ({"reasoning": {"effort": "none"}, "chat_template_kwargs": {"enable_thinking": True, "x": 1}},
              {"reasoning_effort": "none", "enable_thinking": True, "x": 1}),
             ({"chat_template_kwargs": {"x": 2}}, {"x": 2}), ({}, {})]
    server = types.SimpleNamespace(default_chat_template_kwargs={"enable_thinking": False, "d": 0})
    for fields, kwargs in cases:  # the server's defaults under them, its enable_thinking under the effort's too
        chat = chat_request(ResponsesRequest.model_validate({"input": "Hi", **fields}))
        got = ServerContext.template_kwargs(server, chat.chat_template_kwargs, chat.reasoning_effort)
        assert got == {"enable_thinking": False, "d": 0, **kwargs}, fields
    # what OpenAI's API takes, and nothing else; a null stream is not streamed
    for fields in ({"reasoning": {"effort": "bogus"}}, {"include": ["bogus"]}):
        with pytest.raises(pydantic.ValidationError):
            ResponsesRequest.model_validate({"input": "Hi", **fields})
    assert not ResponsesRequest.model_validate({"input": "Hi", "stream": None}).stream


def test_input_items_become_the_chat_conversation():
    thought, args = "".join(random.choices("abc ", k=12)), json.dumps({"city": random.choice(["Rome", "Kyiv"])})
    req = ResponsesRequest.model_validate({"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather"}, {"type": "input_text", "text": "?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": thought}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": args},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
        {"role": "developer", "content": "Answer now."},
    ]})
    call = {"type": "function", "function": {"name": "get_weather"}}
    assert chat_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "?"}]},  # parts
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."}], "reasoning_content": thought,
         "tool_calls": [
            {"id": "c1", **call, "function": {**call["function"], "arguments": args}},
            {"id": "c2", **call, "function": {**call["function"], "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
        {"role": "developer", "content": "Answer now."},
    ]


def test_the_stream_opens_and_closes_each_item_in_order():
    writer = _EventWriter()
    call = ToolCall("get_weather", '{"city": "Oslo"}')
    frames = writer.write(ChoiceDelta(reasoning="hm"))
    frames += writer.write(ChoiceDelta(reasoning="m", content="It is"))
    frames += writer.write(ChoiceDelta(content=" cold.", tool_calls=[call]))
    frames += writer.close("completed")
    events = [json.loads(frame.split("data: ", 1)[1]) for frame in frames]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1, 2]
    assert [item["type"] for item in writer.items] == ["reasoning", "message", "function_call"]
    assert writer.items[0]["content"][0]["text"] == "hmm" == writer.reasoning
    assert writer.items[1]["content"][0]["text"] == "It is cold."
    assert (writer.items[2]["name"], writer.items[2]["arguments"]) == (call.name, call.arguments)


class _Vocabulary:
    """A tokenizer whose token i is PIECES[i]: enough for the detokenizer."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(PIECES[i] for i in ids if not (skip_special_tokens and PIECES[i] == "<eos>"))


PIECES = ["Let", " me", " think", "</", "think", ">", "\n\n", "It", " is", " <", "b", ">", "sunny", "</b>", "\n",
          "<tool", "_call", ">", '{"name": "f", "arguments": {"x": 1}}', "</tool_call>", " ok",
          '<tool_call>{"name": "f", "arguments": {"x": 2}}</tool_call>', "<eos>"]


def _read_in_steps(steps: list[int], max_calls: int | None) -> tuple[ChoiceDelta, list[str]]:
    """The reply of PIECES read by MessageLogprobs, its outputs ending after each token count in `steps`."""
    parser = ChoiceParser(reasoning=True, start_in_reasoning=True, tool_schemas={"f": {}}, max_calls=max_calls)
    reader = MessageLogprobs(parser, lambda o, start, end: [PIECES[t] for t in o.token_ids[start:end]],
                             _Vocabulary(), [0], skip_special_tokens=True)
    delta, placed = ChoiceDelta(), []
    for count in steps:
        ids = list(range(count))
        finished = "stop" if count == len(PIECES) else None
        got, logprobs = reader.feed(CompletionOutput(0, _Vocabulary().decode(ids), ids, finish_reason=finished))
        delta.extend(got)
        placed += logprobs
    return delta, placed


def test_message_logprobs_are_the_tokens_of_the_message_text_in_steps_of_any_size():
    """Each token's logprobs go with the message text it wrote, none with the reasoning, a call's markup or the
    end token, however the output's steps fall (a streamed reply's or a whole one's)."""
    for max_calls in (None, 1):
        whole, placed = _read_in_steps([len(PIECES)], max_calls)
        assert whole.reasoning == "Let me think" and whole.content == "It is <b>sunny</b>\n ok"
        assert [json.loads(c.arguments)["x"] for c in whole.tool_calls] == [1, 2][:max_calls]
        assert "".join(placed) == whole.content
        steps = sorted(random.sample(range(1, len(PIECES)), random.randint(1, 8))) + [len(PIECES)]
        streamed, streamed_placed = _read_in_steps(steps, max_calls)
        assert streamed_placed == placed, steps
        assert (streamed.reasoning, streamed.content) == (whole.reasoning, whole.content)
        assert [c.arguments for c in streamed.tool_calls] == [c.arguments for c in whole.tool_calls]
        # in the order written, each stretch of text with its own tokens' logprobs
        assert [_piece(p) for p in whole.answer] == [("It is <b>sunny</b>\n", "It is <b>sunny</b>\n"), 1,
                                                     (" ok", " ok"), 2][:3 if max_calls else 4]
        assert [_piece(p) for p in streamed.answer] == [_piece(p) for p in whole.answer], steps


def _piece(piece):
    """A text's text and its logprobs' tokens joined, or a call's x."""
    return (piece.text, "".join(piece.logprobs)) if isinstance(piece, AnswerText) else json.loads(piece.arguments)["x"]


CALL_F = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
CALL_G = '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'


def _response_job() -> _ResponseJob:
    """A response's shaping over a chat job of no model: its parser reads Qwen's tool calls to f and g."""
    req = ResponsesRequest.model_validate({"model": MODEL, "input": "Go."})
    chat = types.SimpleNamespace(request_id="resp_1", model=MODEL,
                                 parser=lambda: ChoiceParser(tool_schemas={"f": {}, "g": {}}),
                                 api=types.SimpleNamespace(ctx=types.SimpleNamespace(tokenizer=None, engine=None)))
    return _ResponseJob(req, chat)


def _without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


@pytest.mark.parametrize("text, kinds", [
    ("Let me look.\n" + CALL_F + " Then the next one.", ["message", "function_call", "message"]),
    (CALL_F + "\nand\n" + CALL_G, ["function_call", "message", "function_call"]),
    ("Just text.", ["message"]),
])
def test_a_responses_items_are_in_the_order_written_whole_and_streamed(text, kinds):
    """Text after a call is an item after the call's, in the whole response as in the stream's, wherever the
    stream's outputs are cut."""
    reason = random.choice(["stop", "length"])
    whole = _response_job().whole(cut_outputs(text, "resp_1", reason)[-1])

    async def frames():
        job = _response_job()
        return [frame async for frame in job.stream(StreamedOutputs(cut_outputs(text, "resp_1", reason)))]

    final = json.loads(asyncio.run(frames())[-1].split("data: ", 1)[1])["response"]
    assert [item["type"] for item in whole["output"]] == kinds
    assert _without_ids(final["output"]) == _without_ids(whole["output"])
    assert final["status"] == whole["status"] == ("incomplete" if reason == "length" else "completed")


def test_a_reasoning_summary_alone_stands_for_the_reasoning_and_tool_choice_none_hides_the_tools():
    # as vLLM's Responses route: a reasoning item without content gives its first summary's text, and tool_choice
    # "none" gives the template no tools
    thought = "".join(random.choices("abc ", k=12))
    req = ResponsesRequest.model_validate({"input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": thought}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"role": "user", "content": "again"}], "tools": [WEATHER], "tool_choice": random.choice(["none", "auto"])})
    assert chat_messages(req)[1]["reasoning_content"] == thought
    assert (chat_request(req).tools is None) == (req.tool_choice == "none")
