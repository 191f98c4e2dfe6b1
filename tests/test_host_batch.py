"""The host side of a step's batch: its columns built from decode rows and numpy runs, and lists to
tensors through numpy."""

import random
from array import array

import numpy as np
import pytest
import torch

from deltaserve.engine.request import Request
from deltaserve.engine.step_plan import ScheduledChunk, StepPlan
from deltaserve.host_to_device import columns_to_device, host_tensor, to_device
from deltaserve.runner.batch_builder import RowColumn, build_host_batch, kv_slots
from deltaserve.sampling_params import SamplingParams


def _slot(blocks, position, block_size):
    return blocks[position // block_size] * block_size + position % block_size


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_slots_of_a_run_match_position_by_position(block_size):
    rng = random.Random()
    for _ in range(50):
        blocks = rng.sample(range(1000), 40)
        start = rng.randrange(0, 40 * block_size - 1)
        end = rng.randrange(start + 1, 40 * block_size + 1)
        slots = kv_slots(blocks, start, end, block_size)
        assert slots.dtype == np.int64
        assert slots.tolist() == [_slot(blocks, p, block_size) for p in range(start, end)]


def test_row_column_keeps_order_across_values_and_runs():
    rng = random.Random()
    for _ in range(30):
        column, expected = RowColumn(), []
        for _ in range(rng.randrange(0, 8)):
            if rng.random() < 0.5:
                value = rng.randrange(1 << 40)
                column.append(value)
                expected.append(value)
            else:
                run = np.array([rng.randrange(1 << 40) for _ in range(rng.randrange(1, 20))], dtype=np.int64)
                column.extend(run)
                expected += run.tolist()
        values = column.values()
        assert list(values) == expected
        assert isinstance(values, list) or values.dtype == np.int64


def _request(rng, prompt_len, outputs, block_size, with_bytes):
    prompt = [rng.randrange(1000) for _ in range(prompt_len)]
    request = Request(f"r{rng.random()}", prompt, SamplingParams(), 16,
                      prompt_bytes=array("q", prompt).tobytes() if with_bytes else b"")
    request.output_token_ids = [rng.randrange(1000) for _ in range(outputs)]
    request.block_ids = rng.sample(range(5000), (prompt_len + outputs) // block_size + 1)
    request.state_slot = rng.choice([None, rng.randrange(64)])  # None: a plain attention model's
    return request


@pytest.mark.parametrize("block_size", [1, 16])
def test_host_batch_matches_row_by_row(block_size):
    """Mixed steps (decode rows, prompt chunks, chunks reaching into the output) against the batch
    written out position by position."""
    rng = random.Random()
    for _ in range(20):
        chunks = []
        for _ in range(rng.randrange(1, 6)):
            prompt_len, outputs = rng.randrange(1, 200), rng.choice([0, 0, rng.randrange(1, 40)])
            request = _request(rng, prompt_len, outputs, block_size, with_bytes=rng.random() < 0.7)
            total = prompt_len + outputs
            start = rng.randrange(total) if rng.random() < 0.5 else total - 1
            end = rng.randrange(start + 1, total + 1)
            chunks.append(ScheduledChunk(request, start, end - start))
        host = build_host_batch(StepPlan(chunks), block_size)
        ids, positions, slots, starts = [], [], [], [0]
        for c in chunks:
            ids += [c.request.token_at(p) for p in range(c.start, c.end)]
            positions += range(c.start, c.end)
            slots += [_slot(c.request.block_ids, p, block_size) for p in range(c.start, c.end)]
            starts.append(starts[-1] + c.end - c.start)
        assert list(host.input_ids) == ids and list(host.positions) == positions and list(host.slot_mapping) == slots
        assert host.query_start_loc == starts and host.seq_lens == [c.end for c in chunks]
        assert host.state_slots == [c.request.state_slot or 0 for c in chunks]
        assert host.logits_indices == [starts[i + 1] - 1 for i, c in enumerate(chunks) if c.samples]
        if all(c.end - c.start == 1 for c in chunks):  # a decode step keeps its lists
            assert isinstance(host.input_ids, list) and isinstance(host.slot_mapping, list)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.bool])
def test_host_tensor_is_what_torch_tensor_makes(dtype):
    rng = random.Random()
    flat = [rng.randrange(-5, 1 << 20) for _ in range(rng.randrange(1, 300))]
    if dtype == torch.float32:
        flat = [rng.uniform(-2.0, 2.0) for _ in flat]
    elif dtype == torch.bool:
        flat = [rng.random() < 0.5 for _ in flat]
    nested = [flat[i:i + 3] for i in range(0, len(flat) - len(flat) % 3, 3)] or [[0, 0, 0]]
    for values in (flat, nested, []):
        got = host_tensor(values, dtype)
        expected = torch.tensor(values, dtype=dtype)
        assert got.dtype == dtype and got.shape == expected.shape and torch.equal(got, expected)
    assert torch.equal(to_device(flat, torch.device("cpu"), dtype), torch.tensor(flat, dtype=dtype))


def test_host_tensor_refuses_a_value_its_dtype_cannot_hold():
    with pytest.raises(OverflowError):
        host_tensor([1 << 40], torch.int32)


def test_columns_travel_in_one_copy_each_where_it_was_and_aligned():
    rng = np.random.default_rng()
    columns = [rng.integers(0, 1 << 40, size=rng.integers(0, 9)) for _ in range(5)]
    columns.insert(2, rng.integers(0, 100, size=(rng.integers(1, 4), rng.integers(1, 5))).tolist())  # a 2-D list
    columns.append([int(rng.integers(0, 100)) for _ in range(3)])
    views = columns_to_device(columns, torch.device("cpu"))
    base = views[0].untyped_storage().data_ptr()
    for column, view in zip(columns, views):
        assert view.dtype == torch.int64 and torch.equal(view, torch.as_tensor(np.asarray(column, dtype=np.int64)))
        assert view.untyped_storage().data_ptr() == base  # one buffer: one copy to the device
        assert (view.data_ptr() - base) % 16 == 0  # as Triton takes a tensor of its own
