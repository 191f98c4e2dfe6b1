"""The OpenAI API of a live server on the demo model, driven by the official `openai` client."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, MODEL

pytestmark = pytest.mark.timeout(300)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=120)


def test_models_lists_the_served_names(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL, "demo"]
    assert client.models.retrieve("demo").id == "demo"
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}


def test_chat_answers_and_reports_usage(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    choice = r.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    # the other served name reaches the same model, which replies under its first name (as vLLM's);
    # max_completion_tokens is the newer spelling
    r2 = client.chat.completions.create(model="demo", messages=QUESTION, max_completion_tokens=12, temperature=0)
    assert r2.choices[0].message.content == choice.message.content and r2.model == r.model == MODEL


def test_chat_stream_matches_the_whole_response(client):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_continuous_usage_counts_every_chunk(client):
    """vLLM's continuous_usage_stats: each chunk carries its choice's tokens so far, growing to the final count."""
    max_tokens = random.randint(4, 12)
    options = {"include_usage": True, "continuous_usage_stats": True}
    chat = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=max_tokens, temperature=0,
                                               stream=True, stream_options=options, extra_body={"ignore_eos": True}))
    counts = [c.usage.completion_tokens for c in chat]
    assert all(c.usage is not None and c.usage.prompt_tokens == chat[-1].usage.prompt_tokens for c in chat)
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == max_tokens and counts[-2] == max_tokens
    text = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0,
                                          stream=True, stream_options=options, extra_body={"ignore_eos": True}))
    counts = [c.usage.completion_tokens for c in text]
    assert counts == sorted(counts) and counts[-1] == max_tokens and len(set(counts)) > 1


def test_sampled_multibyte_text_streams_without_loss_or_repeats(client):
    # high-temperature samples from a non-Latin prompt hit tokens that hold parts of a UTF-8 character
    for seed in (11, 12):
        kwargs = dict(model=MODEL, prompt="日本語の文章: こんにちは、", max_tokens=16, temperature=1.3, seed=seed)
        whole = client.completions.create(**kwargs).choices[0].text
        pieces = [c.choices[0].text for c in client.completions.create(**kwargs, stream=True) if c.choices]
        assert "".join(pieces) == whole
        assert all("\ufffd" not in piece for piece in pieces[:-1])


def test_chat_accepts_system_text_parts_and_tool_turns(client):
    messages = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]},
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                "parameters": {"type": "object",
                                                               "properties": {"city": {"type": "string"}}}}}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0, tools=tools,
                                       tool_choice="auto")
    assert r.choices[0].message.content
    follow_up = messages + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=follow_up, max_tokens=4, temperature=0, tools=tools)
    assert r.usage.completion_tokens >= 1


def _hermes_calls(values: list[int]) -> str:
    return "\n".join(f'<tool_call>\n{{"name": "f", "arguments": {{"x": {x}}}}}\n</tool_call>' for x in values)


def test_parallel_tool_calls_false_keeps_the_first_call_whole_and_streamed(client):
    """OpenAI's parallel_tool_calls false: at most one call. A model that writes several under tool_choice auto
    gives its first, as vLLM's does; the others are dropped, their text with them."""
    values = random.sample(range(100), random.randint(2, 3))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "number"}}}}}]
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "call f"}], tools=tools, temperature=0,
                  max_tokens=40 * len(values),
                  extra_body={"structured_outputs": {"regex": re.escape(_hermes_calls(values))}})
    free = client.chat.completions.create(**kwargs).choices[0]
    assert [json.loads(c.function.arguments)["x"] for c in free.message.tool_calls] == values
    one = client.chat.completions.create(**kwargs, parallel_tool_calls=False).choices[0]
    assert [json.loads(c.function.arguments)["x"] for c in one.message.tool_calls] == values[:1]
    assert one.message.content is None and one.finish_reason == "tool_calls"
    chunks = [c.choices[0] for c in client.chat.completions.create(**kwargs, parallel_tool_calls=False, stream=True)
              if c.choices]
    streamed = [call for c in chunks for call in c.delta.tool_calls or ()]
    assert [(c.index, json.loads(c.function.arguments)["x"]) for c in streamed] == [(0, values[0])]
    assert "".join(c.delta.content or "" for c in chunks) == "" and chunks[-1].finish_reason == "tool_calls"


