"""Result files: JSON with date, commit, GPU and the exact command."""

import datetime
import json
import os
import shlex
import subprocess
import sys


def commit() -> str:
    """DELTASERVE_COMMIT when set (a copy of the tree may carry a stale .git), else git's HEAD."""
    if os.environ.get("DELTASERVE_COMMIT"):
        return os.environ["DELTASERVE_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# environment variables that change what a run measures: they belong to its exact command
SETTINGS = ("CUDNN_", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS", "DELTASERVE_",
            "TRITON_")


def command() -> str:
    """The command line as run, led by the settings in its environment (DELTASERVE_COMMIT is the commit)."""
    settings = [f"{k}={v}" for k, v in sorted(os.environ.items())
                if k.startswith(SETTINGS) and k != "DELTASERVE_COMMIT"]
    return shlex.join(settings + [os.path.basename(sys.executable)] + sys.argv)  # an empty argument shows as ''


def header() -> dict:
    import torch

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "command": command(),
    }


def write(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
