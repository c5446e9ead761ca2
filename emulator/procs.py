"""Worker processes that are safe with any torch build, and arrays they share without copies.

groupfel never forks a process that may have run torch. A CUDA build of torch starts autograd's
device threads at a process's first backward pass when a GPU is present, and a child forked after
that refuses to run backward ("Unable to handle autograd's threading in combination with
fork-based multiprocessing"); a CPU-only build never starts them, so the hazard hides on most
test machines. Every pool's workers (the run pool's and the batched engine's) therefore fork from
one server process (:func:`worker_context`) that imported torch and the emulator but never ran a torch
op. It starts with this process's environment, so with the numerics' variables that
:func:`groupfel.emulator.numerics.apply` set before torch loaded here.

Workers do not inherit this process's memory, so bulk data reaches them through
:class:`SharedArrays`: arrays in one anonymous memory file whose descriptor travels to each
worker as it starts; parent and workers map the same pages.
"""
from __future__ import annotations

import mmap
import os
import signal
import sys
import tempfile
import threading
import types
import weakref
from multiprocessing import context, forkserver, reduction
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # numpy loads with the arrays: the command line's parser imports this module
    import numpy as np

# What the server imports before it forks workers (a worker then starts in milliseconds). One list
# for every pool of the process: the server starts once, with the list as it is then.
_PRELOAD = ["groupfel.emulator.world", "groupfel.emulator.driver"]


def preload(*modules: str) -> None:
    """Add modules the server imports (before its first start)."""
    _PRELOAD.extend(m for m in modules if m not in _PRELOAD)


class _WorkerProcess(context.ForkServerProcess):
    """A pool worker that does not re-run the caller's ``__main__``. multiprocessing re-imports the
    main module in every worker so that functions defined there unpickle; ours run groupfel's own
    functions and need none of it. Re-running it would start the caller's work again from a
    script without an ``if __name__ == "__main__":`` guard, and fail for ``python -``."""

    @staticmethod
    def _Popen(process_obj):
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")   # no __file__, no __spec__: nothing to re-run
        try:
            return context.ForkServerProcess._Popen(process_obj)
        finally:
            sys.modules["__main__"] = main


class _WorkerContext(context.ForkServerContext):
    Process = _WorkerProcess


def worker_context() -> context.ForkServerContext:
    """The multiprocessing context of every groupfel pool (see the module docstring). The server
    starts with SIGINT ignored, and so does every worker it forks (a forked worker takes the
    server's first handlers): Ctrl-C reaches the whole process group, and the run speaks for all
    of them in one line, with no KeyboardInterrupt traceback from a worker."""
    ctx = _WorkerContext()
    ctx.set_forkserver_preload(list(_PRELOAD))
    if threading.current_thread() is not threading.main_thread():   # handlers are the main thread's
        return ctx
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)   # an ignored signal stays ignored across exec
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, before)
    return ctx


def _memory_file() -> int:
    """A descriptor of an anonymous memory file (Linux: memfd, not bounded by /dev/shm's size;
    elsewhere an unlinked temporary file, whose pages the OS caches)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("groupfel-shared", os.MFD_CLOEXEC)
    fd, path = tempfile.mkstemp(prefix="groupfel-shared-")
    os.unlink(path)
    return fd


def _map(fd: int, layout: dict[str, tuple[int, str, tuple[int, ...]]], size: int) -> dict[str, np.ndarray]:
    import numpy as np

    buf = mmap.mmap(fd, max(size, 1))
    return {name: np.frombuffer(buf, dtype=np.dtype(dtype), count=int(np.prod(shape)), offset=offset).reshape(shape)
            for name, (offset, dtype, shape) in layout.items()}


class SharedArrays:
    """Named arrays in one anonymous memory file, writable by this process and by every worker
    that attaches it (:meth:`handle` passed as a worker's start argument, :func:`attach` there)."""

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], np.dtype]]):
        import numpy as np

        self.layout, size = {}, 0
        for name, (shape, dtype) in shapes.items():
            size = -(-size // 64) * 64                      # each array cache-line aligned
            self.layout[name] = (size, np.dtype(dtype).str, tuple(int(s) for s in shape))
            size += int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.size = size
        self.fd = _memory_file()
        weakref.finalize(self, os.close, self.fd)           # the pages go with the last mapping
        os.ftruncate(self.fd, max(size, 1))
        self.arrays = _map(self.fd, self.layout, size)

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray]) -> SharedArrays:
        """A shared copy of ``arrays``."""
        shared = cls({name: (a.shape, a.dtype) for name, a in arrays.items()})
        for name, a in arrays.items():
            shared.arrays[name][...] = a
        return shared

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def handle(self):
        """What a worker's start arguments carry: the descriptor and the layout."""
        return _Descriptor(self.fd), self.layout, self.size


class _Descriptor:
    """A descriptor that pickles as a duplicate handed to the process being started (a pool
    pickles its workers' start arguments anew for each worker it starts, replacements too)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


def attach(handle) -> dict[str, np.ndarray]:
    """In a worker: the arrays of :meth:`SharedArrays.handle`."""
    fd, layout, size = handle
    try:
        return _map(fd, layout, size)
    finally:
        os.close(fd)                                        # the mapping keeps the pages
