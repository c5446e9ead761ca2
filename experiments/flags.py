"""Numeric command-line flags, bounded where they are declared.

Every numeric flag's ``type=`` is a :class:`Number`: argparse checks the value as it reads the
command line, before any work, and the CLI prints its one line (exit 2). The bounds are the
physical ones of the config reference (docs/guide/config.md, "Limits").
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

INT64 = 2**63 - 1


@dataclass(frozen=True)
class Number:
    """An argparse ``type``: an int or float in [lo, hi] (``lo`` excluded when ``open_lo``); with
    ``many``, one or more of them separated by commas (returned as a list)."""

    kind: type
    lo: float
    hi: float
    unit: str = ""
    open_lo: bool = False
    many: bool = False

    @property
    def __name__(self) -> str:     # argparse names the type in some of its messages
        return self.kind.__name__

    def range(self) -> str:
        lo = f"above {self.lo:g} and at most" if self.open_lo else f"from {self._fmt(self.lo)} to"
        return f"{lo} {self._fmt(self.hi)}{' ' + self.unit if self.unit else ''}"

    def _fmt(self, v: float) -> str:
        return f"{int(v):,}" if self.kind is int else f"{v:g}"

    def one(self, text: str) -> int | float:
        what = "an integer" if self.kind is int else "a number"
        try:
            v = self.kind(text.strip())
        except ValueError:
            v = None
        if v is None or (self.kind is float and not math.isfinite(v)) or not self.lo <= v <= self.hi \
                or (self.open_lo and v == self.lo):
            raise argparse.ArgumentTypeError(f"{text!r}: give {what} {self.range()}")
        return v

    def __call__(self, text: str):
        if not self.many:
            return self.one(text)
        return [self.one(t) for t in text.split(",")]


class SizesText:
    """The type of a flag of sizes (``LO..HI[:STEP]`` or ``A,B,C``): its form is checked here,
    its bound where the flag it depends on is known (``cost_cli.parse_sizes``)."""

    __name__ = "sizes"

    def __call__(self, text: str) -> str:
        from groupfel.errors import InputError

        from .cost_cli import parse_sizes

        try:
            parse_sizes(text, "")
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc).strip()) from None
        return text


SIZES = SizesText()
SEED = Number(int, 0, INT64)
JOBS = Number(int, 1, 1024, "processes")
ROUNDS = Number(int, 1, 10**6)
MBPS = Number(float, 1e-6, 1e9, "Mbit/s")         # 1 bit/s .. 1 Pbit/s
LATENCY = Number(float, 0, 86_400, "s")           # at most a day
MAX_COV = Number(float, 0, 1e3, open_lo=True)
ALPHA = Number(float, 1e-3, 1e6)
