"""The one gate of every file a user gives or a run reads back: configs, sweeps, profiles, power
tables, traces, logs and checkpoints.

Before a byte is read, :func:`check_file` stats the path (never opening it: opening a FIFO waits
for a writer forever) and refuses anything but a regular file, and a file larger than its kind's
limit, naming the limit. Text is then checked for nesting depth and long numbers before a parser
sees it (:func:`check_nesting`: JSON's and TOML's parsers recurse, and Python refuses to convert
an integer of more than 4,300 digits). A pickle's C unpickler builds any depth without recursing,
so what it built is walked once (:func:`check_tree`: its nesting, how many values it expands to
through shared references, and its integers' size) before code that recurses or counts sees it.
:func:`short` is the repr a message may hold: a few hundred characters of any value, however large
or deep.

Standard library only at import (numpy inside one scan): ``groupfel group`` must start fast.
"""
from __future__ import annotations

import json
import os
import re
import reprlib
import stat
import tomllib
from pathlib import Path
from typing import Any

from groupfel.errors import InputError

MiB = 2**20
# A file's size limit by what it holds (GROUPFEL_MAX_FILE_MB replaces them all). Each is far above
# the largest real file of its kind (FedScale's traces: tens of MB) and far below what its parser
# would need more memory for than a machine has (a CSV row in memory takes ~50x its bytes).
LIMITS = {"text": 16 * MiB,       # configs, sweeps, power tables and profiles as TOML
          "table": 64 * MiB,      # users' CSV files
          "trace": 512 * MiB,     # FedScale's traces (pickle, JSON)
          "data": 2048 * MiB,     # a dataset's files (idx, CIFAR-10 batches, recordings)
          "run": 8192 * MiB}      # what a run wrote: logs, ledgers, checkpoints
ENV_LIMIT = "GROUPFEL_MAX_FILE_MB"
MAX_DEPTH = 64          # nesting of lists and tables: a run config's deepest is 4
MAX_DIGITS = 400        # digits of one number: beyond 1e308, no float holds it
MAX_VALUES = 10**8      # values a pickle expands to: a 10^6-client trace holds ~10^7
MAX_MESSAGE_VALUE = 200  # characters of a user's value a message may quote

_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}


def limit_of(kind: str) -> int:
    """The size limit in bytes of a file of ``kind`` (a key of :data:`LIMITS`)."""
    env = os.environ.get(ENV_LIMIT, "").strip()
    if env:
        try:
            mb = float(env)
        except ValueError:
            mb = float("nan")
        if not 0 < mb < 2**40:
            raise InputError(f"{ENV_LIMIT}={short(env)}: give a size in MB above 0 (e.g. {ENV_LIMIT}=1024)")
        return int(mb * MiB)
    return LIMITS[kind]


def _mb(n: int) -> str:
    if n < MiB:
        return f"{n / 1024:,.1f} KB"
    return f"{n / MiB:,.1f} MB" if n < 10 * MiB else f"{n / MiB:,.0f} MB"


