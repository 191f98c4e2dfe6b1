"""copy_slot (see reference.py) for two pools (the conv and the recurrent states) in one Triton launch
over (layer, piece of the slot, pool).

torch's copy of `pool[:, slot]` takes the strided elementwise path, and over a snapshot pool of many
GiB it splits into several launches to keep 32-bit offsets: restoring the 30 GDN layers' states of a
Qwen3.5-35B-A3B sequence (60 MiB) took eight launches and ~100 us on the H200, where reading and
writing it once is ~30 us. Here each program copies one contiguous piece of one layer's slot with
64-bit offsets, and one launch serves both pools: a restore sits on the host's path before a
prefix-cache hit's pass starts. `copy_slot_at` reads the two slots from the device instead, so a
graph-replayed pass can start with its own restore; `copy_slots_at` copies many pairs so in one launch (a
speculative step sets back every sequence whose drafts were refuted: at 64 sequences of the Qwen3.5-9B shape
on an H100, 2.37 against 2.59 ms with a launch a sequence, 0.70 against 0.71 at 16; the bytes bound it,
speculative_step_times_qwen3.5-9b_one_set_back_launch_h100.json).

`zero_slots` clears the slots of sequences that start from their first token the same way, a program
per (layer, piece of a slot, slot and pool). torch's index_fill over the pools' slot dimension wrote
at about 1.1 TB/s: 5.8 ms before the prefill of 128 new prompts of the Qwen3.5-9B shape (6 GiB of
fp32 states) on the H200 (profile_prefill_qwen3.5-9b_128x128_f3df3cd.json).
"""

import math

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _copy_piece(src, dst, src_offset, dst_offset, stride_src_layer, stride_dst_layer, numel, layer, piece,
                BLOCK: tl.constexpr):
    offs = piece * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    values = tl.load(src + layer * stride_src_layer + src_offset + offs, mask=mask)
    tl.store(dst + layer * stride_dst_layer + dst_offset + offs, values.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _copy_pools(src_a, dst_a, src_offset_a, dst_offset_a, stride_src_layer_a, stride_dst_layer_a, numel_a,
                src_b, dst_b, src_offset_b, dst_offset_b, stride_src_layer_b, stride_dst_layer_b, numel_b,
                BLOCK: tl.constexpr):
    """This program's piece of one layer's slot, of pool a or b (grid axis 2)."""
    layer, piece = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if tl.program_id(2) == 0:
        _copy_piece(src_a, dst_a, src_offset_a, dst_offset_a, stride_src_layer_a, stride_dst_layer_a, numel_a, layer,
                    piece, BLOCK)
    else:
        _copy_piece(src_b, dst_b, src_offset_b, dst_offset_b, stride_src_layer_b, stride_dst_layer_b, numel_b, layer,
                    piece, BLOCK)


@triton.jit
def _copy_slot_kernel(src_a, dst_a, src_offset_a, dst_offset_a, stride_src_layer_a, stride_dst_layer_a, numel_a,
                      src_b, dst_b, src_offset_b, dst_offset_b, stride_src_layer_b, stride_dst_layer_b, numel_b,
                      BLOCK: tl.constexpr):
    _copy_pools(src_a, dst_a, src_offset_a, dst_offset_a, stride_src_layer_a, stride_dst_layer_a, numel_a,
                src_b, dst_b, src_offset_b, dst_offset_b, stride_src_layer_b, stride_dst_layer_b, numel_b, BLOCK)


@triton.jit
def _copy_slot_at_kernel(src_a, dst_a, stride_src_slot_a, stride_dst_slot_a, stride_src_layer_a, stride_dst_layer_a,
                         numel_a, src_b, dst_b, stride_src_slot_b, stride_dst_slot_b, stride_src_layer_b,
                         stride_dst_layer_b, numel_b, slots, BLOCK: tl.constexpr):
    src_slot, dst_slot = tl.load(slots).to(tl.int64), tl.load(slots + 1).to(tl.int64)
    if src_slot >= 0:  # a negative source slot: nothing to restore this time
        _copy_pools(src_a, dst_a, src_slot * stride_src_slot_a, dst_slot * stride_dst_slot_a, stride_src_layer_a,
                    stride_dst_layer_a, numel_a, src_b, dst_b, src_slot * stride_src_slot_b,
                    dst_slot * stride_dst_slot_b, stride_src_layer_b, stride_dst_layer_b, numel_b, BLOCK)


@triton.jit
def _copy_slots_at_kernel(src_a, dst_a, stride_src_slot_a, stride_dst_slot_a, stride_src_layer_a, stride_dst_layer_a,
                          numel_a, src_b, dst_b, stride_src_slot_b, stride_dst_slot_b, stride_src_layer_b,
                          stride_dst_layer_b, numel_b, pairs, BLOCK: tl.constexpr, POOLS: tl.constexpr = 2):
    """This program's piece of one layer's slot of pair pairs[i], in pool a or b (grid axis 2: i * POOLS + pool;
    POOLS 1: pool a alone)."""
    layer, piece, i = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2) // POOLS
    src_slot, dst_slot = tl.load(pairs + 2 * i).to(tl.int64), tl.load(pairs + 2 * i + 1).to(tl.int64)
    if src_slot >= 0:
        if tl.program_id(2) % POOLS == 0:
            _copy_piece(src_a, dst_a, src_slot * stride_src_slot_a, dst_slot * stride_dst_slot_a, stride_src_layer_a,
                        stride_dst_layer_a, numel_a, layer, piece, BLOCK)
        else:
            _copy_piece(src_b, dst_b, src_slot * stride_src_slot_b, dst_slot * stride_dst_slot_b, stride_src_layer_b,
                        stride_dst_layer_b, numel_b, layer, piece, BLOCK)


