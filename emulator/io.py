"""Output files: check an output path is writable before any work starts, then write atomically
(a reader never sees a half-written result file, a kill leaves the old one); worker processes
exit with the run that started them (:func:`exit_with_parent`)."""
from __future__ import annotations

import errno
import itertools
import json
import os
import select
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from groupfel.errors import InputError


def check_writable(path: str | Path, kind: Literal["file", "dir"], flag: str) -> Path:
    """Raise :class:`InputError` (naming ``flag``, the path and the fix) unless ``path`` can be
    written as a ``kind``: an existing one of that kind, or one whose nearest existing ancestor is a
    writable directory. Creates nothing. ``os.access`` also sees read-only mounts (even as root)."""
    path = Path(path)
    what = "directory" if kind == "dir" else "file"
    if path.exists():
        if kind == "dir" and not path.is_dir():
            raise InputError(f"{flag} {path}: exists and is not a directory; give a directory path "
                             f"(or remove the file)")
        if kind == "file" and path.is_dir():
            raise InputError(f"{flag} {path}: is a directory; give a file path inside it, e.g. {path / 'out'}")
        if kind == "file" and not path.is_file():
            # a FIFO or a device (/dev/null): the output is written beside it and renamed over it,
            # which would replace the special file with a regular one
            raise InputError(f"{flag} {path}: not a regular file (a FIFO or a device), which the output would "
                             f"replace; give a file path")
        target = path if kind == "dir" else path.parent
    else:
        target = path.parent
    while not target.exists():
        target = target.parent
    if not target.is_dir():
        raise InputError(f"{flag} {path}: {target} is a file, not a directory, so the {what} cannot be "
                         f"created there; choose another path")
    if not os.access(target, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: directory {target} is not writable (permissions or a read-only "
                         f"file system); choose a writable location")
    return path


def remove_inside(path: str | Path, parent: str | Path) -> None:
    """``shutil.rmtree(path)``, only where ``path`` resolves strictly inside ``parent``: a forced
    rerun replaces its own arm or seed folders, never a folder a name such as ``..`` would reach."""
    path, parent = Path(path), Path(parent)
    real, root = path.resolve(), parent.resolve()
    if real == root or root not in real.parents:
        raise InputError(f"{path}: resolves to {real}, outside {root}; refusing to delete it (a name must be a "
                         f"folder of its own inside the run)")
    shutil.rmtree(real, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


CRASH_AT = "GROUPFEL_CRASH_AT"
_steps = itertools.count(1)   # write steps taken by this process (see crash_point)


def crash_point() -> None:
    """A write step (a temporary file written, a rename, a checkpoint's tables): the crash tests'
    hook. With ``GROUPFEL_CRASH_AT=N`` in the environment the process kills itself (SIGKILL,
    nothing flushed, as the out-of-memory killer or a power cut would) at its Nth step; unset or
    0 it only counts (:func:`steps_taken`)."""
    step = next(_steps)
    at = os.environ.get(CRASH_AT, "")
    if at.isdigit() and step == int(at):
        os.kill(os.getpid(), signal.SIGKILL)


def steps_taken(reset: bool = False) -> int:
    """How many write steps this process took (``reset``: count from 0 again)."""
    global _steps
    taken = next(_steps) - 1
    _steps = itertools.count(1 if reset else taken + 1)
    return 0 if reset else taken


TMP_SUFFIX = ".tmp"


def remove_stale(run_dir: str | Path) -> None:
    """Temporary files a killed writer left in ``run_dir`` (``.<name>.<random>.tmp``, beside the
    file it was replacing): called under the run's lock, so no live writer owns them."""
    import re

    ours = re.compile(r"\..+\.[a-z0-9_]{8}" + re.escape(TMP_SUFFIX))   # mkstemp's name in atomic_write
    for tmp in Path(run_dir).rglob(f".*{TMP_SUFFIX}"):
        if ours.fullmatch(tmp.name) and tmp.is_file() and not tmp.is_symlink():
            tmp.unlink(missing_ok=True)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``.
    The file gets the mode a plain ``open`` would give (0o666 less the umask), not mkstemp's 0o600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
        crash_point()
        os.replace(tmp, path)
        crash_point()
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):   # name the file the user knows, not the temporary
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, RuntimeError) and _full(path):   # torch.save reports a full disk as RuntimeError
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None
        raise


def _full(path: Path, need: int = 1 << 16) -> bool:
    """Whether the file system holding ``path`` has less than ``need`` bytes left."""
    try:
        return shutil.disk_usage(path.parent).free < need
    except OSError:
        return False


def write_json(path: Path, obj) -> None:
    atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=2, default=str) + "\n"))


