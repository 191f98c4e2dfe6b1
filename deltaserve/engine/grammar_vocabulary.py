"""llguidance's view of a vocabulary (its LLTokenizer), with text that spells an added token tokenized as text.

llguidance.hf marks every added token of a tokenizer as special: a Lark grammar names `<think>` or
`<|im_end|>` as a token, and a grammar's text is written by ordinary tokens. Yet where a grammar forces some
text, llguidance tokenizes the forced bytes with the tokenizer, which reads the text of an added token as that
token: the mask then allowed only the added token, and the matcher refused it, so a regex or a Lark string
that spelled `<tool_call>` (one of Qwen's added tokens) or `<|im_start|>` failed its request there. Here the
tokenizer that llguidance calls reads no added token in text, so a grammar's text is written in tokens its
matcher takes; each id's bytes and mark stay llguidance's own, and so does every other tokenization.
"""

from __future__ import annotations

import json
from collections.abc import Sequence


def ll_tokenizer(hf_tokenizer, n_vocab: int, eos_token_ids: Sequence[int]):
    """The LLTokenizer of `hf_tokenizer` (a fast tokenizer) over the logits' `n_vocab` ids."""
    import llguidance
    import llguidance.hf

    marked = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=n_vocab, eos_token=list(eos_token_ids))
    vocabulary = _Vocabulary(marked, text_encoder(hf_tokenizer), eos_token_ids)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocabulary), n_vocab=n_vocab,
                                  eos_token=list(eos_token_ids))


def text_encoder(hf_tokenizer):
    """A copy of the tokenizer (a `tokenizers.Tokenizer`) that matches no added token in text: a special
    token's text is split as any text is, and the other added tokens are left out."""
    import tokenizers

    spec = json.loads(hf_tokenizer.backend_tokenizer.to_str())
    spec["added_tokens"] = [token for token in spec.get("added_tokens", []) if token.get("special")]
    encoder = tokenizers.Tokenizer.from_str(json.dumps(spec))
    encoder.encode_special_tokens = True
    encoder.no_padding()
    encoder.no_truncation()
    return encoder


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads of a tokenizer: each id's bytes and the special ids, both as
    llguidance's own LLTokenizer (`marked`) has them, and the encoder it calls on text (as llguidance.hf calls
    the tokenizer's: no special tokens added around it)."""

    bos_token_id = None

    def __init__(self, marked, encoder, eos_token_ids: Sequence[int]):
        self._encoder = encoder
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else marked.eos_token
        self.tokens = [marked.decode_bytes([i]) for i in range(marked.vocab_size)]
        self.special_token_ids = [i for i in range(marked.vocab_size) if marked.is_special_token(i)]

    def __call__(self, text: bytes) -> list[int]:
        # llguidance passes whole UTF-8 characters here and takes any bytes after them itself
        return self._encoder.encode(text.decode("utf-8"), add_special_tokens=False).ids
