"""The conv state as a ring (kernels/conv1d/reference.py): a sequence fed in random chunks, with
snapshots restored into other slots on the way, gives the conv of the whole sequence at once."""

import random

import torch

from deltaserve.kernels.conv1d.reference import causal_conv1d


def _whole(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(causal conv) of one whole sequence, zero-padded on the left: the definition."""
    kernel = weight.shape[1]
    padded = torch.cat([torch.zeros(kernel - 1, x.shape[1]), x])
    return torch.nn.functional.silu(torch.stack([(padded[t : t + kernel].T * weight).sum(-1)
                                                 for t in range(x.shape[0])]))


def test_chunks_and_restored_snapshots_give_the_whole_sequence_conv():
    channels, kernel, length = 6, random.choice([2, 3, 4]), random.randrange(20, 60)
    weight, x = torch.randn(channels, kernel), torch.randn(length, channels)
    state, snapshots = torch.zeros(3, channels, kernel), torch.zeros(2, channels, kernel)
    slot, done, out = 0, 0, []
    while done < length:
        rows = min(random.choice([1, 1, 2, 3, 7]), length - done)
        capture = random.randrange(rows)  # the state after this row of the chunk, saved on the way
        out.append(causal_conv1d(x[done : done + rows], weight, state, torch.tensor([slot]), torch.tensor([0, rows]),
                                 torch.tensor([done + rows]), [(capture, 0)], snapshots))
        done += rows
        if random.random() < 0.3 and capture == rows - 1:  # continue in another slot, from the snapshot
            slot = (slot + 1) % 3
            state[slot] = snapshots[0]
    torch.testing.assert_close(torch.cat(out), _whole(x, weight))


def test_a_step_writes_only_the_column_of_its_new_input():
    """What lets a fused decode step's programs read a channel's old inputs while one writes: column
    p % K of a one-token step at position p is the only one that changes."""
    channels, kernel, position = 5, 4, random.randrange(0, 100)
    state = torch.randn(1, channels, kernel)
    before = state.clone()
    causal_conv1d(torch.randn(1, channels), torch.randn(channels, kernel), state, torch.tensor([0]),
                  torch.tensor([0, 1]), torch.tensor([position + 1]))
    changed = (state != before).any(1)[0].nonzero().flatten().tolist()
    assert changed == [position % kernel]
