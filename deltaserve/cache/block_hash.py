"""The hash chain that names KV blocks and recurrent-state snapshots by their whole prefix.

Block i of a sequence is named by hash(name of block i-1, token ids of block i), so one name stands
for every token from position 0 to the end of the block: two sequences share block i's name only if
they share all of their first (i + 1) * block_size tokens. A snapshot taken at position
(i + 1) * block_size is keyed by the same name. Only full blocks have names. Pure Python.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    digest = hashlib.blake2b(parent or b"", digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def chain_hashes(token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """The names of every full block of `token_ids`."""
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        hashes.append(hash_block(hashes[-1] if hashes else None, token_ids[start:start + block_size]))
    return hashes
