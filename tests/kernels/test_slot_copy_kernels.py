import pytest
import torch

from deltaserve.kernels.slot_copy import reference
from deltaserve.kernels.slot_copy.triton_slot_copy import (BLOCK, copy_slot, copy_slot_at, copy_slots_at,
                                                          slot_is_contiguous)

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


@pytest.mark.parametrize("restore", [True, False])
def test_copy_slot_at_reads_the_slots_from_the_device(restore):
    # The slots come from a tensor (a graph's fixed buffer); a negative source slot copies nothing.
    layers = 2
    srcs = (torch.randn(layers, 6, 4, 9).to(torch.bfloat16), torch.randn(layers, 6, BLOCK + 5))
    dsts = (torch.randn(layers, 3, 4, 9).to(torch.bfloat16), torch.randn(layers, 3, BLOCK + 5))
    src_slot, dst_slot = int(torch.randint(0, 6, ())), int(torch.randint(0, 3, ()))
    slots = torch.tensor([src_slot if restore else -1, dst_slot])
    before = tuple(d.clone() for d in dsts)
    expected = tuple(d.clone() for d in dsts)
    if restore:
        reference.copy_slot(srcs, src_slot, expected, dst_slot)
    by_reference = tuple(d.clone() for d in dsts)
    reference.copy_slot_at(srcs, by_reference, slots)
    copy_slot_at(srcs, dsts, slots)
    for got, ref, want, old in zip(dsts, by_reference, expected, before):
        assert torch.equal(ref, want) and torch.equal(got, want)
        assert torch.equal(got, old) != restore  # a restore changes the slot (random values), none does not


@pytest.mark.parametrize("pools", [2, 1])  # a verify graph sets back the conv states alone
def test_copy_slots_at_moves_many_pairs_in_one_launch(pools):
    # A speculative step's set-back: snapshot slots into distinct state slots, a pair with a negative source
    # (nothing to copy) among them; each row as copy_slot would copy it, the other slots untouched.
    layers, n = 3, 5
    srcs = (torch.randn(layers, 7, 3, 5).to(torch.bfloat16), torch.randn(layers, 7, BLOCK + 11))[:pools]
    dsts = (torch.randn(layers, 6, 3, 5).to(torch.bfloat16), torch.randn(layers, 6, BLOCK + 11))[:pools]
    sources, targets = torch.randperm(7)[:n], torch.randperm(6)[:n]
    sources[int(torch.randint(0, n - 1, ()))] = -1  # never the last: every other pair's copy is seen
    pairs = torch.stack([sources, targets], dim=1).contiguous()
    expected = tuple(d.clone() for d in dsts)
    for src_slot, dst_slot in pairs.tolist():
        if src_slot >= 0:
            reference.copy_slot(srcs, src_slot, expected, dst_slot)
    by_reference = tuple(d.clone() for d in dsts)
    reference.copy_slots_at(srcs, by_reference, pairs)
    copy_slots_at(srcs, dsts, pairs)
    for got, ref, want in zip(dsts, by_reference, expected):
        assert torch.equal(ref, want) and torch.equal(got, want)


def test_copy_slot_at_moves_a_kv_block_within_its_own_pool():
    # KVPool's layout: K and V of every layer in one tensor [2, layers, blocks, page, heads, dim], each a
    # layer-major pool whose slots are the blocks; the copy reads and writes the same pools.
    kv = torch.randn(2, 3, 7, 4, 2, 8).to(torch.bfloat16)
    pools = (kv[0], kv[1])
    source, dest = (int(i) for i in torch.randperm(7)[:2])
    expected = kv.clone()
    expected[:, :, dest] = kv[:, :, source]
    copy_slot_at(pools, pools, torch.tensor([source, dest]))
    assert torch.equal(kv, expected)


def test_slot_is_contiguous():
    pool = torch.zeros(2, 3, 4, 5)
    assert slot_is_contiguous(pool) and slot_is_contiguous(pool[:, :2])
    assert not slot_is_contiguous(pool[..., :4]) and not slot_is_contiguous(pool.transpose(2, 3))


def test_zero_slots_clears_those_slots_of_every_layer_in_both_pools():
    from deltaserve.kernels.slot_copy.triton_slot_copy import zero_slots

    layers = 3
    pools = (torch.randn(layers, 6, 3, 5, 7).to(torch.bfloat16), torch.randn(layers, 6, 2 * BLOCK + 9))
    slots = torch.randperm(6)[: int(torch.randint(1, 6, ()))]
    expected = tuple(p.clone() for p in pools)
    reference.zero_slots(expected, slots)
    zero_slots(pools, slots)
    kept = [s for s in range(6) if s not in slots.tolist()]
    for got, want in zip(pools, expected):
        assert torch.equal(got, want)
        assert not got[:, slots].any() and got[:, kept].ne(0).any()
