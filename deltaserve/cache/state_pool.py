"""StatePool: per GDN layer, the conv state `[slots, conv_dim, kernel-1]` and the fp32 recurrent
state `[slots, v_heads, k_dim, v_dim]`. One extra slot at the end absorbs padded rows of a graph."""

import torch


class StatePool:
    def __init__(self, layer_ids: list[int], num_slots: int, conv_dim: int, conv_kernel: int, v_heads: int,
                 k_dim: int, v_dim: int, dtype: torch.dtype, device: torch.device):
        self.num_slots = num_slots
        self.padding_slot = num_slots
        rows = num_slots + 1
        self.conv = {i: torch.zeros(rows, conv_dim, conv_kernel - 1, dtype=dtype, device=device) for i in layer_ids}
        self.h = {i: torch.zeros(rows, v_heads, k_dim, v_dim, dtype=torch.float32, device=device) for i in layer_ids}

    def reset(self, slots: list[int]) -> None:
        """Zeroes the states of sequences that start from their first token."""
        if not slots:
            return
        index = torch.tensor(slots, device=next(iter(self.h.values())).device)
        for layer in self.h:
            self.conv[layer].index_fill_(0, index, 0)
            self.h[layer].index_fill_(0, index, 0)

    @staticmethod
    def bytes_per_slot(num_layers: int, conv_dim: int, conv_kernel: int, v_heads: int, k_dim: int, v_dim: int,
                       dtype: torch.dtype) -> int:
        conv = conv_dim * (conv_kernel - 1) * torch.tensor([], dtype=dtype).element_size()
        return num_layers * (conv + v_heads * k_dim * v_dim * 4)
