"""Numeric command-line flags, bounded where they are declared.

Every numeric flag's ``type=`` is a :class:`Number`: argparse checks the value as it reads the
command line, before any work, and the CLI prints its one line (exit 2). The bounds are the
physical ones of the config reference (docs/guide/config.md, "Limits").
"""
from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

from groupfel.errors import InputError

INT64 = 2**63 - 1

MAX_SIZES = 100_000      # sizes one command sweeps; more is a typo or a missing step


def parse_sizes(text: str, where: str = "--sizes", most: int | None = None, bound: str = "",
                count: bool = True) -> list[int]:
    """``2..30`` (inclusive), ``2..30:4`` (step 4) or ``2,5,10``; each size at most ``most``
    (``bound`` says what that is). The bounds are compared before the list is built, so a range
    that cannot be meant (``2..100000000``) gets one line instead of a MemoryError. Without
    ``count``, the form alone is checked (and nothing is built)."""
    form = f"{where} {text!r}: give positive integers as LO..HI, LO..HI:STEP or A,B,C (e.g. 2..30)"
    m = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*(?::\s*(\d+))?\s*", text)
    try:
        ends = [int(m[1]), int(m[2])] if m else [int(s) for s in text.split(",")]
    except ValueError:
        raise InputError(form) from None
    step = int(m[3] or 1) if m else 1
    if not ends or min(ends) < 1 or step < 1 or m and ends[0] > ends[1]:
        raise InputError(form)
    top = max(ends)
    if top > INT64:
        raise InputError(f"{where} {text!r}: {top} is beyond 64-bit integers; give sizes up to {most or INT64:,}")
    if most is not None and top > most:
        raise InputError(f"{where} {text!r}: size {top:,} exceeds {bound or most}; give sizes up to {most:,}")
    if not count:
        return []
    n = (ends[1] - ends[0]) // step + 1 if m else len(ends)
    if n > MAX_SIZES:
        raise InputError(f"{where} {text!r}: {n:,} sizes; sweep at most {MAX_SIZES:,} (add a step, e.g. "
                         f"{ends[0]}..{ends[1]}:{-(-(ends[1] - ends[0]) // MAX_SIZES) + 1})")
    return list(range(ends[0], ends[1] + 1, step)) if m else ends


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
    its bound where the flag it depends on is known (:func:`parse_sizes`)."""

    def __call__(self, text: str) -> str:
        try:
            parse_sizes(text, "", count=False)
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc).strip()) from None
        return text


SIZES = SizesText()
SEED = Number(int, 0, INT64)
JOBS = Number(int, 1, 1024, "processes")
STACK = Number(int, 1, 1024, "runs")
ROUNDS = Number(int, 1, 10**6)
MBPS = Number(float, 1e-6, 1e9, "Mbit/s")         # 1 bit/s .. 1 Pbit/s
LATENCY = Number(float, 0, 86_400, "s")           # at most a day
MAX_COV = Number(float, 0, 1e3, open_lo=True)


@dataclass(frozen=True)
class AutoOr:
    """An argparse ``type``: the word ``auto`` or a :class:`Number` (``--seeds auto|N``)."""

    number: Number

    def __call__(self, text: str):
        if text.strip() == "auto":
            return "auto"
        try:
            return self.number(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{text!r}: give auto or {'an integer' if self.number.kind is int else 'a number'} "
                                             f"{self.number.range()}") from None


class Text:
    """The type of every flag and argument that takes text (a path, a name, a device): an empty or
    blank value is refused here, so ``--device ''`` cannot fall back to the default unseen. The
    parser gives it to every such flag (:func:`require_text`), those added later included."""

    def __call__(self, text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r}: give a value (it is empty)")
        return text


TEXT = Text()


def require_text(parser: argparse.ArgumentParser) -> None:
    """Give :data:`TEXT` to every action of ``parser`` and its subparsers that takes a value but has
    no type or choices (a numeric flag has its :class:`Number`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                require_text(sub)
        elif action.nargs != 0 and action.type is None and action.choices is None \
                and not isinstance(action, argparse._HelpAction):
            action.type = TEXT


def toml_value(text: str):
    """The VALUE of a ``--set PATH=VALUE``: a TOML value, or the bare word as a string
    (``train.model=mlp``, ``grow=authors``)."""
    import tomllib

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
