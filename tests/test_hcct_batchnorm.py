"""The BatchNorm experiment's two gradient vectors (experiments/reproductions/hcct-batchnorm/
hcct_batchnorm.py): the authors'
state-dict vector holds every parameter plus each BatchNorm layer's running mean, variance and
batch counter; the counter's entry of (before − after)/lr is −steps/lr for every client alike."""
import torch

from conftest import reproduction_script

_script = reproduction_script("hcct-batchnorm/hcct_batchnorm.py")
digit_bn_cnn, flat_state, train = _script.digit_bn_cnn, _script.flat_state, _script.train


def test_state_vector_adds_running_statistics_and_batch_counters():
    model = digit_bn_cnn(1, 10, 16)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    bn = [m for m in model.modules() if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d))]
    assert len(bn) == 5                                   # FedBN's Digit model: 3 conv + 2 linear, each with BN
    extra = sum(2 * m.num_features + 1 for m in bn)       # running mean, running variance, num_batches_tracked
    assert len(flat_state(model, True)) == n_params
    assert len(flat_state(model, False)) == n_params + extra


def test_batch_counter_moves_by_the_number_of_steps():
    torch.manual_seed(0)
    model = digit_bn_cnn(1, 10, 16)
    x, y = torch.randn(10, 1, 16, 16), torch.randint(0, 10, (10,))
    before = dict(model.state_dict())
    counters = [k for k in before if k.endswith("num_batches_tracked")]
    before = {k: v.clone() for k, v in before.items()}
    train(model, x, y, 2, 4, 0.1, torch.Generator().manual_seed(1))   # batches of 4, 4, 2: 3 steps an epoch
    for k in counters:
        assert int(model.state_dict()[k] - before[k]) == 6
