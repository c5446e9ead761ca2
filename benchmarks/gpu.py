"""groupfel on a GPU: a check that a run on CUDA agrees with the CPU, and the Table 1 round on every
engine against this machine's CPU sequential engine, in one process, side by side.

    python benchmarks/gpu.py                       # on a GPU machine: at most 8 minutes on one H100 or H200
    python benchmarks/gpu.py --device cpu --quick  # the same code on tiny sizes (the test suite runs this)

It prints a table and writes JSON (``--json``, default gpu.json):

1. **tiny**: one small run (digits, MLP, 6 rounds) on ``--device`` and on the CPU. Final accuracy
   must agree within 0.05 (float32 on both; the sums run in another order, and over rounds the
   models drift apart by more than rounding), and two runs on ``--device`` must give bitwise the
   same results (deterministic algorithms).
2. **round**: the Table 1 round (Fashion-MNIST, 12 groups of 6 clients of 20-200 samples, K = 5,
   E = 2) for each model and batch size, on every engine: the CPU's sequential engine with all
   its threads (the baseline), the CPU's batched per-client engine (one process per core), and on
   ``--device`` the sequential, batched per-client and batched stacked engines. Slow engines are
   timed on 1 of the K = 5 group rounds and scaled by 5 (marked ``×5``): the work of each group
   round is the same. For each: seconds per round, speed-up over the CPU sequential engine,
   training TFLOP/s (forward + backward FLOPs from torch's FlopCounterMode), its share of the
   card's float32 peak (a measured 8192³ float32 matmul, TF32 off), and peak GPU memory.
3. **full-size**: ``--rounds`` rounds of the full-size Group-FEL run (groupfel-base: 300 clients,
   resnet-1, batch 5, K = 5, E = 2) on ``--device``, and from its seconds per unit of Eq. 5 cost
   the projected time of each pending full-size reproduction that shares that setting (its runs
   stop at the same cost budget); the others are listed as not projected.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engines import flops_per_sample, setup  # noqa: E402  (benchmarks/engines.py: the Table 1 round's clients)

from groupfel.emulator.compute import LocalSpec, run_group_rounds  # noqa: E402
from groupfel.emulator.config import parse_config  # noqa: E402
from groupfel.emulator.devices import check, describe, prepare, resolve  # noqa: E402
from groupfel.emulator.driver import plan_arm, run_arm  # noqa: E402
from groupfel.emulator.training import BatchedEngine, TorchEngine  # noqa: E402
from groupfel.emulator.world import build_world  # noqa: E402
from groupfel.errors import InputError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPRODUCTIONS = ROOT / "experiments" / "reproductions"
K, E = 5, 2
TINY_TOLERANCE = 0.05
TINY = {
    "name": "gpu-tiny", "seed": 0,
    "data": {"dataset": "digits", "alpha": 0.5, "min_samples": 20, "max_samples": 60},
    "topology": {"edges": 2, "clients_per_edge": 10},
    "cost": {"task": "cifar10-resnet", "training": "sgd", "group_operations": ["secagg"]},
    "train": {"model": "mlp", "lr": 0.05, "batch_size": 8, "group_rounds": 2, "local_epochs": 1, "rounds": 6,
              "eval_every": 2, "momentum": 0.5},
    "arms": [{"name": "covg", "grouping": {"policy": "covg", "min_group_size": 3, "max_cov": 0.5},
              "sampling": {"policy": "esrcov", "groups_per_round": 3}}],
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_tiny(device: str, out: Path) -> dict:
    d = copy.deepcopy(TINY)
    d["train"]["device"] = device
    world = build_world(parse_config(d))
    t0 = time.perf_counter()
    rows = run_arm(world, plan_arm(world, 0), out)
    return {"seconds": time.perf_counter() - t0, "accuracy": rows["accuracy"].tolist(), "loss": rows["loss"].tolist()}


def tiny_check(device: str, tmp: Path) -> dict:
    cpu = run_tiny("cpu", tmp / "cpu")
    dev = run_tiny(device, tmp / "dev")
    again = run_tiny(device, tmp / "again")
    out = {"cpu_final_accuracy": cpu["accuracy"][-1], "device_final_accuracy": dev["accuracy"][-1],
           "difference": abs(cpu["accuracy"][-1] - dev["accuracy"][-1]), "tolerance": TINY_TOLERANCE,
           "bitwise_repeatable": dev["accuracy"] == again["accuracy"] and dev["loss"] == again["loss"],
           "cpu_seconds": cpu["seconds"], "device_seconds": dev["seconds"]}
    out["ok"] = out["difference"] <= TINY_TOLERANCE and out["bitwise_repeatable"]
    return out


def matmul_tflops(device: torch.device, n: int) -> float:
    """A float32 matmul's TFLOP/s with TF32 off: the card's float32 peak as reached in practice."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a @ b
    sync(device)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e12


