import pytest
import torch

from deltaserve.kernels.slot_copy import reference
from deltaserve.kernels.slot_copy.triton_slot_copy import BLOCK, copy_slot, slot_is_contiguous

pytestmark = pytest.mark.triton


def test_copy_slot_moves_one_slot_of_every_layer_in_both_pools():
    # A conv-like pool (bf16, a slot of 105 elements) and a state-like one (fp32, a little over a
    # program's piece); pools with other slot counts (a snapshot pool into a state pool and back).
    layers = 3
    srcs = (torch.randn(layers, 5, 3, 5, 7).to(torch.bfloat16), torch.randn(layers, 5, BLOCK + 9))
    dsts = (torch.randn(layers, 4, 3, 5, 7).to(torch.bfloat16), torch.randn(layers, 4, BLOCK + 9))
    src_slot, dst_slot = int(torch.randint(0, 5, ())), int(torch.randint(0, 4, ()))
    expected = tuple(d.clone() for d in dsts)
    reference.copy_slot(srcs, src_slot, expected, dst_slot)
    copy_slot(srcs, src_slot, dsts, dst_slot)
    for got, want, src in zip(dsts, expected, srcs):
        assert torch.equal(got, want)  # a copy: bit for bit, and the other slots untouched
        assert torch.equal(got[:, dst_slot], src[:, src_slot])


def test_slot_is_contiguous():
    pool = torch.zeros(2, 3, 4, 5)
    assert slot_is_contiguous(pool) and slot_is_contiguous(pool[:, :2])
    assert not slot_is_contiguous(pool[..., :4]) and not slot_is_contiguous(pool.transpose(2, 3))
