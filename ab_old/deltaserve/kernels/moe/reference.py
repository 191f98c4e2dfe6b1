"""Mixture-of-experts: top-k routing and the experts' SwiGLU MLPs over tokens grouped by expert."""

import torch

from deltaserve.kernels.activation.reference import silu_and_mul


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool, shared_gate: bool = False,
              live_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts, keep the top k; renormalised to sum 1 when asked. Returns (weights fp32, ids).

    shared_gate: the last column is the shared expert's gate logit, not a router logit. The shared
    expert is then stacked after the E routed ones, so every token gets a (k+1)-th choice: expert E
    with weight sigmoid(gate), never renormalised with the others.
    live_rows ([1]): rows at or after it are unrouted: every choice gets the id one past the stacked
    experts and weight 0, and moe_experts gives them nothing."""
    logits = router_logits.float()
    if shared_gate:
        logits, gate = logits[:, :-1], logits[:, -1:]
    probs = torch.softmax(logits, dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    if shared_gate:
        weights = torch.cat([weights, torch.sigmoid(gate)], dim=-1)
        ids = torch.cat([ids, torch.full_like(ids[:, :1], logits.shape[-1])], dim=-1)
    if live_rows is not None:
        unrouted = (torch.arange(ids.shape[0], device=ids.device) >= live_rows.to(ids.device))[:, None]
        ids = torch.where(unrouted, logits.shape[-1] + int(shared_gate), ids)
        weights = torch.where(unrouted, 0.0, weights)
    return weights, ids


def moe_experts(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I]; weights/ids [T, k]. A pair whose
    id is E or more is unrouted (see moe_route's live_rows) and adds nothing."""
    out = torch.zeros_like(x)
    flat_ids = ids.flatten()
    order = flat_ids.argsort(stable=True)  # token-choice pairs sorted by expert
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    token_of_pair = order // ids.shape[1]
    weight_of_pair = weights.flatten()[order]
    begin = 0
    for expert, count in enumerate(counts[: w13.shape[0]]):
        if count == 0:
            continue
        pairs = slice(begin, begin + count)
        tokens = token_of_pair[pairs]
        hidden = silu_and_mul(x[tokens] @ w13[expert].T) @ w2[expert].T
        out.index_add_(0, tokens, (hidden * weight_of_pair[pairs, None].to(x.dtype)).to(out.dtype))
        begin += count
    return out
