"""Row tables that whole passes stream over, on huge pages where the system gives them.

A round's scratch tables (SCAFFOLD's c_i, c_i⁺, corrections and their float64 changes: 60 rows of
a model's parameters each) are read and written whole several times per group round. On 4 KiB
pages every pass misses the TLB once per page; on a CPU under Linux these tables are mapped on
transparent huge pages (``madvise``), 512 times fewer. Only where they are placed changes, never
what is computed in them.
"""
from __future__ import annotations

import math
import mmap

import torch

HUGE_PAGE = 2 << 20


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``torch.empty(shape)``; a CPU table of at least one huge page starts on a huge-page
    boundary of an anonymous mapping advised ``MADV_HUGEPAGE`` (a system without it, or a
    refusal: pages as torch's own)."""
    device = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if device.type != "cpu" or nbytes < HUGE_PAGE or advice is None:
        return torch.empty(shape, dtype=dtype, device=device)
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    try:
        block = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw = torch.frombuffer(block, dtype=torch.uint8)   # the tensor keeps the mapping alive
        start = -raw.data_ptr() % HUGE_PAGE
        block.madvise(advice, start, size)
    except (OSError, ValueError):
        return torch.empty(shape, dtype=dtype, device=device)
    return raw[start:start + nbytes].view(dtype).view(shape)
