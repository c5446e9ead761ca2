"""The flat workload W in Flower's simulation engine (Ray) against groupfel's batched engine.

    pip install "flwr[simulation]"          # optional: a benchmark extra, never a runtime dependency
    python benchmarks/flower.py [--models mlp,cnn] [--rounds 5]

W: 300 clients of 20-200 Fashion-MNIST samples, E = 2, B = 32, lr 0.05, one round of all clients.
Flower: its legacy ``start_simulation`` on a local Ray cluster (one CPU per client actor, FedAvg,
no evaluation), the clients training the same torch model with torch's SGD; a round is timed from
the strategy's configure_fit to its aggregate_fit, after one warm-up round. groupfel: one call of
the batched engine over the 300 clients from the global model, then the FedAvg average. Printed:
median seconds per round over ``--rounds`` rounds of each, and the ratio, measured in one run.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
N_CLIENTS, E, B, LR, SEED = 300, 2, 32, 0.05, 0


def partitions(n_train: int) -> list[np.ndarray]:
    from groupfel.topologies import client_sizes
    rng = np.random.default_rng(SEED)
    sizes = client_sizes(N_CLIENTS, 20, 200, 110, 45, rng)
    perm = rng.permutation(n_train)
    return np.split(perm[:sizes.sum()], np.cumsum(sizes)[:-1])


_DATA: dict = {}


def _client_data():
    """Loaded once per Ray actor process."""
    if not _DATA:
        from groupfel.topologies import load_dataset
        d = load_dataset("fashion-mnist")
        _DATA.update(x=torch.from_numpy(d.x_train), y=torch.from_numpy(d.y_train), parts=partitions(len(d.y_train)),
                     shape=d.input_shape, classes=d.num_classes)
    return _DATA


def _fit(model_name: str, cid: int, parameters: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
    """One Flower client's local training: the same model, E epochs of torch SGD."""
    from groupfel.emulator.models import build_model
    d = _client_data()
    idx = torch.as_tensor(d["parts"][cid])
    net = build_model(model_name, d["shape"], d["classes"])
    with torch.no_grad():
        for p, v in zip(net.parameters(), parameters):
            p.copy_(torch.from_numpy(v))
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for _ in range(E):
        order = idx[torch.randperm(len(idx))]
        for b in range(0, len(order), B):
            batch = order[b:b + B]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(d["x"][batch]), d["y"][batch]).backward()
            opt.step()
    return [p.detach().numpy() for p in net.parameters()], len(idx)


def client_fn(model_name: str, context):
    """Top-level (pickled by reference): each Ray actor imports this module once and keeps its
    dataset cache, as a Flower app's module would."""
    import flwr as fl

    class TorchClient(fl.client.NumPyClient):
        def fit(self, parameters, config):
            weights, n = _fit(model_name, int(context.node_config["partition-id"]), parameters)
            return weights, n, {}
    return TorchClient().to_client()


def flower_rounds(model_name: str, initial: list[np.ndarray], rounds: int) -> list[float]:
    import flwr as fl
    from flwr.server.strategy import FedAvg

    times: list[float] = []

    class Timed(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            self._t0 = time.perf_counter()
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            out = super().aggregate_fit(server_round, results, failures)
            times.append(time.perf_counter() - self._t0)
            if failures:
                raise RuntimeError(f"flower: {len(failures)} clients failed: {failures[0]!r}")
            return out

    strategy = Timed(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=N_CLIENTS,
                     min_available_clients=N_CLIENTS,
                     initial_parameters=fl.common.ndarrays_to_parameters(initial))
    fl.simulation.start_simulation(
        client_fn=functools.partial(client_fn, model_name), num_clients=N_CLIENTS, client_resources={"num_cpus": 1},
        config=fl.server.ServerConfig(num_rounds=rounds + 1), strategy=strategy,
        ray_init_args={"include_dashboard": False, "num_cpus": os.cpu_count(),
                       "object_store_memory": 300 * 2**20, "log_to_driver": False,
                       "runtime_env": {"env_vars": {"PYTHONPATH": str(ROOT)}}})
    return times[1:]                                                  # drop the warm-up round


def groupfel_rounds(model_name: str, rounds: int, device: str = "cpu") -> tuple[list[float], list[np.ndarray], str]:
    from groupfel.emulator.training import BatchedEngine
    from groupfel.topologies import load_dataset
    d = load_dataset("fashion-mnist")
    parts = partitions(len(d.y_train))
    engine = BatchedEngine(d, parts, model_name, LR, B, device)
    x = engine.initial_weights(SEED).to(engine.device)
    n = torch.tensor([len(p) for p in parts], dtype=torch.float32, device=engine.device)
    clients = list(range(N_CLIENTS))
    times = []
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        local = engine.train(x, clients, E, [r * N_CLIENTS + c for c in clients])
        x = (n / n.sum()) @ local                                     # FedAvg
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    shapes = [p.shape for p in engine.model.parameters()]
    initial = [v.reshape(s).cpu().numpy() for v, s in zip(engine.initial_weights(SEED).split([s.numel() for s in shapes]),
                                                   shapes)]
    return times[1:], initial, engine.formulation


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    try:
        import flwr
    except ImportError:
        raise SystemExit('flower benchmark: flwr is not installed; pip install "flwr[simulation]"') from None
    print(f"W: {N_CLIENTS} clients of 20-200 Fashion-MNIST samples, E={E}, B={B}; flwr {flwr.__version__}, "
          f"{os.cpu_count()} CPUs; medians of {args.rounds} rounds after one warm-up")
    print(f"{'model':6} {'flower s/round':>14} {'groupfel s/round':>16} {'speed-up':>8}  formulation")
    for model in args.models.split(","):
        ours, initial, form = groupfel_rounds(model, args.rounds)
        theirs = flower_rounds(model, initial, args.rounds)
        f, g = statistics.median(theirs), statistics.median(ours)
        print(f"{model:6} {f:14.2f} {g:16.2f} {f / g:7.1f}x  {form}", flush=True)


if __name__ == "__main__":
    import sys
    sys.path.insert(0, str(ROOT))
    from benchmarks.flower import main as main_by_reference   # so the actors import, not unpickle, it
    main_by_reference()
