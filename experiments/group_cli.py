"""``groupfel group``: run one grouping policy on a clients × labels count matrix from a CSV.

The CSV has a header and one row per client; every column is a label's sample count except an
optional ``edge`` column, which assigns clients to edges (groups never cross edges). Client ids
in the output are the 0-based data-row index of the input.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from groupfel.errors import InputError
from groupfel.usercsv import read_user_csv
from groupfel.userfile import short

from . import flags

if TYPE_CHECKING:
    import numpy as np


def read_label_matrix(path: str | Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(counts clients × labels, edge of each client, label names); InputError on a bad file.

    Read with the csv module rather than pandas: importing pandas alone would double the
    start-up time of ``groupfel group``."""
    import numpy as np

    path = Path(path)
    if path.is_dir():
        raise InputError(f"--label-matrix {str(path)!r} is a directory; give the CSV file of clients × label "
                         f"counts (e.g. {str(path / 'labels.csv')!r})")
    if not path.exists():
        raise InputError(f"--label-matrix: no such file {str(path)!r}; give a CSV of clients × label counts")
    table = read_user_csv(path, f"--label-matrix {path}")
    header, data = table.header, table.rows
    if not data:
        raise InputError(f"--label-matrix {path}: no client rows; write one row of label counts per client")
    edge_col = next((i for i, c in enumerate(header) if c.lower() == "edge"), None)
    labels = [i for i in range(len(header)) if i != edge_col]
    if not labels:
        raise InputError(f"--label-matrix {path}: no label columns; add one count column per label")
    values = np.zeros((len(data), len(header)), dtype=np.int64)
    for r, row in enumerate(data):
        for i, name in enumerate(header):
            cell = row.get(name)
            try:
                v = float(cell)
            except ValueError:
                v = float("nan")
            if not (np.isfinite(v) and 0 <= v < 2**62 and v == round(v)):
                raise InputError(f"{table.where(row)} column {name!r} is {short(cell)}; every cell must "
                                 f"be a non-negative integer (empty cells are not allowed)")
            values[r, i] = int(v)
    counts = values[:, labels]
    empty = np.flatnonzero(counts.sum(axis=1) == 0)
    if len(empty):
        raise InputError(f"--label-matrix {path}: client row {int(empty[0]) + 1} has no samples (all counts 0); "
                         f"remove it or give it its label counts")
    edges = values[:, edge_col] if edge_col is not None else np.zeros(len(data), dtype=np.int64)
    return counts, edges, [header[i] for i in labels]


def parse_params(items: list[str] | None) -> dict:
    """``--set KEY=VALUE`` items as {key: value}; VALUE is a TOML value (a bare word is a string:
    ``grow=authors``)."""
    out = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or not text.strip():
            raise InputError(f"--set {item!r}: write KEY=VALUE, a parameter of the policy, e.g. --set leftover=drop")
        out[key.strip()] = flags.toml_value(text.strip())
    return out


def make_policy(name: str, min_group_size: int | None, max_cov: float | None, extra: dict | None = None):
    from groupfel.policies import groupings

    cls = groupings.resolve(name, "--policy")   # a shipped name, an installed plug-in or module:Class
    if cls.needs_gradients or cls.needs_distances is True:
        raise InputError(f"--policy {name}: needs client {'gradients' if cls.needs_gradients else 'distances'}, "
                         f"which a label matrix does not hold; use it in 'groupfel run' or choose one of "
                         f"{sorted(n for n, c in groupings.items() if not c.needs_gradients)}")
    params = {k: v for k, v in (("min_group_size", min_group_size), ("max_cov", max_cov)) if v is not None}
    flag = {"min_group_size": "--min-group-size", "max_cov": "--max-cov"}
    for key in extra or {}:
        if key in flag:
            raise InputError(f"--set {key}: use {flag[key]}")
        flag[key] = f"--set {key}"
    try:
        return groupings.make(name, {**params, **(extra or {})}, "group")
    except InputError as exc:
        msg = str(exc)
        for key, opt in flag.items():
            msg = msg.replace(f"group.{key}", opt).replace(f"group: {key} ", f"{opt}: {key} ")
        raise InputError(msg) from None