def check_file(path: str | Path, source: str, what: str, kind: str = "text") -> int:
    """The size of ``path``, a regular file within its kind's limit; else one line naming
    ``source`` (how the user gave the path) and asking for ``what`` (e.g. "a TOML file")."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"{source}: cannot read ({exc.strerror}); check the path") from None
    except ValueError:      # a NUL byte in the path
        raise InputError(f"{source}: not a valid path; check it") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{source}: is a directory; give {what}")
    if not stat.S_ISREG(st.st_mode):
        got = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise InputError(f"{source}: is {got}, not a regular file; give {what}")
    limit = limit_of(kind)
    if st.st_size > limit:
        raise InputError(f"{source}: {_mb(st.st_size)}, more than the {_mb(limit)} groupfel reads from one file; "
                         f"give a smaller file, or set {ENV_LIMIT} to allow more")
    return st.st_size


def read_bytes(path: str | Path, source: str, what: str, kind: str = "text") -> bytes:
    """A user's file's bytes, through :func:`check_file`. Opened non-blocking and checked again
    once open, so a path swapped for a FIFO after the check cannot hang the read."""
    check_file(path, source, what, kind)
    limit = limit_of(kind)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{source}: cannot read ({exc.strerror}); check the path") from None
    with open(fd, "rb", closefd=True) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{source}: not a regular file; give {what}")
        try:
            # a buffer the file's size (one byte more shows it grew), never the limit's: reading
            # 8 GiB's worth asks for 8 GiB up front, which a memory limit (ulimit -v) refuses
            parts = [f.read(min(st.st_size, limit) + 1)]
            got = len(parts[0])
            while got > st.st_size and got <= limit and (more := f.read(min(MiB, limit + 1 - got))):
                parts.append(more)
                got += len(more)
            raw = b"".join(parts) if len(parts) > 1 else parts[0]
        except OSError as exc:
            raise InputError(f"{source}: cannot read ({exc.strerror}); check the path") from None
    if len(raw) > limit:    # it grew since the check
        raise InputError(f"{source}: more than the {_mb(limit)} groupfel reads from one file; give a smaller "
                         f"file, or set {ENV_LIMIT} to allow more")
    return raw


def read_text(path: str | Path, source: str, what: str, kind: str = "text") -> str:
    """A user's UTF-8 text file (a byte-order mark dropped), through :func:`read_bytes`."""
    raw = read_bytes(path, source, what, kind)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{source}: not a UTF-8 text file (byte 0x{exc.object[exc.start]:02x} at offset "
                         f"{exc.start}); give {what}") from None


# what a depth scan skips: strings (JSON's; TOML's four kinds) and TOML's comments
_SKIP = {"json": re.compile(r'"(?:[^"\\]|\\.)*"?', re.S),
         "toml": re.compile(r'"""[\s\S]*?(?:"""|$)|\'\'\'[\s\S]*?(?:\'\'\'|$)|"(?:[^"\\\n]|\\.)*"?|\'[^\'\n]*\'?|#[^\n]*')}
_LONG_NUMBER = re.compile(r"[0-9_]{%d,}" % (MAX_DIGITS + 1))


def check_nesting(text: str, source: str, syntax: str = "json") -> None:
    """Refuse ``text`` (JSON or TOML) nested deeper than :data:`MAX_DEPTH` or holding a number of
    more than :data:`MAX_DIGITS` digits, before a parser recurses into it or converts it."""
    import numpy as np

    bare = _SKIP[syntax].sub("", text)
    if _LONG_NUMBER.search(bare):
        raise InputError(f"{source}: a number of more than {MAX_DIGITS} digits, beyond any value groupfel "
                         f"reads; write it with an exponent (e.g. 1e30) or fix it")
    brackets = np.frombuffer(re.sub(r"[^\[\]{}]", "", bare).encode("ascii"), dtype=np.uint8)
    if brackets.size:
        depth = np.cumsum(np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1))
        if depth.max() > MAX_DEPTH:
            raise InputError(f"{source}: lists or tables nested more than {MAX_DEPTH} deep, beyond any file "
                             f"groupfel reads; fix the brackets")


def parse_json(text: str, source: str, **kwargs) -> Any:
    """JSON text after :func:`check_nesting`; a parser's error is raised as ``ValueError`` (its
    ``json.JSONDecodeError``) for the caller to word."""
    check_nesting(text, source, "json")
    try:
        return json.loads(text, **kwargs)
    except RecursionError:      # nesting the scan missed (brackets inside odd strings): still one line
        raise InputError(f"{source}: nested too deep to read; fix the brackets") from None


def read_json(path: str | Path, source: str, what: str = "a JSON file", kind: str = "text", **kwargs) -> Any:
    """A JSON file through :func:`read_text` and :func:`parse_json` (a parser's error passes as
    ``ValueError``, as from :func:`json.loads`)."""
    return parse_json(read_text(path, source, what, kind), source, **kwargs)


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """TOML text after :func:`check_nesting`, as :func:`tomllib.loads` (its TOMLDecodeError
    passes through for the caller to word)."""
    check_nesting(text, source, "toml")
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise InputError(f"{source}: nested too deep to read; fix the brackets") from None
    except ValueError as exc:
        if isinstance(exc, tomllib.TOMLDecodeError):
            raise
        raise InputError(f"{source}: not valid TOML ({clip(str(exc), 200)})") from None


