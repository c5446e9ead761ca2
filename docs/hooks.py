"""MkDocs hooks: pages generated at build time, so they cannot drift from the code.

* ``reference/config.md``: every field of the run config (the pydantic models of emulator/config/)
  with its type, default, constraints and description, and every registered grouping, sampling
  and aggregation policy with its parameters. A field without a description fails the build.
* ``reference/api/*.md``: one mkdocstrings page per public module that exists.
* Optional pages (the tutorial notebook, guides written separately) are in the nav only when
  their file exists, so the build never points at a missing page.
"""
from __future__ import annotations

import dataclasses
import atexit
import logging
import re
import shutil
import sys
import tempfile
import types
import typing
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("mkdocs.hooks.groupfel")

OPTIONAL_PAGES = {"tutorial.ipynb", "plugins.md", "api.md", "cluster.md"}

# (page, title, module, intro); a module that is not in the tree yet is left out of the nav.
API_PAGES = [
    ("reference/api/experiments-api.md", "groupfel.experiments.api", "groupfel.experiments.api",
     "The Python API: run, load and compare studies from a script or a notebook."),
    ("reference/api/policies.md", "policies", "policies",
     "Grouping, sampling and aggregation policies and their registries."),
    ("reference/api/topologies.md", "topologies", "topologies",
     "Datasets, data placement and the cloud/edge/client graph."),
    ("reference/api/cost-models.md", "cost_models", "cost_models",
     "Cost curves, device profiles, the Eq. 5 cost model, calibration and the what-if sweep."),
    ("reference/api/config.md", "groupfel.emulator.config", "groupfel.emulator.config",
     "The run configuration's pydantic models (see also the [config reference](../config.md))."),
]

# Submodules documented on each package's page (a package re-exports their public names).
SUBMODULES = {
    "policies": ["grouping", "cov", "sampling", "aggregation", "registry"],
    "topologies": ["datasets", "partition", "topology"],
    "cost_models": ["curves", "model", "profiles", "calibrate", "measure", "secagg", "whatif"],
}


def _module_exists(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _api_pages() -> list[tuple[str, str, str, str]]:
    return [p for p in API_PAGES if _module_exists(p[2])]


def _prune_nav(nav, docs_dir: Path):
    """Drop optional pages whose file is missing; expand the API reference entry."""
    out = []
    for item in nav:
        if isinstance(item, dict):
            (title, value), = item.items()
            if isinstance(value, list):
                out.append({title: _prune_nav(value, docs_dir)})
                continue
            if value == "reference/api.md":
                out.append({title: [{t: page} for page, t, _, _ in _api_pages()]})
                continue
            if value in OPTIONAL_PAGES and not (docs_dir / value).is_file():
                log.info("nav: %s is not written yet; left out", value)
                continue
        out.append(item)
    return out


def _package_tree() -> str:
    """A directory holding ``groupfel/`` as it installs: the namespace's own files beside links to
    the repository's folders (pyproject's package-dir), for mkdocstrings to read the API from."""
    root = Path(__file__).resolve().parents[1]
    stage = Path(tempfile.mkdtemp(prefix="groupfel-docs-"))
    atexit.register(shutil.rmtree, stage, True)
    (stage / "groupfel").mkdir()
    for item in (root / "groupfel").iterdir():
        (stage / "groupfel" / item.name).symlink_to(item)
    for folder in ("emulator", "topologies", "cost_models", "policies", "experiments"):
        (stage / "groupfel" / folder).symlink_to(root / folder, target_is_directory=True)
    return str(stage)


@event_priority(100)   # before mkdocstrings reads its handlers' paths
def on_config(config, **kwargs):
    config["nav"] = _prune_nav(config["nav"], Path(config["docs_dir"]))
    config.plugins["mkdocstrings"].config["handlers"]["python"]["paths"] = [_package_tree()]
    return config


def on_files(files, config, **kwargs):
    files.append(File.generated(config, "reference/config.md", content=config_reference()))
    for page, title, module, intro in _api_pages():
        files.append(File.generated(config, page, content=api_page(title, module, intro)))
    return files


# Sphinx roles in docstrings (:class:`X`) reach the HTML as ":class:<code>X</code>": keep the code.
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|obj|exc):(?=<code>)")


def on_page_content(html, page, **kwargs):
    return _ROLE.sub("", html) if page.file.src_uri.startswith("reference/api/") else html


# --- API reference -------------------------------------------------------------------------------

def api_page(title: str, module: str, intro: str) -> str:
    lines = [f"# `{title}`", "", intro, ""]
    if module not in SUBMODULES:
        return "\n".join(lines + [f"::: {module}", ""])
    # a package: its docstring, then each submodule (the package re-exports their public names)
    lines += [f"::: {module}", "    options:", "      members: false", "      show_root_heading: false", ""]
    for sub in SUBMODULES[module]:
        if _module_exists(f"{module}.{sub}"):
            lines += [f"::: {module}.{sub}", ""]
    return "\n".join(lines)


# --- config reference ----------------------------------------------------------------------------

def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " \\| ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "unset"
    if origin is not None:
        args = ", ".join(_type_name(a).strip("`") for a in typing.get_args(tp))
        return f"`{getattr(origin, '__name__', str(origin))}[{args}]`"
    return f"`{getattr(tp, '__name__', str(tp))}`"


