"""thinking_token_budget through the server: the reply's reasoning ends after the budget and its answer follows."""

import json
import random

import httpx
import pytest

from tests.checkpoints import add_think_tokens, make_checkpoint
from tests.server.conftest import serving
from tests.server.live_server import LiveServer
from tests.test_thinking_budget import end_due_at

MODEL = "thinker"
TEMPLATE = (  # ChatML, the reply opened inside a think block as Qwen3's templates do
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("thinker"))
    make_checkpoint("qwen3.5", path)
    tags = add_think_tokens(path)
    template = tmp_path_factory.mktemp("template") / "thinking.jinja"
    template.write_text(TEMPLATE)
    for live in serving(LiveServer(path, "--max-model-len", "512", "--served-model-name", MODEL,
                                         "--chat-template", str(template))):
        yield live, tags


def chat(live, **fields) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": random.choice(["Hi", "Why?", "Go on"])}],
            "temperature": 0, "logprobs": True, "return_tokens_as_token_ids": True, **fields}
    r = httpx.post(live.base_url + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def token_ids(reply: dict) -> list[int]:
    return [int(entry["token"].removeprefix("token_id:")) for entry in reply["choices"][0]["logprobs"]["content"]]


def test_the_reasoning_ends_after_the_budget_and_the_answer_follows(thinker):
    live, (start, end) = thinker
    budget = random.randint(1, 8)
    question = [{"role": "user", "content": random.choice(["Hi", "Why?", "Go on", "Tell me"])}]
    free = chat(live, messages=question, max_tokens=budget + 8)
    kept = chat(live, messages=question, max_tokens=budget + 8, thinking_token_budget=budget)
    free_ids, kept_ids = token_ids(free), token_ids(kept)
    rendered = httpx.post(live.url + "/tokenize", json={"model": MODEL, "messages": question}, timeout=60).json()
    prompt = rendered["tokens"]
    already = len(prompt) - 1 - prompt.index(start)  # the template's newline after <think> is a thought too
    at = end_due_at(free_ids, budget, start, end, already)
    if at is None:  # the model closed its block by itself within the budget
        assert kept_ids == free_ids
        return
    assert kept_ids[:at] == free_ids[:at] and kept_ids[at] == end
    message = kept["choices"][0]["message"]  # the forced tag closed the reasoning: what follows is the answer
    assert "</think>" not in (message.get("reasoning") or "") and message["content"] is not None
    assert kept["usage"]["completion_tokens"] == budget + 8  # the reply went on after the block


def test_a_budget_is_checked_by_the_server(thinker):
    live, _ = thinker
    for value, status in ((-2, 400), (1.5, 400), ("8", 400), (-1, 200), (0, 200)):
        body = {"model": MODEL, "prompt": "a", "max_tokens": 2, "thinking_token_budget": value}
        r = httpx.post(live.base_url + "/completions", json=body, timeout=60)
        assert r.status_code == status, (value, r.text)
        if status == 400:
            assert r.json()["error"]["param"] == "thinking_token_budget", r.text


def test_anthropic_enabled_thinking_keeps_its_budget(thinker):
    """Anthropic's thinking {"type": "enabled", "budget_tokens": B} is a thinking_token_budget of B: the reply's
    thinking and text are the chat route's under that budget."""
    live, _ = thinker
    budget = random.randint(1, 8)
    question = [{"role": "user", "content": random.choice(["Hi", "Why?", "Go on", "Tell me"])}]
    limit = budget + 8
    chat_reply = chat(live, messages=question, max_tokens=limit, thinking_token_budget=budget, logprobs=False)
    body = {"model": MODEL, "max_tokens": limit, "temperature": 0, "messages": question,
            "thinking": {"type": "enabled", "budget_tokens": budget}}
    r = httpx.post(live.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    blocks = {block["type"]: block for block in r.json()["content"]}
    message = chat_reply["choices"][0]["message"]
    assert blocks.get("thinking", {}).get("thinking", "") == (message.get("reasoning") or "")
    assert blocks.get("text", {}).get("text", "") == (message["content"] or "")
    assert r.json()["usage"]["output_tokens"] == chat_reply["usage"]["completion_tokens"]


def test_anthropic_thinking_is_checked_as_anthropic_checks_it(thinker):
    live, _ = thinker
    question = [{"role": "user", "content": "Hi"}]
    cases = [({"type": "enabled"}, 16, 400), ({"type": "enabled", "budget_tokens": 16}, 16, 400),
             ({"type": "enabled", "budget_tokens": -1}, 16, 400), ({"type": "sometimes"}, 16, 400),
             ({"type": "disabled"}, 4, 200), ({"type": "adaptive"}, 4, 200),
             ({"type": "enabled", "budget_tokens": 3}, 4, 200)]
    for thinking, max_tokens, status in cases:
        body = {"model": MODEL, "max_tokens": max_tokens, "messages": question, "thinking": thinking}
        r = httpx.post(live.url + "/v1/messages", json=body, timeout=60)
        assert r.status_code == status, (thinking, r.text)
        if status == 400:
            assert r.json()["type"] == "error" and "thinking" in r.json()["error"]["message"], r.text


def test_include_reasoning_false_leaves_the_reasoning_out_whole_and_streamed(thinker):
    live, _ = thinker
    question = [{"role": "user", "content": random.choice(["Hi", "Why?", "Go on", "Tell me"])}]
    budget = random.randint(3, 6)  # thoughts past the template's newline, so that there is reasoning to leave out
    fields = {"messages": question, "max_tokens": budget + 8, "thinking_token_budget": budget, "logprobs": False}
    full = chat(live, **fields)["choices"][0]
    bare = chat(live, include_reasoning=False, **fields)["choices"][0]
    assert full["message"].get("reasoning")  # the prompt opened the block: the reply starts with reasoning
    assert "reasoning" not in bare["message"] and "reasoning_content" not in bare["message"]
    assert bare["message"]["content"] == full["message"]["content"]
    body = {"model": MODEL, "temperature": 0, "stream": True, "include_reasoning": False, **fields}
    chunks = []
    with httpx.stream("POST", live.base_url + "/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[len("data: "):]))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert all("reasoning" not in d and "reasoning_content" not in d for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == (full["message"]["content"] or "")
    assert chunks[-1]["choices"][0]["finish_reason"] == full["finish_reason"]
