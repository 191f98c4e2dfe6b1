"""A logprob's token text against the text of the whole sequence (the demo tokenizer, byte-level BPE): each
token's text is what it adds to the tokens before it, so the texts of a sequence's tokens join into its text, a
character split over tokens shown whole on the token that completes it."""

import os
import random

import pytest

from deltaserve.engine.logprob_text import logprob_token_text
from deltaserve.models.gguf_loader import demo_model_path
from deltaserve.tokenizer import Tokenizer

PIECES = ["Hello", " world", " 日本語", " 🙂", "🎉", " naïve", " ☃", "ß", "\n", " 12", "😀😃", " Ω"]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_gguf(demo_model_path())


def test_the_texts_of_a_sequences_tokens_join_into_its_text(tokenizer):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    split = 0
    for _ in range(40):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12)))
        ids = tokenizer.encode(text, add_special_tokens=False)
        texts = [logprob_token_text(decode, t, ids[:i]) for i, t in enumerate(ids)]
        assert "".join(texts) == decode(ids) == text, (seed, text)
        assert all("\ufffd" not in t for t in texts), (seed, text)
        split += sum(t == "" != decode([i]) for t, i in zip(texts, ids))  # tokens that only begin a character
        # a token read alone, or after tokens that end whole, is its own decode
        whole = [i for i in ids if "\ufffd" not in decode([i])]
        assert all(logprob_token_text(decode, i, []) == decode([i]) for i in whole)
    assert split, seed  # the pieces' emoji and CJK do split
