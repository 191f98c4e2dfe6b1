"""The text a logprob shows for a token: its own decode, or, where that ends in a broken character (a token that
holds some of a character's bytes), what it adds to the tokens before it in its sequence, as vLLM corrects it:
the whole character on the token that completes it, "" on a token that only begins it. The texts of a sequence's
tokens then join to its text, and a completions reply's text offsets stay within it."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from deltaserve.engine.detokenizer import REPLACEMENT

MAX_CONTEXT = 4  # a UTF-8 character is at most four bytes: four tokens before it hold all of its start


def logprob_token_text(decode: Callable[[list[int]], str], token_id: int, before: Sequence[int]) -> str:
    """`token_id`'s text where the tokens `before` it (oldest first; the last few are read) come first."""
    text = decode([token_id])
    if not text.endswith(REPLACEMENT):
        return text
    for n in range(1, min(len(before), MAX_CONTEXT) + 1):
        context = list(before[-n:])
        joined = decode(context + [token_id])
        if joined.endswith(REPLACEMENT):
            continue  # still a broken character: it began further back
        # the context's last tokens that break a character alone showed "": their bytes are this token's text
        clean = len(context)
        while clean > 0 and decode([context[clean - 1]]).endswith(REPLACEMENT):
            clean -= 1
        prefix = decode(context[:clean]) if clean else ""
        return joined[len(os.path.commonprefix([prefix, joined])):]
    return ""  # a character not complete here: its text comes with the token that completes it
