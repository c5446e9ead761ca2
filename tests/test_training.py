import numpy as np
import torch

from emulator.training import TorchEngine
from topologies import load_dataset


def _engine(parts):
    return TorchEngine(load_dataset("digits"), parts, "cnn", lr=0.1, batch_size=8)


def test_training_leaves_the_start_model_untouched_and_clients_independent():
    same = np.arange(40)
    engine = _engine([same, same, np.arange(40, 80)])
    start = engine.initial_weights(0)
    before = start.clone()
    out = engine.train(start, [0, 1, 2], epochs=2, seeds=[7, 7, 7])
    assert torch.equal(start, before)
    assert torch.equal(out[0], out[1])          # same data, same seed, same start -> same model
    assert not torch.equal(out[0], out[2])
    assert not torch.equal(out[0], start)


def test_training_reduces_the_clients_loss():
    engine = _engine([np.arange(200)])
    start = engine.initial_weights(1)
    trained = engine.train(start, [0], epochs=5, seeds=[0])[0]
    acc0, loss0 = engine.evaluate(start)
    acc1, loss1 = engine.evaluate(trained)
    assert loss1 < loss0 and acc1 > acc0 + 0.2


def test_fused_engine_matches_sequential():
    from emulator.training import FusedEngine
    data = load_dataset("digits")
    rng = np.random.default_rng(0)
    parts = [np.sort(rng.choice(len(data.y_train), size=n, replace=False)) for n in (5, 17, 30, 9)]
    for model in ("cnn", "mlp"):
        seq = TorchEngine(data, parts, model, lr=0.05, batch_size=8)
        fused = FusedEngine(data, parts, model, lr=0.05, batch_size=8)
        start = seq.initial_weights(3)
        a = seq.train(start, [0, 1, 2, 3], epochs=2, seeds=[1, 2, 3, 4])
        b = fused.train(start, [0, 1, 2, 3], epochs=2, seeds=[1, 2, 3, 4])
        assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())
        assert not torch.allclose(a[0], a[1], atol=1e-3)
