import atexit
import copy
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from groupfel.emulator import numerics
from groupfel.emulator.config import parse_config

# The default numerics, set before any test loads torch, as the groupfel command sets them.
numerics.apply("portable")
# Discriminator distances are kept in a cache of this test session's own, not the user's.
os.environ["GROUPFEL_CACHE"] = tempfile.mkdtemp(prefix="groupfel-test-cache-")
atexit.register(shutil.rmtree, os.environ["GROUPFEL_CACHE"], ignore_errors=True)


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU this process may use. xdist's own count is of physical
    cores where psutil is installed, one on a machine of two hyperthreads."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """The suite runs on pytest-xdist workers (``--dist loadgroup``, pyproject.toml). Tests that
    share a module-scoped fixture go to one worker, so that the fixture is built once; a test
    that starts Ray says so with ``xdist_group("ray")``, so that no two Ray instances meet."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        shared = sorted(name for name, defs in item._fixtureinfo.name2fixturedefs.items()
                        if defs and defs[-1].scope == "module")
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{shared[0]}"))


TINY = {
    "name": "tiny",
    "seed": 3,
    "data": {"dataset": "digits", "alpha": 0.3, "min_samples": 8, "max_samples": 20},
    "topology": {"edges": 2, "clients_per_edge": 6},
    "cost": {"task": "cifar10-resnet", "training": "sgd", "group_operations": ["secagg"]},
    "train": {"model": "mlp", "lr": 0.05, "batch_size": 8, "group_rounds": 2, "local_epochs": 1,
              "rounds": 6, "eval_every": 1},
    "arms": [
        {"name": "covg-esrcov", "grouping": {"policy": "covg", "min_group_size": 3, "max_cov": 0.5},
         "sampling": {"policy": "esrcov", "groups_per_round": 2}},
        {"name": "rg-random", "grouping": {"policy": "rg", "min_group_size": 3},
         "sampling": {"policy": "random", "groups_per_round": 2}},
    ],
}


@pytest.fixture
def tiny_dict():
    return copy.deepcopy(TINY)


@pytest.fixture
def tiny_config(tiny_dict):
    return parse_config(tiny_dict)


class _Payload:
    """Unpickling this would create the marker file (any code could run in its place)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def code_running_payload():
    """A picklable object whose unpickling creates the given marker file: a stand-in for a
    malicious file's payload."""
    return _Payload


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
REQUIRE_BROWSER = "GROUPFEL_REQUIRE_BROWSER"


def find_browser() -> str | None:
    """A headless-capable Chromium: $GROUPFEL_BROWSER (a path or a name on PATH) if set, else the
    first of BROWSERS on PATH."""
    named = os.environ.get("GROUPFEL_BROWSER")
    for name in (named,) if named else BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture
def browser() -> str:
    """The browser's path; without one the test skips, saying why, unless $GROUPFEL_REQUIRE_BROWSER
    is set (CI, which installs Chromium, sets it), where it fails."""
    exe = find_browser()
    if exe is None:
        looked = os.environ.get("GROUPFEL_BROWSER") or ", ".join(BROWSERS)
        reason = (f"no Chromium found (looked for {looked} on PATH); install chromium to check the HTML "
                  f"report in a real browser")
        if os.environ.get(REQUIRE_BROWSER):
            pytest.fail(f"{reason} ({REQUIRE_BROWSER} is set, so this test is required)")
        pytest.skip(reason)
    return exe


def write_fsdd(directory: Path, lengths) -> dict:
    """FSDD's on-disk format under ``directory``: {digit}_{speaker}_{index}.wav, 8 kHz 16-bit, one
    recording of each length a digit, random samples; the first is index 0 (the test set, index
    0-4), the others index 5, 6, ... (training). Their samples by file name."""
    import numpy as np
    from scipy.io import wavfile

    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    signals = {}
    for i, n in enumerate(lengths):
        for digit in range(10):
            name = f"{digit}_spk_{0 if i == 0 else i + 4}.wav"
            signals[name] = rng.integers(-20000, 20000, n).astype(np.int16)
            wavfile.write(directory / name, 8000, signals[name])
    return signals


def write_toml(tmp_path, d, name="c.toml"):
    """A config dict written as TOML under ``tmp_path``; its path."""
    import tomli_w

    path = tmp_path / name
    path.write_text(tomli_w.dumps(d))
    return path


def one_error_line(capsys) -> str:
    """The CLI's stderr, asserted to be one 'groupfel: error:' line without a traceback."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("groupfel: error: ") and "Traceback" not in err, err
    return err


def one_arm(d, **train):
    """``d`` with its rg-random arm only (cheap, no training to group) and ``train`` changes."""
    d["arms"] = [d["arms"][1]]
    d["train"].update(train)
    return d


def reproduction_script(path: str):
    """A script that sits beside its reproduction (experiments/reproductions/NAME/x.py, not part
    of the installed package), imported as a module."""
    import importlib.util

    file = Path(__file__).parent.parent / "experiments" / "reproductions" / path
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out
