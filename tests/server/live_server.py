"""Starts `deltaserve serve` on the demo model as a real process on a free 127.0.0.1 port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A small pool and context keep start-up and memory low; every test fits in them.
SMALL_ENGINE = ["--max-model-len", "1024", "--num-kv-blocks", "256"]


class LiveServer:
    def __init__(self, *args: str, api_key: str | None = None, timeout: float = 300.0):
        self.api_key = api_key
        self.log = tempfile.NamedTemporaryFile(prefix="deltaserve-server-", suffix=".log", delete=False)
        self.stdout = tempfile.NamedTemporaryFile(prefix="deltaserve-stdout-", suffix=".log", delete=False)
        env = dict(os.environ)
        env.pop("DELTASERVE_API_KEY", None)
        env.pop("VLLM_API_KEY", None)
        if api_key is not None:
            env["DELTASERVE_API_KEY"] = api_key  # the environment twin of --api-key
        env["PYTHONUNBUFFERED"] = "1"
        command = [sys.executable, "-m", "deltaserve.cli", "serve", "--port", "0", *SMALL_ENGINE, *args]
        self.proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=self.stdout, stderr=self.log,
                                     stdin=subprocess.DEVNULL)
        self.url = self._wait_for_url(timeout)
        self.base_url = self.url + "/v1"

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.stdout.name) as f:
                match = re.search(r"at (https?://127\.0\.0\.1:\d+)/v1", f.read())
            if match:
                return match.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.read_log()}")
            time.sleep(0.2)
        self.proc.kill()
        raise RuntimeError(f"server did not start in {timeout} s:\n{self.read_log()}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def read_log(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def labelled_metrics(self) -> dict[tuple, float]:
        """(sample name, frozenset of its labels' (name, value) pairs) -> value, whatever the labels' order."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the server and wait for it; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"server did not stop within {timeout} s after signal {sig}")
        return self.proc.returncode

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.log, self.stdout):
            f.close()
            os.unlink(f.name)
