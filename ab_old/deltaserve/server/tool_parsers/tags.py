"""Helpers for finding tags in text that arrives in arbitrary chunks."""

from __future__ import annotations


def held_suffix_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`.

    Those characters may turn out to be the start of the tag once the next chunk arrives,
    so a streaming parser holds them back instead of emitting them as plain text.
    """
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
