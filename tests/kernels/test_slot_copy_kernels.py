import pytest
import torch

from deltaserve.kernels.slot_copy import reference
from deltaserve.kernels.slot_copy.triton_slot_copy import BLOCK, copy_slot

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("dtype,inner", [(torch.float32, (3, 5, 7)), (torch.bfloat16, (BLOCK + 9,))])
def test_copy_slot_moves_one_slot_of_every_layer(dtype, inner):
    # Pools with other slot counts (a snapshot pool into a state pool and back); a slot of 105 elements,
    # and one a little over a program's piece.
    layers = 3
    src = torch.randn(layers, 5, *inner).to(dtype)
    dst = torch.randn(layers, 4, *inner).to(dtype)
    src_slot, dst_slot = int(torch.randint(0, 5, ())), int(torch.randint(0, 4, ()))
    expected = dst.clone()
    reference.copy_slot(src, src_slot, expected, dst_slot)
    copy_slot(src, src_slot, dst, dst_slot)
    assert torch.equal(dst, expected)  # a copy: bit for bit, and the other slots untouched
    assert torch.equal(dst[:, dst_slot], src[:, src_slot])
