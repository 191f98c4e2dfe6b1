"""Device time of a function's calls (CUDA events) and of each kernel it launches (torch's profiler). It
imports nothing of deltaserve, so a benchmark that measures another source tree's kernels can use it."""


def time_us(fn, calls: int = 10, warm: int = 1) -> float:
    """Microseconds a call over `calls` calls back to back (launches included), after `warm` calls."""
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / calls


def per_kernel_us(fn, calls: int = 3) -> dict:
    """Mean device time of each kernel `fn` launches over `calls` calls, by kernel name (us)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if total and event.count:
            out[event.key] = round(total / calls, 1)
    return out
