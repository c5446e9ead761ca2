"""Moved to :mod:`groupfel.emulator.network`; this name stays for benchmarks/clock.py."""
from .network import ClientNet, ContendedFederation, EdgeNetwork, quota_seconds

__all__ = ["ClientNet", "ContendedFederation", "EdgeNetwork", "quota_seconds"]
