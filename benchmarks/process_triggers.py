"""What a process can do besides the engine's work that might change how fast the engine's decode steps run:
start cuDNN (cudnnCreate, one convolution, one fresh-prefill attention call, or only its libraries loaded),
start another cuBLASLt handle, cuFFT or cuSOLVER, make streams, mapped host buffers or raw device buffers,
or run one kernel on a stream of its own. Each is one call for warm_up_cost.py and pdl_after_cudnn.py to
make between two timings; `api_calls` records the CUDA calls one of them makes."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os

import torch

from deltaserve.kernels.attention.fresh_prefill import causal_attention_fresh


def cudart():
    """The CUDA runtime library torch loaded, or None."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def runtime():
    """The CUDA runtime library, for a trigger that must reach it."""
    lib = cudart()
    if lib is None:
        raise RuntimeError("no CUDA runtime library found")
    return lib


def libcuda():
    """The CUDA driver library, or None."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def loaded_path(soname: str) -> str | None:
    """Where a shared library that the process has loaded lies (/proc/self/maps), or None."""
    with open("/proc/self/maps") as maps:
        return next((line.split()[-1] for line in maps if soname in line), None)


def cudnn_libraries() -> list[str]:
    """cuDNN's sub-libraries loaded into the process (what cudnnCreate loads), no cuDNN call made."""
    cudnn = loaded_path("libcudnn.so")
    if cudnn is None:
        raise RuntimeError("libcudnn is not loaded")
    names = sorted(glob.glob(os.path.join(os.path.dirname(cudnn), "libcudnn_*.so*")))
    for name in names:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    return [os.path.basename(n) for n in names]


def cublaslt_handle() -> None:
    """A second cuBLASLt handle, as a library that brings its own would create."""
    lib = ctypes.CDLL(loaded_path("libcublasLt.so") or "libcublasLt.so")
    handle = ctypes.c_void_p()
    if lib.cublasLtCreate(ctypes.byref(handle)) != 0:
        raise RuntimeError("cublasLtCreate failed")


def fresh_attention(backend: str, rows: int = 2048) -> None:
    """One fresh-prefill attention call (causal_attention_fresh) at the 9B shape's heads, outside the
    engine: `default` lets torch's sdpa pick its backend (cuDNN's on the H200), `flash` and `cudnn` pin
    one, `cudnn-side-stream` runs cuDNN's on a stream of its own."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(rows, 16, 256, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(rows, 4, 256, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    pinned = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "cudnn-side-stream": SDPBackend.CUDNN_ATTENTION}.get(backend)
    side = torch.cuda.Stream() if backend.endswith("side-stream") else None
    with sdpa_kernel(pinned) if pinned is not None else contextlib.nullcontext():
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            causal_attention_fresh(q, k, v, [0, rows], 256**-0.5)
    torch.cuda.synchronize()


def cudnn_convolution() -> None:
    """One convolution through cuDNN (its library and handle brought up with no attention kernel run)."""
    x = torch.randn(8, 64, 32, 32, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(64, 64, 3, 3, dtype=torch.bfloat16, device="cuda")
    torch.nn.functional.conv2d(x, w, padding=1)
    torch.cuda.synchronize()


def cudnn_handle() -> None:
    """cudnnCreate and nothing else: cuDNN's own start-up (its sub-libraries loaded), no kernel of it run."""
    lib = ctypes.CDLL("libcudnn.so.9")  # torch has it loaded already; this finds that copy
    handle = ctypes.c_void_p()
    if lib.cudnnCreate(ctypes.byref(handle)) != 0:
        raise RuntimeError("cudnnCreate failed")
    torch.cuda.synchronize()


def create_streams(count: int) -> None:
    """`count` non-blocking streams made with cudaStreamCreateWithFlags, as cudnnCreate makes 16, never used."""
    lib = runtime()
    for _ in range(count):
        stream = ctypes.c_void_p()
        if lib.cudaStreamCreateWithFlags(ctypes.byref(stream), ctypes.c_uint(1)) != 0:  # cudaStreamNonBlocking
            raise RuntimeError("cudaStreamCreateWithFlags failed")
    torch.cuda.synchronize()


