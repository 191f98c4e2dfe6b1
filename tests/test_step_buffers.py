"""StepBuffers on CPU: what a graph-replayed step reads from the fixed buffers after load_decode (and
the unpacking a decode graph starts with) and load_prefill, against the host batch it came from (fresh
random batches)."""

import random

import torch

from deltaserve.runner.batch_builder import HostBatch
from deltaserve.runner.step_buffers import MAX_GRAPH_CAPTURES, StepBuffers


def _tables(rng: random.Random, count: int, max_blocks: int) -> list[list[int]]:
    return [[rng.randrange(1000) for _ in range(rng.randint(1, max_blocks))] for _ in range(count)]


def test_decode_layout_holds_each_row_and_pads_the_rest():
    rng = random.Random()
    buffers = StepBuffers(16, 12, None, None, torch.device("cpu"))
    for _ in range(3):  # the mirrors are used in turn: stale contents must not leak into a later step
        n = rng.randint(1, 12)
        size = rng.choice([s for s in (1, 2, 4, 8, 16) if s >= n])
        tables = _tables(rng, n, 12)
        host = HostBatch([rng.randrange(500) for _ in range(n)], [rng.randrange(100) for _ in range(n)],
                         list(range(n + 1)), [rng.randrange(1, 100) for _ in range(n)], tables,
                         [rng.randrange(5000) for _ in range(n)], [rng.randrange(8) for _ in range(n)], list(range(n)))
        # Some rows take their input id from the tokens the step before sampled (still on the device).
        buffers.sampled_tokens.copy_(torch.randint(0, 500, buffers.sampled_tokens.shape))
        sources = [rng.randrange(16) if rng.random() < 0.5 else -1 for _ in range(n)]
        buffers.load_decode(host, size, sources)
        buffers.unpack_decode(size)
        view = buffers.view(size)
        expected_ids = [int(buffers.sampled_tokens[s]) if s >= 0 else i for s, i in zip(sources, host.input_ids)]
        assert view.input_ids[:n].tolist() == expected_ids and view.input_ids[n:].eq(0).all()
        assert view.positions[:n].tolist() == host.positions
        assert view.seq_lens[:n].tolist() == host.seq_lens and view.seq_lens[n:].eq(1).all()
        assert view.slot_mapping[:n].tolist() == host.slot_mapping and view.slot_mapping[n:].eq(-1).all()
        assert view.state_slots[:n].tolist() == host.state_slots
        assert view.state_slots[n:].eq(buffers.padding_slot).all()
        assert view.query_start_loc.tolist() == list(range(size + 1)) and int(view.live_rows) == n
        width = max(len(t) for t in tables)
        for row, table in enumerate(tables):  # the columns a row reads: its table, zeros to the widest
            assert view.block_tables[row, :width].tolist() == table + [0] * (width - len(table))
        assert view.block_tables[n:size, :width].eq(0).all()


def test_prefill_layout_holds_the_pass_its_padding_captures_and_restore():
    rng = random.Random()
    buffers = StepBuffers(4, 40, None, None, torch.device("cpu"), max_prefill_rows=64)
    for restore in ((rng.randrange(9), rng.randrange(4)), None, (rng.randrange(9), rng.randrange(4))):
        n = rng.randint(2, 48)  # 48: the pass fills its rung, the padding sequence has no rows
        num_rows = 48
        table = _tables(rng, 1, 40)[0]
        start = rng.randrange(200)
        host = HostBatch([rng.randrange(500) for _ in range(n)], list(range(start, start + n)), [0, n], [start + n],
                         [table], [rng.randrange(5000) for _ in range(n)], [rng.randrange(4)], [n - 1])
        # a decode step before it leaves nonzero tables in the rows the pass's padding sequence uses
        buffers.load_decode(HostBatch([1, 2], [3, 4], [0, 1, 2], [4, 5], _tables(rng, 2, 40), [6, 7], [0, 1], [0, 1]), 2)
        buffers.unpack_decode(2)
        rows = rng.sample(range(n), rng.randint(0, min(n, MAX_GRAPH_CAPTURES)))
        captures = [(row, rng.randrange(9)) for row in rows]
        pairs = buffers.load_prefill(host, num_rows, captures, 8, restore)
        assert pairs[: len(captures)] == sorted(captures) and len(pairs) == MAX_GRAPH_CAPTURES
        assert all(row >= num_rows for row, _ in pairs[len(captures):])  # unused entries: past the pass
        view = buffers.prefill_view(num_rows)
        assert view.input_ids[:n].tolist() == host.input_ids and view.input_ids[n:].eq(0).all()
        assert view.positions[:n].tolist() == host.positions
        assert view.positions[n:].eq(0).all()  # padding rows at position 0, inside any rotary table
        assert view.slot_mapping[:n].tolist() == host.slot_mapping and view.slot_mapping[n:].eq(-1).all()
        assert view.query_start_loc.tolist() == [0, n, num_rows]
        assert view.seq_lens.tolist() == [start + n, num_rows - n]
        assert view.state_slots.tolist() == [host.state_slots[0], buffers.padding_slot]
        assert int(view.logits_indices) == n - 1 and int(view.live_rows) == n and view.max_query_len == num_rows
        assert view.block_tables[0, : len(table)].tolist() == table
        assert view.block_tables[1, : len(table)].eq(0).all()  # the padding sequence's: zeros
        assert buffers.captures[0].tolist() == [row for row, _ in pairs] == buffers.captures[2].tolist()
        assert buffers.captures[1].tolist() == [slot for _, slot in pairs] == buffers.captures[3].tolist()
        assert buffers.restore.tolist() == (list(restore) if restore else [-1, buffers.padding_slot])
