"""KVPool: per-layer K and V views of one tensor, and the block copy a prefix-cache tail takes."""

import random

import torch

from deltaserve.cache.kv_pool import KVPool


def test_copy_blocks_copies_every_layer_and_nothing_else():
    rng = random.Random()
    layers = sorted(rng.sample(range(12), 3))
    pool = KVPool(layers, num_blocks=9, block_size=4, kv_heads=2, head_dim=8, dtype=torch.float32,
                  device=torch.device("cpu"))
    for layer in layers:
        pool.k[layer].normal_()
        pool.v[layer].normal_()
    before = {layer: (pool.k[layer].clone(), pool.v[layer].clone()) for layer in layers}
    source, dest = rng.sample(range(9), 2)
    pool.copy_blocks([(source, dest)])
    for layer in layers:
        for now, then in zip((pool.k[layer], pool.v[layer]), before[layer]):
            expected = then.clone()
            expected[dest] = then[source]
            assert torch.equal(now, expected)
            assert now.is_contiguous() and now.shape == (9, 4, 2, 8)
