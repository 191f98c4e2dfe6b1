"""ForwardBatch: the flat ragged batch of one step, as the model's layers read it.

Rows of all sequences are concatenated: sequence b owns rows query_start_loc[b]:query_start_loc[b+1]
at positions seq_lens[b] - q_len ... seq_lens[b] - 1. The pools are reached through the batch so
that the layers never hold cache state themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deltaserve.cache.kv_pool import KVPool
from deltaserve.cache.state_pool import StatePool
from deltaserve.kernels.capture_rows import CaptureRows


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    query_start_loc: torch.Tensor  # [B + 1]
    seq_lens: torch.Tensor  # [B]
    block_tables: torch.Tensor  # [B, max_blocks]
    slot_mapping: torch.Tensor  # [T], -1 for padding rows
    state_slots: torch.Tensor  # [B]
    logits_indices: torch.Tensor | None  # rows whose logits are sampled (None: every row, as in graphs)
    is_decode: bool
    kv_pool: KVPool | None
    state_pool: StatePool | None
    # (row, snapshot slot): GDN states to copy out after that row (prefix caching)
    capture_rows: CaptureRows | list = field(default_factory=list)
    snapshot_pool: StatePool | None = None
    # Host copy of query_start_loc when every sequence starts at position 0 in this step and the
    # chunks are long: attention then runs over the chunk itself (dense FlashAttention).
    fresh_query_start_loc: list[int] | None = None
    # The longest chunk of the step, known on the host for an eager pass (None in a graph, whose kernels
    # take the bound that any batch of its rows keeps): attention sizes its grid by it.
    max_query_len: int | None = None
    # [1] on the device: rows at or after it pad a graph's batch (their MoE routes nowhere, so they read
    # no expert's weights); None: every row is live.
    live_rows: torch.Tensor | None = None

    def kv_cache(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv_pool.k[layer_idx], self.kv_pool.v[layer_idx]

    def gdn_state(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.state_pool.conv[layer_idx], self.state_pool.h[layer_idx]

    def gdn_snapshots(self, layer_idx: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.snapshot_pool is None:
            return None, None
        return self.snapshot_pool.conv[layer_idx], self.snapshot_pool.h[layer_idx]