LOCK_NAME = ".groupfel.lock"
_held: dict[str, list] = {}   # resolved directory -> [open lock file, depth]: re-entrant in one process


@contextmanager
def run_lock(run_dir: str | Path):
    """Hold an exclusive OS lock (``fcntl.flock``) on ``run_dir`` while writing it: one writer per
    run directory. The OS releases it when the process ends, however it ends. A second writer gets
    :class:`InputError` at once, naming the PID that holds the lock. Re-entrant within a process
    (``reproduce`` locks its directory, then runs the sweep into it)."""
    run_dir = Path(run_dir)
    key = str(run_dir.resolve())
    if key not in _held:
        _held[key] = [_acquire(run_dir), 0]
    _held[key][1] += 1
    try:
        yield
    finally:
        _held[key][1] -= 1
        if _held[key][1] == 0:
            _release(_held.pop(key)[0])


def _forget_locks() -> None:
    """In a forked child: close its copies of the lock files without unlocking, so the lock lives
    exactly as long as the process that took it (a child left behind would otherwise hold it)."""
    for f, _ in _held.values():
        f.close()
    _held.clear()


os.register_at_fork(after_in_child=_forget_locks)


def _release(f) -> None:
    """Unlock explicitly, then close: processes forked while the lock was held (the training
    engine's workers) share its open file description, and closing only this process's descriptor
    would leave the directory locked while they live. The file stays (removing it would race)."""
    import fcntl

    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()


def held_elsewhere(folder: str | Path) -> str | None:
    """The PID (as its lock file says) of another process holding ``folder``'s run lock, or None:
    nobody, or this process. A probe takes the lock shared for an instant and lets it go."""
    import fcntl

    folder = Path(folder)
    lock = folder / LOCK_NAME
    if str(folder.resolve()) in _held or not lock.is_file():
        return None
    try:
        f = open(lock)
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "unknown"
        except OSError:
            return None
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def _acquire(run_dir: Path):
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / LOCK_NAME
    try:
        f = open(lock, "a+")
    except IsADirectoryError:
        raise InputError(f"{lock}: a directory where groupfel keeps its lock file; remove it (rmdir {lock}) and "
                         f"rerun") from None
    except PermissionError:
        raise InputError(f"{lock}: cannot be opened for writing (permissions); make {run_dir} writable, or write "
                         f"to another directory") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise InputError(f"{run_dir}: another groupfel process (PID {holder}) is writing this run directory; "
                         f"wait for it to finish, or write to another directory") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def exit_with_parent(parent: int | None = None, poll_s: float = 0.5) -> None:
    """Called first in a worker process: exit as soon as process ``parent`` (default: this
    process's parent) is gone. A run killed by SIGTERM or SIGKILL then takes its workers down with
    it; an orphan would go on writing its arm's checkpoints while the resumed run writes the same
    arm. A forkserver's workers name the run's pid: the forkserver outlives the run while any of
    them lives (each holds its liveness pipe)."""
    parent = os.getppid() if parent is None else parent
    try:
        handle = os.pidfd_open(parent)     # readable once the process has exited (Linux 5.3+)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        handle = None

    def gone() -> bool:
        if handle is not None:
            return bool(select.select([handle], [], [], 0)[0])
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False

    def watch() -> None:
        while not gone():
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


# -- checkpoints: small state in the checkpoint file, large tables beside it ---------------------------------
# A checkpoint's large tensors (models, momentum, variates, the ledger's columns) go to one of two
# side files, ``<checkpoint>.tables0`` and ``.tables1``, overwritten in place in turn as raw bytes
# after a token; the checkpoint file (written atomically, after its tables) names its side file
# and token. A kill while the tables are written leaves the other side file, the one the last
# checkpoint names, intact. Writing in place skips a new 20-50 MB file, its zip records and CRCs,
# and the release of the old one's pages at every checkpoint.
CHECKPOINT = "checkpoint.pt"   # an unfinished arm's, in its folder
TABLES = (".tables0", ".tables1")
_TABLE_MIN = 1 << 16          # tensors of at least this many bytes go to the side file
_ALIGN = 64
_MARK = "__groupfel_table__"
_written: dict[str, int] = {}  # checkpoint path -> the side file its last write used


def checkpoint_files(path: str | Path) -> list[Path]:
    """The checkpoint file and its side files."""
    path = Path(path)
    return [path, *(path.with_name(path.name + s) for s in TABLES)]


def remove_checkpoint(path: str | Path) -> None:
    """Remove a checkpoint and its side files."""
    for p in checkpoint_files(path):
        p.unlink(missing_ok=True)
    _written.pop(str(Path(path).resolve()), None)


