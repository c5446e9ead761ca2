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


def test_the_authors_alg2_is_ours_without_statistics_and_reads_client_0s_with_them():
    """authors_partition (the authors' user_cluster) gives our Alg. 2's partition where no entry is a
    BatchNorm statistic; with statistics, a group's ĝ holds client 0's, member or not: two clients
    whose statistics entries agree with each other but oppose client 0's do not merge, though
    they merge under our ĝ (hand-built vectors)."""
    import numpy as np

    from groupfel.policies.hcct import hcct_partition

    rng = np.random.default_rng(0)
    for _ in range(100):
        g = rng.normal(size=(6, 8))
        g[:3] += 3 * rng.normal(size=8)
        sizes = rng.integers(20, 200, 6).astype(float)
        assert _script.authors_partition(g, sizes, 1.0, np.zeros(8, dtype=bool)) == \
            sorted(sorted(p) for p in hcct_partition(g, sizes, 1.0))
    stats = np.array([False, False, True, True])
    g = np.array([[1.0, 0.0, -10.0, -10.0],      # client 0: its statistics oppose 1's and 2's
                  [0.0, 1.0, 10.0, 10.0],
                  [0.0, 1.0, 10.0, 10.0]])
    sizes = np.array([100.0, 100.0, 100.0])
    assert sorted(sorted(p) for p in hcct_partition(g, sizes, 1.0)) == [[0], [1, 2]]
    assert _script.authors_partition(g, sizes, 1.0, stats) == [[0], [1], [2]]
    assert len(_script.stat_mask(digit_bn_cnn(1, 10, 16))) == len(flat_state(digit_bn_cnn(1, 10, 16), False))
