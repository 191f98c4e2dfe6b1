"""Chunked gated delta rule for prefill over a ragged batch, on flash-linear-attention's kernels: an
alternative to our own `triton_chunk.py`, kept to compare against it (benchmarks/kernels_check.py).

fla-core's `chunk_gated_delta_rule` already fuses what our layer needs (the gate
`-exp(A_log) * softplus(a + dt_bias)`, `sigmoid(b)`, q/k L2 norm, grouped value heads, ragged
`cu_seqlens`, initial and final states). What it lacks is ours to add around it:
- states live in `h_pool[state_slots]`: gathered before, scattered after;
- a state snapshot at a row inside a sequence: the sequence is cut after each capture row, and the
  pieces run in rounds (round j runs the j-th piece of every sequence), so a snapshot is the final
  state of the piece that ends at its row and the initial state of the next piece.
Its intermediates are bf16 (relative error about 1e-2 at the Qwen3.5 shapes, measured on the H200).
"""

import functools

import torch


@functools.cache
def fla_available() -> bool:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception:  # ImportError, or a driver error on a machine without a GPU
        return False
    return True


def split_at_captures(starts: list[int], slots: list[int], capture_rows) -> list[list[tuple]]:
    """Rounds of pieces (slot, first_row, end_row, [snapshot slots at end_row - 1]); empty sequences dropped."""
    snaps_at: dict[int, list[int]] = {}
    for row, snap in capture_rows or ():
        snaps_at.setdefault(row, []).append(snap)
    rounds: list[list[tuple]] = []
    for seq, slot in enumerate(slots):
        start, end = starts[seq], starts[seq + 1]
        cuts = sorted(r + 1 for r in snaps_at if start <= r < end - 1) + [end]
        lo = start
        for j, hi in enumerate(cuts):
            if len(rounds) <= j:
                rounds.append([])
            rounds[j].append((slot, lo, hi, snaps_at.get(hi - 1, []) if hi > lo else []))
            lo = hi
    return rounds


def chunk_gdn_fla(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, query_start_loc, capture_rows,
                  h_snapshots, fp32_inputs: bool = False) -> torch.Tensor:
    """Same contract as the reference `chunk_gated_delta_rule`. fp32_inputs runs fla-core on fp32 copies
    of q, k, v (its intermediates then follow in fp32)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

    tokens, hv, dv = v.shape
    out = torch.empty((tokens, hv, dv), dtype=v.dtype, device=v.device)
    if fp32_inputs:
        q, k, v = q.float(), k.float(), v.float()
    starts, slots = query_start_loc.tolist(), state_slots.tolist()
    for pieces in split_at_captures(starts, slots, capture_rows):
        pieces = [p for p in pieces if p[2] > p[1]]
        if not pieces:
            continue
        lengths = [hi - lo for _, lo, hi, _ in pieces]
        contiguous = all(pieces[i][2] == pieces[i + 1][1] for i in range(len(pieces) - 1))
        if contiguous:
            rows = slice(pieces[0][1], pieces[-1][2])
        else:
            rows = torch.cat([torch.arange(lo, hi) for _, lo, hi, _ in pieces]).to(q.device)
        cu_cpu = torch.tensor([0] + lengths, dtype=torch.long).cumsum(0)
        piece_slots = torch.tensor([p[0] for p in pieces], dtype=torch.long, device=q.device)
        o, final = fla_chunk(
            q[rows][None], k[rows][None], v[rows][None], a[rows].float()[None], b[rows].float()[None],
            initial_state=h_pool[piece_slots].float(), output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log.float(), dt_bias=dt_bias.float(),
            use_beta_sigmoid_in_kernel=True, cu_seqlens=cu_cpu.to(q.device), cu_seqlens_cpu=cu_cpu,
        )
        out[rows] = o[0].to(out.dtype)
        h_pool[piece_slots] = final.to(h_pool.dtype)
        for i, (_, _, _, snaps) in enumerate(pieces):
            for snap in snaps:
                h_snapshots[snap] = final[i].to(h_snapshots.dtype)
    return out
