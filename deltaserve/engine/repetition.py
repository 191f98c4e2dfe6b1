"""Repetition detection (vLLM's repetition_detection): a sequence ends once its output ends in one pattern of
tokens written again and again, the loop a model can fall into until max_tokens.

The output ends in a repetition where, for some pattern length n between the request's min_pattern_size (1 where
0) and max_pattern_size, its last n * min_count tokens are min_count copies of its last n. Plain Python over the
output's tail, once per token taken."""

from __future__ import annotations

from collections.abc import Sequence


def ends_in_repetition(tokens: Sequence[int], max_pattern_size: int, min_pattern_size: int, min_count: int) -> bool:
    """Whether `tokens` (the output so far, or its last max_pattern_size * min_count) end in min_count copies
    of one pattern of a length in [max(min_pattern_size, 1), max_pattern_size]."""
    if max_pattern_size <= 0 or min_count < 2:
        return False
    for length in range(max(min_pattern_size, 1), max_pattern_size + 1):
        if length * min_count > len(tokens):
            return False  # longer patterns need even more tokens
        if _repeats(tokens, length, min_count):
            return True
    return False


def _repeats(tokens: Sequence[int], length: int, count: int) -> bool:
    """Whether the last length * count tokens are `count` copies of the last `length`."""
    end = len(tokens)
    pattern = tokens[end - length:]
    return all(tokens[end - length * (k + 1): end - length * k] == pattern for k in range(1, count))
