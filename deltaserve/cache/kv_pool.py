"""KVPool: one K and one V tensor per attention layer, `[num_blocks, block_size, kv_heads, head_dim]`.
Allocated once at start-up; their addresses never move."""

import torch


class KVPool:
    def __init__(self, layer_ids: list[int], num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.k = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layer_ids}
        self.v = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layer_ids}

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """(source, destination): copies every layer's K and V of each source block into the destination."""
        source, dest = zip(*pairs)
        views = [(pool[d], pool[s]) for pools in (self.k, self.v) for pool in pools.values()
                 for s, d in zip(source, dest)]
        torch._foreach_copy_([d for d, _ in views], [s for _, s in views])  # one launch for every layer
