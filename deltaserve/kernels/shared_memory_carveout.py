"""Every Triton kernel of the process asks for the largest shared-memory carveout, the split of each
multiprocessor's unified L1 that cuBLAS's GEMMs run at.

A multiprocessor runs blocks of two kernels side by side only while both fit its current split of L1 and
shared memory; a kernel that asks for another split waits until the multiprocessor drains and is
reconfigured. Where a decode step's Triton kernel follows a cuBLAS GEMM or precedes one, that wait undoes
what programmatic dependent launch (pdl.py) gains at the boundary. Left to the driver, our kernels ran at
the GEMMs' split until cuDNN started in the process (torch's sdpa starts it for long fresh prompts), and at
another one after: each boundary with a GEMM then took about 0.45 us more and the Qwen3.5-9B shape's decode
graph 0.1 ms more from 17 rows on. Asked for explicitly, the split no longer depends on what else the
process has loaded (benchmarks/pdl_after_cudnn.py --carveout, warm_up_cost.py --chains).

Set once per kernel as Triton loads it (its kernel_load_end_hook), from the engine's start on: a kernel
loaded before that keeps the driver's choice. DELTASERVE_CARVEOUT=0 leaves every kernel to the driver."""

import ctypes
import functools
import logging
import os

log = logging.getLogger(__name__)

CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
MAX_SHARED = 100  # percent of the unified L1 given to shared memory (cudaSharedmemCarveoutMaxShared)


@functools.cache
def prefer_max_shared_memory() -> bool:
    """Installs the hook (once per process); whether it is installed."""
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("DELTASERVE_CARVEOUT") == "0":
        return False
    import triton

    hook = getattr(triton.knobs.runtime, "kernel_load_end_hook", None)
    if not hasattr(hook, "add"):
        log.warning("this Triton (%s) has no kernel load hook: its kernels keep the driver's shared-memory "
                    "carveout", triton.__version__)
        return False
    libcuda = ctypes.CDLL("libcuda.so.1")

    def set_carveout(module, function, *_) -> None:
        attribute, percent = CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, ctypes.c_int(MAX_SHARED)
        result = libcuda.cuFuncSetAttribute(ctypes.c_void_p(function), attribute, percent)
        if result != 0:
            raise RuntimeError(f"cuFuncSetAttribute(preferred shared-memory carveout) failed with CUresult {result}")

    hook.add(set_carveout)
    return True
