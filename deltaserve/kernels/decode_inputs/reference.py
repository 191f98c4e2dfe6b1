"""A graph-replayed decode step's inputs, completed on the device from what one host-to-device copy
brought (see StepBuffers.load_decode).

- input_ids[r] becomes sampled_tokens[token_sources[r]] where that source is >= 0: the token the step
  before sampled in that row, which the host has not read back yet (asynchronous scheduling); rows with
  source -1 keep the id the host wrote.
- block_tables[r, :width] becomes packed_blocks[r * width : (r + 1) * width], `width` being the device
  scalar block_width (the widest table of the step); the columns past it are left as they were, since
  no kernel reads past its row's length.

Only static shapes and no read-back, so a CUDA graph can hold it."""

import torch


def unpack_decode_inputs(input_ids: torch.Tensor, token_sources: torch.Tensor, sampled_tokens: torch.Tensor,
                         packed_blocks: torch.Tensor, block_width: torch.Tensor, block_tables: torch.Tensor) -> None:
    pending = token_sources >= 0
    taken = sampled_tokens.index_select(0, token_sources.clamp(min=0, max=sampled_tokens.numel() - 1))
    input_ids.copy_(torch.where(pending, taken, input_ids))
    rows, cols = block_tables.shape
    row = torch.arange(rows, device=block_tables.device).unsqueeze(1)
    col = torch.arange(cols, device=block_tables.device).unsqueeze(0)
    inside = col < block_width
    index = (row * block_width + col).clamp(max=packed_blocks.numel() - 1)
    block_tables.copy_(torch.where(inside, packed_blocks[index], block_tables))