def run_grouping(counts: np.ndarray, edges: np.ndarray, policy, seed: int) -> dict:
    """Group each edge's clients, checked at the seam; the JSON-able result (groups and summary)."""
    import numpy as np
    from groupfel.policies import EdgeView
    from groupfel.policies.cov import cov_of_counts

    from groupfel.emulator.contracts import calling, check_grouping, spec_of

    norm = getattr(policy, "normalization", "std")
    groups, dropped, touched = [], [], 0
    for e in np.unique(edges):
        members = np.flatnonzero(edges == e)
        if policy.min_group_size > len(members):
            raise InputError(f"--min-group-size: {policy.min_group_size} exceeds the {len(members)} clients "
                             f"of edge {int(e)}; lower it")
        spec = spec_of(policy)
        with calling("--policy", spec, "group()"):
            result = policy.group(EdgeView(counts[members]), np.random.default_rng((seed, int(e))))
        local_groups, missing = check_grouping(getattr(result, "groups", result), getattr(result, "dropped", None),
                                               len(members), "--policy", spec, policy.leaves_clients_out, int(e))
        dropped += members[missing].tolist()
        touched += getattr(result, "leftover_clients", 0)
        for local in local_groups:
            clients = members[np.sort(local)]
            label_counts = counts[clients].sum(axis=0)
            groups.append({"edge": int(e), "clients": clients.tolist(), "size": len(clients),
                           "samples": int(label_counts.sum()), "label_counts": label_counts.tolist(),
                           "cov": float(cov_of_counts(label_counts, norm))})
    sizes = np.array([g["size"] for g in groups])
    summary = {"policy": policy.name, "n_clients": len(counts), "n_edges": len(np.unique(edges)),
               "n_groups": len(groups), "size_min": int(sizes.min()), "size_max": int(sizes.max()),
               "size_mean": float(sizes.mean()), "cov_mean": float(np.mean([g["cov"] for g in groups])),
               "cov_normalization": norm, "clients_dropped": sorted(dropped),
               "clients_touched_by_leftover_rule": touched}
    return {"groups": groups, "summary": summary}


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    """Right-aligned columns (what pandas' to_string prints, without importing pandas)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return "\n".join(" ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [header, *rows])


def format_table(result: dict, label_names: list[str]) -> str:
    header = ["edge", "group", "size", "samples", "cov", *label_names, "clients"]
    rows = [[str(g["edge"]), str(i), str(g["size"]), str(g["samples"]), f"{g['cov']:.4f}",
             *map(str, g["label_counts"]), " ".join(map(str, g["clients"]))]
            for i, g in enumerate(result["groups"])]
    table = _text_table(header, rows)
    s = result["summary"]
    lines = [table, "", f"policy {s['policy']}: {s['n_groups']} groups of {s['n_clients']} clients on "
             f"{s['n_edges']} edge(s); size min {s['size_min']} / mean {s['size_mean']:.2f} / max {s['size_max']}; "
             f"mean CoV {s['cov_mean']:.4f} ({s['cov_normalization']})"]
    if s["clients_dropped"] or s["clients_touched_by_leftover_rule"]:
        lines.append(f"clients dropped: {s['clients_dropped'] or 'none'}; clients touched by the leftover rule: "
                     f"{s['clients_touched_by_leftover_rule']}")
    return "\n".join(lines)


def _cmd_group(args) -> int:
    counts, edges, names = read_label_matrix(args.label_matrix)
    policy = make_policy(args.policy, args.min_group_size, args.max_cov, parse_params(args.set))
    result = run_grouping(counts, edges, policy, args.seed)
    print(json.dumps(result, indent=2) if args.format == "json" else format_table(result, names))
    return 0


def _policy_help(parser) -> None:
    """Fill --policy's help with the policy names, when the help is printed (listing them imports
    the policies, which ``groupfel --help`` and the parser of other commands must not pay for)."""
    from groupfel.policies import groupings

    usable = sorted(n for n, c in groupings.items() if not c.needs_gradients)
    probed = sorted(n for n, c in groupings.items() if c.needs_gradients)
    installed = [n for n in groupings.names() if n not in groupings]   # entry points: metadata, not imported
    action = next(a for a in parser._actions if "--policy" in a.option_strings)
    action.help = (f"grouping policy: {', '.join(usable)} ({', '.join(probed)} group on client gradients, "
                   f"which a label matrix does not hold: use them in 'groupfel run')"
                   + (f"; installed plug-ins: {', '.join(installed)}" if installed else "")
                   + "; or a plug-in's import path module:Class")


def add_group_parser(sub) -> None:
    p = sub.add_parser("group", help="partition clients of a label-count CSV with a grouping policy")
    p.add_argument("--policy", required=True, help="grouping policy (the names: groupfel group --help)")
    p.before_help = _policy_help
    p.add_argument("--label-matrix", required=True, metavar="FILE.csv",
                   help="clients × labels counts with a header; optional 'edge' column")
    p.add_argument("--min-group-size", type=flags.Number(int, 1, 10**8), default=None, help="MinGS (default: the policy's)")
    p.add_argument("--max-cov", type=flags.MAX_COV, default=None, help="MaxCoV, covg only (default: the policy's)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="another parameter of the policy, e.g. --set grow=authors --set leftover=drop (covg as "
                        "the Group-FEL authors' code runs it); repeatable")
    p.add_argument("--seed", type=flags.SEED, default=0, help="(default 0)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="(default table)")
    p.set_defaults(func=_cmd_group)