def _toml(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if isinstance(value, dict):
        inner = ", ".join(f'"{k}" = {_toml(v).strip("`")}' if "-" in str(k) else f"{k} = {_toml(v).strip('`')}"
                          for k, v in value.items())
        return f"`{{ {inner} }}`"
    if isinstance(value, list):
        return "`[" + ", ".join(_toml(v).strip("`") for v in value) + "]`"
    return f"`{value!r}`"


_SYMBOLS = {"Ge": "≥", "Gt": ">", "Le": "≤", "Lt": "<", "MinLen": "length ≥", "MaxLen": "length ≤"}


def _constraints(field) -> str:
    out = []
    for m in field.metadata:
        name = type(m).__name__
        if name in _SYMBOLS:
            value = next(iter(dataclasses.asdict(m).values())) if dataclasses.is_dataclass(m) else m
            out.append(f"{_SYMBOLS[name]} {value}")
        elif getattr(m, "pattern", None):
            out.append(f"matches `{m.pattern}`")
    return ", ".join(out) or "–"


def _default(field) -> str:
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined
    if isinstance(field.default, BaseModel):
        return "its table's defaults"
    if field.default_factory is not None:
        return _toml(field.default_factory())
    if field.default is PydanticUndefined:
        return "**required**"
    return _toml(field.default)


def _model_table(model, where: str, missing: list[str]) -> list[str]:
    rows = ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if not field.description:
            missing.append(f"{where}.{name}" if where else name)
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{name}` | {_type_name(field.annotation)} | {_default(field)} | "
                    f"{_constraints(field)} | {desc} |")
    return rows


def _policy_tables(registry, heading: str) -> list[str]:
    lines = [f"### {heading}", "", "| name | parameters (default) | what it is |", "|---|---|---|"]
    for name in sorted(registry):
        cls = registry[name]
        params = [f"`{f.name}` = {_toml(f.default) if f.default is not dataclasses.MISSING else 'required'}"
                  for f in dataclasses.fields(cls) if f.init] if dataclasses.is_dataclass(cls) else []
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split()).replace("|", "\\|")
        lines.append(f"| `{name}` | {'<br>'.join(params) or '–'} | {doc} |")
    return lines + [""]


def _nested(annotation) -> list[tuple[type, bool]]:
    """The config models inside a field's type, each with whether it is a list of them."""
    from pydantic import BaseModel
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, False)]
    out = []
    for arg in typing.get_args(annotation):
        listed = typing.get_origin(annotation) is list
        out += [(m, listed or is_list) for m, is_list in _nested(arg)]
    return out


def _sections(root) -> list[tuple[str, str, type]]:
    """Every config model reachable from the root, found by walking the field types (so a new
    table appears by itself), as (title, dotted path, model); a model used at several places
    (client_link, edge_link) gets one section naming them all."""
    paths: dict[type, list[tuple[str, bool]]] = {}

    def visit(model, where: str, listed: bool) -> None:     # depth first: a table, then its sub-tables
        if model in paths:
            paths[model].append((where, listed))
            return
        paths[model] = [(where, listed)]
        for name, field in model.model_fields.items():
            for sub, is_list in _nested(field.annotation):
                visit(sub, f"{where}.{name}" if where else name, is_list)

    visit(root, "", False)
    sections = []
    for model, places in paths.items():
        where, listed = places[0]
        title = ("Top level" if not where else
                 ", ".join(f"`[[{w}]]`" if lst else f"`[{w}]`" for w, lst in places))
        sections.append((title, where, model))
    return sections


def config_reference() -> str:
    sys.path.insert(0, str(ROOT))
    from groupfel.emulator import config as c

    sections = _sections(c.RunConfig)
    missing: list[str] = []
    out = ["# Config reference", "",
           "Every key of a run config (TOML), generated at build time from the pydantic models in "
           "`emulator/config/`. An unknown key, a wrong type or a value outside its constraints is "
           "refused with one line naming the key, before anything runs. See "
           "[Config files](../guide/config.md) for a commented example.", ""]
    for title, where, model in sections:
        doc = (model.__doc__ or "").strip()
        out += [f"## {title}", ""]
        if doc and not doc.startswith("!!!"):
            out += [" ".join(doc.split()), ""]
        out += _model_table(model, where, missing) + [""]
    if missing:
        log.warning("config reference: fields without a description (add Field(description=...) "
                    "in emulator/config/): %s", ", ".join(missing))

    from groupfel.policies import aggregations, groupings, samplings
    out += ["## Policies", "",
            "The names an arm's `grouping = { policy = ... }`, `sampling = { policy = ... }` and "
            "`aggregation` accept, read from the registries, with each policy's parameters and "
            "defaults (the other keys of the inline table).", ""]
    out += _policy_tables(groupings, "Grouping (`grouping.policy`)")
    out += _policy_tables(samplings, "Sampling (`sampling.policy`)")
    out += _policy_tables(aggregations, "Aggregation (`aggregation`)")
    from groupfel.emulator.algorithms import algorithms

    out += ["## Training algorithms", "",
            "The names `train.algorithm` accepts, with each algorithm's parameters and defaults (the keys "
            "of `train.algorithm_params`).", ""]
    out += _policy_tables(algorithms, "Training algorithm (`train.algorithm`)")
    return "\n".join(out)
