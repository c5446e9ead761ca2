"""Preloaded by the local pool's forkserver only (never imported by a run's own process): its
workers report an error before their task loop in one line (:mod:`.pool_worker`)."""
import sys

from .pool_worker import record_startup_error

sys.excepthook = record_startup_error
