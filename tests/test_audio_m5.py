"""Raw waveforms (``data.audio = "waveform"``) and the Group-FEL authors' Speech Commands model
(``train.model = "audio-m5"``): the loader reads recordings as torchaudio does, one second at
8 kHz, and the model is theirs, layer for layer, BatchNorm statistics included."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import TINY, write_fsdd
from groupfel.emulator.config import parse_config
from groupfel.emulator.models import build_model
from groupfel.errors import InputError
from groupfel.experiments.api import run
from groupfel.topologies import load_dataset


class SpeechCommand(nn.Module):
    """Jiyao17/fl-grouping utils/model.py ``SpeechCommand``, as written there (10 outputs here)."""

    def __init__(self, n_input=1, n_output=10, stride=16, n_channel=32):
        super().__init__()
        self.conv1 = nn.Conv1d(n_input, n_channel, kernel_size=80, stride=stride)
        self.bn1 = nn.BatchNorm1d(n_channel)
        self.pool1 = nn.MaxPool1d(4)
        self.conv2 = nn.Conv1d(n_channel, n_channel, kernel_size=3)
        self.bn2 = nn.BatchNorm1d(n_channel)
        self.pool2 = nn.MaxPool1d(4)
        self.conv3 = nn.Conv1d(n_channel, 2 * n_channel, kernel_size=3)
        self.bn3 = nn.BatchNorm1d(2 * n_channel)
        self.pool3 = nn.MaxPool1d(4)
        self.conv4 = nn.Conv1d(2 * n_channel, 2 * n_channel, kernel_size=3)
        self.bn4 = nn.BatchNorm1d(2 * n_channel)
        self.pool4 = nn.MaxPool1d(4)
        self.fc = nn.Linear(2 * n_channel, n_output)

    def forward(self, x):
        x = self.pool1(F.relu(self.bn1(self.conv1(x))))
        x = self.pool2(F.relu(self.bn2(self.conv2(x))))
        x = self.pool3(F.relu(self.bn3(self.conv3(x))))
        x = self.pool4(F.relu(self.bn4(self.conv4(x))))
        x = F.avg_pool1d(x, x.shape[-1])
        x = x.permute(0, 2, 1)
        return F.log_softmax(self.fc(x), dim=2)


def test_fsdd_waveforms_are_torchaudio_scaled_padded_and_cut(tmp_path):
    directory = tmp_path / "fsdd"
    signals = write_fsdd(directory / "recordings", (3000, 9000, 5000, 4000))
    d = load_dataset("fsdd", str(directory), "waveform")
    assert d.x_train.shape == (30, 1, 1, 8000) and d.x_test.shape == (10, 1, 1, 8000)
    assert d.x_train.dtype == np.float32
    # the test set is index 0 (3,000 samples): zero-padded to a second, scaled by 2^15 as torchaudio.load
    want = signals["3_spk_0.wav"].astype(np.float32) / 32768.0
    row = d.x_test[d.y_test == 3][0, 0, 0]
    assert np.array_equal(row[:3000], want) and not row[3000:].any()
    # index 5 (9,000 samples) is cut to the first second; nothing is standardised
    cut = d.x_train[(d.y_train == 7)][0, 0, 0]
    assert np.array_equal(cut, signals["7_spk_5.wav"][:8000].astype(np.float32) / 32768.0)
    assert load_dataset("fsdd", str(directory)).x_train.shape == (30, 1, 32, 32)   # log-mel stays the default


def test_m5_is_the_authors_model_statistics_included():
    ours, theirs = build_model("audio-m5", (1, 1, 8000), 10), SpeechCommand()
    assert sum(p.numel() for p in ours.parameters() if p.requires_grad) == sum(p.numel() for p in theirs.parameters())
    # the same state entries in the same order: the authors' state dict, the statistics as parameters
    assert [tuple(v.shape) for v in ours.state_dict().values()] == [tuple(v.shape) for v in theirs.state_dict().values()]
    torch.manual_seed(0)
    for v in theirs.state_dict().values():
        if v.is_floating_point():
            v.copy_(torch.randn_like(v).abs() + 0.1)   # statistics and weights alike: a non-trivial state
    with torch.no_grad():
        for mine, their in zip(ours.state_dict().values(), theirs.state_dict().values()):
            mine.copy_(their)
    x = torch.randn(6, 1, 1, 8000)
    for mode in ("train", "eval"):
        getattr(ours, mode)()
        getattr(theirs, mode)()
        torch.testing.assert_close(F.log_softmax(ours(x), 1), theirs(x[:, 0]).squeeze(1), rtol=1e-5, atol=1e-5)
    # a training forward moved both models' running statistics alike
    for mine, their in zip(ours.state_dict().values(), theirs.state_dict().values()):
        torch.testing.assert_close(mine.float(), their.float())


def test_m5_trains_on_fsdd_waveforms_in_a_run(tmp_path):
    directory = tmp_path / "fsdd"
    write_fsdd(directory / "recordings", (3000, 4000, 5000, 6000, 7000, 8000, 3500, 4500))
    d = copy.deepcopy(TINY)
    d["data"] = {"dataset": "fsdd", "path": str(directory), "audio": "waveform", "alpha": 1.0,
                 "min_samples": 6, "max_samples": 10}
    d["topology"].update(edges=1, clients_per_edge=6)
    d["train"].update(model="audio-m5", rounds=2, eval_every=1, optimizer="adam", lr=0.01, momentum=0.0,
                      batch_size=5, workers=1)
    d["arms"] = d["arms"][1:]
    d["arms"][0]["grouping"]["min_group_size"] = 3
    table = run(d, tmp_path / "out", progress=False).runs
    assert table["round"].tolist()[-1] == 2 and np.isfinite(table["accuracy"]).all()


@pytest.mark.parametrize("data, model, field", [
    ({"audio": "log-mel"}, "audio-m5", 'data.audio = "waveform"'),
    ({"audio": "waveform"}, "cnn", 'train.model = "audio-m5"'),
])
def test_models_and_inputs_that_do_not_fit_are_one_line(tmp_path, data, model, field):
    d = copy.deepcopy(TINY)
    d["data"].update(dataset="fsdd", path=str(tmp_path), **data)
    d["train"]["model"] = model
    with pytest.raises(InputError, match=field.replace("(", r"\(")) as exc:
        parse_config(d)
    assert "\n" not in str(exc.value)


def test_waveforms_of_a_dataset_without_recordings_are_refused():
    d = copy.deepcopy(TINY)
    d["data"]["audio"] = "waveform"
    with pytest.raises(InputError, match="audio: only fsdd and speech-commands"):
        parse_config(d)