def test_completions_string_and_token_prompts(client, server):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    text = r.choices[0].text
    assert "Paris" in text
    ids = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": PROMPT}, headers=server.headers,
                     timeout=30).json()["tokens"]
    r2 = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert r2.choices[0].text == text
    assert r2.usage.prompt_tokens == len(ids) == r.usage.prompt_tokens
    echo = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, echo=True)
    assert echo.choices[0].text == PROMPT + text
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text
    batch = client.completions.create(model=MODEL, prompt=[PROMPT, "1, 2, 3,"], max_tokens=6, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == text


def test_stop_strings_end_the_text_and_never_leak(client):
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    stop = free[len(free) // 2: len(free) // 2 + 3]
    assert stop and stop.strip()
    expected = free[: free.index(stop)]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop, "zzzz"])
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"
    chunks = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop, stream=True) if c.choices]
    assert "".join(chunks) == expected
    assert all(stop not in "".join(chunks[: i + 1]) for i in range(len(chunks)))


def test_min_tokens_holds_back_the_stop_until_then(client):
    """vLLM's min_tokens: a stop string that would end the text at once counts only past that many tokens."""
    count = "Count with me: 1, 2, 3, 4, 5"
    early = client.completions.create(model=MODEL, prompt=count, max_tokens=40, temperature=0, stop=[","])
    assert early.usage.completion_tokens < 6 and early.choices[0].finish_reason == "stop"
    min_tokens = random.randint(6, 10)
    later = client.completions.create(model=MODEL, prompt=count, max_tokens=40, temperature=0, stop=[","],
                                      extra_body={"min_tokens": min_tokens})
    assert later.usage.completion_tokens > min_tokens and later.choices[0].finish_reason == "stop"
    assert later.choices[0].text.startswith(early.choices[0].text)


def test_allowed_token_ids_and_bad_words(client, server):
    """vLLM's: a choice of tokens keeps the text to them; a bad word of the greedy answer is not written."""
    tokens = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": " yes no maybe",
                                                        "add_special_tokens": False},
                        headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30).json()["tokens"]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0,
                                  seed=random.randrange(2**31), extra_body={"allowed_token_ids": tokens})
    assert r.usage.completion_tokens == 6 and not r.choices[0].text.replace(" yes", "").replace(" no", "").replace(
        " maybe", "").strip()
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    word = free.split()[0].strip(".,")
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                  extra_body={"bad_words": [word]})
    assert word not in r.choices[0].text.split()


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(client, server):
    """vLLM's truncate_prompt_tokens: the answer is the one to the prompt's last k tokens sent alone."""
    text = "Here is a list of fruits: apple, pear, plum, fig, lime, kiwi, mango, peach, grape, melon, and"
    tokens = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": text},
                        headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30).json()["tokens"]
    keep = random.randint(3, len(tokens) - 2)
    cut = client.completions.create(model=MODEL, prompt=text, max_tokens=6, temperature=0,
                                    extra_body={"truncate_prompt_tokens": keep})
    alone = client.completions.create(model=MODEL, prompt=tokens[-keep:], max_tokens=6, temperature=0)
    assert cut.usage.prompt_tokens == keep and cut.choices[0].text == alone.choices[0].text
    whole = client.completions.create(model=MODEL, prompt=text, max_tokens=1, extra_body={"truncate_prompt_tokens": -1})
    assert whole.usage.prompt_tokens == len(tokens)
    # -1 keeps what the context leaves beside max_tokens, as vLLM's; more than that is refused
    asked = random.randint(1, 32)
    long = client.completions.create(model=MODEL, prompt=" plum" * 1100, max_tokens=asked,
                                     extra_body={"truncate_prompt_tokens": -1, "ignore_eos": True})
    assert long.usage.prompt_tokens == 1024 - asked and long.usage.completion_tokens == asked
    with pytest.raises(openai.BadRequestError, match="truncate_prompt_tokens"):
        client.completions.create(model=MODEL, prompt=text, max_tokens=asked,
                                  extra_body={"truncate_prompt_tokens": 1024 - asked + 1})
    keep = random.randint(3, 8)  # of the chat's rendered prompt
    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2,
                                          extra_body={"truncate_prompt_tokens": keep})
    assert chat.usage.prompt_tokens == keep


