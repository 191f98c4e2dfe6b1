"""How a chat template is given a message's content: read from the template as vLLM reads it ("openai" where it
loops over a message's content, "string" otherwise), or named; the parts' texts joined by newlines for a
"string" template, as text parts for an "openai" one, a tool message's as text either way."""

import random

import pytest

from deltaserve import SamplingParams
from deltaserve.chat_content_format import detect_content_format, messages_for_template, resolve_content_format
from tests.checkpoints import CHATML

LOOPS_OVER_CONTENT = [
    "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}",
    "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}",
    # through a variable set from the messages, a slice of them and a filter over the content
    "{% set rest = messages[1:] %}{% for m in rest %}{% for p in m.content | list %}{{ p }}{% endfor %}{% endfor %}",
    "{% set ms = messages %}{% set again = ms %}{% for m in again %}{% for p in m.content %}x{% endfor %}{% endfor %}",
    # a macro's argument named content (Qwen3.5's render_content)
    "{% macro render(content) %}{% for item in content %}{{ item.text }}{% endfor %}{% endmacro %}"
    "{% for m in messages %}{{ render(m.content) }}{% endfor %}",
    # transformers' generation tag and loop controls parse
    "{% for m in messages %}{% generation %}{% for p in m.content %}{% break %}{% endfor %}{% endgeneration %}"
    "{% endfor %}",
]
READS_CONTENT_AS_TEXT = [
    CHATML,
    "{% for m in messages %}{{ m.content | trim }}{% endfor %}",
    "{% for m in messages %}{% for t in tools %}{{ t }}{% endfor %}{{ m.content }}{% endfor %}",
    "{% for m in messages %}{% for c in m.content_list %}{{ c }}{% endfor %}{% endfor %}",  # another key
    "{% for a, b in messages %}{% for p in a.content %}{% endfor %}{% endfor %}",  # two names: not read
    "{% for m in messages %",  # does not parse
]


@pytest.mark.parametrize("template", LOOPS_OVER_CONTENT)
def test_a_template_that_loops_over_content_reads_parts(template):
    assert detect_content_format(template) == "openai"


@pytest.mark.parametrize("template", READS_CONTENT_AS_TEXT)
def test_any_other_template_reads_text(template):
    assert detect_content_format(template) == "string"


def test_messages_take_the_form_their_template_reads():
    texts = [random.choice(["Name a", "colour", "", "two\nlines"]) for _ in range(random.randint(1, 4))]
    parts = [{"type": "text", "text": t} for t in texts]
    messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": None},
                {"role": "tool", "content": parts, "tool_call_id": "c"}, {"role": "user", "content": "plain"}]
    as_text = messages_for_template(messages, "string")
    assert [m["content"] for m in as_text] == ["\n".join(texts), "", "\n".join(texts), "plain"]
    as_parts = messages_for_template(messages, "openai")
    assert [m["content"] for m in as_parts] == [parts, [], "\n".join(texts), [{"type": "text", "text": "plain"}]]
    assert as_parts[2]["tool_call_id"] == "c" and messages[0]["content"] == parts  # the caller's list untouched
    assert resolve_content_format("string", LOOPS_OVER_CONTENT[0]) == "string"
    with pytest.raises(ValueError, match="'parts'"):
        resolve_content_format("parts", CHATML)


def test_llm_chat_gives_each_template_its_form(demo_llm):
    words = [random.choice(["alpha", "beta", "gamma"]) for _ in range(3)]
    conversation = [{"role": "user", "content": [{"type": "text", "text": w} for w in words]}]
    one = SamplingParams(max_tokens=1)

    def prompt(template: str, given: str = "auto") -> str:
        return demo_llm.chat(conversation, one, use_tqdm=False, chat_template=template,
                             chat_template_content_format=given)[0].prompt

    assert prompt("{% for m in messages %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endfor %}") == \
        "".join(f"[{w}]" for w in words)
    assert prompt("{% for m in messages %}<{{ m.content }}>{% endfor %}") == "<" + "\n".join(words) + ">"
    assert prompt("{% for m in messages %}<{{ m.content[0].text }}>{% endfor %}", "openai") == f"<{words[0]}>"
