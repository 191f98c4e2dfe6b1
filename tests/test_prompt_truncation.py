"""truncate_prompt_tokens on a text prompt encoded with the tokenizer's special tokens: without a side, the
tokenizer's own truncation is the reference (vLLM hands it max_length): the special tokens stay and the text
loses its first tokens; with a side, the encoded prompt's tokens are cut as they are."""

import random

import pytest
from tokenizers import processors
from transformers import AutoTokenizer

from deltaserve.server.sampling import truncated_tokens
from tests.checkpoints import write_tokenizer

TEXT = "The capital of France is Paris. The quick brown fox jumps over the lazy dog."


@pytest.mark.parametrize("template", ["<|endoftext|> $A", "<|endoftext|> $A <|im_end|>"])
def test_the_tokenizers_special_tokens_stay(tmp_path, template):
    write_tokenizer(str(tmp_path))
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[("<|endoftext|>", tok.convert_tokens_to_ids("<|endoftext|>")),
                                         ("<|im_end|>", tok.convert_tokens_to_ids("<|im_end|>"))])
    tok.truncation_side = "left"  # vLLM's default for generation
    ids, text_ids = tok.encode(TEXT), tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) > len(text_ids)  # the template added them
    keep = random.randint(len(ids) - len(text_ids) + 1, len(ids) - 1)
    reference = tok(TEXT, truncation=True, max_length=keep)["input_ids"]
    assert truncated_tokens(ids, keep, None, text_ids) == reference
    assert truncated_tokens(ids, keep, "left", text_ids) == ids[-keep:]  # a side named: cut as they are
    assert truncated_tokens(ids, keep, "right", text_ids) == ids[:keep]
    assert truncated_tokens(ids, len(ids), None, text_ids) == ids
