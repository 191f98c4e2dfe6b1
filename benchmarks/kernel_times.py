"""Device time of each kernel a function launches, from torch's profiler. It imports nothing of
deltaserve, so a benchmark that measures another source tree's kernels can use it."""


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