def test_prompt_logprobs_are_the_models(client, server, demo_reference):
    """vLLM's prompt_logprobs: each prompt token's logprob as transformers computes it from the same GGUF file,
    its rank, and the top k; the chat's cover its rendered prompt; a stream is refused."""
    import torch

    top = random.randint(0, 3)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": top})
    entries = r.choices[0].model_extra["prompt_logprobs"]
    tokens = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": PROMPT},
                        headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30).json()["tokens"]
    with torch.no_grad():
        expected = torch.log_softmax(demo_reference(torch.tensor([tokens])).logits[0].float(), -1)
    assert entries[0] is None and len(entries) == len(tokens)
    for position in range(1, len(tokens)):
        entry = {int(tid): e for tid, e in entries[position].items()}
        own, row = entry[tokens[position]], expected[position - 1]
        assert abs(own["logprob"] - row[tokens[position]].item()) < 1e-3
        # its rank among the reference's, where those within rounding of its own may stand either side
        better, near = int((row > own["logprob"] + 1e-3).sum()), int((row > own["logprob"] - 1e-3).sum())
        assert better + 1 <= own["rank"] <= near + 1
        assert set(range(1, top + 1)) <= {e["rank"] for e in entry.values()} and len(entry) <= top + 1
    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1,
                                          extra_body={"prompt_logprobs": 0})
    assert len(chat.model_extra["prompt_logprobs"]) == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1, stream=True,
                                       extra_body={"prompt_logprobs": 0})


def test_logit_bias_forces_a_token_and_bans_the_greedy_ones(client, server):
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    ids = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": " Lyon"}, headers=server.headers,
                     timeout=30).json()["tokens"]
    forced = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                       logit_bias={str(ids[-1]): 100})
    assert forced.choices[0].text == httpx.post(
        server.url + "/detokenize", json={"model": MODEL, "tokens": [ids[-1]] * 3}, headers=server.headers,
        timeout=30).json()["prompt"]
    free_ids = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": free.choices[0].text,
                                                           "add_special_tokens": False},
                          headers=server.headers, timeout=30).json()["tokens"]
    banned = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                       logit_bias={str(t): -100 for t in free_ids})
    assert banned.choices[0].text != free.choices[0].text
    for bias, message in (({"Paris": 5}, "token ids"), ({"10000000": 5}, "outside the vocabulary")):
        r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "logit_bias": bias},
                       headers=server.headers, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
        assert message in r.json()["error"]["message"]
    # past OpenAI's [-100, 100] a bias is clamped to it, as vLLM's server clamps it: 1000 is 100, -1000 is -100
    past = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                     logit_bias={str(ids[-1]): 1000})
    assert past.choices[0].text == forced.choices[0].text
    unbanned = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                         logit_bias={str(t): -1000 for t in free_ids})
    assert unbanned.choices[0].text == banned.choices[0].text


def test_seeded_sampling_is_reproducible(client):
    def sample(seed):
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0,
                                         seed=seed).choices[0].text

    first = sample(1234)
    assert sample(1234) == first
    others = {sample(s) for s in (1, 2, 3)}
    assert len(others | {first}) > 1  # different seeds do sample differently


def test_n_gives_several_choices(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=1.0, n=2, seed=7,
                                       logprobs=True)
    assert [c.index for c in r.choices] == [0, 1]
    # usage counts the tokens of both choices
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=1.0, n=2,
                                            seed=7, stream=True)
    texts = ["", ""]
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert texts == [c.message.content for c in r.choices]  # same seed, same samples
    assert finished == {0, 1}


def test_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the most likely token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
    assert "".join(e.token for e in content) == r.choices[0].message.content
    # legacy completions: the chosen token, then the top ones (sampled, so that it is often not among them)
    c = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.5, seed=3, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == c.usage.completion_tokens
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        others = [v for t, v in top.items() if t != token]
        assert top[token] == logprob
        # among the two best, it stands once; otherwise beside them, and no likelier than either
        assert len(top) == 2 and len(others) == 1 or len(top) == 3 and logprob <= min(others)
    assert "".join(lp.tokens) == c.choices[0].text
    assert lp.text_offset[0] == 0
    alone = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.5, seed=3, logprobs=0)
    assert [dict(top) for top in alone.choices[0].logprobs.top_logprobs] == [
        {t: v} for t, v in zip(lp.tokens, lp.token_logprobs)]


