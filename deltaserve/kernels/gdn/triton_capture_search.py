"""The GDN chunk kernels' search of a step's capture table (`capture_rows.CaptureRows.distinct_rows`:
the distinct captured rows, sorted) from inside a program, so that finding a sequence's or a chunk's
first capture costs no launch of its own: built from the host (`capture_rows.capture_tables`), that
index was a search, a copy and two fills per GDN layer.

The token loop (`triton_recurrent.py`) keeps the host-built index: with this search at its start, its
one-warp programs took 20.1 against 18.7 us on a 16-row pass and 76.9 against 62.3 on an 80-row one
(H200, kernels_check gdn_short_pass_16/80 twice each; kernels_check_short_pass_at_b0511ba.json against
kernels_check_short_pass_token_loop_search_at_0d99b3a.json)."""

import triton
import triton.language as tl


@triton.jit
def captures_before(cap_rows, num_caps, row, BLOCK_CAPS: tl.constexpr):
    """How many of the `num_caps` distinct, sorted capture rows come before `row`: the index of the
    first capture at or after it (BLOCK_CAPS: a power of two >= num_caps)."""
    c = tl.arange(0, BLOCK_CAPS)
    return tl.sum((tl.load(cap_rows + c, mask=c < num_caps, other=2147483647) < row).to(tl.int32), 0)


def block_caps(num_caps: int) -> int:
    """BLOCK_CAPS for a table of num_caps rows."""
    return max(16, triton.next_power_of_2(num_caps))
