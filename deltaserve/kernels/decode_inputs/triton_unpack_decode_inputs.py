"""unpack_decode_inputs (see reference.py) in one launch, a program per row: the first kernel of every
decode graph. Launched from the host, the same work took a host-to-device copy of the pending rows,
an index_select, an index_copy, and a second copy for the block tables with a kernel spreading it over
the table's rows, all between two graphs."""

import torch
import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def _unpack_decode_inputs_kernel(input_ids, token_sources, sampled_tokens, packed_blocks, block_width, block_tables,
                                 stride_table, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    source = tl.load(token_sources + row)
    if source >= 0:
        tl.store(input_ids + row, tl.load(sampled_tokens + source))
    width = tl.load(block_width)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < width
        blocks = tl.load(packed_blocks + row * width + cols, mask=mask)
        tl.store(block_tables + row * stride_table + cols, blocks, mask=mask)


def unpack_decode_inputs(input_ids: torch.Tensor, token_sources: torch.Tensor, sampled_tokens: torch.Tensor,
                         packed_blocks: torch.Tensor, block_width: torch.Tensor, block_tables: torch.Tensor) -> None:
    rows = block_tables.shape[0]
    assert input_ids.shape[0] == token_sources.shape[0] == rows and block_tables.stride(1) == 1
    _unpack_decode_inputs_kernel[(rows,)](input_ids, token_sources, sampled_tokens, packed_blocks, block_width,
                                          block_tables, block_tables.stride(0), BLOCK=BLOCK)
