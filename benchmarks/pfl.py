"""Workload W of benchmarks/flower.py in pfl-research's simulator against groupfel's batched engine.

    pip install -e '.[pfl]'                 # optional: a benchmark extra, never a runtime dependency
    python benchmarks/pfl.py [--models mlp,cnn] [--rounds 5] [--procs 1,2]

W (benchmarks/flower.py, imported from there): 300 clients of 20-200 Fashion-MNIST samples, E = 2,
B = 32, lr 0.05, one FedAvg round of all clients from the same initial weights, the same torch model.

pfl: its own simulation API as its docs and benchmarks use it: a ``FederatedDataset`` of per-user
torch tensors (the minimize-reuse user sampler, so a cohort of 300 is every client once, and
``user_id_to_weight`` = sample counts so its multi-process mode balances the cohort),
``PyTorchModel`` with torch's SGD locally and SGD at lr 1 centrally, ``FederatedAveraging`` over a
``SimulatedBackend`` weighting by data points (FedAvg), no evaluation after the first round. Run in
fresh processes: one (torch's default threads), and for each P > 1 of ``--procs``, P processes of
one torch thread each started as pfl's docs start them (``PFL_WORKER_ADDRESSES`` and
``PFL_WORKER_RANK``; torch.distributed with gloo on a CPU, NCCL on a GPU). A round is timed from
one ``after_central_iteration`` callback to the next (the first from ``on_train_begin``).
groupfel: the batched engine over the 300 clients, then the FedAvg average (flower.py's loop); on a
CPU its per-client formulation uses one process of one torch thread per core.

Both run ``--rounds`` rounds after one warm-up round that is left out; groupfel's rounds are run
before and after pfl's and pooled, as the load of a shared machine drifts. Printed: the median
seconds per round of each, and pfl's median over groupfel's, measured in one run. With CUDA present the
same rows are measured again on the GPU after the CPU rows.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder leads sys.path and this file would shadow the pfl package.
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
from benchmarks.flower import B, E, LR, N_CLIENTS, SEED, groupfel_rounds, partitions  # noqa: E402


def _loss(self, x, y, eval=False):
    """pfl calls ``model.loss(*batch)``: the mean cross-entropy, as groupfel and Flower train."""
    self.eval() if eval else self.train()
    return torch.nn.functional.cross_entropy(self(x), y)


@torch.no_grad()
def _metrics(self, x, y, eval=True):
    from pfl.metrics import Weighted
    self.eval() if eval else self.train()
    logits = self(x)
    return {"loss": Weighted(torch.nn.functional.cross_entropy(logits, y, reduction="sum").item(), len(y)),
            "accuracy": Weighted((logits.argmax(-1) == y).sum().item(), len(y))}


def pfl_worker(model_name: str, rounds: int, initial: Path, out: Path) -> None:
    """One pfl process (rank PFL_WORKER_RANK of PFL_WORKER_ADDRESSES when these are set)."""
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops.pytorch_ops import to_tensor
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    from groupfel.emulator.models import build_model
    from groupfel.topologies import load_dataset

    np.random.seed(SEED)                    # every worker the same: pfl's samplers must agree across ranks
    torch.manual_seed(SEED)
    d = load_dataset("fashion-mnist")
    parts = partitions(len(d.y_train))
    x, y = to_tensor(d.x_train), to_tensor(d.y_train, dtype="int64")
    users = [(x[p], y[p]) for p in parts]
    federated = FederatedDataset(lambda uid: Dataset(users[uid], user_id=uid),
                                 get_user_sampler("minimize_reuse", list(range(N_CLIENTS))),
                                 user_id_to_weight={uid: len(p) for uid, p in enumerate(parts)})

    net = build_model(model_name, d.input_shape, d.num_classes)
    with torch.no_grad():
        for p, v in zip(net.parameters(), np.load(initial).values()):
            p.copy_(torch.from_numpy(v))
    net.loss, net.metrics = types.MethodType(_loss, net), types.MethodType(_metrics, net)
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    times: list[float] = []

    class Timer(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            self.t = time.perf_counter()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            now = time.perf_counter()
            times.append(now - self.t)
            self.t = now
            return False, Metrics()

    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=rounds + 1, evaluation_frequency=rounds + 2,
                                           train_cohort_size=N_CLIENTS, val_cohort_size=0),
        backend=SimulatedBackend(training_data=federated, val_data=federated, postprocessors=[WeightByDatapoints()]),
        model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=LR, local_num_epochs=E, local_batch_size=B),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=[Timer()], send_metrics_to_platform=False)
    if int(os.environ.get("PFL_WORKER_RANK", "0")) == 0:
        out.write_text(json.dumps({"times": times[1:],                 # drop the warm-up round
                                   "device": str(next(net.parameters()).device)}))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def pfl_rounds(model_name: str, initial: Path, rounds: int, procs: int, device: str, tmp: Path) -> dict:
    """pfl in ``procs`` fresh processes; returns rank 0's round times, or the error that stopped it."""
    out = tmp / f"pfl-{model_name}-{procs}-{device}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PFL_PYTORCH_DEVICE": device}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""          # else pfl's multi-process mode picks NCCL for CPU tensors
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if procs > 1:
        env["PFL_WORKER_ADDRESSES"] = ",".join(f"localhost:{p}" for p in _free_ports(procs))
        env["OMP_NUM_THREADS"] = str(max(1, cores // procs))           # no oversubscription of the cores
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", model_name, "--rounds", str(rounds),
           "--initial", str(initial), "--out", str(out)]
    logs = [tmp / f"pfl-{model_name}-{procs}-{device}-{r}.log" for r in range(procs)]
    workers = [subprocess.Popen(cmd, env={**env, "PFL_WORKER_RANK": str(r)} if procs > 1 else env,
                                stdout=log.open("w"), stderr=subprocess.STDOUT) for r, log in enumerate(logs)]
    codes = [w.wait() for w in workers]
    if any(codes) or not out.exists():
        tail = next((log.read_text().strip().splitlines()[-1:] for log, c in zip(logs, codes) if c), [])
        return {"error": f"exit codes {codes}: {tail[0] if tail else 'no output'}"}
    return json.loads(out.read_text())


def measure(models: list[str], rounds: int, procs: list[int], device: str) -> None:
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    print(f"{'model':6} {'device':6} {'pfl procs':>9} {'pfl s/round':>11} {'groupfel s/round':>16} "
          f"{'pfl / groupfel':>14}  groupfel formulation", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            # groupfel's rounds before and after pfl's: on a shared machine the load drifts
            ours, initial, form = groupfel_rounds(model, rounds, device)
            path = Path(tmp) / f"initial-{model}.npz"
            np.savez(path, *initial)
            results = {p: pfl_rounds(model, path, rounds, p, device, Path(tmp)) for p in procs}
            g = statistics.median(ours + groupfel_rounds(model, rounds, device)[0])
            for p, theirs in results.items():
                if "error" in theirs:
                    print(f"{model:6} {device:6} {p:9d} {'failed':>11} {g:16.2f} {'-':>14}  {form}; "
                          f"pfl: {theirs['error']}", flush=True)
                    continue
                f = statistics.median(theirs["times"])
                print(f"{model:6} {device:6} {p:9d} {f:11.2f} {g:16.2f} {f / g:13.1f}x  {form}; load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--procs", default="1,2", help="pfl process counts, comma-separated")
    ap.add_argument("--worker", help=argparse.SUPPRESS)          # one pfl process, started by the run
    ap.add_argument("--initial", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return pfl_worker(args.worker, args.rounds, args.initial, args.out)
    try:
        from pfl.version import __version__ as pfl_version
    except ImportError:
        raise SystemExit("pfl benchmark: pfl is not installed; pip install -e '.[pfl]'") from None
    procs = [int(p) for p in args.procs.split(",")]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"W: {N_CLIENTS} clients of 20-200 Fashion-MNIST samples, E={E}, B={B}; pfl {pfl_version}, "
          f"torch {torch.__version__}, {cores} CPUs; medians of {args.rounds} rounds after one warm-up", flush=True)
    measure(args.models.split(","), args.rounds, procs, "cpu")
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()}", flush=True)
        measure(args.models.split(","), args.rounds, procs, "cuda")


if __name__ == "__main__":
    main()
