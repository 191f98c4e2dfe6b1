"""Programmatic dependent launch (sm_90 and later) for the kernels of a decode step.

A decode step of a 2048-wide MoE model at one sequence is some 440 short kernels; between two of them
the GPU drains one grid and only then launches the next. Launched with `launch_pdl`, a kernel's grid
is set up while the one before it still runs: its programs start once every program of the one before
has signalled (`gdc_launch_dependents`), and wait (`gdc_wait`) until that grid has finished and its
writes are visible before they touch memory. Every kernel that takes part waits first thing, so what
it reads and overwrites is as a plain launch would find it; one launched without it waits as before.
CUDA graphs capture the dependency, so replayed steps keep it. Once cuDNN has started in the process
(attention/fresh_prefill.py), the gain is gone where cuBLAS runs the output and down projections (the
9B shape from 17 rows), and kept where the skinny GEMM does: before it, a cuBLAS GEMM starts under the
tail of the kernel before it and the kernel after it under the GEMM's; after it, both wait about 0.45 us.
The graph's edges stay as captured (cuBLAS launches its GEMMs without dependent launch); chains of these
kernels in a process of their own wait so from the start unless their Triton kernels ask for the largest
shared-memory carveout, which in the engine cost the GDN decode its L1 and did not keep the gain. Any
work on a second stream of the process (one small kernel, one memset) takes the gain as cudnnCreate does,
whichever stream the steps run on (README, benchmarks/graph_edges.py, benchmarks/pdl_after_cudnn.py,
benchmarks/warm_up_cost.py).
"""

import functools
import os

import torch
import triton
import triton.language as tl


@functools.cache
def _options(device_index: int) -> dict:
    """Read once per device: the environment is the process's, the capability the card's."""
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("DELTASERVE_PDL") == "0":
        return {}
    if torch.cuda.get_device_capability(device_index)[0] < 9:
        return {}
    return {"USE_PDL": True, "launch_pdl": True}


def launch_options(x: torch.Tensor) -> dict:
    """Keyword arguments for a participating kernel's launch (splat, never changed): PDL where the GPU
    has it, not under Triton's interpreter, nor with DELTASERVE_PDL=0."""
    if not x.is_cuda:
        return {}
    return _options(x.device.index if x.device.index is not None else torch.cuda.current_device())


@triton.jit
def wait_for_prior_grid(USE_PDL: tl.constexpr):
    """First statement of a participating kernel: wait for the grid before to finish, then let the next
    one start launching."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_for_prior_grid_only(USE_PDL: tl.constexpr):
    """First statement of a kernel that starts early but lets the next grid launch only once it ends. The
    SiLU-and-multiply between the 9B shape's gate/up and down projections: releasing the down projection's
    skinny GEMM at its start made that GEMM take 32.5-34.0 us against 26.7 at one row (CUPTI traces,
    warm_up_cost_qwen3.5-9b_cudnn_handle_c1_trace_at_*.json), and the step 4.651-4.661 against 4.484-4.487
    ms (engine_qwen3.5-9b_silu_pdl_same_machine.json)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
