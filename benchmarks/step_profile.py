"""The full-size step on one GPU, profiled: at most 5 minutes, for the first minutes a GPU is lent.

    python benchmarks/step_profile.py [--json step-profile.json]   # on a GPU machine
    python benchmarks/step_profile.py --device cpu --quick         # the same code on tiny sizes

1. **step**: one local SGD step's gradients of W stacked clients of resnet-1 (1x28x28, B = 5: the
   full-size Group-FEL step) at W = 56 (one run's group round) and W = 416 (8 runs stacked), per
   client-step: ``vmap`` over the model against the written-out step (emulator.stacked), each
   under every kernel setting: fp32 NCHW (the default), channels-last, cuDNN autotuning (among
   deterministic algorithms), tf32, bf16. Medians of ``--repeats``, the forms interleaved.
2. **engine**: one engine call of W ragged clients (20-200 samples, E = 2) in the stacked
   formulation, as a run trains: ordered by step count, each step its bucket of live rows, one
   captured CUDA graph per bucket; seconds, and the rows computed against a padded stack's.
3. **full-size** (``--rounds`` > 0): benchmarks/campaign.py's full-size rounds at ``--stack`` 1
   and 8, with the fp32 limit and the projected hours of the pending reproductions.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from campaign import interleaved_ms  # noqa: E402  (benchmarks/campaign.py)
from gpu import usable_device  # noqa: E402  (benchmarks/gpu.py)

from groupfel.emulator.devices import prepare  # noqa: E402
from groupfel.emulator.models import build_model  # noqa: E402
from groupfel.emulator.precision import autocast, set_precision  # noqa: E402
from groupfel.emulator.stacked import GroupedNet, Kernels, bucket  # noqa: E402

# (name, channels_last, autotune, precision): each a GPU's; a CPU runs the first two
SETTINGS = [("fp32", False, False, "fp32"), ("channels-last", True, False, "fp32"), ("autotune", False, True, "fp32"),
            ("tf32", False, False, "tf32"), ("bf16", False, False, "bf16")]


def step_rows(device: torch.device, widths, shape, batch: int, repeats: int) -> list[dict]:
    from torch.func import functional_call, grad, vmap

    rows = []
    settings = SETTINGS if device.type == "cuda" else SETTINGS[:2]
    for width in widths:
        torch.manual_seed(0)
        model = build_model("resnet-1", shape, 10).to(device)
        names = [n for n, _ in model.named_parameters()]
        params = [p.detach().unsqueeze(0).repeat(width, *[1] * p.dim()).clone() for p in model.parameters()]
        x = torch.randn(width, batch, *shape, device=device)
        y, m = torch.randint(0, 10, (width, batch), device=device), torch.ones(width, batch, device=device)

        def loss(ps, x, y, m):
            ce = F.cross_entropy(functional_call(model, dict(zip(names, ps)), (x,)), y, reduction="none")
            return (ce * m).sum() / m.sum().clamp(min=1.0)
        vmapped = vmap(grad(loss))
        for name, channels_last, autotune, precision in settings:
            set_precision(device, precision)
            Kernels(autotune=autotune, channels_last=channels_last).apply(device)
            grouped = GroupedNet.of(model, channels_last=channels_last)
            held = [grouped.zeros(width, i, p.shape, device).copy_(q)   # as a stack holds them
                    for i, (p, q) in enumerate(zip(model.parameters(), params))]

            def timed(f):
                def run():
                    with autocast(device, precision):
                        f()
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                return run
            t = interleaved_ms([timed(lambda: vmapped(tuple(params), x, y, m)), timed(lambda: grouped(held, x, y, m))],
                               repeats)
            rows.append({"W": width, "setting": name, "vmap_ms": t[0] / width, "grouped_ms": t[1] / width,
                         "vmap_over_grouped": t[0] / t[1]})
            print(f"step  W {width:4d} {name:14} vmap {t[0] / width:8.4f}  grouped {t[1] / width:8.4f} ms per "
                  f"client-step  ({t[0] / t[1]:.2f}x)", flush=True)
        set_precision(device, "fp32")
        Kernels().apply(device)
    return rows


def engine_row(device: torch.device, width: int, quick: bool) -> dict:
    """One stacked engine call of ``width`` ragged Fashion-MNIST-sized clients."""
    from groupfel.emulator.training import BatchedEngine
    from groupfel.topologies import Dataset

    rng = np.random.default_rng(0)
    sizes = rng.integers(20, 201, width) if not quick else rng.integers(3, 20, width)
    n = int(sizes.sum())
    side = 8 if quick else 28
    data = Dataset("synthetic", rng.standard_normal((n, 1, side, side)).astype(np.float32),
                   rng.integers(0, 10, n).astype(np.int64), np.zeros((1, 1, side, side), np.float32),
                   np.zeros(1, np.int64), 10)
    parts = np.split(np.arange(n), np.cumsum(sizes)[:-1])
    eng = BatchedEngine(data, parts, "resnet-1", 0.001, 5, str(device), momentum=0.9, weight_decay=1e-4,
                        formulation="stacked", workers=1)
    start = eng.initial_weights(0)
    clients, seeds = list(range(width)), list(range(width))
    momentum = torch.zeros(width, eng.n_params, device=device)
    eng.train(start, clients, 2, seeds, momentum=momentum)   # captures the buckets' graphs
    t0 = time.perf_counter()
    eng.train(start, clients, 2, seeds, momentum=momentum)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    steps = -(-sizes // 5)
    live = [int((steps > s).sum()) for s in range(int(steps.max()))]
    stack_width = bucket(width, 1 << 30) if eng.buckets else width
    computed = sum(bucket(k, stack_width) if eng.buckets else max(k, 2) for k in live)
    row = {"W": width, "seconds": seconds, "rows_computed": 2 * computed, "rows_padded": 2 * len(live) * stack_width,
           "graphs": len(next(iter(eng._stacks.values()))._graphs)}
    print(f"engine W {width:4d}: {seconds:.3f} s a call (E = 2), {row['rows_computed']} row-steps computed of "
          f"{row['rows_padded']} padded, {row['graphs']} captured graphs", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (the test suite runs this on a CPU)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=None, help="full-size rounds (default 1 on a GPU; quick: 0)")
    ap.add_argument("--json", default="step-profile.json", help="where the results go (default step-profile.json)")
    args = ap.parse_args()
    device = usable_device(args.device, "step profile")
    if device is None:
        return 2
    prepare(device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    shape, widths = ((1, 8, 8), (4, 8)) if args.quick else ((1, 28, 28), (56, 416))
    out = {"device": str(device), "step": step_rows(device, widths, shape, 5, 1 if args.quick else args.repeats),
           "engine": [engine_row(device, w, args.quick) for w in widths]}
    rounds = args.rounds if args.rounds is not None else (0 if args.quick else 1)
    if rounds:
        import campaign
        from gpu import pending_projection

        with tempfile.TemporaryDirectory() as tmp:
            fits = {s: campaign.full_size(str(device), s, rounds, Path(tmp)) for s in (1, 8)}
        campaign.print_full_size(str(device), rounds, 8, fits, {s: pending_projection(f) for s, f in fits.items()})
        out["full_size"] = {str(s): f for s, f in fits.items()}
    Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
