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
    pool.copy_block_at(torch.tensor([source, source]))  # onto itself: nothing changes
    pool.copy_blocks([(source, dest)])
    for layer in layers:
        for now, then in zip((pool.k[layer], pool.v[layer]), before[layer]):
            expected = then.clone()
            expected[dest] = then[source]
            assert torch.equal(now, expected)
            assert now.is_contiguous() and now.shape == (9, 4, 2, 8)


def test_copy_block_at_reads_the_pair_from_a_tensor_as_copy_blocks_does():
    rng = random.Random()
    pools = [KVPool([0, 3], num_blocks=6, block_size=2, kv_heads=1, head_dim=4, dtype=torch.float32,
                    device=torch.device("cpu")) for _ in range(2)]
    pools[0].kv.normal_()
    pools[1].kv.copy_(pools[0].kv)
    source, dest = rng.sample(range(6), 2)
    pools[0].copy_blocks([(source, dest)])
    pools[1].copy_block_at(torch.tensor([source, dest]))
    assert torch.equal(pools[0].kv, pools[1].kv) and torch.equal(pools[1].k[3][dest], pools[1].k[3][source])
