"""Requests once answered with a 500, a hang or a traceback: each is a 4xx naming the problem (or, for model
output no JSON can carry, a response that is still JSON), and the server goes on serving."""

from __future__ import annotations

import math
import random
import socket
import threading
import time

import httpx
import pytest

from deltaserve.server.tool_parsers.parser import ToolCallParser, parse_tool_call_body
from tests.server.conftest import API_KEY, MODEL, serving
from tests.server.live_server import LiveServer

pytestmark = pytest.mark.timeout(300)

QUESTION = [{"role": "user", "content": "Hi"}]


def _post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=60, headers=server.headers)


def _still_serves(server):
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 2})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("text", [5, ["a"], {"t": "x"}, True])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_tool_result_block_whose_text_is_not_a_string_is_400(server, path, text):
    """tool_result content is a list of plain dicts: a text that is not a string was joined (TypeError, 500)."""
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": text}]}]}]}
    r = httpx.post(server.url + path, json=body, headers={"x-api-key": API_KEY}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "messages.0.content.0" in error["error"]["message"] or "string" in error["error"]["message"], error
    _still_serves(server)


def test_a_logit_bias_key_past_int_parsing_is_400(server):
    """int() refuses more than 4300 digits with a ValueError, which was a 500."""
    for path, body in (("/v1/completions", {"prompt": "a"}), ("/v1/chat/completions", {"messages": QUESTION})):
        r = _post(server, path, {"model": MODEL, "max_tokens": 2, "logit_bias": {"9" * 5000: 1}, **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "logit_bias", r.text
    _still_serves(server)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_chat_template_of_the_clients_own_is_refused(server, path):
    """chat_template_kwargs could replace the server's template: a loop of loops rendered for as long as the client
    liked, on the event loop for /tokenize (/health waited), in a worker thread for chat (every step waited)."""
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}"
    started = time.monotonic()
    r = _post(server, path, {"model": MODEL, "messages": QUESTION, "max_tokens": 2,
                             "chat_template_kwargs": {"chat_template": endless}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "chat_template_kwargs.chat_template", r.text
    assert time.monotonic() - started < 10
    # other template options still reach the template
    r = _post(server, path, {"model": MODEL, "messages": QUESTION, "max_tokens": 2,
                             "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text


def test_a_client_gone_before_its_body_ends_leaves_no_traceback(server):
    """Starlette's ClientDisconnect from reading the body was logged as a failed request (a 500 with a traceback)."""
    logged = len(server.read_log())
    host, port = server.url.split("//")[1].split(":")
    body = b'{"model": "smollm2", "prompt": "hi"'
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/messages", "/tokenize"):
        with socket.create_connection((host, int(port))) as sock:
            head = (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\n"
                    b"Content-Length: %d\r\n\r\n" % (path.encode(), API_KEY.encode(), len(body) + 100))
            sock.sendall(head + body)  # a body 100 bytes short of its length
            time.sleep(0.2)
    time.sleep(1.0)
    _still_serves(server)
    new = server.read_log()[logged:]
    assert "Traceback" not in new and "request failed" not in new, new


def test_a_huge_completions_prompt_leaves_the_other_clients_served(server):
    """A prompt of megabytes takes seconds to tokenize: on the event loop it held every other client (a
    health check waited 7 s) until its 400 for the context's length came."""
    words = random.randint(1_500_000, 2_000_000)
    answered = {}

    def send():
        answered["status"] = _post(server, "/v1/completions", {"model": MODEL, "prompt": "hello " * words,
                                                               "max_tokens": 2}).status_code

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.5)  # the body is in and being tokenized
    waits = []
    while sender.is_alive() and len(waits) < 20:
        start = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=60).status_code == 200
        waits.append(time.monotonic() - start)
        time.sleep(0.1)
    sender.join()
    assert answered["status"] == 400 and waits and max(waits) < 1.0, (answered, waits)
    _still_serves(server)


def test_method_not_allowed_says_which_are(server):
    for path in ("/v1/chat/completions", "/v1/messages", "/tokenize"):
        r = httpx.put(server.url + path, headers=server.headers, timeout=30)
        assert r.status_code == 405
        assert r.headers.get("allow") == "POST", r.headers


# ---- tool calls in the model's output: what they hold must go back out as JSON ----------------------------------

@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_tool_call_argument_json_cannot_carry_stays_text(value):
    """Python's json reads NaN, Infinity and 1e400 (inf) and writes them back as NaN / Infinity: OpenAI's arguments
    were then not JSON, and Anthropic's tool_use input (a JSON object in the body) failed to encode (500)."""
    [call] = parse_tool_call_body(f'<function=f>\n<parameter=x>\n{value}\n</parameter>\n</function>',
                                  {"f": {"type": "object", "properties": {"x": {"type": "number"}}}})
    args = _strict(call.arguments)
    assert args == {"x": value}
    # Qwen3's JSON body holding one is no well-formed call: it is given back as text
    assert parse_tool_call_body('{"name": "f", "arguments": {"x": %s}}' % value) is None


@pytest.mark.parametrize("kind", [{"enum": ["a"]}, [{"a": 1}], ["integer", {}], 5])
def test_a_schema_type_that_is_no_type_name_types_nothing(kind):
    """The tools' schemas are the client's: a type that was a dict (or a list holding one) raised
    TypeError (unhashable) when the model called the tool, a 500 or a stream's error event. As vLLM's, what
    names no type allows a string."""
    parser = ToolCallParser({"f": {"type": "object", "properties": {"x": {"type": kind}}}})
    out = parser.feed('<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>')
    typed = 1 if isinstance(kind, list) and "integer" in kind else "1"
    assert [(c.name, _strict(c.arguments)) for c in out.tool_calls] == [("f", {"x": typed})]


def _strict(text: str):
    import json

    def refuse(name):
        raise AssertionError(f"{name} in {text}")

    value = json.loads(text, parse_constant=refuse)
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in value.values())
    return value


NAN_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNaN\n</parameter>\n</function>\n</tool_call>"


def _checkpoint_that_calls(path: str, text: str) -> str:
    """A tiny Qwen3.5 checkpoint whose every greedy token decodes to `text`: two added tokens (`text` and `text `),
    a final norm that keeps one dimension of the hidden state and an LM head that reads only it, one token by its
    sign each."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AddedToken, AutoTokenizer

    from tests.checkpoints import make_checkpoint

    make_checkpoint("qwen3.5", path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens([AddedToken(text, special=False, normalized=False),
                          AddedToken(text + " ", special=False, normalized=False)])
    tokenizer.save_pretrained(path)
    ids = tokenizer.convert_tokens_to_ids([text, text + " "])
    weights = load_file(path + "/model.safetensors")
    norm = next(k for k in weights if k.endswith("model.norm.weight"))
    weights[norm] = torch.full_like(weights[norm], -1.0)  # the (1 + w) norm: every dimension but the first is zero
    weights[norm][0] = 0.0
    head = torch.zeros_like(weights["lm_head.weight"])
    assert max(ids) < head.shape[0]
    head[ids[0], 0], head[ids[1], 0] = 100.0, -100.0
    weights["lm_head.weight"] = head
    save_file(weights, path + "/model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def calling_server(tmp_path_factory):
    path = _checkpoint_that_calls(str(tmp_path_factory.mktemp("calls")), NAN_CALL)
    yield from serving(LiveServer(path, "--max-model-len", "512"))  # the tiny checkpoint's own context


def test_a_model_calling_a_tool_with_nan_still_gets_json_responses(calling_server):
    """The model writes NaN as a number's value: /v1/messages was a 500 (Out of range float values are not JSON
    compliant), chat's arguments were `{"city": NaN}`, and a client's schema type that is no type name was a 500."""
    server = calling_server
    weather = {"type": "object", "properties": {"city": {"type": "number"}}}
    name = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    r = httpx.post(server.url + "/v1/messages", timeout=60, json={
        "model": name, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"name": "get_weather", "input_schema": weather}]})
    assert r.status_code == 200, r.text
    assert [b["input"] for b in r.json()["content"] if b["type"] == "tool_use"] == [{"city": "NaN"}], r.text
    for kind in ("number", {"enum": ["x"]}):
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": kind}}}}}]
        for stream in (False, True):
            r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
                "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "weather?"}],
                "tools": tools, "stream": stream})
            assert r.status_code == 200, r.text
            assert "error" not in r.text and "NaN}" not in r.text, r.text
            if not stream:
                call = r.json()["choices"][0]["message"]["tool_calls"][0]
                assert _strict(call["function"]["arguments"]) == {"city": "NaN"}  # the text, as a string
