"""Bad input gets an OpenAI-style 4xx with the right status, and the server goes on serving."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, MODEL

pytestmark = pytest.mark.timeout(300)

QUESTION = [{"role": "user", "content": "Hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _post(server, path, body=None, *, content=None, headers=None):
    return httpx.post(server.url + path, json=body, content=content, timeout=60,
                      headers={**server.headers, **(headers or {})})


def _assert_error(r, status, param=None, text=None):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param, error
    if text is not None:
        assert text in error["message"], error
    return error


def _still_serves(server):
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def _nested(depth: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


CASES = {
    "malformed json": ("/v1/chat/completions", None, b'{"model": "smollm2", "messages": [', None),
    "body not an object": ("/v1/completions", None, b"[1, 2]", None),
    "missing messages": ("/v1/chat/completions", {"model": MODEL, "max_tokens": 2}, None, "messages"),
    "empty messages": ("/v1/chat/completions", {"model": MODEL, "messages": []}, None, "messages"),
    "missing prompt": ("/v1/completions", {"model": MODEL}, None, "prompt"),
    "wrongly typed max_tokens": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": "2"},
                                 None, "max_tokens"),
    "wrongly typed temperature": ("/v1/completions", {"model": MODEL, "prompt": "a", "temperature": "hot"}, None,
                                  "temperature"),
    "no role": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "", "content": "x"}]}, None,
                "messages.0.role"),
    "negative temperature": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "temperature": -1}, None,
                             "temperature"),
    "top_p above one": ("/v1/completions", {"model": MODEL, "prompt": "a", "top_p": 1.5}, None, "top_p"),
    "zero max_tokens": ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 0}, None, "max_tokens"),
    "n of zero": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "n": 0}, None, "n"),
    "too many logprobs": ("/v1/completions", {"model": MODEL, "prompt": "a", "logprobs": 99}, None, "logprobs"),
    "empty prompt": ("/v1/completions", {"model": MODEL, "prompt": ""}, None, "prompt"),
    "empty token-id prompt": ("/v1/completions", {"model": MODEL, "prompt": [[1, 2], []]}, None, "prompt"),
    "token outside the vocabulary": ("/v1/completions", {"model": MODEL, "prompt": [1, 10_000_000]}, None, "prompt"),
    "unknown response_format": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                                                         "response_format": {"type": "xml"}}, None,
                                "response_format"),
    "json_schema without a schema": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                                                              "response_format": {"type": "json_schema"}}, None,
                                     "response_format"),
    "schema that does not compile": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                                                              "response_format": {"type": "json_schema", "json_schema": {
                                                                  "name": "x", "schema": {"type": "objectx"}}}},
                                     None, "response_format"),
    "schema nested deep": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": _nested(900)}}}, None, "response_format"),
    "regex that does not compile": ("/v1/completions", {"model": MODEL, "prompt": "a",
                                                        "structured_outputs": {"regex": "a(b"}}, None,
                                    "structured_outputs"),
    "two kinds of structured output": ("/v1/completions", {"model": MODEL, "prompt": "a",
                                                           "structured_outputs": {"regex": "a", "choice": ["a"]}},
                                       None, "structured_outputs"),
    "structured output field unknown": ("/v1/completions", {"model": MODEL, "prompt": "a",
                                                            "structured_outputs": {"structural_tag": "{}"}}, None,
                                        "structured_outputs.structural_tag"),
    "GBNF grammar that does not parse": ("/v1/completions", {"model": MODEL, "prompt": "a",
                                                             "structured_outputs": {"grammar": 'root ::= ("a"'}},
                                         None, "structured_outputs"),
    "Lark grammar with an undefined rule": ("/v1/completions", {
        "model": MODEL, "prompt": "a", "structured_outputs": {"grammar": 'start: a b\na: "x"'}}, None,
        "structured_outputs"),
    "response_format beside structured_outputs": ("/v1/chat/completions", {
        "model": MODEL, "messages": QUESTION, "response_format": {"type": "json_object"},
        "structured_outputs": {"regex": "a"}}, None, "structured_outputs"),
    "min_tokens past max_tokens": ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 3,
                                                       "min_tokens": 4}, None, "min_tokens"),
    "negative min_tokens": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "min_tokens": -1}, None,
                            "min_tokens"),
    "allowed token outside the vocabulary": ("/v1/completions", {"model": MODEL, "prompt": "a",
                                                                 "allowed_token_ids": [5, 10_000_000]}, None,
                                             "allowed_token_ids"),
    "empty bad word": ("/v1/completions", {"model": MODEL, "prompt": "a", "bad_words": [""]}, None, "bad_words"),
    "truncate_prompt_tokens of 0": ("/v1/completions", {"model": MODEL, "prompt": "a", "truncate_prompt_tokens": 0},
                                    None, "truncate_prompt_tokens"),
    "truncate_prompt_tokens past the context": ("/v1/chat/completions", {
        "model": MODEL, "messages": QUESTION, "truncate_prompt_tokens": 10**7}, None, "truncate_prompt_tokens"),
    "prompt_logprobs past the bound": ("/v1/completions", {"model": MODEL, "prompt": "a", "prompt_logprobs": 10**6},
                                       None, "prompt_logprobs"),
    "negative prompt_logprobs beside echo": ("/v1/completions", {"model": MODEL, "prompt": "a", "echo": True,
                                                                 "logprobs": 2, "prompt_logprobs": -1}, None,
                                             "prompt_logprobs"),
    "beam search under a tool choice's grammar": ("/v1/chat/completions", {
        "model": MODEL, "messages": QUESTION, "use_beam_search": True, "n": 2, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, None,
        "tool_choice"),
    "beam search's length_penalty not a number": ("/v1/completions", {
        "model": MODEL, "prompt": "a", "use_beam_search": True, "length_penalty": "long"}, None, "length_penalty"),
    "guided_json": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "guided_json": {"type": "object"}},
                    None, "guided_json"),
    "thinking budget without think tokens": ("/v1/chat/completions", {
        "model": MODEL, "messages": QUESTION, "thinking_token_budget": 64}, None, "thinking_token_budget"),
    "repetition detection without a count": ("/v1/completions", {"model": MODEL, "prompt": "a",
                                                                 "repetition_detection": {"max_pattern_size": 4}},
                                             None, "repetition_detection.min_count"),
    "top_logprobs without logprobs": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                                                               "top_logprobs": 3}, None, "top_logprobs"),
    "suffix": ("/v1/completions", {"model": MODEL, "prompt": "a", "suffix": "b"}, None, "suffix"),
    "best_of above n": ("/v1/completions", {"model": MODEL, "prompt": "a", "best_of": 3}, None, "best_of"),
    "image part": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}}]}]}, None, "messages.0.content"),
    "text part without text": ("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": [{"type": "text"}]}]}, None, "messages.0.content"),
    "template variable the server sets": ("/v1/chat/completions", {
        "model": MODEL, "messages": QUESTION, "chat_template_kwargs": {"messages": [], "enable_thinking": False}},
        None, "chat_template_kwargs.messages"),
    "tool without a name": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "tools": [
        {"type": "function", "function": {"name": "", "parameters": {"type": "object"}}}]}, None,
        "tools.0.function.name"),
    "two tools of one name": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "tools": TOOLS * 2},
                              None, "tools.1.function.name"),
    "a bad token id among many prompts": ("/v1/completions", {"model": MODEL, "prompt": [[1, 2]] * 50 + [
        [1, 10_000_000]] + [[3]] * 50, "max_tokens": 2}, None, "prompt"),
    "seed past int64": ("/v1/completions", {"model": MODEL, "prompt": "a", "seed": 2**63}, None, "seed"),
    "seed below int64": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "seed": -(2**63) - 1},
                         None, "seed"),
    "n above OpenAI's bound": ("/v1/completions", {"model": MODEL, "prompt": "a", "n": 129}, None, "n"),
    "stream_options without stream": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                                                               "stream_options": {"include_usage": True}}, None,
                                      "stream_options"),
    "tool_choice without tools": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                                                           "tool_choice": "auto"}, None, "tool_choice"),
    "tool_choice naming no tool": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "tools": TOOLS,
                                                           "tool_choice": {"type": "function",
                                                                           "function": {"name": "get_time"}}},
                                   None, "tool_choice"),
    "demanded tool call beside response_format": ("/v1/chat/completions", {
        "model": MODEL, "messages": QUESTION, "tools": TOOLS, "tool_choice": "required",
        "response_format": {"type": "json_object"}}, None, "tool_choice"),
    "zero max_completion_tokens": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION,
                                                            "max_completion_tokens": 0}, None, "max_completion_tokens"),
    "too many top_logprobs": ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "logprobs": True,
                                                       "top_logprobs": 25}, None, "top_logprobs"),
    "lone surrogate in a prompt": ("/v1/completions", None,
                                   b'{"model": "smollm2", "prompt": "hi \\ud800 there", "max_tokens": 2}', "prompt"),
    "lone surrogate in a message": ("/v1/chat/completions", None,
                                    b'{"model": "smollm2", "messages": [{"role": "user", "content": "\\udfff"}]}',
                                    "messages.0.content"),
    "lone surrogate to tokenize": ("/tokenize", None, b'{"prompt": "a\\ud83d"}', "prompt"),
    # the key itself at fault: the error names it escaped, and is text itself
    "lone surrogate in a key": ("/v1/chat/completions", None,
                                b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], '
                                b'"logit_bias": {"\\ud800": 1}}', "logit_bias.\\ud800"),
    "lone surrogate in a top-level key": ("/tokenize", None, b'{"prompt": "a", "x\\udc00": 1}', "x\\udc00"),
    "nested past any parser": ("/v1/completions", None,
                               b'{"prompt": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_request_is_400(server, case):
    path, body, raw, param = CASES[case]
    headers = {"content-type": "application/json"} if raw is not None else None
    _assert_error(_post(server, path, body, content=raw, headers=headers), 400, param)
    _still_serves(server)


@pytest.mark.parametrize("prompt", ["", [], [1, 10_000_000]])
def test_unusable_prompts_share_one_code(server, prompt):
    """An empty prompt and a token outside the vocabulary are both an invalid prompt, as the engine names them."""
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2})
    _assert_error(r, 400, "prompt")
    assert r.json()["error"]["code"] == "invalid_prompt", r.text


def test_a_body_of_another_media_type_is_refused(server):
    """As vLLM's: only application/json (a browser sends a form or text across sites without asking first)."""
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()
    for media_type in ("text/plain", "application/x-www-form-urlencoded", None):
        r = httpx.post(server.url + "/v1/completions", content=body, timeout=60,
                       headers={**server.headers, **({"content-type": media_type} if media_type else {})})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_media_type", r.text
    ok = _post(server, "/v1/completions", content=body, headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text
    missing = httpx.get(server.url + "/v1/models/", headers=server.headers, timeout=30)  # no name: none served
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found", missing.text


def test_an_escaped_surrogate_pair_is_text(server):
    """An emoji escaped as a UTF-16 pair is one character: only half of a pair is refused."""
    r = _post(server, "/tokenize", content=b'{"prompt": "a\\ud83d\\ude00"}',
              headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == _post(server, "/tokenize", {"prompt": "a\U0001F600"}).json()["tokens"]


def test_a_top_k_past_the_vocabulary_is_top_k_off_and_harms_no_other_request(server):
    """k is an integer of any size; one past the vocabulary keeps every token, as -1 does, and the step it
    shares with other requests runs."""
    def complete(**fields):
        body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0.9,
                "seed": 7, **fields}
        r = _post(server, "/v1/completions", body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(complete, top_k=k) for k in (2**63, 2**80, 10**6, -1)]
        texts = [f.result() for f in futures]
    assert texts[0] == texts[1] == texts[2] == texts[3]


def test_text_response_format_and_best_of_n_are_served(server):
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 2,
                                               "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2, "n": 2, "best_of": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text
    # fields the server does not know are ignored (and logged), as vLLM does; beam search turned off is no beam,
    # and priority 0 is the only one there is
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2, "a_field_of_tomorrow": 3,
                                          "use_beam_search": False, "priority": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text


def test_constraints_that_leave_no_token_are_a_400_naming_them(server):
    """allowed_token_ids that no JSON text starts with, under response_format json_object, and allowed tokens
    that min_tokens holds back as stop tokens: each request ends with a 400 naming them (a stream with an error
    event), and the server goes on serving with nothing held."""
    ids = _post(server, "/tokenize", {"model": MODEL, "prompt": "hello there"}).json()["tokens"]
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "allowed_token_ids": ids,
            "response_format": {"type": "json_object"}}
    error = _assert_error(_post(server, "/v1/chat/completions", body), 400, "allowed_token_ids", "structured output")
    assert error["code"] == "no_token_allowed" and "output token 0" in error["message"]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60,
                      headers=server.headers) as r:
        events = "".join(r.iter_text())
    assert '"no_token_allowed"' in events and "[DONE]" in events
    stops = {"stop_token_ids": ids, "allowed_token_ids": ids, "min_tokens": 3}
    error = _assert_error(_post(server, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 8, **stops}),
                          400, "allowed_token_ids", "min_tokens")
    assert error["code"] == "no_token_allowed"
    _still_serves(server)
    gauges = [line for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines()
              if line.startswith(("deltaserve_kv_blocks_used ", "deltaserve_requests_running "))]
    assert sorted(gauges) == ["deltaserve_kv_blocks_used 0.0", "deltaserve_requests_running 0.0"]