def mapped_host_buffer(nbytes: int = 1 << 20) -> None:
    """A mapped pinned host buffer and its device pointer (cudaHostAlloc, cudaHostGetDevicePointer), as
    cudnnCreate makes one, never used."""
    lib = runtime()
    host, device = ctypes.c_void_p(), ctypes.c_void_p()
    if lib.cudaHostAlloc(ctypes.byref(host), ctypes.c_size_t(nbytes), ctypes.c_uint(2)) != 0:  # cudaHostAllocMapped
        raise RuntimeError("cudaHostAlloc failed")
    if lib.cudaHostGetDevicePointer(ctypes.byref(device), host, ctypes.c_uint(0)) != 0:
        raise RuntimeError("cudaHostGetDevicePointer failed")
    torch.cuda.synchronize()


def raw_device_buffers(nbytes: int) -> None:
    """Two device buffers from cudaMalloc itself (not torch's allocator), each cleared, the first freed:
    cudnnCreate's memory calls (cudaMalloc 2, cudaMemsetAsync 2, cudaFree 1) at a chosen size."""
    lib = runtime()
    buffers = [ctypes.c_void_p(), ctypes.c_void_p()]
    for buffer in buffers:
        if lib.cudaMalloc(ctypes.byref(buffer), ctypes.c_size_t(nbytes)) != 0:
            raise RuntimeError("cudaMalloc failed")
        if lib.cudaMemsetAsync(buffer, 0, ctypes.c_size_t(nbytes), None) != 0:
            raise RuntimeError("cudaMemsetAsync failed")
    torch.cuda.synchronize()
    lib.cudaFree(buffers[0])


def side_stream_kernel() -> None:
    """One small torch kernel on a stream of its own, the rest of the process's work staying on its stream."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.zeros(1 << 20, device="cuda").add_(1)
    torch.cuda.synchronize()


def side_stream_memset(nbytes: int = 4 << 20) -> None:
    """One cudaMemsetAsync on a stream of its own (no kernel of torch's), as cuDNN may clear its buffers on
    one of the streams it makes."""
    lib = runtime()
    stream, buffer = ctypes.c_void_p(), ctypes.c_void_p()
    if lib.cudaStreamCreateWithFlags(ctypes.byref(stream), ctypes.c_uint(1)) != 0:
        raise RuntimeError("cudaStreamCreateWithFlags failed")
    if lib.cudaMalloc(ctypes.byref(buffer), ctypes.c_size_t(nbytes)) != 0:
        raise RuntimeError("cudaMalloc failed")
    if lib.cudaMemsetAsync(buffer, 0, ctypes.c_size_t(nbytes), stream) != 0:
        raise RuntimeError("cudaMemsetAsync failed")
    torch.cuda.synchronize()


def destroyed_stream_kernel() -> None:
    """side_stream_kernel on a stream from cudaStreamCreate that is destroyed once the kernel is done: whether
    the cost outlives the stream."""
    lib = runtime()
    stream = ctypes.c_void_p()
    if lib.cudaStreamCreateWithFlags(ctypes.byref(stream), ctypes.c_uint(1)) != 0:
        raise RuntimeError("cudaStreamCreateWithFlags failed")
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.value)):
        torch.zeros(1 << 20, device="cuda").add_(1)
    torch.cuda.synchronize()
    if lib.cudaStreamDestroy(stream) != 0:
        raise RuntimeError("cudaStreamDestroy failed")
    torch.cuda.synchronize()


def other_library(name: str) -> None:
    """One small call into another CUDA library that torch brings up on first use, as it brings up cuDNN:
    cuFFT (`cufft`) or cuSOLVER (`cusolver`)."""
    x = torch.randn(64, 64, device="cuda", dtype=torch.float32)
    if name == "cufft":
        torch.fft.fft(x)
    else:
        torch.linalg.cholesky(x @ x.T + 64 * torch.eye(64, device="cuda"))
    torch.cuda.synchronize()


def api_calls(fn) -> dict[str, int]:
    """The CUDA runtime and driver calls that `fn()` makes, as CUPTI records them: {name: count}."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
    counts: dict[str, int] = {}
    for event in prof.events():
        if event.device_type.name == "CPU" and event.name.startswith("cu"):
            counts[event.name] = counts.get(event.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
