"""``train.precision``: fp32 everywhere (the default: a GPU's numbers track the CPU's), or on a GPU
TF32 matrix products and convolutions, or bfloat16 autocast of the training steps' forward passes."""
from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "tf32", "bf16")


def set_precision(device: torch.device, precision: str) -> None:
    """Set this process's float32 matmul and convolution precision for ``precision`` (after
    :func:`groupfel.emulator.devices.prepare`, which turns TF32 off); only a GPU has the others."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "fp32" and device.type != "cuda":
        raise ValueError(f"precision {precision!r} needs a CUDA device, not {device.type}")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"


def autocast(device: torch.device, precision: str):
    """The context of a training step's forward pass: bfloat16 autocast for ``bf16``, else none
    (parameters, gradients and the optimiser state stay float32 either way)."""
    if precision != "bf16":   # no autocast context at all: any device, the meta device of the tests too
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