def time_round(engine, device: torch.device, sampled: dict, start: torch.Tensor, group_rounds: int,
               repeats: int) -> float:
    """Median seconds of ``group_rounds`` group rounds of every sampled group (one engine call
    each), after a warm-up call where the engine starts something (workers, CUDA graphs)."""
    start = start.to(device)
    times = []
    for r in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        run_group_rounds(engine, {g: start for g in sampled}, sampled, r, LocalSpec(0, group_rounds, E, 0.05))
        sync(device)
        if r:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time_engine(engine, on, sampled, start, scaled: bool, name: str, repeats: int) -> float:
    """Seconds of one Table 1 round on ``engine`` (scaled: one group round timed, times K)."""
    if scaled:
        return K * time_round(engine, on, sampled, start, 1, 1)
    return time_round(engine, on, sampled, start, K, repeats)


def round_table(device: torch.device, models: list[str], batches: list[int], groups: int, size: int,
                repeats: int, peak: float, quick: bool) -> list[dict]:
    data, parts, _, sampled = setup(groups, size, dataset="digits" if quick else "fashion-mnist")
    passes = K * E * sum(int(g.n_samples.sum()) for g in sampled.values())
    cpu = torch.device("cpu")
    rows = []
    for model in models:
        for batch in batches:
            base_engine = TorchEngine(data, parts, model, 0.05, batch)
            flops = flops_per_sample(base_engine, batch) * passes
            start = base_engine.initial_weights(0)
            baseline = time_round(base_engine, cpu, sampled, start, 1, 1) * K
            engines = [("cpu", "batched per-client", BatchedEngine(data, parts, model, 0.05, batch,
                                                                   formulation="per-client"), True)]
            if device.type != "cpu":
                engines += [(device.type, "sequential", TorchEngine(data, parts, model, 0.05, batch, str(device)), True),
                            (device.type, "batched per-client", BatchedEngine(data, parts, model, 0.05, batch,
                                                                              str(device), formulation="per-client"), True)]
            engines.append((device.type, "batched stacked", BatchedEngine(data, parts, model, 0.05, batch, str(device),
                                                                          formulation="stacked"), False))
            rows.append({"model": model, "batch": batch, "where": "cpu", "engine": "sequential", "seconds": baseline,
                         "scaled": True, "speedup": 1.0, "tflops": flops / baseline / 1e12,
                         "peak_share": None, "peak_memory_gib": None})
            for where, name, engine, scaled in engines:
                on = torch.device(where if where == "cpu" else str(device))
                if on.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(on)
                try:
                    seconds = _time_engine(engine, on, sampled, start, scaled, name, repeats)
                except Exception as exc:   # one engine's failure is a row of the table, not the end of it
                    rows.append({"model": model, "batch": batch, "where": where, "engine": name, "error": repr(exc)})
                    print(f"  {model} B={batch} {where} {name}: {exc!r}", flush=True)
                    continue
                memory = torch.cuda.max_memory_allocated(on) / 2**30 if on.type == "cuda" else None
                print(f"  {model} B={batch} {where} {name}: {seconds:.3f} s ({baseline / seconds:.1f}x)", flush=True)
                rows.append({"model": model, "batch": batch, "where": where, "engine": name, "seconds": seconds,
                             "scaled": scaled, "speedup": baseline / seconds, "tflops": flops / seconds / 1e12,
                             "peak_share": flops / seconds / 1e12 / peak if on.type == "cuda" else None,
                             "peak_memory_gib": memory})
                del engine
    return rows


