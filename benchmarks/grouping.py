"""Grouping runtimes, measured side by side in one run (run from the repository root):

    python benchmarks/grouping.py [--quick]

* CoVG fast (vectorised steps) vs the straightforward literal Alg. 2 (policies/reference.py) on
  the same label matrix and seed; the two must produce identical groups. The straightforward
  one runs only up to 1,000 clients (it is O(|K|³|Y|): minutes beyond), nothing is extrapolated.
* KLDG, CDG, QCID and FedCollab on 1,000 clients.
* HCCT / HCCT-E on 100 clients with real gradients: one local epoch of a small CNN on
  scikit-learn's digits from a common start (the runner's probe), gradient = start − trained.

Each time is the best of ``--repeat`` runs. Targets from the issue are printed beside them.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script from anywhere

from groupfel.emulator.training import TorchEngine  # noqa: E402
from groupfel.experiments.grouping_studies import synthetic_label_matrix  # noqa: E402
from groupfel.policies import EdgeView, groupings  # noqa: E402
from groupfel.policies.reference import covg_reference  # noqa: E402
from groupfel.topologies import dirichlet_partition, label_matrix, load_dataset  # noqa: E402


def best_time(fn, repeat: int) -> tuple[float, object]:
    best, out = np.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def report(rows: list[tuple]) -> None:
    for what, n, sec, target in rows:
        verdict = "" if target is None else ("ok" if sec < target else "SLOWER THAN TARGET")
        tgt = "" if target is None else f"< {target:g}"
        print(f"{what:<56}{n:>8}{sec:>11.4f}{tgt:>10}  {verdict}", flush=True)


def covg_rows(sizes: list[int], reference_max: int, repeat: int) -> list[tuple]:
    rows = []
    pol = groupings.make("covg", {"min_group_size": 5, "max_cov": 0.5})
    for n in sizes:
        L = synthetic_label_matrix(n, np.random.default_rng((0, n)))
        fast_s, fast = best_time(lambda: pol.group(EdgeView(L), np.random.default_rng(1)), repeat)
        target = {1000: 0.06, 10000: 5.0}.get(n)
        rows.append(("covg fast (vectorised)", n, fast_s, target))
        if n <= reference_max:
            ref_s, ref = best_time(lambda: covg_reference(pol, EdgeView(L), np.random.default_rng(1)), 1)
            same = [g.tolist() for g in fast.groups] == [g.tolist() for g in ref.groups]
            rows.append((f"covg straightforward: {ref_s / fast_s:.0f}x slower, same groups: {same}", n, ref_s, None))
    return rows


def baseline_rows(n: int, repeat: int) -> list[tuple]:
    L = synthetic_label_matrix(n, np.random.default_rng((0, n)))
    rows = []
    for name in ("rg", "cdg", "kldg", "qcid", "fedcollab"):
        pol = groupings.make(name, {"min_group_size": 5})
        sec, res = best_time(lambda: pol.group(EdgeView(L), np.random.default_rng(1)), repeat)
        rows.append((f"{name} ({len(res.groups)} groups)", n, sec, None if name == "rg" else 2.0))
    return rows


def hcct_rows(n: int, repeat: int) -> list[tuple]:
    data = load_dataset("digits")
    rng = np.random.default_rng(0)
    parts = dirichlet_partition(data.y_train, np.full(n, 13), 0.3, data.num_classes, rng)
    engine = TorchEngine(data, parts, "cnn", lr=0.05, batch_size=16)
    start = engine.initial_weights(0)
    engine.train(start, [0], 1, [0])  # warm torch up so the probe time is the probe's
    t0 = time.perf_counter()
    grads = (start[None, :] - engine.train(start, list(range(n)), 1, list(range(n)))).numpy().astype(float)
    probe_s = time.perf_counter() - t0
    slices, offset = [], 0
    for module in engine.model.modules():
        size = sum(p.numel() for p in module.parameters(recurse=False))
        if size:
            slices.append(slice(offset, offset + size))
            offset += size
    view = EdgeView(label_matrix(data.y_train, parts, data.num_classes), grads, tuple(slices))
    rows = [(f"gradient probe: 1 epoch of the CNN ({grads.shape[1]} params)", n, probe_s, None)]
    for name in ("hcct", "hcct-e"):
        pol = groupings.make(name, {"alpha": 10.0})
        sec, res = best_time(lambda: pol.group(view, None), repeat)
        rows.append((f"{name} on real gradients ({len(res.groups)} groups)", n, sec, 5.0))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip 10,000 clients and the 1,000-client reference")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [100, 300, 1000] if args.quick else [100, 300, 1000, 3000, 10000]
    print(f"{'what':<56}{'clients':>8}{'seconds':>11}{'target':>10}  verdict")
    report(covg_rows(sizes, 300 if args.quick else 1000, args.repeat))
    report(baseline_rows(1000, args.repeat))
    report(hcct_rows(100, args.repeat))


if __name__ == "__main__":
    main()