def test_context_overflow_names_both_numbers(server):
    prompt = "hello " * 300
    n_prompt = _post(server, "/tokenize", {"model": MODEL, "prompt": prompt}).json()["count"]
    error = _assert_error(_post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1000}),
                          400, "prompt")
    assert "1024" in error["message"] and str(n_prompt) in error["message"] and "1000" in error["message"]
    error = _assert_error(_post(server, "/v1/completions", {"model": MODEL, "prompt": "hello " * 1100}), 400)
    assert "1024" in error["message"]
    _still_serves(server)


def test_unknown_model_is_404(server):
    client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-17", messages=QUESTION, max_tokens=2)
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-17")
    _still_serves(server)


def test_missing_or_wrong_key_is_401(server):
    for key in ("wrong-key", ""):
        client = openai.OpenAI(base_url=server.base_url, api_key=key or "x", max_retries=0,
                               default_headers={} if key else {"Authorization": ""})
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    r = httpx.post(server.base_url + "/completions", json={"model": MODEL, "prompt": "a"}, timeout=30)
    _assert_error(r, 401)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # health needs no key
    _still_serves(server)


def test_a_schema_error_is_named_as_the_request_named_the_schema(server):
    """A response_format schema that admits nothing is refused under response_format, in the message too."""
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}})
    _assert_error(r, 400, "response_format")
    assert r.json()["error"]["message"].startswith("response_format: nothing can be written"), r.text
    _still_serves(server)


def test_a_schema_whose_every_value_nests_without_end_is_a_400_naming_the_field(server):
    """Required properties of itself: no value of it ends, under response_format or as a demanded call's
    parameters."""
    forever = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    tool = {"type": "function", "function": {"name": "chain", "parameters": forever}}
    for body, field in [({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": forever}}},
                         "response_format"),
                        ({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "chain"}}},
                         "tool_choice")]:
        r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, **body})
        _assert_error(r, 400, field)
        assert r.json()["error"]["message"].startswith(f"{field}: the schema admits no finite value"), r.text
    _still_serves(server)
