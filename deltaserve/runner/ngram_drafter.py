"""NgramDrafter: drafts by prompt lookup (vLLM's speculative method "ngram"), no model at all.

After each step, a drafting sequence's tokens so far (its prompt, its output, the drafts its step kept and the
token it sampled) end in an n-gram; where the same n-gram stands earlier in them, the tokens that followed it
there are the drafts. The longest n from prompt_lookup_max down to prompt_lookup_min that matches is taken, at its
earliest place (as vLLM takes it), and up to k tokens after it. Text that repeats what came before (code edited
in place, a quoted document, a list that follows a pattern) drafts well; elsewhere nothing matches and the
sequence decodes a token a step. The verifier keeps what the target model would have given either way.
"""

from __future__ import annotations

import numpy as np

from deltaserve.runner.mtp_drafter import DraftRequest, useful_drafts


class NgramDrafter:
    graphs = None  # nothing to replay: the drafts are read off the tokens on the host

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, hidden, rows: list[DraftRequest], verify_rung: int | None = None) -> dict:
        """{request: drafts} for the sequences that draft and whose tokens end in an n-gram seen before (the
        target's hidden states and the verify rung are the MTP head's; prompt lookup reads neither)."""
        drafts = {}
        for row in rows:
            wanted = useful_drafts(row, self.num_speculative_tokens)
            if not wanted:
                continue
            found = lookup(_tokens_so_far(row), self.prompt_lookup_min, self.prompt_lookup_max, wanted)
            if found:
                drafts[row.chunk.request] = found
        return drafts


def _tokens_so_far(row: DraftRequest) -> np.ndarray:
    """The sequence's tokens through the one its step sampled: the verify chunk's kept drafts are not in its
    output yet (the engine takes them after the step)."""
    request = row.chunk.request
    past = request.prompt_token_ids + request.output_token_ids
    return np.asarray(past[: row.chunk.start + 1] + list(row.chunk.draft_token_ids) + [row.next_token]
                      if row.chunk.draft_token_ids else past[: row.chunk.end] + [row.next_token], dtype=np.int64)


def lookup(tokens: np.ndarray, shortest: int, longest: int, count: int) -> list[int]:
    """Up to `count` tokens after the earliest earlier occurrence of the longest suffix of `tokens` of
    `shortest`..`longest` tokens that occurs earlier; [] where none does."""
    total = tokens.shape[0]
    for n in range(min(longest, total - 1), shortest - 1, -1):
        # windows starting at 0 .. total - n - 1: each is followed by at least one token
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tokens[total - n:]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return tokens[start : start + count].tolist()
    return []
