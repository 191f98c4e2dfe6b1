"""Top-k routing: softmax over the experts, the k largest probabilities (descending) and their ids,
renormalised to sum 1 when asked. One program per token.

Each pick is one max-reduction over packed keys: a probability's bits (non-negative floats order like
their integer bits) in the high word and the reversed expert index in the low word, so equal
probabilities go to the lowest index, as before, without a second reduction to find it."""

import torch
import triton
import triton.language as tl


@triton.jit
def _moe_route_kernel(logits, weights, ids, stride_l, EXPERTS: tl.constexpr, TOP_K: tl.constexpr,
                      BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, RENORMALIZE: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    valid = offs < EXPERTS
    z = tl.load(logits + token * stride_l + offs, mask=valid, other=float("-inf")).to(tl.float32)
    p = tl.exp(z - tl.max(z, 0))
    p = p / tl.sum(p, 0)
    bits = p.to(tl.int32, bitcast=True).to(tl.int64)
    key = tl.where(valid, (bits << 32) | (BLOCK_E - 1 - offs).to(tl.int64), -1)
    slots = tl.arange(0, BLOCK_K)
    top_key = tl.zeros([BLOCK_K], dtype=tl.int64)
    for i in tl.static_range(TOP_K):
        best = tl.max(key, 0)
        top_key = tl.where(slots == i, best, top_key)
        key = tl.where(key == best, -1, key)
    top_p = (top_key >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    top_i = (BLOCK_E - 1) - (top_key & (BLOCK_E - 1))
    if RENORMALIZE:
        top_p = top_p / tl.sum(tl.where(slots < TOP_K, top_p, 0.0), 0)
    tl.store(weights + token * TOP_K + slots, top_p, mask=slots < TOP_K)
    tl.store(ids + token * TOP_K + slots, top_i, mask=slots < TOP_K)


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool,
              num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    tokens, experts = logits.shape
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int64, device=logits.device)
    if tokens:
        _moe_route_kernel[(tokens,)](
            logits, weights, ids, logits.stride(0), EXPERTS=experts, TOP_K=top_k,
            BLOCK_E=triton.next_power_of_2(experts), BLOCK_K=triton.next_power_of_2(top_k),
            RENORMALIZE=renormalize, num_warps=num_warps or (2 if experts >= 256 else 1),
        )
    return weights, ids
