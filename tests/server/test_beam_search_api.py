"""vLLM's use_beam_search on chat and completions of a live server: the n choices are the engine's n best beams
(LLM.beam_search on the same engine's model), whole or streamed; what beams do not apply is refused by name; a
client that leaves mid-search stops it."""

from __future__ import annotations

import time

import httpx
import pytest

from deltaserve import BeamSearchParams
from tests.server.conftest import MODEL
from tests.server.test_disconnect_and_metrics import _wait_for_idle_pools

pytestmark = pytest.mark.timeout(300)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _post(server, route: str, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.base_url + route, json={"model": MODEL, **body}, headers=server.headers,
                      timeout=timeout)


def test_completion_beams_are_the_engines_best_beams(server, demo_llm):
    prompt = demo_llm.get_tokenizer().encode("The capital of France is", add_special_tokens=False)
    r = _post(server, "/completions", {"prompt": prompt, "max_tokens": 8, "n": 3, "use_beam_search": True,
                                       "logprobs": 1, "return_token_ids": True, "length_penalty": 0.5})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    expected = demo_llm.beam_search([{"prompt_token_ids": prompt}],
                                    BeamSearchParams(beam_width=3, max_tokens=8, length_penalty=0.5))[0].sequences
    tok = demo_llm.get_tokenizer()
    assert [c["token_ids"] for c in choices] == [s.tokens[len(prompt):] for s in expected]
    for choice, seq in zip(choices, expected):
        generated = seq.tokens[len(prompt):]
        shown = generated[:-1] if seq.finish_reason == "stop" else generated  # the end token's text is not
        assert choice["text"] == tok.decode(shown, skip_special_tokens=True)
        assert choice["finish_reason"] == seq.finish_reason
        logprobs = choice["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(generated)
        assert sum(logprobs["token_logprobs"]) == pytest.approx(seq.cum_logprob, abs=1e-3)
        assert all(len(top) in (1, 2) for top in logprobs["top_logprobs"])  # the best one, and the chosen one
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)


def test_chat_beams_streamed_are_the_whole_reply(server):
    body = {"messages": QUESTION, "max_tokens": 10, "n": 2, "use_beam_search": True}
    whole = _post(server, "/chat/completions", body)
    assert whole.status_code == 200, whole.text
    texts = [c["message"]["content"] for c in whole.json()["choices"]]
    assert len(set(texts)) == 2 and all(texts)
    streamed, finished = ["", ""], {}
    with httpx.stream("POST", server.base_url + "/chat/completions", json={"model": MODEL, **body, "stream": True},
                      headers=server.headers, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for c in httpx.Response(200, content=line[6:]).json()["choices"]:
                    streamed[c["index"]] += c["delta"].get("content") or ""
                    if c["finish_reason"]:
                        finished[c["index"]] = c["finish_reason"]
    assert streamed == texts
    assert finished == {i: c["finish_reason"] for i, c in enumerate(whole.json()["choices"])}


@pytest.mark.parametrize("field, value", [("stop", "x"), ("logit_bias", {"5": 3}), ("presence_penalty", 0.5),
                                          ("response_format", {"type": "json_object"}), ("prompt_logprobs", 1)])
def test_what_beams_do_not_apply_is_refused_by_name(server, field, value):
    r = _post(server, "/completions", {"prompt": "a", "max_tokens": 3, "n": 2, "use_beam_search": True,
                                       field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert "not applied by beam search" in r.json()["error"]["message"]


def test_echos_prompt_logprobs_are_refused_beside_beams(server):
    r = _post(server, "/completions", {"prompt": "a b", "max_tokens": 3, "n": 2, "use_beam_search": True,
                                       "echo": True, "logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo", r.text
    r = _post(server, "/completions", {"prompt": "a b", "max_tokens": 3, "n": 2, "use_beam_search": True,
                                       "length_penalty": 1000})  # past float's range: ranked all the same
    assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text


def test_a_width_past_max_logprobs_is_refused_and_the_server_serves_on(server):
    r = _post(server, "/chat/completions", {"messages": QUESTION, "max_tokens": 3, "n": 11, "use_beam_search": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    assert "22 likeliest tokens" in r.json()["error"]["message"]
    assert _post(server, "/completions", {"prompt": "a", "max_tokens": 2}).status_code == 200


def test_a_client_gone_mid_search_stops_it(server):
    """The whole search would generate 4 x 300 tokens, a token a beam each step; it ends with the connection (the
    pools are idle between two steps too, so the count is read until it stays put)."""
    before = _wait_for_idle_pools(server)
    with pytest.raises(httpx.ReadTimeout):
        _post(server, "/completions", {"prompt": "Once upon a time", "max_tokens": 300, "n": 4,
                                       "use_beam_search": True, "ignore_eos": True}, timeout=2.0)
    deadline, last = time.monotonic() + 30, None
    while True:
        now = _wait_for_idle_pools(server)["deltaserve_generation_tokens_total"]
        if now == last:
            break
        assert time.monotonic() < deadline, "the search ran on after its client left"
        last = now
        time.sleep(1.5)
    assert 0 < last - before["deltaserve_generation_tokens_total"] < 4 * 300