def full_size(device: str, rounds: int, quick: bool, tmp: Path) -> dict:
    base = tomllib.loads((REPRODUCTIONS / "groupfel-base.toml").read_text())
    base["train"]["device"] = device
    if quick:
        base["data"]["dataset"] = "digits"
        base["topology"]["clients_per_edge"] = 5
        base["data"].update(min_samples=20, max_samples=60, mean_samples=40.0, std_samples=10.0)
        base["train"]["model"] = "mlp"
    world = build_world(parse_config(base))

    class Enough(Exception):
        pass

    seen = []

    def stop(t, cost, acc):
        seen.append((time.perf_counter(), cost))
        if len(seen) > rounds:
            raise Enough
    try:
        run_arm(world, plan_arm(world, 0), tmp / "full-size", stop)
    except Enough:
        pass
    (t0, c0), (t1, c1) = seen[0], seen[-1]   # round 1 onwards: the first round builds graphs and groups
    seconds, cost = t1 - t0, c1 - c0
    return {"rounds": len(seen) - 1, "seconds_per_round": seconds / max(len(seen) - 1, 1),
            "eq5_cost_per_round": cost / max(len(seen) - 1, 1), "seconds_per_cost": seconds / cost if cost else None,
            "budget": base["train"]["budget"], "model": base["train"]["model"], "batch": base["train"]["batch_size"]}


def sweep_runs(sweep: dict, base: dict) -> int:
    """The runs a reproduction's sweep trains, as the sweep module expands it: each point's seeds
    times its arms (zipped axes move together; a point may set its own arms)."""
    from groupfel.experiments.reproduce import point_configs_of

    return sum(len(c.seeds) * len(c.arms) for c in point_configs_of(sweep, base))


def pending_projection(full: dict) -> list[dict]:
    """Each reproduction with no committed full-size results: its runs, and its projected hours
    where its runs share groupfel-base's model, batch and budget."""
    from groupfel.experiments import reproduce

    out = []
    for name in reproduce.names():
        rep = reproduce.load(name)
        if rep.kind == "study" or (rep.folder / "full").exists() or rep.needs:
            continue
        sweep, cfg, _ = reproduce.resolve(rep, False)
        runs = sweep_runs(sweep, cfg)
        t = cfg.get("train", {})
        same = (t.get("model"), t.get("batch_size"), t.get("budget")) == (full["model"], full["batch"], full["budget"])
        hours = runs * full["budget"] * full["seconds_per_cost"] / 3600 if same and full["seconds_per_cost"] else None
        out.append({"name": name, "runs": runs, "model": t.get("model"), "batch": t.get("batch_size"),
                    "projected_hours": hours})
    return sorted(out, key=lambda r: -(r["projected_hours"] or 0))


