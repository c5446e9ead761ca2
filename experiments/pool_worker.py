"""What runs first in a local pool worker (:mod:`groupfel.experiments.backends`). A worker that
fails to start writes its own error, one line, to ``$GROUPFEL_WORKER_ERRORS/<pid>`` and exits; the
run then reports that line instead of counting the worker as killed. Errors in the initializer
are caught by :func:`start`; earlier ones reach ``sys.excepthook``, which the forkserver (and so
every worker it forks) sets to :func:`record_startup_error` by preloading :mod:`.pool_hook`."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

STARTUP_ERRORS = "GROUPFEL_WORKER_ERRORS"


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def record_startup_error(exc_type, exc, tb, directory: str | None = None) -> None:
    if _owner_gone(exc, tb):
        return
    directory = directory or os.environ.get(STARTUP_ERRORS)
    if directory and os.path.isdir(directory):
        Path(directory, str(os.getpid())).write_text(one_line(exc))
    else:
        sys.__excepthook__(exc_type, exc, tb)


def _owner_gone(exc: BaseException, tb) -> bool:
    """A worker started as its pool's owner exited (Ctrl-C while the pool starts): the pool's locks
    are gone before the worker could read its start. The run has already said it stopped; the
    worker leaves without a word."""
    if not isinstance(exc, FileNotFoundError):
        return False
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(os.path.join("multiprocessing", "synchronize.py")):
            return True
        tb = tb.tb_next
    return False


def start(parent: int, setup: Callable[[int], None], directory: str) -> None:
    """The pool's initializer: ``setup(parent)`` (exit with the run, :func:`~groupfel.emulator.io.exit_with_parent`);
    an error there is a start-up error too, recorded in ``directory``."""
    try:
        setup(parent)
    except BaseException as exc:
        record_startup_error(type(exc), exc, exc.__traceback__, directory)
        os._exit(1)

