"""The built-in demo model against transformers' own model loaded from the same GGUF file."""

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
