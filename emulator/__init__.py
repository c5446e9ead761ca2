"""The emulator: config, world, training engine, SimPy federation, cost ledger and the arm driver.

``from groupfel.emulator import Algorithm`` is the base class of training algorithms (loaded on first
use: importing ``groupfel.errors`` or ``groupfel.emulator.config`` does not import torch).
"""
from importlib import import_module

_LAZY = {"Algorithm": "algorithms", "AlgorithmContext": "algorithms", "AlgorithmState": "algorithms",
         "GroupUpdate": "algorithms", "algorithms": "algorithms"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_LAZY)
