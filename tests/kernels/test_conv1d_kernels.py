import pytest
import torch

from deltaserve.kernels.conv1d import reference
from deltaserve.kernels.conv1d.triton_causal_conv1d import causal_conv1d
from tests.kernels.conftest import assert_close

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("kernel,block_t", [(4, 4), (3, None)])
def test_ragged_prefill_reads_and_writes_state_with_captures(kernel, block_t):
    channels, slots_total = 20, 6
    weight = torch.randn(channels, kernel)
    state = torch.randn(slots_total, channels, kernel - 1)
    lens = [1, 2, 13, 0, 5]
    starts = torch.tensor([0] + lens).cumsum(0)
    slots = torch.tensor([4, 0, 2, 5, 1])
    x = torch.randn(sum(lens), 2 * channels)[:, :channels]  # a slice of the fused projection
    captures = [(0, 0), (1, 1), (3, 2), (10, 3), (15, 4), (20, 5)]
    expected_state, out_state = state.clone(), state.clone()
    expected_snaps, snaps = torch.zeros(6, channels, kernel - 1), torch.zeros(6, channels, kernel - 1)
    expected = reference.causal_conv1d(x, weight, expected_state, slots, starts, captures, expected_snaps)
    out = causal_conv1d(x, weight, out_state, slots, starts, captures, snaps, block_c=16, block_t=block_t)
    assert_close(out, expected)
    assert_close(out_state, expected_state)
    assert_close(snaps, expected_snaps)


def test_captures_from_a_graphs_device_table():
    from deltaserve.kernels.capture_rows import GraphCaptureRows

    channels, kernel = 20, 4
    weight, state = torch.randn(channels, kernel), torch.randn(4, channels, kernel - 1)
    starts, slots = torch.tensor([0, 13, 18]), torch.tensor([2, 0])
    x = torch.randn(18, channels)
    captures = [(1, 0), (12, 3), (16, 1), (19, 2)]  # the last past the rows: an unused graph entry
    rows, snap_slots = [r for r, _ in captures], [s for _, s in captures]
    table = GraphCaptureRows(torch.tensor([rows, snap_slots, rows, snap_slots], dtype=torch.int32))
    expected_state, out_state = state.clone(), state.clone()
    expected_snaps, snaps = torch.zeros(4, channels, kernel - 1), torch.zeros(4, channels, kernel - 1)
    expected = causal_conv1d(x, weight, expected_state, slots, starts, captures, expected_snaps)
    out = causal_conv1d(x, weight, out_state, slots, starts, table, snaps)
    assert torch.equal(out, expected) and torch.equal(out_state, expected_state)
    assert torch.equal(snaps, expected_snaps) and snaps[[0, 1, 3]].abs().sum() > 0 and not snaps[2].any()


def test_single_token_update():
    channels, kernel = 24, 4
    weight = torch.randn(channels, kernel)
    state = torch.randn(5, channels, kernel - 1)
    x = torch.randn(3, channels)
    slots = torch.tensor([3, 1, 4])
    expected_state = state.clone()
    expected = reference.causal_conv1d(x, weight, expected_state, slots, torch.arange(4))
    for starts in (torch.arange(4), None):
        out_state = state.clone()
        assert_close(causal_conv1d(x, weight, out_state, slots, starts), expected)
        assert_close(out_state, expected_state)


@pytest.mark.parametrize("kernel,row_tiles", [(4, None), (4, (8, 16, 2)), (4, (3, 16, 1)), (3, (8, 16, 1))])
def test_long_prefill_by_row_tiles(kernel, row_tiles):
    """Runs of rows inside one sequence, across a sequence start, and across several; empty sequences."""
    channels = 20
    weight = torch.randn(channels, kernel)
    state = torch.randn(5, channels, kernel - 1)
    lens = [70, 1, 0, 2, 5]  # past 64 rows the conv runs over global row tiles
    starts = torch.tensor([0] + lens).cumsum(0)
    slots = torch.tensor([3, 1, 4, 0, 2])
    x = torch.randn(sum(lens), channels)
    captures = [(1, 0), (69, 1), (71, 2), (74, 3)]
    expected_state, out_state = state.clone(), state.clone()
    expected_snaps, snaps = torch.zeros(4, channels, kernel - 1), torch.zeros(4, channels, kernel - 1)
    expected = reference.causal_conv1d(x, weight, expected_state, slots, starts, captures, expected_snaps)
    out = causal_conv1d(x, weight, out_state, slots, starts, captures, snaps, row_tiles=row_tiles)
    assert_close(out, expected)
    assert_close(out_state, expected_state)
    assert_close(snaps, expected_snaps)


@pytest.mark.parametrize("rows", [12, 80])  # the per-sequence kernel, the row tiles
def test_a_graphs_pass_that_fills_its_rows_beside_an_empty_padding_sequence(rows):
    channels, kernel = 20, 4
    weight = torch.randn(channels, kernel)
    state = torch.randn(3, channels, kernel - 1)
    starts, slots = torch.tensor([0, rows, rows]), torch.tensor([1, 2])
    x = torch.randn(rows, channels)
    expected_state, out_state = state.clone(), state.clone()
    expected = reference.causal_conv1d(x, weight, expected_state, slots, starts)
    out = causal_conv1d(x, weight, out_state, slots, starts)
    assert_close(out, expected)
    assert_close(out_state, expected_state)
    assert torch.equal(out_state[[0, 2]], state[[0, 2]])  # the empty sequence's slot is as it was


def test_row_runs_shorten_for_short_passes():
    from deltaserve.kernels.conv1d.triton_causal_conv1d import MIN_ROW_PROGRAMS, ROW_TILES, row_tiles_for

    assert row_tiles_for(8192, 8192) == ROW_TILES  # a long prompt: the measured tiles
    rows, block_c, _ = row_tiles_for(96, 8192)  # a graph-replayed prefix-cache tail
    assert rows == 8 and -(-96 // rows) * (8192 // block_c) >= 256
    rows, block_c, _ = row_tiles_for(1024, 8192)
    assert rows < ROW_TILES[0] and -(-1024 // rows) * (8192 // block_c) >= MIN_ROW_PROGRAMS