def read_toml(path: str | Path, source: str, what: str = "a TOML file") -> dict[str, Any]:
    """A user's TOML file as a dict; every failure one line naming ``source``."""
    text = read_text(path, source, what)
    try:
        return parse_toml(text, source)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: not valid TOML ({exc})") from None


# -- loaded values ------------------------------------------------------------------------------------

_LEAVES = {int, float, str, bool, type(None), bytes}


def check_tree(value: Any, source: str, fix: str) -> None:
    """Refuse a loaded value (a pickle's: its C unpickler builds any depth without recursing)
    nested deeper than :data:`MAX_DEPTH`, expanding to more than :data:`MAX_VALUES` values (a few
    bytes of shared references stand for 2^30 values: the "billion laughs"), holding itself, or an
    integer of more than :data:`MAX_DIGITS` digits, before code that recurses or counts walks it.
    Iterative; each shared container is visited once; a list of plain numbers or strings is counted
    at C speed."""
    sizes: dict[int, int] = {}         # id -> values the container expands to
    depth_of: dict[int, int] = {}
    path: set[int] = set()
    max_bits = int(MAX_DIGITS * 3.3219) + 1

    def big_int(v) -> bool:
        return type(v) is int and v.bit_length() > max_bits

    if big_int(value):
        raise InputError(f"{source}: an integer of more than {MAX_DIGITS} digits, beyond any value groupfel reads; {fix}")
    todo: list[tuple[Any, bool]] = [(value, False)]
    while todo:
        node, done = todo.pop()
        if type(node) in _LEAVES or id(node) in sizes and not done:
            continue
        if isinstance(node, dict):
            children = [*node.keys(), *node.values()]
        elif isinstance(node, (list, tuple, set, frozenset)):
            children = list(node)
        else:
            continue
        if done:
            path.discard(id(node))
            kids = [c for c in children if id(c) in sizes]
            size = 1 + len(children) - len(kids) + sum(sizes[id(c)] for c in kids)
            depth = 1 + max((depth_of[id(c)] for c in kids), default=0)
            if size > MAX_VALUES:
                raise InputError(f"{source}: expands to more than {MAX_VALUES:,} values (shared references "
                                 f"repeated), beyond any file groupfel reads; {fix}")
            sizes[id(node)], depth_of[id(node)] = size, depth
            continue
        if id(node) in path:
            raise InputError(f"{source}: a list or dict that holds itself, which no file groupfel reads holds; {fix}")
        if len(path) >= MAX_DEPTH:
            raise InputError(f"{source}: lists or dicts nested more than {MAX_DEPTH} deep, beyond any file "
                             f"groupfel reads; {fix}")
        kinds = set(map(type, children))
        if int in kinds and max(map(int.bit_length, (c for c in children if type(c) is int)), default=0) > max_bits:
            raise InputError(f"{source}: an integer of more than {MAX_DIGITS} digits, beyond any value groupfel "
                             f"reads; {fix}")
        if kinds <= _LEAVES:        # most of a trace: a client's dict of numbers, a list of times
            sizes[id(node)], depth_of[id(node)] = 1 + len(children), 1
            continue
        path.add(id(node))
        todo.append((node, True))
        todo.extend((c, False) for c in children if type(c) not in _LEAVES)


# -- messages --------------------------------------------------------------------------------------------

class _Short(reprlib.Repr):
    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict, self.maxset = 3, 6, 6, 4, 6
        self.maxstring, self.maxlong, self.maxother = 80, 40, 80

    def repr_int(self, x, level):
        if x.bit_length() > 128:     # repr of a 4,301-digit int raises; its size is what a message needs
            return f"<an integer of about {int(x.bit_length() * 0.30103) + 1:,} digits>"
        return super().repr_int(x, level)


_SHORT = _Short()


def short(value: Any, limit: int = MAX_MESSAGE_VALUE) -> str:
    """The repr of ``value`` a message may quote: at most ``limit`` characters, whatever its size,
    depth or shared references (a string is quoted like ``repr``)."""
    try:
        text = _SHORT.repr(value)
    except Exception:       # a user object's own __repr__ failing: its type is enough
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def clip(message: str, limit: int = 2000) -> str:
    """A message (or a library's text inside one) on one line of at most ``limit`` characters, its
    start kept (where it names the field)."""
    message = message.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return message if len(message) <= limit else message[:limit - 40] + f"... ({len(message):,} characters)"
