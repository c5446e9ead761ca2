"""The import graph of the ``groupfel`` package shows the design: every import points down and
none closes a circle.

Floors, bottom up: ``groupfel.errors`` and ``groupfel.usercsv`` (what every layer raises and
reads users' files with); the pluggable layers (``policies``, ``topologies``,
``cost_models``); the ``emulator``; ``experiments`` (commands, API, studies); the namespace's own
front (``groupfel/__init__.py``, ``__main__.py``). A module imports only its own floor and those
below, at any depth (inside functions too: a lazy import is still a dependency), and no chain of
imports leads back to where it started. Above the emulator, ``experiments`` and ``benchmarks``
reach arms only through :mod:`groupfel.emulator.driver`, and the run path's modules depend one
way: runner -> backends -> tasks."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("emulator", "policies", "topologies", "cost_models", "experiments")
FLOORS = {"groupfel.errors": 0, "groupfel.usercsv": 0, "groupfel.userfile": 0, "groupfel.policies": 1, "groupfel.topologies": 1, "groupfel.cost_models": 1,
          "groupfel.emulator": 2, "groupfel.experiments": 3, "groupfel": 4}


def modules(root: Path = ROOT) -> dict[str, tuple[str, Path]]:
    """Every module of the installed package: name -> (its package, file). The folders at the
    repository's root install beneath ``groupfel`` (pyproject's package-dir)."""
    out = {}
    for top in ("groupfel", *FOLDERS):
        for path in sorted((root / top).rglob("*.py")) if (root / top).is_dir() else []:
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[0] != "groupfel":
                parts.insert(0, "groupfel")
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            out[name] = (name if is_package else name.rpartition(".")[0], path)
    return out


def imports(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, absolute name) of every import at any depth (functions, classes, ``if``/``try``
    blocks, ``importlib.import_module("...")``); ``from x import y`` gives ``x.y`` (y may be a
    submodule) and ``x``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:   # relative: resolve against the package the file sits in
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("__import__", "import_module")):
            out.append((node.lineno, node.args[0].value))
    return sorted(out)


def _target(name: str, known: dict) -> str | None:
    """The package module an imported name lives in (``groupfel.policies.grouping.EdgeView`` ->
    ``groupfel.policies.grouping``), or None outside the package."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def floor(module: str) -> int:
    """The floor of the longest matching prefix (``groupfel.emulator.io``: the emulator's)."""
    return FLOORS[max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len)]


def graph(root: Path = ROOT) -> tuple[nx.DiGraph, list[str]]:
    """The import graph (edges carry ``where``: file:line) and every upward import."""
    known = modules(root)
    g, upward = nx.DiGraph(), []
    for name, (package, path) in known.items():
        g.add_node(name)
        for line, imported in imports(ast.parse(path.read_text(), str(path)), package):
            target = _target(imported, known)
            # a module's own parent packages (``from . import x``, ``from groupfel.policies import
            # groupings`` inside policies/) are its own floor; the top namespace's attributes are not
            if target is None or target == name or (name.startswith(target + ".") and target != "groupfel"):
                continue
            where = f"{path.relative_to(root)}:{line}"
            g.add_edge(name, target, where=where)
            if floor(target) > floor(name):
                upward.append(f"{where}: {name} imports {target}, a floor above it")
    return g, upward


def circles(g: nx.DiGraph) -> list[str]:
    return [" -> ".join(c + [c[0]]) + "  (" + ", ".join(g.edges[a, b]["where"] for a, b in zip(c, c[1:] + c[:1])) + ")"
            for c in nx.simple_cycles(g)]


def test_no_import_circles():
    found = circles(graph()[0])
    assert not found, "import circles:\n" + "\n".join(found)


def test_every_import_points_down():
    up = graph()[1]
    assert not up, "upward imports (errors < policies, topologies, cost_models < emulator < experiments):\n" + \
        "\n".join(up)