def test_a_temperature_too_small_to_divide_by_samples_at_vllms_floor_and_one_past_2_is_refused(client, server):
    """vLLM's: a temperature in (0, 0.01) samples at 0.01 (under it the logits would overflow), and one past 2
    (OpenAI's bound too) is refused."""
    seed = random.randrange(2**31)
    floor = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0.01, seed=seed)
    for temperature in (1e-45, 1e-6):
        tiny = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=temperature,
                                         seed=seed)
        assert tiny.choices[0].text == floor.choices[0].text
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "temperature": 2.5},
                   headers=server.headers, timeout=30)
    assert r.status_code == 400 and "temperature=2.5: must be in [0, 2]" in r.json()["error"]["message"], r.text


def test_sixteen_concurrent_streams_all_complete(server):
    async def one(client, k):
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Write a word about the number {k}."}],
            max_tokens=8, temperature=0.8, seed=k, stream=True, stream_options={"include_usage": True})
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        return text, finish, usage

    async def main():
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=240) as client:
            return await asyncio.gather(*(one(client, k) for k in range(16)))

    results = asyncio.run(main())
    assert len(results) == 16
    for text, finish, usage in results:
        assert finish in ("stop", "length")
        assert usage is not None and 1 <= usage.completion_tokens <= 8
        assert text or finish == "stop"


def test_tokenize_and_detokenize_round_trip(server):
    post = lambda path, body: httpx.post(server.url + path, json=body, headers=server.headers, timeout=30)  # noqa: E731
    tok = post("/tokenize", {"model": MODEL, "prompt": "Hello, world!", "add_special_tokens": False}).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] == 1024
    assert post("/detokenize", {"model": MODEL, "tokens": tok["tokens"]}).json()["prompt"] == "Hello, world!"
    chat = post("/tokenize", {"model": MODEL, "messages": QUESTION}).json()
    r = post("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 1}).json()
    assert chat["count"] == r["usage"]["prompt_tokens"]


def test_tokenize_renders_the_chat_as_asked(server):
    post = lambda body: httpx.post(server.url + "/tokenize", json=body, headers=server.headers, timeout=30)  # noqa: E731
    asked = post({"messages": QUESTION}).json()["tokens"]
    bare = post({"messages": QUESTION, "add_generation_prompt": False}).json()["tokens"]
    assert len(bare) < len(asked) and asked[: len(bare)] == bare
    assert post({"messages": QUESTION, "chat_template_kwargs": {"enable_thinking": False}}).status_code == 200
    # the demo template reads a message's content as text: its parts' texts joined by newlines, as vLLM joins them
    texts = random.sample(["Name a", "colour.", "in French", "please"], random.randint(2, 3))
    parts = [{"type": "text", "text": t} for t in texts]
    assert post({"messages": [{"role": "user", "content": parts}]}).json()["tokens"] == \
        post({"messages": [{"role": "user", "content": "\n".join(texts)}]}).json()["tokens"]
    # vLLM's continue_final_message: the count a chat that goes on writing the last message is given
    head = random.choice(["The", "Paris is", "It"])
    going_on = {"model": MODEL, "messages": QUESTION + [{"role": "assistant", "content": head}],
                "add_generation_prompt": False, "continue_final_message": True}
    counted = post(going_on).json()
    r = httpx.post(server.url + "/v1/chat/completions", json={**going_on, "max_tokens": 1}, headers=server.headers,
                   timeout=60).json()
    assert counted["count"] == r["usage"]["prompt_tokens"], (counted, r)
    assert post({**going_on, "add_generation_prompt": True}).json()["error"]["param"] == "continue_final_message"
    # vLLM's return_token_strs: each id's string in the vocabulary
    strs = post({"prompt": PROMPT, "return_token_strs": True}).json()
    assert len(strs["token_strs"]) == strs["count"] and all(isinstance(t, str) for t in strs["token_strs"])
    assert post({"prompt": PROMPT}).json()["token_strs"] is None  # vLLM's response field, null unless asked
    assert post({"messages": QUESTION, "chat_template": "{{ messages }}"}).json()["error"]["param"] == "chat_template"


def test_continue_final_message_goes_on_writing_the_assistants_text(client, server):
    free = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0)
    head = " ".join(free.choices[0].message.content.split(" ")[:2])
    messages = QUESTION + [{"role": "assistant", "content": head}]
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    go_on = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0,
                                           extra_body=extra)
    assert free.choices[0].message.content.startswith(head + go_on.choices[0].message.content)
    r = httpx.post(server.url + "/v1/chat/completions", headers=server.headers, timeout=30,
                   json={"model": MODEL, "messages": messages, "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text
    # as vLLM's, the last message of any role may be continued: the user's, left open
    r = httpx.post(server.url + "/v1/chat/completions", headers=server.headers, timeout=30,
                   json={"model": MODEL, "messages": QUESTION, "max_tokens": 2, **extra})
    assert r.status_code == 200, r.text
    # as vLLM's, the request's own fields stand over chat_template_kwargs of the same names
    closed = {"model": MODEL, "messages": messages, "add_generation_prompt": False, "max_tokens": 4, "temperature": 0}
    asked = [httpx.post(server.url + "/v1/chat/completions", headers=server.headers, timeout=30, json=body).json()
             for body in (closed, {**closed, "chat_template_kwargs": {"continue_final_message": True,
                                                                      "add_generation_prompt": True}})]
    assert asked[0]["usage"] == asked[1]["usage"] and asked[0]["choices"] == asked[1]["choices"], asked


def test_chat_echo_starts_the_reply_with_the_message_it_goes_on_writing(client, server):
    """vLLM's echo: a reply that goes on writing the last message (of its own role) starts with that message's
    text, whole and streamed; a reply that opens a new turn echoes nothing, the user's words not being its own.
    With top_logprobs, echo brings the prompt's logprobs too, as prompt_logprobs would."""
    free = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0)
    words = free.choices[0].message.content.split(" ")
    head = " ".join(words[: random.randint(1, max(1, len(words) - 2))])
    messages = QUESTION + [{"role": "assistant", "content": head}]
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0,
                                           extra_body=extra)
    echoed = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0,
                                            logprobs=True, top_logprobs=2, extra_body={**extra, "echo": True})
    assert echoed.choices[0].message.content == head + plain.choices[0].message.content
    assert echoed.choices[0].message.role == "assistant"
    prompt_logprobs = echoed.model_extra["prompt_logprobs"]
    assert len(prompt_logprobs) == echoed.usage.prompt_tokens and prompt_logprobs[0] is None
    assert all(1 <= len(entry) <= 3 for entry in prompt_logprobs[1:])
    # the echo is the message as the prompt holds it: its text parts joined by newlines (the demo template reads
    # text), a refusal part's refusal
    parts = [{"type": "text", "text": head}, {"type": "refusal", "refusal": " x"}]
    listed = client.chat.completions.create(model=MODEL, messages=QUESTION + [{"role": "assistant", "content": parts}],
                                            max_tokens=2, temperature=0, extra_body={**extra, "echo": True})
    assert listed.choices[0].message.content.startswith(head + "\n x")
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0,
                                            stream=True, extra_body={**extra, "echo": True})
    chunks = [c for c in stream if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[1].choices[0].delta.content == head
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == echoed.choices[0].message.content
    new_turn = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0,
                                              extra_body={"echo": True})
    assert new_turn.choices[0].message.content == free.choices[0].message.content
    assert "prompt_logprobs" not in new_turn.model_extra


