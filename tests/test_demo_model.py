"""The built-in demo model against transformers' own model loaded from the same GGUF file."""

import pytest

from deltaserve import SamplingParams
from tests.reference import hf_greedy

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name three primary colors."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]


def test_demo_model_answers_paris(demo_llm):
    out = demo_llm.chat(CHATS[0], SamplingParams(max_tokens=32, temperature=0))[0].outputs[0]
    assert "Paris" in out.text


def test_demo_model_greedy_equals_transformers_from_same_gguf(demo_llm, demo_reference):
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    outputs = demo_llm.chat(CHATS, params)
    tok = demo_llm.get_tokenizer()
    for chat, output in zip(CHATS, outputs):
        prompt = tok.encode(tok.apply_chat_template(chat), add_special_tokens=False)
        assert output.prompt_token_ids == prompt
        tokens, _ = hf_greedy(demo_reference, prompt, 32)
        assert output.outputs[0].token_ids == tokens


def test_chat_takes_openais_message_shapes(demo_llm):
    """As vLLM's LLM.chat: a list of text parts is their text joined by newlines (the demo template reads text),
    content None is "" (a turn of tool calls only), and a part or template variable that cannot be is named."""
    import random

    from deltaserve import InvalidPromptError, SamplingParams

    greedy = SamplingParams(max_tokens=6, temperature=0)
    words = random.choice(["What is the capital of France?", "Name a colour.", "Count to three."])
    cut = random.randrange(1, len(words))
    plain = demo_llm.chat([{"role": "user", "content": words[:cut] + "\n" + words[cut:]}], greedy,
                          use_tqdm=False)[0]
    parts = [{"type": "text", "text": words[:cut]}, {"type": "text", "text": words[cut:]}]
    assert demo_llm.chat([{"role": "user", "content": parts}], greedy, use_tqdm=False)[0].outputs[0].token_ids == \
        plain.outputs[0].token_ids
    turns = [{"role": "user", "content": words}, {"role": "assistant", "content": None},
             {"role": "user", "content": "Again."}]
    empty = [dict(turn, content=turn["content"] or "") for turn in turns]
    assert demo_llm.chat(turns, greedy, use_tqdm=False)[0].prompt_token_ids == \
        demo_llm.chat(empty, greedy, use_tqdm=False)[0].prompt_token_ids
    for bad, named in (([{"type": "image_url", "image_url": {"url": "x"}}], "text parts only"), (5, "got int")):
        with pytest.raises(InvalidPromptError, match=named):
            demo_llm.chat([{"role": "user", "content": bad}], greedy, use_tqdm=False)
    for kwargs in (["x"], {1: 2}, {"messages": []}, {"tokenize": True}):
        with pytest.raises(InvalidPromptError, match="chat_template_kwargs"):
            demo_llm.chat([{"role": "user", "content": words}], greedy, use_tqdm=False, chat_template_kwargs=kwargs)
    assert not demo_llm.engine.stats().num_running
