"""vLLM's profiler_config (--profiler-config) and the engine's profiling between start_profile and stop_profile:
torch's profiler over the engine's steps, its trace written to torch_profiler_dir when it stops, or the CUDA
profiler's capture range (cudaProfilerStart/Stop, for `nsys profile --capture-range=cudaProfilerApi`).
delay_iterations steps pass before it starts; max_iterations steps (0: no limit) end it early."""

from __future__ import annotations

import dataclasses
import gzip
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

import torch

from deltaserve.errors import DeltaServeError

log = logging.getLogger(__name__)

PROFILERS = ("torch", "cuda")


@dataclass
class ProfilerConfig:
    """vLLM's fields of the same names. Its schedule (wait/warmup/active iterations) and the front end's own trace
    (ignore_frontend) are taken and do nothing here: every step between start and stop is traced."""

    profiler: str | None = None
    torch_profiler_dir: str = ""
    torch_profiler_with_stack: bool = True
    torch_profiler_with_flops: bool = False
    torch_profiler_use_gzip: bool = True
    torch_profiler_dump_cuda_time_total: bool = True
    torch_profiler_record_shapes: bool = False
    torch_profiler_with_memory: bool = False
    ignore_frontend: bool = False
    delay_iterations: int = 0
    max_iterations: int = 0
    warmup_iterations: int = 0
    active_iterations: int = 5
    wait_iterations: int = 0

    @classmethod
    def from_value(cls, value: Any) -> ProfilerConfig | None:
        """A ProfilerConfig, a dict of its fields (the command line's JSON), or None (no profiling)."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise DeltaServeError(f"profiler_config={value!r:.80}: give a dict of vLLM's ProfilerConfig fields")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise DeltaServeError(f"profiler_config.{unknown[0]}: not one of vLLM's ProfilerConfig fields "
                                  f"({', '.join(sorted(known))})")
        config = cls(**value)
        config.validate()
        return config

    def validate(self) -> None:
        if self.profiler is not None and self.profiler not in PROFILERS:
            raise DeltaServeError(f"profiler_config.profiler={self.profiler!r}: give 'torch' or 'cuda'")
        if self.profiler == "torch" and not self.torch_profiler_dir:
            raise DeltaServeError("profiler_config.torch_profiler_dir: the torch profiler needs a directory for "
                                  "its traces")
        if self.profiler == "torch":  # made now, so that a path that cannot be one ends the start, not a trace
            self.torch_profiler_dir = os.path.abspath(os.path.expanduser(self.torch_profiler_dir))
            try:
                os.makedirs(self.torch_profiler_dir, exist_ok=True)
            except OSError as exc:
                raise DeltaServeError(f"profiler_config.torch_profiler_dir={self.torch_profiler_dir!r}: cannot be "
                                      f"made a directory ({exc.strerror or exc})") from None
        for name in ("delay_iterations", "max_iterations", "warmup_iterations", "wait_iterations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DeltaServeError(f"profiler_config.{name}={value!r}: must be an integer of at least 0")


class ProfilerError(DeltaServeError):
    """The profiler failed to start, or to stop and write its trace; the engine serves on."""


class StepProfiler:
    """Profiles the engine's steps between start() and stop(); step() is called once a step. A profiler that
    fails is let go and logged where a step ended it, and raised as ProfilerError to a start or stop call: it
    never fails a step."""

    def __init__(self, config: ProfilerConfig, device: torch.device):
        if config.profiler == "cuda" and device.type != "cuda":
            raise DeltaServeError("profiler_config.profiler='cuda': the CUDA profiler needs the engine on a GPU "
                                  f"(it runs on {device.type}); the torch profiler traces a CPU engine")
        self.config = config
        self.device = device
        self.active = False  # between start and stop
        self._running = False  # the profiler itself records
        self._steps = 0  # since start
        self._traced = 0  # recorded
        self._prefix: str | None = None
        self._torch: torch.profiler.profile | None = None
        self.last_trace: str | None = None  # where the last torch trace was written

    def start(self, prefix: str | None = None) -> None:
        if self.active:
            log.info("start_profile while profiling: ignored")
            return
        self.active, self._steps, self._traced, self._prefix = True, 0, 0, prefix
        if self.config.delay_iterations == 0:
            self._begin()

    def step(self) -> None:
        if not self.active:
            return
        self._steps += 1
        try:
            if not self._running and self._steps == self.config.delay_iterations:
                self._begin()
                return
            if self._running:
                self._traced += 1
                if self.config.max_iterations and self._traced >= self.config.max_iterations:
                    log.info("profiler: %d steps traced, stopping", self._traced)
                    self._end()
        except ProfilerError:
            log.warning("the profiler failed after a step; profiling is off until the next start_profile",
                        exc_info=True)
            self.active = False

    def stop(self) -> None:
        if not self.active:
            log.info("stop_profile while not profiling: ignored")
            return
        self.active = False
        if self._running:
            self._end()

    def _begin(self) -> None:
        try:
            self._start_profiler()
        except Exception as exc:
            self._torch = None
            raise ProfilerError(f"the {self.config.profiler} profiler did not start: {exc}") from exc
        self._running = True
        log.info("profiler (%s) started", self.config.profiler)

    def _start_profiler(self) -> None:
        if self.config.profiler == "cuda":
            torch.cuda.profiler.start()
        else:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            c = self.config
            self._torch = torch.profiler.profile(activities=activities, with_stack=c.torch_profiler_with_stack,
                                                 with_flops=c.torch_profiler_with_flops,
                                                 record_shapes=c.torch_profiler_record_shapes,
                                                 profile_memory=c.torch_profiler_with_memory)
            self._torch.start()

    def _end(self) -> None:
        self._running = False
        try:
            if self.config.profiler == "cuda":
                torch.cuda.profiler.stop()
                log.info("profiler (cuda) stopped")
                return
            prof, self._torch = self._torch, None
            prof.stop()
            self.last_trace = self._write(prof)
        except Exception as exc:
            raise ProfilerError(f"the {self.config.profiler} profiler did not stop and write its trace: {exc}") \
                from exc
        log.info("profiler trace written to %s", self.last_trace)

    def _write(self, prof: torch.profiler.profile) -> str:
        folder = self.config.torch_profiler_dir
        os.makedirs(folder, exist_ok=True)
        stamp = time.time()
        name = (f"{self._prefix or 'deltaserve'}_{time.strftime('%Y%m%d-%H%M%S', time.localtime(stamp))}"
                f".{int(stamp * 1000) % 1000:03d}_{os.getpid()}")
        path = os.path.join(folder, name + ".pt.trace.json")
        count = 1
        while os.path.exists(path) or os.path.exists(path + ".gz"):  # two traces in one millisecond
            path = os.path.join(folder, f"{name}_{count}.pt.trace.json")
            count += 1
        prof.export_chrome_trace(path)
        if self.config.torch_profiler_dump_cuda_time_total:  # vLLM's table of the kernels, beside the trace
            sort = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
            with open(path[:-len(".pt.trace.json")] + "_kernels.txt", "w") as table:
                table.write(prof.key_averages().table(sort_by=sort, row_limit=50))
        if self.config.torch_profiler_use_gzip:
            with open(path, "rb") as plain, gzip.open(path + ".gz", "wb") as packed:
                shutil.copyfileobj(plain, packed)
            os.remove(path)
            path += ".gz"
        return path
