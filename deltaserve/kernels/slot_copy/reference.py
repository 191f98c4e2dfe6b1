"""Copying one slot of layer-major state pools: `dst[:, dst_slot] = src[:, src_slot]` for each (src, dst)
pair of pools shaped [layers, slots, ...] (StatePool and SnapshotPool keep every GDN layer's conv and
recurrent states so)."""

import torch


def copy_slot(srcs: tuple[torch.Tensor, ...], src_slot: int, dsts: tuple[torch.Tensor, ...], dst_slot: int) -> None:
    for src, dst in zip(srcs, dsts, strict=True):
        dst[:, dst_slot].copy_(src[:, src_slot])
