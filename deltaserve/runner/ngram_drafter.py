"""NgramDrafter: drafts by prompt lookup (vLLM's speculative method "ngram"), no model at all.

After each step, a drafting sequence's tokens so far (its prompt, its output, the drafts its step kept and the
token it sampled) end in an n-gram; where the same n-gram stands earlier in them, the tokens that followed it
there are the drafts. The longest n from prompt_lookup_max down to prompt_lookup_min that matches is taken, at its
earliest place (as vLLM takes it), and up to k tokens after it. Text that repeats what came before (code edited
in place, a quoted document, a list that follows a pattern) drafts well; elsewhere nothing matches and the
sequence decodes a token a step. The verifier keeps what the target model would have given either way.
"""

from __future__ import annotations

import weakref
from array import array

import numpy as np

from deltaserve.runner.mtp_drafter import DraftRequest, useful_drafts


class NgramDrafter:
    graphs = None  # nothing to replay: the drafts are read off the tokens on the host
    reads_hidden = False  # so a step without drafts to verify runs as a plain engine's (SpeculativeStep)

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max
        # request -> its tokens (prompt, then output) known so far, grown by the new ones each step: listing a long
        # sequence's tokens again every step would cost the host as much as the lookup itself
        self._known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def propose(self, hidden, rows: list[DraftRequest], verify_rung: int | None = None) -> dict:
        """{request: drafts} for the sequences that draft and whose tokens end in an n-gram seen before (the
        target's hidden states and the verify rung are the MTP head's; prompt lookup reads neither)."""
        drafts = {}
        for row in rows:
            wanted = useful_drafts(row, self.num_speculative_tokens)
            if not wanted:
                continue
            found = lookup(self._tokens_so_far(row), self.prompt_lookup_min, self.prompt_lookup_max, wanted)
            if found:
                drafts[row.chunk.request] = found
        return drafts

    def _tokens_so_far(self, row: DraftRequest) -> np.ndarray:
        """The sequence's tokens through the one its step sampled: the verify chunk's kept drafts are not in its
        output yet (the engine takes them after the step)."""
        chunk = row.chunk
        own = chunk.start + 1 if chunk.draft_token_ids else chunk.end  # the request's own tokens the step read
        after = np.asarray([*chunk.draft_token_ids, row.next_token], dtype=np.int64)
        return np.concatenate([self._own_tokens(chunk.request, own), after])

    def _own_tokens(self, request, count: int) -> np.ndarray:
        """The request's first `count` tokens, from the array kept for it (made again if its output shrank)."""
        known = self._known.get(request)
        if known is None or len(known) > request.num_tokens:
            known = self._known[request] = array("q")
        if len(known) < count:
            prompt = request.prompt_token_ids
            start = len(known)
            known.extend(prompt[start:count])
            known.extend(request.output_token_ids[max(0, start - len(prompt)) : count - len(prompt)])
        return np.frombuffer(known, dtype=np.int64, count=count)  # a view: the caller copies it out at once


def lookup(tokens: np.ndarray, shortest: int, longest: int, count: int) -> list[int]:
    """Up to `count` tokens after the earliest earlier occurrence of the longest suffix of `tokens` of
    `shortest`..`longest` tokens that occurs earlier; [] where none does. The places where the last token stood
    before end every candidate; each is followed back one token at a time while it still matches."""
    total = tokens.shape[0]
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # each followed by at least one token
    if not ends.size:
        return []
    matched = np.ones(ends.size, dtype=np.int64)  # how many of the suffix's last tokens end at each candidate
    for back in range(1, longest):
        at = ends - back
        going = (matched == back) & (at >= 0)
        going[going] = tokens[at[going]] == tokens[total - 1 - back]
        if not going.any():
            break
        matched[going] += 1
    best = min(int(matched.max()), longest)
    if best < shortest:
        return []
    start = int(ends[np.flatnonzero(matched >= best)[0]]) + 1  # the earliest: ends ascend
    return tokens[start : start + count].tolist()
