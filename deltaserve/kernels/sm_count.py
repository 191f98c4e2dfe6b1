"""How many multiprocessors a device has: the kernels that size their tiles or key splits to fill the
GPU once read it here."""

import functools

import torch

H200_SMS = 132  # the interpreter's answer: tests then tile and split as the H200 does


@functools.cache
def _cuda_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return H200_SMS
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
