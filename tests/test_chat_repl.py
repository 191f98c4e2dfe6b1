"""`deltaserve chat`'s session: its replies sample as a server's request that leaves the fields out (the generation
config's values under the flags given, its max_new_tokens a cap), and the template takes a message's content in
the form it reads (a template that loops over content parts gets parts), as LLM.chat and the server give it."""

import argparse
import io
import random

import pytest

from deltaserve.chat_repl import ChatSession, reply_params
from deltaserve.engine.llm_engine import LLMEngine

# reads each message's content as a list of parts only: a plain string renders as nothing
PARTS_TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {% for p in m['content'] %}{{ p['text'] }}{% endfor %};"
                  "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.fixture(scope="module")
def cap():
    return random.randint(2, 6)


@pytest.fixture(scope="module")
def engine(checkpoint_factory, cap):
    return LLMEngine.from_args(checkpoint_factory("llama"), device="cpu", chat_template=PARTS_TEMPLATE,
                               override_generation_config={"max_new_tokens": cap, "temperature": 0.0, "top_p": 0.5},
                               max_model_len=256)


def _sent(engine, session: ChatSession, text: str) -> tuple[str, object]:
    """The prompt text and the sampling params of the request a reply sends."""
    seen = []
    add_request = engine.add_request
    engine.add_request = lambda *a, **kw: (seen.append((kw["prompt_text"], a[2])), add_request(*a, **kw))[1]
    try:
        session.reply(text)
    finally:
        del engine.add_request
    return seen[0]


def test_a_reply_samples_as_the_generation_config_says_under_the_flags_given(engine, cap):
    unset = argparse.Namespace(max_tokens=None, temperature=None, top_p=None)
    prompt, params = _sent(engine, ChatSession(engine, reply_params(engine, unset), out=io.StringIO()), "hello")
    assert (params.temperature, params.top_p, params.max_tokens) == (0.0, 0.5, cap)
    temperature = random.uniform(0.1, 1.5)
    given = argparse.Namespace(max_tokens=cap + random.randint(1, 50), temperature=temperature, top_p=None)
    _, params = _sent(engine, ChatSession(engine, reply_params(engine, given), out=io.StringIO()), "hello")
    # the override's max_new_tokens caps what a flag asks, as it caps a served request
    assert (params.temperature, params.top_p, params.max_tokens) == (temperature, 0.5, cap)


def test_a_template_that_reads_content_parts_gets_the_users_text(engine):
    session = ChatSession(engine, reply_params(engine, argparse.Namespace()), system="be brief", out=io.StringIO())
    words = [f"w{random.randrange(10**6)}" for _ in range(2)]
    prompt, _ = _sent(engine, session, words[0])
    assert prompt == f"[system] be brief;[user] {words[0]};[assistant]"
    answer = session.messages[-1]["content"]
    prompt, _ = _sent(engine, session, words[1])
    assert prompt == f"[system] be brief;[user] {words[0]};[assistant] {answer};[user] {words[1]};[assistant]"
