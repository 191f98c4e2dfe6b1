"""StepBuffers: every device address that a graph-replayed step reads or writes.

The metadata of a step (input ids, positions, sequence lengths, KV slot mapping, state slots, query
start offsets, block tables, the row turned into logits, the rows whose GDN state is captured, the
snapshot a prefill pass restores its sequence's state from) lives in buffers allocated once at
start-up; a step only refreshes their contents, so CUDA graphs captured over them stay valid. The 1-D
fields are views into one device tensor, filled by a single host-to-device copy from a pinned mirror.
Two layouts share them: a decode step (one row per sequence) and a short prefill pass (one sequence's
rows, then a padding sequence up to the graph's row count).

A decode step's one copy also brings its block tables, packed at the step's width behind the fields,
and for each row where its input id comes from: the host's, or the token the step before sampled in
some row, still on the device (asynchronous scheduling). The decode graph's first kernel completes
both (kernels.unpack_decode_inputs), and its last writes the rows' greedy tokens into `sampled_tokens`,
which the next step reads them from (a step that samples otherwise copies its tokens there). Between two decode graphs the GPU then has one copy in and one
out: each small operation launched there cost more than its own work, and with the argmax, three
copies in, one out and three small kernels the 9B shape's graphs at 128 rows lay 0.36 ms apart.

A speculative verify step (load_verify) takes the decode layout's fields for sequences of k + 1 rows each,
its block tables packed as a decode step's. The pools are referenced here too.
"""

from __future__ import annotations

import numpy as np
import torch

from deltaserve import kernels
from deltaserve.cache.kv_pool import KVPool
from deltaserve.cache.state_pool import StatePool
from deltaserve.host_to_device import to_device
from deltaserve.kernels.capture_rows import CaptureRows, GraphCaptureRows
from deltaserve.runner.batch_builder import HostBatch
from deltaserve.runner.forward_batch import ForwardBatch, OutputRows

ROW_FIELDS = ("input_ids", "positions", "slot_mapping", "token_sources")
SEQUENCE_FIELDS = ("seq_lens", "state_slots")

# Mid-pass snapshot captures a graph-replayed prefill pass can make (its tables have this many
# entries; the unused ones name rows past the pass, which every kernel skips).
MAX_GRAPH_CAPTURES = 4


def graph_capture_pairs(captures: list[tuple[int, int]], num_rows: int, padding_snapshot_slot: int
                        ) -> list[tuple[int, int]]:
    """A prefill pass's (row, snapshot slot) captures, sorted, then entries up to MAX_GRAPH_CAPTURES for
    rows past the pass's num_rows: rows of no sequence, so no kernel computes or stores a state for them
    (naming the padding sequence's rows instead would compute and store states nobody reads). Their
    slot is the spare one all the same."""
    spare = MAX_GRAPH_CAPTURES - len(captures)
    return sorted(captures) + [(num_rows + i, padding_snapshot_slot) for i in range(spare)]


