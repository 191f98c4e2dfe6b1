"""Torch reference of the gated delta rule over a ragged batch whose states live in slots.

State per sequence and value head: S [Dk, Dv] (fp32). Per token t:
    S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
with q, k L2-normalised and q scaled by Dk^-1/2. Value heads are grouped over key heads
(value head h reads key head h // (Hv / Hk)).

`chunk_gated_delta_rule` is the chunked (WY) algorithm used for prefill; `recurrent_gated_delta_rule`
is the one-token-per-sequence step used for decode. Both read the initial state from
`h_pool[state_slots[b]]` and write the final state back there.
"""

import torch

from deltaserve.kernels.gdn.gating import gdn_gating, l2_normalize

CHUNK = 64


def _prepare(q, k, v, a, b, A_log, dt_bias):
    """fp32 per-token inputs in head-major layout: q,k [Hv, T, Dk], v [Hv, T, Dv], g,beta [Hv, T]."""
    group = v.shape[1] // q.shape[1]
    q = l2_normalize(q.float()).repeat_interleave(group, dim=1) * q.shape[-1] ** -0.5
    k = l2_normalize(k.float()).repeat_interleave(group, dim=1)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    return q.transpose(0, 1), k.transpose(0, 1), v.float().transpose(0, 1), g.T, beta.T


def chunk_gated_delta_rule(
    q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, query_start_loc,
    capture_rows: list[tuple[int, int]] | None = None,
    h_snapshots: torch.Tensor | None = None,
    store_state: bool | torch.Tensor = True,
) -> torch.Tensor:
    """q,k [T, Hk, Dk]; v [T, Hv, Dv]; a,b [T, Hv]; h_pool [S, Hv, Dk, Dv] fp32. Returns o [T, Hv, Dv].

    capture_rows: (row, snapshot_slot) pairs: the state after global row `row` is copied into
    `h_snapshots[snapshot_slot]`, wherever that row falls inside a chunk. store_state=False leaves h_pool as it
    was (a verify step, whose kept rows commit_gated_delta_rule runs through the state later); a [B] tensor
    leaves it so for the sequences whose entry is 0 (a pass's verify chunks beside its prompt chunks).
    """
    qh, kh, vh, g, beta = _prepare(q, k, v, a, b, A_log, dt_bias)
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    starts, slots = query_start_loc.tolist(), state_slots.tolist()
    stores = store_state.tolist() if isinstance(store_state, torch.Tensor) else [store_state] * len(slots)
    for seq, slot in enumerate(slots):
        start, end = starts[seq], starts[seq + 1]
        state = h_pool[slot].float()
        for c in range(start, end, CHUNK):
            rows = slice(c, min(c + CHUNK, end))
            captures = [(r - c, s) for r, s in capture_rows or () if rows.start <= r < rows.stop]
            o, state = _chunk(qh[:, rows], kh[:, rows], vh[:, rows], g[:, rows], beta[:, rows], state,
                              captures, h_snapshots)
            out[rows] = o.transpose(0, 1)
        if stores[seq]:
            h_pool[slot] = state.to(h_pool.dtype)
    return out.to(v.dtype)


def commit_gated_delta_rule(k, v, a, b, A_log, dt_bias, h_all, state_slots, row_count, rows_per_seq: int) -> None:
    """k [L, T, Hk, Dk], v [L, T, Hv, Dv], a,b [L, T, Hv]: each layer's rows, sequence i's from i * rows_per_seq;
    A_log, dt_bias [L, Hv]; h_all [L, S, Hv, Dk, Dv]. Sequence i's state h_all[:, state_slots[i]] goes through its
    first row_count[i] rows in every layer, as a pass over those rows alone would take it."""
    counts = row_count.tolist()
    kept = [i for i, count in enumerate(counts) if count]
    if not kept:
        return
    rows = torch.tensor([i * rows_per_seq + j for i in kept for j in range(counts[i])], device=k.device)
    query_start_loc = torch.tensor([0] + [counts[i] for i in kept], device=k.device).cumsum(0)
    slots = state_slots[torch.tensor(kept, device=state_slots.device)]
    for layer in range(k.shape[0]):
        k_rows = k[layer, rows]
        chunk_gated_delta_rule(torch.zeros_like(k_rows), k_rows, v[layer, rows], a[layer, rows], b[layer, rows],
                               A_log[layer], dt_bias[layer], h_all[layer], slots, query_start_loc)


def _chunk(q, k, v, g, beta, state, captures, h_snapshots):
    """One chunk of C rows for all heads. q,k [H, C, Dk]; v [H, C, Dv]; g,beta [H, C]; state [H, Dk, Dv]."""
    size = q.shape[1]
    cum = g.cumsum(-1)  # log decay from the chunk start through row i
    decay = (cum[:, :, None] - cum[:, None, :]).tril().exp().tril()  # exp(G_i - G_j) for j <= i
    strict = torch.ones(size, size, dtype=torch.bool, device=q.device).tril(-1)
    kk = (k @ k.transpose(-1, -2)) * decay * beta[:, :, None]
    system = torch.eye(size, device=q.device) + kk * strict  # (I + A), unit lower triangular
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k * (beta * cum.exp())[..., None], upper=False, unitriangular=True)
    v_new = u - w @ state  # the part of each value the carried state does not already predict
    qk = (q @ k.transpose(-1, -2)) * decay  # includes the diagonal
    out = (q * cum.exp()[..., None]) @ state + qk @ v_new
    for row, snap in captures:
        h_snapshots[snap] = _state_after(row, k, v_new, cum, state).to(h_snapshots.dtype)
    return out, _state_after(size - 1, k, v_new, cum, state)


def _state_after(row, k, v_new, cum, state):
    """State after local `row`: exp(G_row) S0 + sum_{j<=row} exp(G_row - G_j) k_j v_new_j^T."""
    upto = slice(0, row + 1)
    weights = (cum[:, row : row + 1] - cum[:, upto]).exp()
    return cum[:, row].exp()[:, None, None] * state + (k[:, upto] * weights[..., None]).transpose(-1, -2) @ v_new[:, upto]


def recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots) -> torch.Tensor:
    """One token per sequence: q,k [B, Hk, Dk]; v [B, Hv, Dv]. Updates h_pool[state_slots] in place."""
    qh, kh, vh, g, beta = _prepare(q, k, v, a, b, A_log, dt_bias)  # [Hv, B, ...]
    state = h_pool[state_slots].float().transpose(0, 1)  # [Hv, B, Dk, Dv]
    state = state * g.exp()[..., None, None]
    predicted = (state * kh[..., None]).sum(-2)
    delta = (vh - predicted) * beta[..., None]
    state = state + kh[..., None] * delta[..., None, :]
    out = (state * qh[..., None]).sum(-2)  # [Hv, B, Dv]
    h_pool[state_slots] = state.transpose(0, 1).to(h_pool.dtype)
    return out.transpose(0, 1).to(v.dtype)
