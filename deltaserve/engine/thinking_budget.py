"""ThinkingBudget: ends a reasoning model's think block after a set number of its tokens (vLLM's
thinking_token_budget).

A think block opens with the start tokens (`<think>`) and closes with the end tokens (`</think>`). Its
tokens are counted from the last opening, in the prompt (a template that opens the block for the model) or
in the output; once the block holds `budget` tokens, the end tokens are forced one by one, so that the
reply goes on after them. A block the model closes itself is not touched, and a later block is counted
afresh. Plain Python: the engine feeds it every output token and the sampler asks it for the forced one.
"""

from __future__ import annotations

import copy


class ThinkingBudget:
    def __init__(self, budget: int, start_ids: list[int], end_ids: list[int], prompt_ids: list[int]):
        if not start_ids or not end_ids:
            raise ValueError("a think block needs start and end tokens")
        self.budget = budget
        self.start_ids, self.end_ids = list(start_ids), list(end_ids)
        self._recent: list[int] = []  # the last tokens seen, as many as the longer tag
        self._keep = max(len(start_ids), len(end_ids))
        self.in_block = False
        self.count = 0  # tokens in the open block so far (those of a partial end tag included)
        self.forcing = 0  # how many of the end tokens are already forced; 0 while none is
        for token in prompt_ids[-self._prompt_tail(prompt_ids):]:
            self._see(token)

    def _prompt_tail(self, prompt_ids: list[int]) -> int:
        """How many of the prompt's last tokens decide its state: from its last start tag on (its whole length
        where it opens none), at most the whole prompt."""
        start = _last_index(prompt_ids, self.start_ids)
        return len(prompt_ids) - start if start >= 0 else min(len(prompt_ids), self._keep)

    @property
    def forced_token(self) -> int | None:
        """The token the next output token must be, or None where it is free."""
        if self.forcing:
            return self.end_ids[self.forcing]
        if self.in_block and self.count >= self.budget:
            return self.end_ids[0]
        return None

    def forced_after(self, drafted: list[int]) -> int | None:
        """forced_token were `drafted` the output's next tokens (a verify row's drafts before it); the budget itself
        stays where it is."""
        if not drafted:
            return self.forced_token
        ahead = copy.copy(self)  # accept() replaces its list of recent tokens, never changes it in place
        for token in drafted:
            ahead.accept(token)
        return ahead.forced_token

    def accept(self, token: int) -> None:
        """The output's next token."""
        forced = self.forced_token
        if forced is not None:
            self.forcing = self.forcing + 1 if token == forced and self.forcing + 1 < len(self.end_ids) else 0
        self._see(token)

    def _see(self, token: int) -> None:
        self._recent = (self._recent + [token])[-self._keep:]
        if _ends_with(self._recent, self.start_ids):
            self.in_block, self.count = True, 0
        elif _ends_with(self._recent, self.end_ids):
            self.in_block, self.forcing = False, 0
        elif self.in_block:
            self.count += 1


def opens_think_block(prompt_ids: list[int], tags: tuple[int, int] | None) -> bool:
    """Whether a prompt leaves a think block open for the output to go on (its last start after its last end)."""
    if tags is None:
        return False
    start, end = _last_index(prompt_ids, [tags[0]]), _last_index(prompt_ids, [tags[1]])
    return start > end


def _ends_with(tokens: list[int], tail: list[int]) -> bool:
    return len(tokens) >= len(tail) and tokens[len(tokens) - len(tail):] == tail


def _last_index(tokens: list[int], part: list[int]) -> int:
    """Where the last occurrence of `part` in `tokens` starts, or -1."""
    for i in range(len(tokens) - len(part), -1, -1):
        if tokens[i : i + len(part)] == part:
            return i
    return -1


THINK_START = "<think>"
THINK_END = "</think>"


def think_tag_ids(encode) -> tuple[int, int] | None:
    """The ids of the tokenizer's `<think>` and `</think>` tokens (`encode`: text -> ids without special
    tokens), or None where either is not one token of its own: a model that spells them in pieces of text
    has no think block that could be told from its words."""
    start, end = encode(THINK_START), encode(THINK_END)
    return (start[0], end[0]) if len(start) == 1 and len(end) == 1 else None

