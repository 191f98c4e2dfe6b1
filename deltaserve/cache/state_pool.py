"""StatePool: per GDN layer, the conv state `[slots, conv_dim, kernel-1]` and the recurrent state
`[slots, v_heads, k_dim, v_dim]` (fp32 unless `state_dtype` says otherwise; the kernels compute in fp32
whatever it is stored in). One extra slot after them absorbs padded rows of a graph. Conv-only slots may
follow it: conv states with no recurrent state beside them (a speculative step's verify rows, whose recurrent
states the verdicts commit instead: runner/gdn_stash.py)."""

import torch

from deltaserve.host_to_device import to_device
from deltaserve.kernels import copy_slot, copy_slot_at, copy_slots_at, zero_slots


class StatePool:
    def __init__(self, layer_ids: list[int], num_slots: int, conv_dim: int, conv_kernel: int, v_heads: int,
                 k_dim: int, v_dim: int, dtype: torch.dtype, device: torch.device,
                 state_dtype: torch.dtype = torch.float32, conv_only_slots: int = 0):
        self.num_slots = num_slots
        self.padding_slot = num_slots
        self.first_conv_only_slot = num_slots + 1
        rows = num_slots + 1
        # One tensor per kind over all layers (layer-major), so a slot of every layer is reset or
        # copied in one operation; the layers read their own views.
        self.conv_all = torch.zeros(len(layer_ids), rows + conv_only_slots, conv_dim, conv_kernel - 1, dtype=dtype,
                                    device=device)
        self.h_all = torch.zeros(len(layer_ids), rows, v_heads, k_dim, v_dim, dtype=state_dtype, device=device)
        self.conv = {layer: self.conv_all[i] for i, layer in enumerate(layer_ids)}
        self.h = {layer: self.h_all[i] for i, layer in enumerate(layer_ids)}

    def reset(self, slots: list[int]) -> None:
        """Zeroes the states of sequences that start from their first token."""
        if not slots:
            return
        zero_slots((self.conv_all, self.h_all), to_device(slots, self.h_all.device))

    def copy_slots(self, pairs: list[tuple[int, int]], destination: "StatePool", conv_only: bool = False) -> None:
        """(slot here, slot there): copies every layer's states of each slot into `destination` (conv_only: the
        conv states alone); several pairs in one launch where no copy reads what another writes."""
        srcs, dsts = (self.conv_all, self.h_all), (destination.conv_all, destination.h_all)
        if conv_only:
            srcs, dsts = srcs[:1], dsts[:1]
        targets = {dst for _, dst in pairs}
        apart = destination is not self or not targets & {src for src, _ in pairs}
        if len(pairs) > 1 and len(targets) == len(pairs) and apart:
            flat = [slot for pair in pairs for slot in pair]
            copy_slots_at(srcs, dsts, to_device(flat, self.h_all.device).view(-1, 2))
            return
        for src, dst in pairs:
            copy_slot(srcs, src, dsts, dst)

    def copy_slots_at(self, slots: torch.Tensor, destination: "StatePool") -> None:
        """copy_slots for the pair in the device tensor `slots` [2] (a negative slot here: nothing)."""
        copy_slot_at((self.conv_all, self.h_all), (destination.conv_all, destination.h_all), slots)

    @staticmethod
    def bytes_per_slot(num_layers: int, conv_dim: int, conv_kernel: int, v_heads: int, k_dim: int, v_dim: int,
                       dtype: torch.dtype, state_dtype: torch.dtype = torch.float32) -> int:
        conv = StatePool.conv_bytes_per_slot(num_layers, conv_dim, conv_kernel, dtype)
        return conv + num_layers * v_heads * k_dim * v_dim * state_dtype.itemsize

    @staticmethod
    def conv_bytes_per_slot(num_layers: int, conv_dim: int, conv_kernel: int, dtype: torch.dtype) -> int:
        return num_layers * conv_dim * (conv_kernel - 1) * dtype.itemsize
