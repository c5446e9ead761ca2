"""Which torch device trains a run, how it is set up to give the same numbers twice, and what the
manifest records of it.

``train.device`` (and ``--device`` on run, sweep and reproduce) is ``cpu`` (the default), ``cuda``,
``cuda:N``, ``mps`` or ``auto`` (the first CUDA GPU where torch sees one, else the CPU). On a GPU
the engine turns on torch's deterministic algorithms, so on one GPU with one set of library
versions a seed gives bitwise the same numbers. TF32 stays off in matrix products and
convolutions: the GPU then computes in the same float32 the CPU does, so its accuracy tracks the
CPU's within float rounding (docs/benchmarks.md says what both choices cost).
"""
from __future__ import annotations

import os
import platform
import re

PATTERN = re.compile(r"^(cpu|auto|mps|cuda(:\d+)?)$")
HELP = "cpu, cuda, cuda:N, mps or auto (the first CUDA GPU if torch sees one, else cpu)"
# cuBLAS gives reproducible sums only with a fixed workspace (CUDA docs, "Results reproducibility"),
# read when its first handle is made: set before any CUDA work in the process.
CUBLAS_WORKSPACE = ":4096:8"


def check(device: str, where: str) -> str:
    """``device`` if it names a device groupfel trains on, else one line naming ``where``."""
    from groupfel.errors import InputError

    if not isinstance(device, str) or not PATTERN.match(device):
        raise InputError(f"{where}: {device!r} is not a device; give {HELP}")
    return device


def resolve(device: str) -> str:
    """The torch device ``device`` stands for here (``auto``: cuda if torch sees a GPU)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def prepare(device) -> None:
    """Set this process up for reproducible numbers on ``device`` (a torch.device), before its
    first CUDA work: deterministic algorithms, cuDNN without autotuning, no TF32."""
    if device.type != "cuda":
        return
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    # warn_only: an op without a deterministic kernel warns (once) instead of stopping the run; the
    # manifest then says the numbers may differ run to run
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def describe(device: str) -> tuple[str, dict]:
    """The hardware a run trained on, in words and in detail, for its manifest."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return f"{dev.type} ({platform.machine()})", {"type": dev.type, "machine": platform.machine()}
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    detail = {"type": "cuda", "index": index, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
              "capability": f"{props.major}.{props.minor}", "driver": _driver(), "cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version(), "torch": torch.__version__,
              "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
              "cudnn_deterministic": torch.backends.cudnn.deterministic,
              "cudnn_benchmark": torch.backends.cudnn.benchmark,
              "tf32": torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32,
              "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
    return f"cuda ({props.name})", detail


# The version is the first word of dot-separated numbers on the NVRM line, wherever the module's
# kind puts it: "NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 ...", "NVIDIA UNIX Open
# Kernel Module for x86_64  550.54.14  Release Build  (builder@host)  ...", aarch64 alike.
_NVRM_VERSION = re.compile(r"^NVRM version:.*?(?<=\s)(\d+(?:\.\d+)+)(?=\s|$)", re.MULTILINE)


def driver_version(proc_version: str) -> str | None:
    """The driver version in the text of /proc/driver/nvidia/version, or None if it has none."""
    found = _NVRM_VERSION.search(proc_version)
    return found.group(1) if found else None


def _driver() -> str | None:
    """The NVIDIA driver's version: the loaded kernel module's, else nvidia-smi's."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            if found := driver_version(f.read()):
                return found
    except OSError:
        pass
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None
