"""RecentChains: the block names of the last few sequences the prefix cache let go, beside their token
bytes. Pure Python.

A follow-up turn resends its whole history, whose blocks the previous turn already named. Finding the
blocks a new prompt shares with a remembered sequence takes a comparison of bytes (memcmp), and their
names are then taken as they are instead of hashed again: naming the 520 blocks of an 8k-token history
is ~0.14 ms of the turn's time to first token on the H200 host. A name is a pure function of the
tokens up to its block's end (and of the chain's root: its cache salt's), so equal bytes under the same
root give equal names.
"""

from __future__ import annotations

from collections import deque

from deltaserve.cache.block_hash import BlockHash


class RecentChains:
    def __init__(self, block_size: int, capacity: int = 16):
        self.step = block_size * 8  # bytes of one block's int64 ids
        # (root, token bytes, names), oldest first
        self._entries: deque[tuple[BlockHash | None, bytes, list[BlockHash]]] = deque(maxlen=capacity)

    def remember(self, token_bytes: bytes, names: list[BlockHash], root: BlockHash | None = None) -> None:
        """A sequence's int64 token bytes and the names of its first len(names) blocks, copied (a preempted
        request goes on naming blocks in its own list, past the bytes remembered here), under the root its
        chain started from."""
        if names:
            self._entries.append((root, token_bytes[: len(names) * self.step], list(names)))

    def clear(self) -> None:
        self._entries.clear()

    def shared_names(self, token_bytes: bytes, max_blocks: int, root: BlockHash | None = None) -> list[BlockHash]:
        """The names of the longest run of leading blocks (at most max_blocks) that `token_bytes` shares
        with a remembered sequence of the same root."""
        best: list[BlockHash] = []
        first = token_bytes[: self.step]
        for known_root, known, names in reversed(self._entries):
            limit = min(len(names), max_blocks)
            if known_root != root or limit <= len(best) or not known.startswith(first):  # not this chain's
                continue
            count = self._shared_blocks(token_bytes, memoryview(known), limit)
            if count > len(best):
                best = names[:count]
        return best

    def _shared_blocks(self, data: bytes, known: memoryview, limit: int) -> int:
        """The most leading blocks, up to limit, on which data and known agree (a binary search)."""
        if data.startswith(known[: limit * self.step]):
            return limit
        low, high = 0, limit - 1  # low blocks agree; more than high do not
        while low < high:
            mid = (low + high + 1) // 2
            if data.startswith(known[: mid * self.step]):
                low = mid
            else:
                high = mid - 1
        return low