def slot_is_contiguous(pool: torch.Tensor) -> bool:
    """Whether each layer's slot of `pool` [layers, slots, ...] is one contiguous run."""
    expected = 1
    for size, stride in zip(reversed(pool.shape[2:]), reversed(pool.stride()[2:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _operands(src: torch.Tensor, src_slot: int, dst: torch.Tensor, dst_slot: int) -> tuple:
    src, dst, stride_src_slot, stride_dst_slot, *rest = _slot_operands(src, dst)
    return src, dst, src_slot * stride_src_slot, dst_slot * stride_dst_slot, *rest


def copy_slot(srcs: tuple[torch.Tensor, ...], src_slot: int, dsts: tuple[torch.Tensor, ...], dst_slot: int) -> None:
    """Same contract as the reference, for two pools with the same layer count, each layer's slot
    contiguous (see slot_is_contiguous)."""
    (src_a, src_b), (dst_a, dst_b) = srcs, dsts
    a, b = _operands(src_a, src_slot, dst_a, dst_slot), _operands(src_b, src_slot, dst_b, dst_slot)
    _copy_slot_kernel[_grid(a, b)](*a, *b, BLOCK=BLOCK, num_warps=8)


def copy_slot_at(srcs: tuple[torch.Tensor, ...], dsts: tuple[torch.Tensor, ...], slots: torch.Tensor) -> None:
    """Same contract as the reference's copy_slot_at, for pools as copy_slot takes them."""
    (src_a, src_b), (dst_a, dst_b) = srcs, dsts
    a, b = _slot_operands(src_a, dst_a), _slot_operands(src_b, dst_b)
    assert slots.numel() == 2 and slots.device == src_a.device
    _copy_slot_at_kernel[_grid(a, b)](*a, *b, slots, BLOCK=BLOCK, num_warps=8)


def copy_slots_at(srcs: tuple[torch.Tensor, ...], dsts: tuple[torch.Tensor, ...], pairs: torch.Tensor) -> None:
    """Same contract as the reference's copy_slots_at, for pools as copy_slot takes them, or one pool (a verify
    graph's conv states): one launch for every pair."""
    pools = len(srcs)
    (src_a, src_b), (dst_a, dst_b) = (srcs * 2)[:2], (dsts * 2)[:2]
    a, b = _slot_operands(src_a, dst_a), _slot_operands(src_b, dst_b)
    assert pairs.dim() == 2 and pairs.shape[1] == 2 and pairs.is_contiguous() and pairs.device == src_a.device
    if pairs.shape[0] == 0:
        return
    layers, pieces, _ = _grid(a, b)
    _copy_slots_at_kernel[(layers, pieces, pools * pairs.shape[0])](*a, *b, pairs, BLOCK=BLOCK, num_warps=8,
                                                                     POOLS=pools)


def _grid(a: tuple, b: tuple) -> tuple[int, int, int]:
    """(layer, piece of a slot, pool) for the operands of two pools with the same layer count."""
    assert a[0].shape[0] == b[0].shape[0]
    return a[0].shape[0], triton.cdiv(max(a[-1], b[-1]), BLOCK), 2


def _slot_operands(src: torch.Tensor, dst: torch.Tensor) -> tuple:
    numel = math.prod(src.shape[2:])
    assert math.prod(dst.shape[2:]) == numel and src.shape[0] == dst.shape[0]
    return src, dst, src.stride(1), dst.stride(1), src.stride(0), dst.stride(0), numel


@triton.jit
def _zero_piece(pool, offset, stride_layer, numel, layer, piece, BLOCK: tl.constexpr):
    offs = piece * BLOCK + tl.arange(0, BLOCK)
    tl.store(pool + layer * stride_layer + offset + offs, tl.zeros([BLOCK], dtype=pool.dtype.element_ty),
             mask=offs < numel)


@triton.jit
def _zero_slots_kernel(pool_a, stride_slot_a, stride_layer_a, numel_a, pool_b, stride_slot_b, stride_layer_b,
                       numel_b, slots, BLOCK: tl.constexpr):
    """This program's piece of one layer's slot slots[i] in pool a or b (grid axis 2: i * 2 + pool)."""
    layer, piece = tl.program_id(0).to(tl.int64), tl.program_id(1)
    slot = tl.load(slots + tl.program_id(2) // 2).to(tl.int64)
    if tl.program_id(2) % 2 == 0:
        _zero_piece(pool_a, slot * stride_slot_a, stride_layer_a, numel_a, layer, piece, BLOCK)
    else:
        _zero_piece(pool_b, slot * stride_slot_b, stride_layer_b, numel_b, layer, piece, BLOCK)


def zero_slots(pools: tuple[torch.Tensor, ...], slots: torch.Tensor) -> None:
    """Same contract as the reference, for two pools as copy_slot takes them."""
    pool_a, pool_b = pools
    a, b = _zero_operands(pool_a), _zero_operands(pool_b)
    if slots.numel() == 0:
        return
    assert pool_a.shape[0] == pool_b.shape[0] and slots.device == pool_a.device
    grid = (pool_a.shape[0], triton.cdiv(max(a[-1], b[-1]), BLOCK), 2 * slots.numel())
    _zero_slots_kernel[grid](*a, *b, slots, BLOCK=BLOCK, num_warps=8)


def _zero_operands(pool: torch.Tensor) -> tuple:
    return pool, pool.stride(1), pool.stride(0), math.prod(pool.shape[2:])