def usable_device(name: str, program: str) -> torch.device | None:
    """``--device name`` as a torch device, or None after one line on stderr saying why not."""
    try:
        device = torch.device(resolve(check(name, "--device")))
    except InputError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        return None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        print(f"{program}: --device {name}: torch {torch.__version__} sees no such CUDA GPU here; run it on a "
              "GPU machine, or check the same code on the CPU with --device cpu --quick", file=sys.stderr)
        return None
    return device


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for the test suite (minutes on a CPU)")
    ap.add_argument("--models", default=None, help="default cnn,resnet-1,mlp (quick: mlp)")
    ap.add_argument("--batches", default=None, help="default 32,5 (quick: 8)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=None, help="full-size rounds timed (default 3; quick: 1)")
    ap.add_argument("--json", default="gpu.json", help="where the results go (default gpu.json)")
    args = ap.parse_args()
    device = usable_device(args.device, "gpu benchmark")
    if device is None:
        return 2
    prepare(device)   # the engine's settings (TF32 off, deterministic) before any CUDA work, the peak matmul's too
    models = (args.models or ("mlp" if args.quick else "cnn,resnet-1,mlp")).split(",")
    batches = [int(b) for b in (args.batches or ("8" if args.quick else "32,5")).split(",")]
    rounds = args.rounds or (1 if args.quick else 3)
    name, detail = describe(str(device))
    print(f"groupfel on {name}: torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch "
          f"threads; CUDA {detail.get('cuda')}, cuDNN {detail.get('cudnn')}, driver {detail.get('driver')}")
    peak = matmul_tflops(device, 1024 if args.quick else 8192)
    print(f"float32 matmul (TF32 off): {peak:.3g} TFLOP/s")
    result = {"device": name, "device_details": detail, "fp32_matmul_tflops": peak, "quick": args.quick}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        result["tiny"] = tiny = tiny_check(str(device), tmp)
        print(f"\ntiny run: final accuracy {tiny['device_final_accuracy']:.4f} on {device} vs "
              f"{tiny['cpu_final_accuracy']:.4f} on cpu (|diff| {tiny['difference']:.4f}, tolerance {TINY_TOLERANCE}); "
              f"bitwise repeatable on {device}: {tiny['bitwise_repeatable']}")
        groups, size = (3, 2) if args.quick else (12, 6)
        result["round"] = rows = round_table(device, models, batches, groups, size, args.repeats, peak, args.quick)
        print(f"\nTable 1 round ({groups} groups x {size} clients, K={K}, E={E}); x5: timed on 1 of {K} group rounds")
        print(f"{'model':9} {'B':>3} {'where':5} {'engine':19} {'seconds':>9} {'speed-up':>9} {'TFLOP/s':>8} "
              f"{'of fp32 peak':>12} {'peak GiB':>8}")
        for r in rows:
            if "error" in r:
                print(f"{r['model']:9} {r['batch']:>3} {r['where']:5} {r['engine']:19} failed: {r['error'][:80]}")
                continue
            share = f"{r['peak_share']:.1%}" if r["peak_share"] is not None else "-"
            mem = f"{r['peak_memory_gib']:.2f}" if r["peak_memory_gib"] is not None else "-"
            secs = f"{r['seconds']:.3f}{' x5' if r['scaled'] else '   '}"
            print(f"{r['model']:9} {r['batch']:>3} {r['where']:5} {r['engine']:19} {secs:>12} {r['speedup']:8.1f}x "
                  f"{r['tflops']:8.2f} {share:>12} {mem:>8}")
        try:
            result["full_size"] = full = full_size(str(device), rounds, args.quick, tmp)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            result["full_size"] = {"error": repr(exc)}
            result["device_details"] = describe(str(device))[1]
            Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
            return 1
        print(f"\nfull-size Group-FEL (groupfel-base{', quick sizes' if args.quick else ''}): {full['rounds']} rounds, "
              f"{full['seconds_per_round']:.2f} s per round, Eq. 5 cost {full['eq5_cost_per_round']:.0f} per round")
        if not args.quick:
            result["pending"] = pending = pending_projection(full)
            print("pending full-size reproductions (projected on this device):")
            for p in pending:
                when = f"{p['projected_hours']:.1f} h" if p["projected_hours"] is not None else \
                    f"not projected ({p['model']}, batch {p['batch']}: another setting)"
                print(f"  {p['name']:24} {p['runs']:5} runs  {when}")
    result["device_details"] = describe(str(device))[1]   # the settings the engines trained with
    Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"\nwritten: {args.json}")
    return 0 if tiny["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
