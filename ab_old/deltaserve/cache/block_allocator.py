"""BlockAllocator: KV block ids with reference counts, and the prefix cache's index of full blocks.
Pure Python; the tensors live in KVPool.

A full block whose contents are known can be registered under its prefix hash (block_hash.py).
Another sequence with the same prefix then shares it (one more reference) instead of computing it
again. A registered block nobody references stays cached: it counts as free, and is reused (its
hash forgotten) only when no never-registered block is left, least recently used first. A finished
sequence's partly filled last block can be registered too, under its tail name: it is never shared,
only copied from (prefix_cache.py).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

from deltaserve.cache.block_hash import BlockHash


class BlockAllocator:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # unreferenced, holding nothing reusable
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, LRU first
        self._hash_of: dict[int, BlockHash] = {}
        self._block_of: dict[BlockHash, int] = {}
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    def can_allocate(self, count: int) -> bool:
        return count <= self.num_free

    def allocate(self, count: int) -> list[int]:
        if count > self.num_free:
            raise MemoryError(f"asked for {count} KV blocks, {self.num_free} free")
        blocks = []
        for _ in range(count):
            if self._free:
                block = self._free.popleft()
            else:
                block, _ = self._evictable.popitem(last=False)
                self._forget(block)
                self.num_evictions += 1
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def incref(self, blocks: Iterable[int]) -> None:
        """Takes one more reference to each block; a cached block nobody held leaves the LRU."""
        counts, evictable = self.ref_counts, self._evictable  # locals: a follow-up turn shares ~500 blocks
        for b in blocks:
            if counts[b] == 0:
                if b not in evictable:
                    raise ValueError(f"block {b} is free and holds nothing to share")
                del evictable[b]
            counts[b] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drops one reference to each block. A block whose count reaches zero is free again; if it is
        registered it stays cached as the most recently used, so free a sequence's blocks tail first."""
        counts, named, evictable, free = self.ref_counts, self._hash_of, self._evictable, self._free
        for b in blocks:
            count = counts[b]
            if count <= 0:
                raise ValueError(f"block {b} freed more often than allocated")
            counts[b] = count - 1
            if count == 1:
                if b in named:
                    evictable[b] = None
                else:
                    free.append(b)

    # -- prefix cache -----------------------------------------------------------------------------
    def register(self, block: int, block_hash: BlockHash) -> None:
        """Records that `block` (referenced, full) holds the prefix named `block_hash`. A block that held
        the same prefix before loses the name: the newest copy is the one the next hits should find
        (an older unreferenced copy may be next in line for eviction), and the old one becomes a
        plain block, free at once if nobody holds it."""
        if self.ref_counts[block] <= 0:
            raise ValueError(f"block {block} is not in use")
        if self._hash_of.get(block) == block_hash:
            return
        if block in self._hash_of:
            raise ValueError(f"block {block} already holds another prefix")
        old = self._block_of.get(block_hash)
        if old is not None:
            self._forget(old)
            if self.ref_counts[old] == 0:
                del self._evictable[old]
                self._free.append(old)
        self._block_of[block_hash] = block
        self._hash_of[block] = block_hash

    def find(self, block_hash: BlockHash) -> int | None:
        """The block registered under `block_hash`, if any; takes no reference."""
        return self._block_of.get(block_hash)

    def cached_prefix(self, hashes: Sequence[BlockHash]) -> list[int]:
        """The blocks caching the longest run hashes[0], hashes[1], ...; takes no references."""
        blocks = list(map(self._block_of.get, hashes))  # one C loop: a follow-up turn looks up ~500 names
        return blocks[: blocks.index(None)] if None in blocks else blocks

    def num_unreferenced(self, blocks: Iterable[int]) -> int:
        """How many of `blocks` are cached with no reference (sharing them takes them off the free count)."""
        return list(map(self.ref_counts.__getitem__, blocks)).count(0)

    def reset_cache(self) -> None:
        """Forgets every registered block; unreferenced ones become plain free blocks."""
        for b in list(self._hash_of):
            self._forget(b)
        self._free.extend(self._evictable)
        self._evictable.clear()

    def _forget(self, block: int) -> None:
        del self._block_of[self._hash_of.pop(block)]