def test_null_is_the_default_where_openai_lets_a_field_be_null(client, server):
    """OpenAI's SDK sends null for a field given as None: n, stream, logprobs, echo and completions' max_tokens
    take their defaults."""
    nulls = {"n": None, "stream": None, "logprobs": None}
    tokens = random.randint(1, 6)
    for route, body in (("/v1/chat/completions", {"messages": QUESTION}), ("/v1/completions", {"prompt": PROMPT})):
        base = {"model": MODEL, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, **body}
        extra = {"echo": None} if route == "/v1/completions" else {}
        plain = httpx.post(server.url + route, json=base, headers=server.headers, timeout=60).json()
        r = httpx.post(server.url + route, json={**base, **nulls, **extra}, headers=server.headers, timeout=60)
        assert r.status_code == 200 and r.json()["choices"] == plain["choices"], r.text
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=tokens, n=None).usage.completion_tokens
    # completions' max_tokens null is its default, 16, as vLLM takes it (not the rest of the context)
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": None,
                                                         "ignore_eos": True}, headers=server.headers, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16, r.text


def test_a_refusal_part_is_the_text_it_refuses_with(server):
    """OpenAI's assistant content part {"type": "refusal"}: the template reads its refusal as the turn's text."""
    words = random.choice(["I can't help with that.", "No.", "That is not something I do."])

    def tokens(content):
        body = {"model": MODEL, "messages": QUESTION + [{"role": "assistant", "content": content},
                                                        {"role": "user", "content": "Why?"}]}
        return httpx.post(server.url + "/tokenize", json=body, headers=server.headers, timeout=30)

    assert tokens([{"type": "refusal", "refusal": words}]).json()["tokens"] == tokens(words).json()["tokens"]
    r = tokens([{"type": "refusal", "refusal": 5}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.1.content", r.text


def test_logprob_bytes_are_each_tokens_own(client):
    """OpenAI's bytes: a token holding part of a character carries its own bytes, so that a reply's tokens' bytes
    join into the reply's UTF-8, emoji and all; its text is what it adds to the tokens before it (vLLM's): ""
    where it only begins a character, the character where it completes one, so the texts join into the reply."""
    word = random.choice(["🎉", "🙂 ok", "naïve ☃", "日本"])
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=0, logprobs=True,
                                       top_logprobs=2, extra_body={"structured_outputs": {"choice": [word]}})
    content = r.choices[0].logprobs.content
    assert r.choices[0].message.content == word and any(t.token == "" for t in content)
    assert "".join(t.token for t in content) == word
    assert bytes(b for t in content for b in t.bytes) == word.encode("utf-8")
    assert all(isinstance(top.bytes, list) for t in content for top in t.top_logprobs)
    # streamed, a token that only begins a character comes in a chunk of its own, content "" (as vLLM's)
    chunks = [c.choices[0] for c in client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=16, temperature=0, logprobs=True, stream=True,
        extra_body={"structured_outputs": {"choice": [word]}}) if c.choices]
    carrying = [c for c in chunks if c.logprobs and c.logprobs.content]
    assert [t.token for c in carrying for t in c.logprobs.content] == [t.token for t in content]
    assert all(c.delta.content is not None for c in carrying)
    r = client.completions.create(model=MODEL, prompt="Say it:", max_tokens=16, temperature=0, logprobs=1,
                                  extra_body={"structured_outputs": {"choice": [word]}})
    logprobs = r.choices[0].logprobs
    assert r.choices[0].text == word and "".join(logprobs.tokens) == word
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]


