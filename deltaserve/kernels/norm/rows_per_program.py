"""How many rows of a norm one program takes.

The norms ran one row per program, which suits wide rows (the hidden stream, 2048-4096 columns). With
narrow rows it left each program 256-512 bytes to move: the per-head norms of a prefill ([T, H, D],
D = 128 or 256). The GDN output norm of an 8k-token prompt (262144 rows of 128) ran at 0.64 TB/s, 316 us
a layer on the H200, and the attention q norm (16 heads of 256) at 0.85 TB/s; in tiles of 4096 values,
50.7 and 34.0 us (about 3.95 TB/s; kernels_check norm_row_tiles). Narrow rows are packed into tiles of
up to TILE_ELEMENTS, but only as far as the batch still gives every SM a few programs, so a decode
step's few rows keep one row a program.
"""

TILE_ELEMENTS = 4096
MIN_PROGRAMS = 512  # about four programs per SM of the H200 (132)


def rows_per_program(rows: int, block: int) -> int:
    """A power of two: 1 for wide rows (block >= 1024) or few of them."""
    if block >= 1024:
        return 1
    by_programs = max(rows // MIN_PROGRAMS, 1)
    return min(TILE_ELEMENTS // block, 1 << (by_programs.bit_length() - 1))


def warps_for(block_rows: int, block: int) -> int:
    """Warps for a [block_rows, block] tile: one per 256 elements, 1 to 8."""
    return min(max(block_rows * block // 256, 1), 8)
