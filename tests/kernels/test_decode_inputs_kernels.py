"""unpack_decode_inputs: the Triton kernel against the torch reference, and both against the rows
written out by hand, on fresh random steps (rows with and without a pending token, tables of random
widths, one wider than a program's block)."""

import pytest
import torch

from deltaserve.kernels.decode_inputs import reference
from deltaserve.kernels.decode_inputs.triton_unpack_decode_inputs import BLOCK, unpack_decode_inputs

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("rows, width", [(1, 1), (5, 3), (7, BLOCK + 9)])
def test_unpack_takes_pending_tokens_and_spreads_the_packed_tables(rows, width):
    max_blocks = width + int(torch.randint(0, 5, ()))
    sampled = torch.randint(0, 50000, (rows + 3,))
    sources = torch.where(torch.rand(rows) < 0.5, torch.randint(0, rows + 3, (rows,)), torch.full((rows,), -1))
    given = torch.randint(0, 50000, (rows,))
    packed = torch.randint(0, 9000, (rows * width + 11,))  # what follows the step's rows is stale
    width_t = torch.tensor(width)
    stale = torch.randint(0, 9000, (rows, max_blocks))
    ids_ref, tables_ref = given.clone(), stale.clone()
    reference.unpack_decode_inputs(ids_ref, sources, sampled, packed, width_t, tables_ref)
    ids, tables = given.clone(), stale.clone()
    unpack_decode_inputs(ids, sources, sampled, packed, width_t, tables)
    assert torch.equal(ids, ids_ref) and torch.equal(tables, tables_ref)
    for r in range(rows):
        assert int(ids[r]) == (int(sampled[sources[r]]) if sources[r] >= 0 else int(given[r]))
        assert tables[r, :width].tolist() == packed[r * width : (r + 1) * width].tolist()
        assert torch.equal(tables[r, width:], stale[r, width:])  # columns past the step's width: untouched