def test_ping_and_version_answer_without_a_key(server):
    for method in ("GET", "POST"):
        assert httpx.request(method, server.url + "/ping", timeout=10).json() == {"status": "ok"}
    version = httpx.get(server.url + "/version", timeout=10).json()["version"]
    assert version and version[0].isdigit()


def test_invocations_routes_by_the_body_and_load_counts_the_engines_requests(server):
    """SageMaker's /invocations answers as the route its body belongs to; /load, open as /metrics, says how
    many requests the engine holds (none once they are done)."""
    tokens = random.randint(1, 8)
    chat = {"model": MODEL, "messages": QUESTION, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    completion = {"model": MODEL, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    for body, route, kind in ((chat, "/v1/chat/completions", "chat.completion"),
                              (completion, "/v1/completions", "text_completion")):
        # each under a salt of its own: both run cold, the same path to the same bytes
        via = httpx.post(server.url + "/invocations", json={**body, "cache_salt": f"s{random.random()}"},
                         headers=server.headers, timeout=120).json()
        direct = httpx.post(server.url + route, json={**body, "cache_salt": f"s{random.random()}"},
                            headers=server.headers, timeout=120).json()
        assert via["object"] == direct["object"] == kind and via["usage"]["completion_tokens"] == tokens
        assert via["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
        assert via["choices"][0].get("message", via["choices"][0].get("text")) == \
            direct["choices"][0].get("message", direct["choices"][0].get("text"))
    r = httpx.post(server.url + "/invocations", json={"model": MODEL}, headers=server.headers, timeout=30)
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    assert httpx.post(server.url + "/invocations", json=chat, timeout=30).status_code == 401  # the key guards it
    long = {**completion, "max_tokens": 900, "stream": True}
    with httpx.stream("POST", server.base_url + "/completions", json=long, headers=server.headers, timeout=120) as r:
        loads = []  # after each chunk, until one counts it: a starved client may read a chunk late
        for line in r.iter_lines():
            if line.startswith("data: {"):
                loads.append(httpx.get(server.url + "/load", timeout=10).json()["server_load"])
                if loads[-1] or json.loads(line[6:])["choices"][0]["finish_reason"] is not None:
                    break
        assert loads and loads[-1] >= 1, loads  # the request is in the engine while it streams
    deadline = time.monotonic() + 30  # closed: the engine aborts it
    while httpx.get(server.url + "/load", timeout=10).json()["server_load"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(server.url + "/load", timeout=10).json() == {"server_load": 0}


def test_cache_salt_keeps_each_salts_prefix_cache_to_itself(server):
    words = " ".join(random.choice(["red", "green", "blue", "river", "stone", "cloud"]) for _ in range(80))
    salts = [f"tenant-{random.randrange(10**9)}" for _ in range(2)]

    def cached(route: str, body: dict, salt: str) -> int:
        r = httpx.post(server.base_url + route, json={**body, "cache_salt": salt}, headers=server.headers, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    for route, body in (("/completions", {"model": MODEL, "prompt": words, "max_tokens": 1}),
                        ("/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": words}],
                                               "max_tokens": 1})):
        assert cached(route, body, salts[0]) == 0  # a prompt the server has not seen under this salt
        assert cached(route, body, salts[1]) == 0  # nor under another, though it has just seen the tokens
        assert cached(route, body, salts[0]) > 0
    r = httpx.post(server.base_url + "/completions", json={"model": MODEL, "prompt": "a", "cache_salt": ""},
                   headers=server.headers, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_completions_echo_without_tokens_scores_the_prompt_alone(client, server):
    """echo with max_tokens 0: the prompt and its logprobs, as with tokens after it, and nothing generated."""
    ids = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": PROMPT}, headers=server.headers,
                     timeout=30).json()["tokens"]
    scored = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1)
    longer = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0, echo=True, logprobs=1)
    choice = scored.choices[0]
    assert choice.finish_reason == "length" and scored.usage.completion_tokens == 0
    assert scored.usage.prompt_tokens == len(ids) == len(choice.logprobs.tokens)
    assert choice.text == "".join(choice.logprobs.tokens) == longer.choices[0].text[: len(choice.text)]
    assert choice.logprobs.token_logprobs == longer.choices[0].logprobs.token_logprobs[: len(ids)]
    streamed = list(client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "length"
    assert [t for c in streamed if c.choices and c.choices[0].logprobs
            for t in c.choices[0].logprobs.token_logprobs] == choice.logprobs.token_logprobs


def test_completions_echo_with_logprobs_scores_the_prompt(client, server):
    ids = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": PROMPT}, headers=server.headers,
                     timeout=30).json()["tokens"]
    first = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0, logprobs=2)
    next_token = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": first.choices[0].text,
                                                            "add_special_tokens": False},
                            headers=server.headers, timeout=30).json()["tokens"]
    echoed = client.completions.create(model=MODEL, prompt=ids + next_token[:1], max_tokens=2, temperature=0,
                                       logprobs=2, echo=True)
    lp = echoed.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1 + 2
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    if next_token[:1] and len(next_token) == 1:  # the generated text is exactly one token: same score both ways
        assert abs(lp.token_logprobs[len(ids)] - first.choices[0].logprobs.token_logprobs[0]) < 1e-3
    streamed = client.completions.create(model=MODEL, prompt=ids + next_token[:1], max_tokens=2, temperature=0,
                                         logprobs=2, echo=True, stream=True)
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == lp.tokens
    # one run of text offsets over the prompt's tokens and the output's, as vLLM's whole reply gives
    text = random.choice(["Café ☕ and naïve 日本語", "🙂 ok", PROMPT])
    lp = client.completions.create(model=MODEL, prompt=text, max_tokens=3, logprobs=0, echo=True).choices[0].logprobs
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))], lp


