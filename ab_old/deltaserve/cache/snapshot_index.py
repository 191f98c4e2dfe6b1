"""SnapshotIndex: which snapshot slot holds the GDN state saved at which prefix. Pure Python; the
tensors live in SnapshotPool.

A slot is free, pending (reserved for a capture the current step writes), or ready (holding the
state after the prefix named by its hash, block_hash.py). Ready slots nobody references sit in an
LRU; a capture needing a slot takes a free one, else evicts the least recently used ready one.
References are held while a restore or a capture is in flight, so those slots are never evicted
under it.
"""

from __future__ import annotations

from collections import OrderedDict

from deltaserve.cache.block_hash import BlockHash


class SnapshotIndex:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.ref_counts = [0] * num_slots
        self._free = list(range(num_slots - 1, -1, -1))
        self._pending: set[int] = set()
        self._slot_of: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # ready and unreferenced, LRU first
        self.num_evictions = 0

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    @property
    def num_ready(self) -> int:
        return len(self._slot_of)

    @property
    def num_referenced(self) -> int:
        return sum(1 for c in self.ref_counts if c > 0)

    def find(self, block_hash: BlockHash) -> int | None:
        """The ready slot holding the state after the prefix `block_hash`, if any; no side effects."""
        return self._slot_of.get(block_hash)

    # -- restores ---------------------------------------------------------------------------------
    def acquire(self, slot: int) -> None:
        """Pins a ready slot while a restore from it is in flight (and marks it recently used)."""
        if slot not in self._hash_of:
            raise ValueError(f"snapshot slot {slot} holds no snapshot")
        self._lru.pop(slot, None)
        self.ref_counts[slot] += 1

    def release(self, slot: int) -> None:
        if self.ref_counts[slot] <= 0:
            raise ValueError(f"snapshot slot {slot} released more often than acquired")
        self.ref_counts[slot] -= 1
        if self.ref_counts[slot] == 0 and slot in self._hash_of:
            self._lru[slot] = None

    # -- captures ---------------------------------------------------------------------------------
    def reserve(self) -> int | None:
        """A slot for a capture in flight (pending, referenced once), or None when every slot is in use."""
        if self._free:
            slot = self._free.pop()
        elif self._lru:
            slot, _ = self._lru.popitem(last=False)
            del self._slot_of[self._hash_of.pop(slot)]
            self.num_evictions += 1
        else:
            return None
        self._pending.add(slot)
        self.ref_counts[slot] = 1
        return slot

    def commit(self, slot: int, block_hash: BlockHash) -> None:
        """The capture into `slot` was written: it now holds the state after prefix `block_hash`. If
        another slot already holds that prefix, this one is freed instead."""
        self._pending.remove(slot)
        self.ref_counts[slot] = 0
        if block_hash in self._slot_of:
            self._free.append(slot)
            return
        self._slot_of[block_hash] = slot
        self._hash_of[slot] = block_hash
        self._lru[slot] = None

    def cancel(self, slot: int) -> None:
        """The capture into `slot` will not be written (its request ended or its step failed)."""
        self._pending.remove(slot)
        self.ref_counts[slot] = 0
        self._free.append(slot)

    def demote(self, block_hash: BlockHash) -> None:
        """Makes the snapshot of `block_hash` the first to evict (one superseded by a later one)."""
        slot = self._slot_of.get(block_hash)
        if slot is not None and slot in self._lru:
            self._lru.move_to_end(slot, last=False)

    def promote(self, block_hash: BlockHash) -> None:
        """Makes the snapshot of `block_hash` the last to evict."""
        slot = self._slot_of.get(block_hash)
        if slot is not None and slot in self._lru:
            self._lru.move_to_end(slot)

    def clear(self) -> None:
        """Forgets every ready snapshot that no restore holds."""
        for slot in list(self._lru):
            del self._slot_of[self._hash_of.pop(slot)]
            self._free.append(slot)
        self._lru.clear()