class StepBuffers:
    def __init__(self, max_batch: int, max_blocks_per_seq: int, kv_pool: KVPool | None,
                 state_pool: StatePool | None, device: torch.device, max_prefill_rows: int = 0):
        self.max_batch = max(max_batch, 2)  # a prefill pass is two sequences: its own and the padding
        self.max_prefill_rows = max_prefill_rows  # the longest pass a prefill graph may take
        self.max_rows = max(self.max_batch, max_prefill_rows)
        self.max_blocks = max_blocks_per_seq
        self.kv_pool, self.state_pool = kv_pool, state_pool
        self.padding_slot = state_pool.padding_slot if state_pool is not None else 0
        self._offsets = {}
        offset = 0
        for name, length in ([(f, self.max_rows) for f in ROW_FIELDS] + [(f, self.max_batch) for f in SEQUENCE_FIELDS]
                             + [("query_start_loc", self.max_batch + 1), ("logits_index", 1), ("live_rows", 1),
                                ("restore", 2), ("kv_copy", 2), ("block_width", 1)]):
            self._offsets[name] = (offset, offset + length)
            offset += length
        self._fields_end = offset  # a decode step's packed block tables follow (what its copy needs of them)
        self._offsets["packed_blocks"] = (offset, offset + self.max_batch * max_blocks_per_seq)
        offset += self.max_batch * max_blocks_per_seq
        pin = device.type == "cuda"
        # Two pinned mirrors, used in turn: with asynchronous scheduling a step is loaded while the one
        # before may still be queued, and its copy must not read a mirror being rewritten.
        self._mirrors = [(torch.zeros(offset, dtype=torch.int64, pin_memory=pin),
                          torch.zeros(2 * max_blocks_per_seq, dtype=torch.int64, pin_memory=pin),  # a prefill pass's
                          torch.zeros(4, MAX_GRAPH_CAPTURES, dtype=torch.int32, pin_memory=pin))
                         for _ in range(2)]
        self._turn = 0
        self.meta = torch.zeros(offset, dtype=torch.int64, device=device)
        for name, (start, end) in self._offsets.items():
            setattr(self, name, self.meta[start:end])
        self.block_tables = torch.zeros(self.max_batch, max_blocks_per_seq, dtype=torch.int64, device=device)
        self.captures = torch.zeros(4, MAX_GRAPH_CAPTURES, dtype=torch.int32, device=device)
        self.sampled_tokens = torch.zeros(self.max_batch, dtype=torch.int64, device=device)  # by the last decode graph
        self.one_row_start = torch.tensor([0, 1], dtype=torch.int64, device=device)  # a prefill pass's output row
        # 0, 1, ..., max_batch: the starts of rows one a sequence (the MTP head's drafting passes after a verify step)
        self.row_starts = torch.arange(self.max_batch + 1, dtype=torch.int64, device=device)
        # The MTP head's drafting after a verify step (load_drafting): each row's next token, then each sequence's
        # last kept row and the drafts it takes, one tensor filled by one copy.
        self.drafting = torch.zeros(self.max_rows + 2 * self.max_batch, dtype=torch.int64, device=device)
        self.next_tokens = self.drafting[: self.max_rows]
        self.last_rows = self.drafting[self.max_rows : self.max_rows + self.max_batch]
        self.draft_limits = self.drafting[self.max_rows + self.max_batch :]

    def _next_mirror(self):
        mirror = self._mirrors[self._turn]
        self._turn ^= 1
        return mirror

    def _field(self, meta: np.ndarray, name: str) -> np.ndarray:
        start, end = self._offsets[name]
        return meta[start:end]

    def load_decode(self, host: HostBatch, batch_size: int, token_sources: list[int] | None = None) -> None:
        """Writes one decode row per sequence into rows [0, n) and padding into rows [n, batch_size):
        padded rows write no KV (slot -1) and update only the spare state slot. token_sources[r] >= 0:
        row r's input id is sampled_tokens[that row] (None: every row's id is the host's). The block
        tables and these sources take effect when unpack_decode runs (the decode graph's first kernel)."""
        n = len(host.input_ids)
        mirror, _, _ = self._next_mirror()
        meta = mirror.numpy()
        fill = {"input_ids": (host.input_ids, 0), "positions": (host.positions, 0), "seq_lens": (host.seq_lens, 1),
                "slot_mapping": (host.slot_mapping, -1), "state_slots": (host.state_slots, self.padding_slot),
                "token_sources": (token_sources if token_sources is not None else -1, -1)}
        for name, (values, pad) in fill.items():
            field = self._field(meta, name)
            field[:n] = values
            field[n:batch_size] = pad
        self._field(meta, "query_start_loc")[: batch_size + 1] = np.arange(batch_size + 1)
        self._field(meta, "live_rows")[0] = n
        width = max((len(t) for t in host.block_tables), default=1) or 1
        self._field(meta, "block_width")[0] = width
        packed = self._field(meta, "packed_blocks")[: batch_size * width].reshape(batch_size, width)
        packed[:] = 0  # rows past a table's length, and the padding rows: block 0, never read
        for row, table in enumerate(host.block_tables):
            packed[row, : len(table)] = table
        used = self._fields_end + batch_size * width
        self.meta[:used].copy_(mirror[:used], non_blocking=True)

    def unpack_decode(self, batch_size: int) -> None:
        """Completes the input ids and block tables of the decode step load_decode wrote (on the device)."""
        kernels.unpack_decode_inputs(self.input_ids[:batch_size], self.token_sources[:batch_size], self.sampled_tokens,
                                     self.packed_blocks, self.block_width, self.block_tables[:batch_size])

    def load_verify(self, host: HostBatch, batch_size: int, rows_per_seq: int) -> None:
        """Writes a speculative verify step: its n sequences of rows_per_seq rows each (a last token and its drafts)
        into rows [0, n * rows_per_seq), then padding sequences of as many rows up to batch_size sequences: their
        rows write no KV (slot -1), sit at position 0 and run on the spare state slot. The block tables travel
        packed, as a decode step's, and unpack_decode completes them (every row's input id is the host's)."""
        n, per = len(host.seq_lens), rows_per_seq
        assert len(host.input_ids) == n * per
        mirror, _, _ = self._next_mirror()
        meta = mirror.numpy()
        fill = {"input_ids": (host.input_ids, 0), "positions": (host.positions, 0),
                "slot_mapping": (host.slot_mapping, -1)}
        for name, (values, pad) in fill.items():
            field = self._field(meta, name)
            field[: n * per] = values
            field[n * per : batch_size * per] = pad
        for name, values, pad in (("seq_lens", host.seq_lens, per),
                                  ("state_slots", host.state_slots, self.padding_slot), ("token_sources", [], -1)):
            field = self._field(meta, name)
            field[: len(values)] = values
            field[len(values) : batch_size] = pad
        self._field(meta, "query_start_loc")[: batch_size + 1] = np.arange(batch_size + 1) * per
        self._field(meta, "live_rows")[0] = n * per
        width = max((len(t) for t in host.block_tables), default=1) or 1
        self._field(meta, "block_width")[0] = width
        packed = self._field(meta, "packed_blocks")[: batch_size * width].reshape(batch_size, width)
        packed[:] = 0
        for row, table in enumerate(host.block_tables):
            packed[row, : len(table)] = table
        used = self._fields_end + batch_size * width
        self.meta[:used].copy_(mirror[:used], non_blocking=True)

    def load_drafting(self, batch_size: int, rows_per_seq: int, next_tokens: list[int], last_rows: list[int],
                      draft_limits: list[int]) -> None:
        """The MTP head's inputs after the verify step load_verify wrote: the next token of each of its rows, each
        sequence's last kept row and the drafts it takes; the padding sequences' rows take token 0, their last
        row their first, and no drafts."""
        n, rows = len(last_rows), batch_size * rows_per_seq
        values = np.zeros(self.drafting.numel(), dtype=np.int64)
        values[: len(next_tokens)] = next_tokens
        values[self.max_rows : self.max_rows + n] = last_rows
        values[self.max_rows + n : self.max_rows + batch_size] = np.arange(n, batch_size) * rows_per_seq
        values[self.max_rows + self.max_batch : self.max_rows + self.max_batch + n] = draft_limits
        assert len(next_tokens) <= rows
        self.drafting.copy_(to_device(values, self.drafting.device), non_blocking=True)

    def verify_view(self, batch_size: int, rows_per_seq: int, capture_rows=None, snapshot_pool=None) -> ForwardBatch:
        """The verify layout load_verify wrote, every row turned into logits; with a snapshot pool, the conv states
        after the rows of `capture_rows` go to its slots (the recurrent states wait for the verdicts: GdnStash)."""
        rows = batch_size * rows_per_seq
        batch = ForwardBatch(
            input_ids=self.input_ids[:rows],
            positions=self.positions[:rows],
            query_start_loc=self.query_start_loc[: batch_size + 1],
            seq_lens=self.seq_lens[:batch_size],
            block_tables=self.block_tables[:batch_size],
            slot_mapping=self.slot_mapping[:rows],
            state_slots=self.state_slots[:batch_size],
            logits_indices=None,
            is_decode=False,
            kv_pool=self.kv_pool,
            state_pool=self.state_pool,
            max_query_len=rows_per_seq,
            live_rows=self.live_rows,
        )
        if snapshot_pool is not None:
            batch.conv_capture_rows, batch.snapshot_pool = capture_rows, snapshot_pool
        return batch

    def load_prefill(self, host: HostBatch, num_rows: int, captures: list[tuple[int, int]],
                     padding_snapshot_slot: int, restore: tuple[int, int] | None = None,
                     kv_copy: tuple[int, int] | None = None) -> list[tuple[int, int]]:
        """Writes one sequence's prefill pass into rows [0, n) and a padding sequence into rows
        [n, num_rows) (none where n == num_rows): it writes no KV and runs on the spare state slot. Row
        n - 1 gives the logits. `captures` (row, snapshot slot), rows distinct and below n, are padded with
        entries past the pass (see graph_capture_pairs) up to MAX_GRAPH_CAPTURES; returns them all.
        `restore` (snapshot slot, state slot): the pass starts by copying that snapshot into the sequence's
        slot (None: -1, none); `kv_copy` (source block, destination block): and that KV block into the
        sequence's (None: -1, none)."""
        n = len(host.input_ids)
        pairs = graph_capture_pairs(captures, num_rows, padding_snapshot_slot)
        assert len(host.seq_lens) == 1 and n <= num_rows and all(row < n for row, _ in captures)
        mirror, mirror_blocks, mirror_captures = self._next_mirror()
        meta = mirror.numpy()
        # padding rows at position 0, as a decode step's are: the rotary table holds max_model_len positions,
        # which may be fewer than a rung's rows (--max-model-len under the step budget)
        fill = {"input_ids": (host.input_ids, 0), "positions": (host.positions, 0),
                "slot_mapping": (host.slot_mapping, -1)}
        for name, (values, padding) in fill.items():
            field = self._field(meta, name)
            field[:n] = values
            field[n:num_rows] = padding
        self._field(meta, "seq_lens")[:2] = (host.seq_lens[0], num_rows - n)
        self._field(meta, "state_slots")[:2] = (host.state_slots[0], self.padding_slot)
        self._field(meta, "query_start_loc")[:3] = (0, n, num_rows)
        self._field(meta, "logits_index")[0] = n - 1
        self._field(meta, "live_rows")[0] = n
        self._field(meta, "restore")[:] = restore if restore is not None else (-1, self.padding_slot)
        self._field(meta, "kv_copy")[:] = kv_copy if kv_copy is not None else (-1, 0)
        self.meta[: self._fields_end].copy_(mirror[: self._fields_end], non_blocking=True)
        self._load_block_tables(mirror_blocks, host.block_tables, 2)
        table = mirror_captures.numpy()
        table[0] = table[2] = [row for row, _ in pairs]  # every capture's row is distinct: no repeats
        table[1] = table[3] = [slot for _, slot in pairs]
        self.captures.copy_(mirror_captures, non_blocking=True)
        return pairs

    def _load_block_tables(self, mirror_blocks: torch.Tensor, tables: list[list[int]], num_seqs: int) -> None:
        # A prefill pass (its sequence and the padding one): the rows travel at the device table's own row
        # stride up to the last column some row needs (a kernel never reads past a row's own length), one
        # plain copy.
        width = max((len(t) for t in tables), default=1) or 1
        stride = self.max_blocks
        target = self.block_tables.view(-1)[: (num_seqs - 1) * stride + width]
        blocks = mirror_blocks[: num_seqs * stride].view(num_seqs, stride).numpy()
        blocks[:, :width] = 0
        for row, table in enumerate(tables):
            blocks[row, : len(table)] = table
        target.copy_(mirror_blocks[: target.numel()], non_blocking=True)

    def view(self, batch_size: int) -> ForwardBatch:
        """The decode layout at `batch_size` rows."""
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
            live_rows=self.live_rows,
        )

    def prefill_view(self, num_rows: int, snapshot_pool=None, captures: list[tuple[int, int]] | None = None,
                     every_row: bool = False) -> ForwardBatch:
        """The prefill layout at `num_rows` rows; with a snapshot pool its captures are on: read from the
        device table (graphs), or from `captures`, the pairs load_prefill wrote there (eager). `every_row`: the
        last layer computes every row (the MTP head reads them all), as a drafting engine's eager pass does."""
        batch = ForwardBatch(
            input_ids=self.input_ids[:num_rows],
            positions=self.positions[:num_rows],
            query_start_loc=self.query_start_loc[:3],
            seq_lens=self.seq_lens[:2],
            block_tables=self.block_tables[:2],
            slot_mapping=self.slot_mapping[:num_rows],
            state_slots=self.state_slots[:2],
            logits_indices=self.logits_index,
            is_decode=False,
            kv_pool=self.kv_pool,
            state_pool=self.state_pool,
            live_rows=self.live_rows,
            # the sequence may fill every row and the padding one none: the attention's bound T - B + 1 on the
            # longest chunk holds only where every sequence has a row
            max_query_len=num_rows,
            # the last layer computes the sequence's last row alone, as an eager pass does (so a prefix-cache hit,
            # whose tail a graph computes, gives the bytes of the miss that computed it eagerly)
            output_rows=None if every_row else OutputRows(rows=self.logits_index, query_start_loc=self.one_row_start,
                                                          seq_lens=self.seq_lens[:1],
                                                          block_tables=self.block_tables[:1]),
        )
        if snapshot_pool is not None:
            rows = GraphCaptureRows(self.captures) if captures is None else CaptureRows(captures)
            batch.capture_rows, batch.snapshot_pool = rows, snapshot_pool
        return batch
