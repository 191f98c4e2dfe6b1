"""Top-k routing: softmax over the experts, the k largest probabilities (descending) and their ids,
renormalised to sum 1 when asked. One program per token.

Each pick is one max-reduction over packed keys: a probability's bits (non-negative floats order like
their integer bits) in the high word and the reversed expert index in the low word, so equal
probabilities go to the lowest index, as before, without a second reduction to find it.

With a shared gate the logits' last column is the shared expert's gate: the token gets one more
choice, expert E (stacked after the routed ones) weighted by sigmoid(gate), so the experts kernels
run the shared expert with the routed ones (see the reference). Rows at or after `live_rows` (a graph's
padding) are unrouted: every choice gets the id one past the stacked experts, and weight 0.

The logits may come as PartialSums (the router GEMM split along K): the parts are added up on load
(triton_partial_sums.py) and rounded to the logits' dtype, as an unsplit GEMM's output would have been."""

import torch
import triton
import triton.language as tl

from deltaserve.kernels.partial_sums import PartialSums, as_parts
from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid
from deltaserve.kernels.triton_partial_sums import load_summed


@triton.jit
def _load_logits(ptrs, mask, stride_part, PARTS: tl.constexpr, BLOCK_P: tl.constexpr, LOGIT_DTYPE: tl.constexpr):
    """fp32 logits (masked: -inf) from the tensor, or summed from its parts and rounded as they would be."""
    z = load_summed(ptrs, mask, stride_part, PARTS, BLOCK_P)
    return tl.where(mask, z.to(LOGIT_DTYPE).to(tl.float32), float("-inf"))


@triton.jit
def _moe_route_kernel(logits, weights, ids, live_rows, stride_l, stride_part, EXPERTS: tl.constexpr,
                      TOP_K: tl.constexpr, CHOICES: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                      RENORMALIZE: tl.constexpr, SHARED_GATE: tl.constexpr, HAS_LIVE_ROWS: tl.constexpr,
                      UNROUTED: tl.constexpr, PARTS: tl.constexpr, BLOCK_P: tl.constexpr,
                      LOGIT_DTYPE: tl.constexpr, USE_PDL: tl.constexpr = False):
    wait_for_prior_grid(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    valid = offs < EXPERTS
    z = _load_logits(logits + token * stride_l + offs, valid, stride_part, PARTS, BLOCK_P, LOGIT_DTYPE)
    if SHARED_GATE:  # loaded with the logits, before the picks: its load is not left to the end
        gate = _load_logits(logits + token * stride_l + EXPERTS, token >= 0, stride_part, PARTS, BLOCK_P, LOGIT_DTYPE)
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
    if SHARED_GATE:  # choice k: the shared expert (id EXPERTS), after the renormalisation
        top_p = tl.where(slots == TOP_K, 1.0 / (1.0 + tl.exp(-gate)), top_p)
        top_i = tl.where(slots == TOP_K, EXPERTS, top_i)
    if HAS_LIVE_ROWS:  # a graph's padding row: unrouted (the id past every stacked expert, weight 0)
        unrouted = token >= tl.load(live_rows)
        top_i = tl.where(unrouted, UNROUTED, top_i)
        top_p = tl.where(unrouted, 0.0, top_p)
    tl.store(weights + token * CHOICES + slots, top_p, mask=slots < CHOICES)
    tl.store(ids + token * CHOICES + slots, top_i, mask=slots < CHOICES)


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def moe_route(router_logits: torch.Tensor | PartialSums, top_k: int, renormalize: bool, shared_gate: bool = False,
              num_warps: int | None = None, live_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    parts, dtype = as_parts(router_logits)
    if parts.stride(-1) != 1:
        parts = parts.contiguous()
    _, tokens, columns = parts.shape
    experts = columns - 1 if shared_gate else columns
    choices = top_k + 1 if shared_gate else top_k
    weights = torch.empty((tokens, choices), dtype=torch.float32, device=parts.device)
    ids = torch.empty((tokens, choices), dtype=torch.int64, device=parts.device)
    if tokens:
        _moe_route_kernel[(tokens,)](
            parts, weights, ids, live_rows if live_rows is not None else ids, parts.stride(1), parts.stride(0),
            EXPERTS=experts, TOP_K=top_k, CHOICES=choices, BLOCK_E=triton.next_power_of_2(experts),
            BLOCK_K=triton.next_power_of_2(choices), RENORMALIZE=renormalize, SHARED_GATE=shared_gate,
            HAS_LIVE_ROWS=live_rows is not None, UNROUTED=experts + int(shared_gate), PARTS=parts.shape[0],
            BLOCK_P=triton.next_power_of_2(parts.shape[0]),
            LOGIT_DTYPE=_TL_DTYPES[dtype], num_warps=num_warps or (2 if experts >= 256 else 1),
            **launch_options(parts),
        )
    return weights, ids