def test_the_algorithm_base_imports_no_algorithm():
    """Each shipped family registers itself, as a plug-in module would; the base knows none."""
    g = graph()[0]
    families = [m for m in g if m.startswith("groupfel.emulator.algorithms.") and not m.endswith(".base")]
    assert families, "no algorithm family modules found"
    assert not [f for f in families if g.has_edge("groupfel.emulator.algorithms.base", f)]


def test_commands_reach_arms_only_through_the_driver():
    known = modules()
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {module}"
           for folder in ("experiments", "benchmarks") for path in sorted((ROOT / folder).rglob("*.py"))
           for line, module in imports(ast.parse(path.read_text()), "groupfel.experiments")
           if (_target(module, known) or "").startswith(("groupfel.emulator.rounds", "groupfel.emulator.arm"))]
    assert not bad, "plan and run arms with groupfel.emulator.driver (plan_arms, run_arm):\n" + "\n".join(bad)


@pytest.mark.parametrize("module", ["backends", "tasks"])
def test_the_run_path_depends_one_way(module):
    """runner imports backends and tasks; neither reaches runner (no cycle), and tasks, the one
    assembly site, imports no other experiments module."""
    g = graph()[0]
    reached = nx.descendants(g, f"groupfel.experiments.{module}")
    assert "groupfel.experiments.runner" not in reached
    if module == "tasks":
        assert not [m for m in reached if m.startswith("groupfel.experiments.")], sorted(reached)


@pytest.mark.parametrize("files, found", [
    ({"cost_models/x.py": "from groupfel.emulator.io import atomic_write\n"}, ["up"]),
    ({"cost_models/x.py": "def f():\n    if True:\n        import groupfel.emulator.training as t\n"}, ["up"]),
    ({"policies/x.py": "class A:\n    def f(self):\n        from groupfel.experiments.cli import main\n"}, ["up"]),
    ({"topologies/x.py": "import importlib\nm = importlib.import_module('groupfel.emulator.world')\n"}, ["up"]),
    ({"emulator/x.py": "from groupfel import run\n"}, ["up"]),
    ({"cost_models/x.py": "from groupfel.errors import InputError\nfrom .y import Curve\n",
      "cost_models/y.py": "Curve = 1\n"}, []),
    ({"emulator/a.py": "from .b import B\n", "emulator/b.py": "def f():\n    from .a import A\n"}, ["circle"]),
    ({"emulator/a.py": "from . import b\n", "emulator/b.py": "from groupfel.emulator import a\n"}, ["circle"]),
])
def test_the_check_sees_every_import(tmp_path, files, found):
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "groupfel").mkdir()
    (tmp_path / "groupfel" / "__init__.py").write_text("")
    (tmp_path / "groupfel" / "errors.py").write_text("")
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    g, up = graph(tmp_path)
    assert (["up"] if up else []) + (["circle"] if circles(g) else []) == found


@pytest.mark.slow
def test_the_wheel_holds_one_package_that_imports_on_its_own(tmp_path):
    """``pip wheel .``: groupfel/ and its dist-info, nothing else; installed alone, it imports and
    its command starts (no top-level emulator/, policies/, ... to collide with a user's own)."""
    import subprocess
    import sys
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("groupfel-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"groupfel", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "groupfel/cost_models/profiles/reference.csv" in names and "groupfel/experiments/configs/default.toml" in names
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True, capture_output=True)
    probe = ("import sys, groupfel, groupfel.emulator.driver as d; "
             "print(groupfel.__file__, d.__file__, 'emulator' in sys.modules, 'policies' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}).stdout.split()
    site = str(tmp_path / "site")
    assert out[0].startswith(site) and out[1].startswith(site) and out[2:] == ["False", "False"]
    help_ = subprocess.run([sys.executable, "-m", "groupfel", "--help"], capture_output=True, text=True, cwd=tmp_path,
                           env={"PYTHONPATH": site, "PATH": "/usr/bin:/bin"})
    assert help_.returncode == 0 and "usage: groupfel" in help_.stdout, help_.stderr
