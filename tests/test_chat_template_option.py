"""--chat-template: a template of the user's (a file, or written inline) in place of the checkpoint's."""

import random

import pytest

from deltaserve import LLM, SamplingParams
from deltaserve.cli import _build_parser
from deltaserve.errors import WeightLoadError
from deltaserve.server.launcher import engine_kwargs

TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.mark.parametrize("as_file", [False, True])
def test_the_given_template_renders_every_chat(checkpoint_factory, tmp_path, as_file):
    if as_file:
        (tmp_path / "template.jinja").write_text(TEMPLATE)
    option = str(tmp_path / "template.jinja") if as_file else TEMPLATE
    llm = LLM(checkpoint_factory("llama"), device="cpu", chat_template=option)
    word = f"w{random.randrange(10**6)}"
    messages = [{"role": "user", "content": word}]
    assert llm.get_tokenizer().apply_chat_template(messages) == f"[user] {word}\n[assistant]"
    out = llm.chat(messages, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))[0]
    assert out.prompt_token_ids == llm.get_tokenizer().encode(f"[user] {word}\n[assistant]", add_special_tokens=False)


def test_a_missing_file_or_a_broken_template_is_named(checkpoint_factory, tmp_path):
    with pytest.raises(WeightLoadError, match="no such file"):
        LLM(checkpoint_factory("llama"), device="cpu", chat_template=str(tmp_path / "missing.jinja"))
    with pytest.raises(WeightLoadError, match="does not parse"):
        LLM(checkpoint_factory("llama"), device="cpu", chat_template="{% for m in messages %}")
    latin1 = tmp_path / "latin1.jinja"
    latin1.write_bytes("{{ messages[0].content }} café".encode("latin-1"))
    with pytest.raises(WeightLoadError, match="latin1.jinja: not UTF-8 text"):
        LLM(checkpoint_factory("llama"), device="cpu", chat_template=str(latin1))


def test_the_serve_option_reaches_the_engine():
    args = _build_parser().parse_args(["serve", "--chat-template", "t.jinja"])
    assert engine_kwargs(args)["chat_template"] == "t.jinja"
