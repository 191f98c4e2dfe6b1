"""StepBuffers: every device address that a graph-replayed step reads or writes.

The metadata of a step (input ids, positions, sequence lengths, KV slot mapping, state slots, query
start offsets, block tables) lives in buffers allocated once at start-up; a step only
refreshes their contents, so CUDA graphs captured over them stay valid. The 1-D fields are views
into one device tensor, filled by a single host-to-device copy from a pinned mirror. The pools are
referenced here too, and the buffers of speculative decoding (draft tokens and per-row verify
metadata) have their place beside them.
"""

from __future__ import annotations

import numpy as np
import torch

from deltaserve.cache.kv_pool import KVPool
from deltaserve.cache.state_pool import StatePool
from deltaserve.runner.batch_builder import HostBatch
from deltaserve.runner.forward_batch import ForwardBatch

FIELDS = ("input_ids", "positions", "seq_lens", "slot_mapping", "state_slots")


class StepBuffers:
    def __init__(self, max_batch: int, max_blocks_per_seq: int, kv_pool: KVPool | None,
                 state_pool: StatePool | None, device: torch.device, num_speculative_tokens: int = 0):
        self.max_batch = max_batch
        self.max_blocks = max_blocks_per_seq
        self.kv_pool, self.state_pool = kv_pool, state_pool
        self.padding_slot = state_pool.padding_slot if state_pool is not None else 0
        size = len(FIELDS) * max_batch + max_batch + 1
        pin = device.type == "cuda"
        # Two pinned mirrors, used in turn: with asynchronous scheduling a step is loaded while the one
        # before may still be queued, and its copy must not read a mirror being rewritten.
        self._mirrors = [(torch.zeros(size, dtype=torch.int64, pin_memory=pin),
                          torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int64, pin_memory=pin))
                         for _ in range(2)]
        self._turn = 0
        self.meta = torch.zeros(size, dtype=torch.int64, device=device)
        for i, name in enumerate(FIELDS):
            setattr(self, name, self.meta[i * max_batch : (i + 1) * max_batch])
        self.query_start_loc = self.meta[len(FIELDS) * max_batch :]
        self.block_tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int64, device=device)
        # Speculative decoding (MTP drafts verified in one step): per-row draft tokens and their count.
        self.draft_tokens = torch.zeros(max_batch, num_speculative_tokens, dtype=torch.int64, device=device)
        self.num_draft_tokens = torch.zeros(max_batch, dtype=torch.int64, device=device)

    def load_decode(self, host: HostBatch, batch_size: int) -> None:
        """Writes one decode row per sequence into rows [0, n) and padding into rows [n, batch_size):
        padded rows write no KV (slot -1) and update only the spare state slot."""
        n = len(host.input_ids)
        mirror, mirror_blocks = self._mirrors[self._turn]
        self._turn ^= 1
        meta = mirror.numpy()
        fill = {"input_ids": (host.input_ids, 0), "positions": (host.positions, 0), "seq_lens": (host.seq_lens, 1),
                "slot_mapping": (host.slot_mapping, -1), "state_slots": (host.state_slots, self.padding_slot)}
        for name, (values, pad) in fill.items():
            i = FIELDS.index(name)
            field = meta[i * self.max_batch : (i + 1) * self.max_batch]
            field[:n] = values
            field[n:batch_size] = pad
        qsl = meta[len(FIELDS) * self.max_batch :]
        qsl[: batch_size + 1] = np.arange(batch_size + 1)
        self.meta.copy_(mirror, non_blocking=True)
        # Only the columns some row needs travel; a kernel never reads past a row's own length.
        width = max((len(t) for t in host.block_tables), default=1) or 1
        blocks = mirror_blocks.numpy()
        blocks[:batch_size, :width] = 0
        for row, table in enumerate(host.block_tables):
            blocks[row, : len(table)] = table
        self.block_tables[:batch_size, :width].copy_(mirror_blocks[:batch_size, :width], non_blocking=True)

    def view(self, batch_size: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:batch_size],
            positions=self.positions[:batch_size],
            query_start_loc=self.query_start_loc[: batch_size + 1],
            seq_lens=self.seq_lens[:batch_size],
            block_tables=self.block_tables[:batch_size],
            slot_mapping=self.slot_mapping[:batch_size],
            state_slots=self.state_slots[:batch_size],
            logits_indices=None,  # a graph turns every row into logits
            is_decode=True,
            kv_pool=self.kv_pool,
            state_pool=self.state_pool,
        )
