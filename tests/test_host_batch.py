"""The host side of a step's batch: KV slots by block runs, and lists to tensors through numpy."""

import random

import pytest
import torch

from deltaserve.host_to_device import host_tensor, to_device
from deltaserve.runner.batch_builder import _extend_slots


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_slots_by_block_runs_match_position_by_position(block_size):
    rng = random.Random()
    for _ in range(50):
        blocks = rng.sample(range(1000), 40)
        start = rng.randrange(0, 40 * block_size)
        end = rng.randrange(start, 40 * block_size + 1)
        slots = [7]  # extended in place, after what is there
        _extend_slots(slots, blocks, start, end, block_size)
        assert slots == [7] + [blocks[p // block_size] * block_size + p % block_size for p in range(start, end)]


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
