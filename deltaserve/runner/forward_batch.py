"""ForwardBatch: the flat ragged batch of one step, as the model's layers read it.

Rows of all sequences are concatenated: sequence b owns rows query_start_loc[b]:query_start_loc[b+1]
at positions seq_lens[b] - q_len ... seq_lens[b] - 1. The pools are reached through the batch so
that the layers never hold cache state themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from deltaserve.cache.kv_pool import KVPool
from deltaserve.cache.state_pool import StatePool
from deltaserve.kernels.capture_rows import CaptureRows

if TYPE_CHECKING:
    from deltaserve.runner.gdn_stash import GdnStash


@dataclass
class OutputRows:
    """The rows of a pass whose final hidden states are wanted: the last row of each chunk that samples.
    Every row's keys, values and recurrent state are needed by later steps, but after the last layer's
    token mixer nothing of the other rows is: that layer attends, projects and runs its feed-forward
    block for these rows only (for one 8192-token prompt, 1 row of 8192)."""

    rows: torch.Tensor  # [R] indices into the batch's rows, in the order of logits_indices
    query_start_loc: torch.Tensor  # [R + 1]: 0, 1, ..., R (each row attends as a one-row chunk)
    seq_lens: torch.Tensor  # [R]: the length of each row's sequence
    block_tables: torch.Tensor  # [R, max_blocks]: each row's sequence's blocks

    @property
    def count(self) -> int:
        """R, from the rows' shape (no read of the device): 0 when no chunk of the pass samples."""
        return self.rows.shape[0]

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """x's rows at these indices (a new tensor of R rows)."""
        return x.index_select(0, self.rows)


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
    # Where set, the conv states' captures, capture_rows then naming the recurrent states' alone: a speculative
    # step captures the conv state after each verify row into a conv-only slot of snapshot_pool, its recurrent
    # states waiting for the verdicts in gdn_stash.
    conv_capture_rows: CaptureRows | None = None
    # Host copy of query_start_loc when every sequence starts at position 0 in this step and the
    # chunks are long: attention then runs over the chunk itself (dense FlashAttention).
    fresh_query_start_loc: list[int] | None = None
    # The longest chunk of the step, known on the host for an eager pass (a prefill graph's rung, which its
    # sequence may fill; None in a decode graph, whose kernels take the bound that any batch of its rows
    # keeps): attention sizes its grid by it.
    max_query_len: int | None = None
    # [1] on the device: rows at or after it pad a graph's batch (their MoE routes nowhere, so they read
    # no expert's weights); None: every row is live.
    live_rows: torch.Tensor | None = None
    # Where set, the model returns the final hidden states of these rows only (see OutputRows).
    output_rows: OutputRows | None = None
    # A verify step's: the GDN layers leave its verify chunks' states as they were and keep their rows' inputs
    # here, for the states to advance through the kept rows alone once the verdicts are in (see GdnStash);
    # stash_rows [R]: the row of the pass each stash row takes (None: the pass's rows as they lie, a verify graph's).
    gdn_stash: GdnStash | None = None
    stash_rows: torch.Tensor | None = None
    # Whose final GDN states the pass writes back: every sequence's (True), none (False: a verify graph), or
    # those whose entry of a [B] integer tensor is not 0 (an eager pass's prompt chunks beside verify chunks).
    store_state: bool | torch.Tensor = True

    def kv_cache(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv_pool.k[layer_idx], self.kv_pool.v[layer_idx]

    def gdn_state(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.state_pool.conv[layer_idx], self.state_pool.h[layer_idx]

    @property
    def conv_captures(self) -> CaptureRows | list:
        return self.capture_rows if self.conv_capture_rows is None else self.conv_capture_rows

    def gdn_snapshots(self, layer_idx: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.snapshot_pool is None:
            return None, None
        return self.snapshot_pool.conv[layer_idx], self.snapshot_pool.h[layer_idx]
