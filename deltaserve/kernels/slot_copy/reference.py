"""Copying one slot of layer-major state pools: `dst[:, dst_slot] = src[:, src_slot]` for each (src, dst)
pair of pools shaped [layers, slots, ...] (StatePool and SnapshotPool keep every GDN layer's conv and
recurrent states so)."""

import torch


def copy_slot(srcs: tuple[torch.Tensor, ...], src_slot: int, dsts: tuple[torch.Tensor, ...], dst_slot: int) -> None:
    for src, dst in zip(srcs, dsts, strict=True):
        dst[:, dst_slot].copy_(src[:, src_slot])


def copy_slot_at(srcs: tuple[torch.Tensor, ...], dsts: tuple[torch.Tensor, ...], slots: torch.Tensor) -> None:
    """copy_slot with the slots read from the device tensor `slots` [2] (source slot, destination slot); a
    negative source copies nothing. Nothing is read back to the host, so a CUDA graph can hold it: a
    graph-replayed pass restores its sequence's state from its fixed buffers."""
    source, destination = slots[0:1], slots[1:2].clamp(min=0)
    restore = source >= 0
    for src, dst in zip(srcs, dsts, strict=True):
        moved = src.index_select(1, source.clamp(min=0)).to(dst.dtype)
        kept = dst.index_select(1, destination)
        dst.index_copy_(1, destination, torch.where(restore.view([1] * dst.dim()), moved, kept))


def copy_slots_at(srcs: tuple[torch.Tensor, ...], dsts: tuple[torch.Tensor, ...], pairs: torch.Tensor) -> None:
    """copy_slot_at for every row (source slot, destination slot) of the device tensor `pairs` [n, 2] at once;
    the destinations are distinct and none is another row's source in the same pool."""
    source, destination = pairs[:, 0], pairs[:, 1].clamp(min=0)
    restore = source >= 0
    for src, dst in zip(srcs, dsts, strict=True):
        moved = src.index_select(1, source.clamp(min=0)).to(dst.dtype)
        kept = dst.index_select(1, destination)
        dst.index_copy_(1, destination, torch.where(restore.view(1, -1, *[1] * (dst.dim() - 2)), moved, kept))


def zero_slots(pools: tuple[torch.Tensor, ...], slots: torch.Tensor) -> None:
    """pool[:, slot] = 0 for every pool [layers, slots, ...] and every slot in the device tensor `slots`."""
    for pool in pools:
        pool.index_fill_(1, slots, 0)
