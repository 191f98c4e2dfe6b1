"""Causal depthwise conv1d over a ragged batch, reading and writing each sequence's conv state.

The conv state of a sequence is its last `kernel - 1` inputs, `[channels, kernel - 1]`, kept in
`conv_state[slot]`. A fresh sequence's slot is zero, which is the same as left zero-padding.
"""

import torch


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    capture_rows: list[tuple[int, int]] | None = None,
    conv_snapshots: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [T, C] rows of all sequences; weight: [C, K]; conv_state: [S, C, K-1] updated in place.
    Returns silu(conv(x)) [T, C].

    capture_rows: (row, snapshot_slot) pairs: the conv state as it stands after `row` (a global row
    index) is copied into `conv_snapshots[snapshot_slot]`.
    """
    out = torch.empty_like(x)
    kernel = weight.shape[1]
    starts, slots = query_start_loc.tolist(), state_slots.tolist()
    for b, slot in enumerate(slots):
        start, end = starts[b], starts[b + 1]
        if end == start:
            continue
        history = torch.cat([conv_state[slot].to(x.dtype), x[start:end].T], dim=1)  # [C, K-1+L]
        windows = history.unfold(1, kernel, 1)  # [C, L, K]
        out[start:end] = torch.nn.functional.silu((windows * weight[:, None, :]).sum(-1).T.float()).to(x.dtype)
        for row, snap in capture_rows or ():
            if start <= row < end:
                local = row - start + 1  # inputs consumed through `row`
                conv_snapshots[snap] = history[:, local : local + kernel - 1].to(conv_snapshots.dtype)
        conv_state[slot] = history[:, -(kernel - 1) :].to(conv_state.dtype)
    return out
