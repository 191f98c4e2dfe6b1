"""Copying one slot of a layer-major state pool: `dst[:, dst_slot] = src[:, src_slot]` for pools shaped
[layers, slots, ...] (StatePool and SnapshotPool keep every GDN layer's states so)."""

import torch


def copy_slot(src: torch.Tensor, src_slot: int, dst: torch.Tensor, dst_slot: int) -> None:
    dst[:, dst_slot].copy_(src[:, src_slot])