def write_checkpoint(path: str | Path, blob: dict) -> None:
    """``torch.save`` ``blob`` (tensors and plain containers) at ``path``, its large tensors in the
    side file the previous checkpoint does not name (see :func:`read_checkpoint`)."""
    import secrets

    import torch

    path = Path(path)
    key = str(path.resolve())
    if key not in _written:
        _written[key] = _side_of(path)
    side = checkpoint_files(path)[1 + (1 - _written[key])]
    tables: list[torch.Tensor] = []

    def out(obj):
        if isinstance(obj, dict):
            return {k: out(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [out(v) for v in obj]
        if isinstance(obj, torch.Tensor) and obj.nbytes >= _TABLE_MIN:
            tables.append(obj)
            return {_MARK: len(tables) - 1, "dtype": str(obj.dtype).removeprefix("torch."), "shape": list(obj.shape)}
        return obj

    small = out(blob)
    token = secrets.token_bytes(16)
    offsets, at = [], _ALIGN
    for t in tables:
        offsets.append(at)
        at += -(-t.nbytes // _ALIGN) * _ALIGN
    try:
        with open(side, "r+b" if side.exists() else "w+b") as f:
            f.write(token)
            f.flush()
            crash_point()   # the side file half written: the last checkpoint names the other one
            for t, offset in zip(tables, offsets):
                f.seek(offset)
                f.write(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().data)
            f.truncate(at)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(exc.errno, exc.strerror, str(side)) from None
        raise
    crash_point()
    small["__tables__"] = {"file": side.name, "token": token.hex(), "size": at, "offsets": offsets}
    atomic_write(path, lambda p: torch.save(small, p))
    _written[key] = TABLES.index(side.name.removeprefix(path.name))


def _side_of(path: Path) -> int:
    """The side file the checkpoint at ``path`` names (1 where there is none: the next is 0)."""
    import torch

    try:
        name = torch.load(path, weights_only=True, map_location="cpu")["__tables__"]["file"]
        return TABLES.index(name.removeprefix(path.name))
    except Exception:   # none yet, damaged, or from before side files
        return 1


def _read_side(side: Path) -> bytearray:
    """A side file's bytes through the gate of a run's files (a regular file within the limit, as
    it is when opened: a FIFO swapped in after the check cannot hang the read)."""
    import stat

    from groupfel.userfile import check_file

    if not side.exists() and not side.is_symlink():
        raise ValueError(f"{side}: missing")
    size = check_file(side, str(side), "the checkpoint's tables groupfel wrote (or delete the checkpoint to "
                      "restart the arm from scratch)", "run")
    fd = os.open(side, os.O_RDONLY | os.O_NONBLOCK)
    with open(fd, "rb", closefd=True) as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{side}: not a regular file; delete the checkpoint to restart the arm from scratch")
        data = bytearray(size)
        got = f.readinto(data)
    return data[:got] if got < size else data


def read_checkpoint(path: str | Path) -> dict:
    """What :func:`write_checkpoint` wrote: the blob with its tables back in place (CPU tensors).
    Loads with ``weights_only=True`` (tensors and plain containers only); raises ``ValueError``
    where the side file is missing, short or of another checkpoint (token)."""
    import torch

    path = Path(path)
    blob = torch.load(path, weights_only=True, map_location="cpu")
    if not isinstance(blob, dict) or "__tables__" not in blob:
        return blob   # no tables (or from before side files)
    meta = blob.pop("__tables__")
    side = path.with_name(str(meta["file"]))
    if side.name.removeprefix(path.name) not in TABLES:
        raise ValueError(f"{path}: names side file {side.name!r}")
    data = _read_side(side)
    if len(data) < int(meta["size"]) or bytes(data[:16]).hex() != meta["token"]:
        raise ValueError(f"{side}: not the tables of {path.name} (short or another checkpoint's)")
    offsets = meta["offsets"]

    def back(obj):
        if isinstance(obj, dict):
            if _MARK in obj:
                dtype = getattr(torch, str(obj["dtype"]), None)
                if not isinstance(dtype, torch.dtype):
                    raise ValueError(f"{path}: a table of dtype {obj['dtype']!r}")
                shape = [int(s) for s in obj["shape"]]
                n = int(torch.Size(shape).numel()) * dtype.itemsize
                return torch.frombuffer(data, dtype=torch.uint8, count=n, offset=int(offsets[obj[_MARK]])) \
                    .view(dtype).reshape(shape)
            return {k: back(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [back(v) for v in obj]
        return obj

    _written[str(path.resolve())] = TABLES.index(side.name.removeprefix(path.name))
    return back(blob)