def test_repetition_detection_ends_a_looping_reply(server):
    """A logit bias makes one token certain: the reply is that token, ended at min_count of it with vLLM's
    finish_reason "repetition", whole and streamed, and counted among the finished requests by that reason."""
    count = random.randint(2, 5)
    token = random.randrange(100, 1000)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 30, "logit_bias": {str(token): 100},
            "repetition_detection": {"max_pattern_size": 2, "min_count": count}}
    headers = {"Authorization": f"Bearer {API_KEY}"}

    def finished() -> float:
        return server.labelled_metrics().get(("vllm:request_success_total", frozenset(
            {("model_name", MODEL), ("engine", "0"), ("finished_reason", "repetition")})), 0.0)

    before = finished()
    whole = httpx.post(server.base_url + "/completions", json=body, headers=headers, timeout=60).json()
    choice = whole["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("repetition", "repetition_detected")
    assert whole["usage"]["completion_tokens"] == count
    chunks = []
    with httpx.stream("POST", server.base_url + "/completions", json={**body, "stream": True}, headers=headers,
                      timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == choice["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "repetition"
    assert finished() == before + 2


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": MODEL, **body}, headers=server.headers, timeout=120)


def _sse(response: httpx.Response) -> list[dict]:
    return [json.loads(line[5:]) for line in response.text.splitlines()
            if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def test_truncation_side_right_keeps_the_first_tokens(server):
    ids = _post(server, "/tokenize", {"prompt": "One two three four five six seven eight"}).json()["tokens"]
    keep = random.randint(2, len(ids) - 2)
    for side, kept in (("right", ids[:keep]), ("left", ids[-keep:]), (None, ids[-keep:])):
        body = {"prompt": ids, "max_tokens": 1, "truncate_prompt_tokens": keep, "return_token_ids": True}
        choice = _post(server, "/v1/completions", {**body, "truncation_side": side}).json()["choices"][0]
        assert choice["prompt_token_ids"] == kept, side
    chat = {"messages": [{"role": "user", "content": "One two three four five six seven"}], "max_tokens": 1,
            "return_token_ids": True}
    whole = _post(server, "/v1/chat/completions", chat).json()["prompt_token_ids"]
    right = _post(server, "/v1/chat/completions", {**chat, "truncate_prompt_tokens": keep,
                                                   "truncation_side": "right"}).json()["prompt_token_ids"]
    assert right == whole[:keep]


def test_add_special_tokens_is_honoured(server):
    text = "Hello there"
    for add in (True, False):
        want = _post(server, "/tokenize", {"prompt": text, "add_special_tokens": add}).json()["tokens"]
        got = _post(server, "/v1/completions", {"prompt": text, "max_tokens": 1, "add_special_tokens": add,
                                                "return_token_ids": True}).json()["choices"][0]
        assert got["prompt_token_ids"] == want, add
    messages = [{"role": "user", "content": text}]
    for add in (True, False):
        want = _post(server, "/tokenize", {"messages": messages, "add_special_tokens": add}).json()["tokens"]
        got = _post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1, "add_special_tokens": add,
                                                     "return_token_ids": True}).json()
        assert got["prompt_token_ids"] == want, add


def test_return_token_ids_whole_and_streamed(server):
    """vLLM's placement: a completion's choices carry prompt_token_ids and token_ids; a chat reply its
    prompt_token_ids, each choice token_ids; streamed, the prompt's ids come once and the new ids with each chunk."""
    base = {"max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True, "n": 2}
    whole = _post(server, "/v1/completions", {**base, "prompt": ["Hi", "The sky"]}).json()
    assert len(whole["choices"]) == 4
    for choice in whole["choices"]:
        assert len(choice["token_ids"]) == 6 and choice["prompt_token_ids"]
    streamed = _sse(_post(server, "/v1/completions", {**base, "prompt": "The sky", "stream": True}))
    for i in range(2):
        chunks = [c["choices"][0] for c in streamed if c["choices"] and c["choices"][0]["index"] == i]
        assert sum("prompt_token_ids" in c for c in chunks) == 1
        assert len([t for c in chunks for t in c["token_ids"]]) == 6
    chat = {**base, "messages": [{"role": "user", "content": "Hi"}]}
    reply = _post(server, "/v1/chat/completions", chat).json()
    assert reply["prompt_token_ids"] and all(len(c["token_ids"]) == 6 for c in reply["choices"])
    chunks = _sse(_post(server, "/v1/chat/completions", {**chat, "stream": True}))
    assert chunks[0]["prompt_token_ids"] == reply["prompt_token_ids"]
    for i in range(2):
        ids = [t for c in chunks for ch in c["choices"] if ch["index"] == i for t in ch.get("token_ids", [])]
        assert ids == reply["choices"][i]["token_ids"]
    plain = _post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}).json()
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain["choices"][0]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field, value", [("priority", random.choice([-3, 1, 7])), ("prompt_embeds", "AAAA")])
def test_unhonoured_vllm_fields_are_refused_by_name(server, path, field, value):
    body = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]}
    refused = _post(server, path, {**body, "max_tokens": 1, field: value})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == field
    if field == "priority":
        assert _post(server, path, {**body, "max_tokens": 1, "priority": 0}).status_code == 200
