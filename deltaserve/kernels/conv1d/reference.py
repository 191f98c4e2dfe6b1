"""Causal depthwise conv1d over a ragged batch, reading and writing each sequence's conv state.

The conv state of a sequence is a ring of its last `kernel` inputs, `[channels, kernel]`, kept in
`conv_state[slot]`: the input at position p sits in column p % kernel. After the sequence's token at
position e, the ring holds the inputs at positions e - kernel + 1 ... e (zeros before position 0: a
fresh sequence's slot is zero, which is the same as left zero-padding).

A ring rather than the last kernel - 1 inputs in order: one token's update writes only column p % kernel,
which holds input p - kernel, read by no tap of that token. So the programs of a fused decode step may
all read a channel's old inputs while one of them writes the new input, with no order between them.
"""

import torch


def ring_columns(first_position: int, count: int, kernel: int) -> list[int]:
    """Ring columns of `count` consecutive positions from `first_position` (which may be negative)."""
    return [(first_position + i) % kernel for i in range(count)]


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    capture_rows: list[tuple[int, int]] | None = None,
    conv_snapshots: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [T, C] rows of all sequences; weight: [C, K]; conv_state: [S, C, K] rings updated in place;
    seq_lens [B]: each sequence's length after this step (its rows are its last positions).
    Returns silu(conv(x)) [T, C].

    capture_rows: (row, snapshot_slot) pairs: the ring as it stands after `row` (a global row index)
    is copied into `conv_snapshots[snapshot_slot]`.
    """
    out = torch.empty_like(x)
    kernel = weight.shape[1]
    starts, slots, lens = query_start_loc.tolist(), state_slots.tolist(), seq_lens.tolist()
    for b, slot in enumerate(slots):
        start, end = starts[b], starts[b + 1]
        if end == start:
            continue
        first = lens[b] - (end - start)  # position of the sequence's first row in this step
        # column i of the history: the input at position first - (K-1) + i
        old = conv_state[slot][:, ring_columns(first - (kernel - 1), kernel - 1, kernel)]
        history = torch.cat([old.to(x.dtype), x[start:end].T], dim=1)  # [C, K-1+L]
        windows = history.unfold(1, kernel, 1)  # [C, L, K]
        out[start:end] = torch.nn.functional.silu((windows * weight[:, None, :]).sum(-1).T.float()).to(x.dtype)
        for row, snap in capture_rows or ():
            if start <= row < end:
                local = row - start  # the window of the K inputs through `row`
                conv_snapshots[snap][:, ring_columns(first + local - (kernel - 1), kernel, kernel)] = (
                    history[:, local : local + kernel].to(conv_snapshots.dtype))
        last = lens[b] - 1
        conv_state[slot][:, ring_columns(last - (kernel - 1), kernel, kernel)] = (
            history[:, -kernel:].to(conv_state.dtype))
    return out
