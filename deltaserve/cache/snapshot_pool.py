"""SnapshotPool: saved copies of every GDN layer's (conv state, recurrent state h) for the prefix
cache, in slots shaped like the StatePool's, with a pure-Python SnapshotIndex naming them.

The GDN kernels write mid-chunk captures straight into `conv[layer][slot]` / `h[layer][slot]`
(ForwardBatch.capture_rows); the copies below cover the rest: restoring a snapshot into a
sequence's state slot before a step, and saving a sequence's state after a step.
"""

from __future__ import annotations

import torch

from deltaserve.cache.snapshot_index import SnapshotIndex
from deltaserve.cache.state_pool import StatePool


class SnapshotPool:
    def __init__(self, layer_ids: list[int], num_slots: int, conv_dim: int, conv_kernel: int, v_heads: int,
                 k_dim: int, v_dim: int, dtype: torch.dtype, device: torch.device,
                 state_dtype: torch.dtype = torch.float32, verify_slots: int = 0):
        """verify_slots: conv-only slots past the index's, where a speculative step's conv kernels write the conv
        state after each of its verify rows but the last (the state to go back to where a draft is refuted; the
        recurrent states are committed through the kept rows instead, runner/gdn_stash.py)."""
        self.index = SnapshotIndex(num_slots)
        self.num_slots = num_slots
        self._tensors = StatePool(layer_ids, num_slots, conv_dim, conv_kernel, v_heads, k_dim, v_dim, dtype, device,
                                  state_dtype, conv_only_slots=verify_slots)
        self.first_verify_slot = self._tensors.first_conv_only_slot
        self.num_verify_slots = verify_slots
        self.conv = self._tensors.conv
        self.h = self._tensors.h
        self.device = device
        self.padding_slot = self._tensors.padding_slot  # never named: a graph's unused capture entries name it

    def restore(self, pairs: list[tuple[int, int]], states: StatePool) -> None:
        """(snapshot slot, state slot): copies each snapshot into the sequence's state slot."""
        self._tensors.copy_slots(pairs, states)

    def restore_conv(self, pairs: list[tuple[int, int]], states: StatePool) -> None:
        """restore for the conv states alone (a verify graph's recurrent states advance by GdnStash.commit)."""
        self._tensors.copy_slots(pairs, states, conv_only=True)

    def restore_at(self, slots: torch.Tensor, states: StatePool) -> None:
        """restore for the pair in the device tensor `slots` [2] (a negative snapshot slot: none)."""
        self._tensors.copy_slots_at(slots, states)

    def save(self, pairs: list[tuple[int, int]], states: StatePool) -> None:
        """(state slot, snapshot slot): copies each sequence's current state into a snapshot slot."""
        states.copy_slots(pairs, self._tensors)
