"""KVPool: one K and one V tensor per attention layer, `[num_blocks, block_size, kv_heads, head_dim]`.
Allocated once at start-up; their addresses never move.

Every layer's K and V are views into one tensor `[2, layers, num_blocks, ...]`, so copying a block of
all of them (a prefix-cache tail, copied into the block of the request that continues it) is one
strided copy rather than one launch per layer: 40 views and a foreach copy took 0.37 ms of host time
before a 35B-A3B follow-up turn's prefill on the H200."""

import torch


class KVPool:
    def __init__(self, layer_ids: list[int], num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.kv = torch.zeros((2, len(layer_ids), num_blocks, block_size, kv_heads, head_dim), dtype=dtype,
                              device=device)
        self.k = {layer: self.kv[0, i] for i, layer in enumerate(layer_ids)}
        self.v = {layer: self.kv[1, i] for i, layer in enumerate(layer_ids)}

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()

    def copy_block_at(self, pair: torch.Tensor) -> None:
        """copy_blocks for the pair (source, destination) in the device tensor `pair` [2]; no host work, so a
        CUDA graph can hold it (a source equal to its destination copies nothing)."""
        self.kv.index_copy_(2, pair[1:], self.kv.index_select(2, pair[:1]))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """(source, destination): copies every layer's K and V of each source block into the destination."""
        for source, dest in pairs:
            self.kv[:, :, dest].copy_(self.kv[:, :, source])
