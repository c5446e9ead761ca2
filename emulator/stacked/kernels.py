"""The stacked step's kernel settings: options, measured rather than assumed (benchmarks/step_profile.py).

* ``autotune``: cuDNN times its algorithms for each convolution shape and keeps the fastest,
  among deterministic ones only (the engine keeps ``torch.backends.cudnn.deterministic`` on). A
  bucket's captured graph fixes its shapes, so a run repeats its own numbers within a process;
  another process may time another algorithm fastest and sum in another order, so runs of the
  same seed agree within float rounding rather than bitwise. Off by default; a GPU's only.
* ``channels_last``: the stacked layout's memory format. Unset: channels-last on a CPU (oneDNN's
  fast grouped kernels; measured faster for every resnet-1 convolution), NCHW on a GPU (cuDNN's
  default; not yet measured against channels-last there).

The precision modes (``train.precision``: fp32, tf32, bf16) are the third setting
(:mod:`groupfel.emulator.precision`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Kernels:
    autotune: bool = False
    channels_last: bool | None = None

    def check(self, device: torch.device) -> None:
        if self.autotune and device.type != "cuda":
            raise ValueError(f"autotune is cuDNN's and needs a CUDA device, not {device.type}")

    def layout(self, device: torch.device) -> bool:
        """Whether the stacked step runs channels-last on ``device``."""
        return device.type == "cpu" if self.channels_last is None else self.channels_last

    def apply(self, device: torch.device) -> None:
        """Set this process's cuDNN autotuning (after :func:`groupfel.emulator.devices.prepare`)."""
        self.check(device)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = self.autotune
