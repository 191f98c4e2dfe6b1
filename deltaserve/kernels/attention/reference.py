"""Paged attention over a ragged batch, and the KV store that fills the pages.

Layout: a pool is `[num_blocks, block_size, kv_heads, head_dim]`; a token's slot is
`block_id * block_size + offset`. Sequence b owns query rows `query_start_loc[b]:query_start_loc[b+1]`,
which are the last `q_len` of its `seq_lens[b]` tokens, so one definition covers prefill chunks,
decode tokens and speculative verify rows.
"""

import torch


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Writes k/v rows [T, Hk, D] into their slots; rows with slot -1 (padding) are skipped."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[valid].to(v_cache.dtype)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] over each sequence's paged K/V. Returns [T, Hq, D], times
    sigmoid(gate) ([T, Hq, D]) when a gate is given (the output gate of Qwen3-Next / Qwen3.5)."""
    out = torch.zeros_like(q)
    block_size = k_cache.shape[1]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        q_start, q_end = starts[b], starts[b + 1]
        if q_end == q_start:
            continue
        num_blocks = -(-seq_len // block_size)
        blocks = block_tables[b, :num_blocks]
        k = k_cache[blocks].flatten(0, 1)[:seq_len]
        v = v_cache[blocks].flatten(0, 1)[:seq_len]
        out[q_start:q_end] = _causal_attention(q[q_start:q_end], k, v, scale)
    return out if gate is None else out * torch.sigmoid(gate)


def output_gate(out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """out * sigmoid(gate) for out, gate [T, Hq, D] (the output gate of Qwen3-Next / Qwen3.5), in fp32 and
    rounded once, as the paged attention kernel applies it in its last store."""
    return (out.float() * torch.sigmoid(gate.float())).to(out.dtype)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Q, Hq, D] are the last Q positions of a sequence whose keys are k/v [S, Hk, D]."""
    q_len, seq_len = q.shape[0], k.shape[0]
    mask = None
    if q_len > 1:  # query i sits at position seq_len - q_len + i and sees keys up to there
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1).float(), k.transpose(0, 1).float(), v.transpose(0, 1).float(),
        attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1).to(q.dtype)


def rotary_store_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None, eps: float = 1e-6,
    norm_offset: float = 0.0, k_out: bool = False, q_rows: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """What an attention layer does to its new q/k/v rows before attending, as one op: the per-head RMSNorm
    of q and k (when weights are given), rotary on both, and k (rotated) and v stored in their slots.
    Returns the rotated q; k leaves only through the cache unless k_out asks for it too: (q, k).
    q_rows: q holds only these rows of the batch (a pass that attends for a few of its rows)."""
    from deltaserve.kernels.norm.reference import rms_norm
    from deltaserve.kernels.rotary.reference import apply_rotary

    if q_norm is not None:
        q = rms_norm(q, q_norm, eps, norm_offset)
        k = rms_norm(k, k_norm, eps, norm_offset)
    if q_rows is not None:
        q = apply_rotary(q, q[:, :0], positions[q_rows], cos_sin_cache)[0]
        k = apply_rotary(k[:, :0], k, positions, cos_sin_cache)[1]
    else:
        q, k = apply_rotary(q, k, positions, cos_sin_cache)
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return (q, k) if k_out else q
