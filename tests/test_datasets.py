"""Dataset loaders on small files the tests write in each dataset's real on-disk format."""
import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from scipy.io import wavfile

from groupfel.errors import InputError
from groupfel.topologies import dirichlet_partition, label_matrix, load_dataset, read_idx

FSDD = Path(__file__).resolve().parents[2] / "shared" / "data" / "fsdd"


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    (gzip.open if path.suffix == ".gz" else open)(path, "wb").write(data)


def test_idx_round_trip(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "x.gz", a)
    write_idx(tmp_path / "y", a[0])
    assert np.array_equal(read_idx(tmp_path / "x.gz"), a)
    assert np.array_equal(read_idx(tmp_path / "y"), a[0])


def test_idx_truncated_file_is_a_clear_error(tmp_path):
    write_idx(tmp_path / "x", np.zeros((4, 2, 2)))
    (tmp_path / "x").write_bytes((tmp_path / "x").read_bytes()[:-3])
    with pytest.raises(InputError, match="truncated"):
        read_idx(tmp_path / "x")


def test_fashion_mnist_from_idx_files(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (30, 28, 28)))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(30) % 10)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", rng.integers(0, 256, (10, 28, 28)))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.arange(10))
    monkeypatch.setenv("GROUPFEL_FASHION_MNIST", str(tmp_path))
    d = load_dataset("fashion-mnist")
    assert d.x_train.shape == (30, 1, 28, 28) and d.x_test.shape == (10, 1, 28, 28)
    assert d.y_train.tolist() == (np.arange(30) % 10).tolist()
    assert abs(float(d.x_train.mean())) < 1e-5       # standardised with the training statistics


def test_fashion_mnist_missing_says_how_to_install(tmp_path):
    with pytest.raises(InputError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist", str(tmp_path))


def test_cifar10_python_batches(tmp_path):
    rng = np.random.default_rng(0)
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        blob = {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 9]}
        (d / name).write_bytes(pickle.dumps(blob))
    data = load_dataset("cifar10", str(tmp_path))
    assert data.x_train.shape == (20, 3, 32, 32) and data.x_test.shape == (4, 3, 32, 32)
    assert data.y_train.tolist() == [0, 1, 2, 9] * 5
    (d / "test_batch").unlink()
    with pytest.raises(InputError, match="test_batch"):
        load_dataset("cifar10", str(tmp_path))


TONES = (("go", 440), ("stop", 1500))


def _speech_commands_dir(path, rate=16000):
    """Speech Commands' layout: a folder of one-second 16-bit WAVs per label (here a tone each),
    the background-noise folder, and the testing and validation lists."""
    t = np.arange(rate) / rate
    for label, freq in TONES:
        (path / label).mkdir()
        for i in range(4):
            wavfile.write(path / label / f"s{i}_nohash_0.wav", rate, (np.sin(2 * np.pi * freq * t) * 8000).astype(np.int16))
    (path / "_background_noise_").mkdir()
    (path / "testing_list.txt").write_text("go/s0_nohash_0.wav\nstop/s0_nohash_0.wav\n")
    (path / "validation_list.txt").write_text("go/s1_nohash_0.wav\n")


def test_speech_commands_layout(tmp_path):
    _speech_commands_dir(tmp_path)
    d = load_dataset("speech-commands", str(tmp_path))
    assert d.num_classes == 2 and d.x_train.shape == (5, 1, 32, 32) and d.y_test.tolist() == [0, 1]
    # the two tones must look different to a model
    assert np.abs(d.x_train[d.y_train == 0].mean(0) - d.x_train[d.y_train == 1].mean(0)).max() > 0.5


def test_speech_commands_waveforms_are_resampled_to_8khz(tmp_path):
    _speech_commands_dir(tmp_path)
    # a clip shorter than a second: the authors' loader drops it (their get_datasets), so does this one
    wavfile.write(tmp_path / "go" / "short_nohash_0.wav", 16000, np.ones(12000, dtype=np.int16))
    assert load_dataset("speech-commands", str(tmp_path)).x_train.shape == (6, 1, 32, 32)
    d = load_dataset("speech-commands", str(tmp_path), "waveform")
    assert d.x_train.shape == (5, 1, 1, 8000)
    for label, (_, freq) in enumerate(TONES):
        sig = d.x_train[d.y_train == label][0, 0, 0]
        assert np.argmax(np.abs(np.fft.rfft(sig))) == freq      # 1 Hz a bin: one second at 8 kHz
        assert abs(np.abs(sig[100:-100]).max() - 8000 / 32768) < 0.01   # torchaudio's scale, not the peak's


@pytest.mark.skipif(not FSDD.is_dir(), reason="shared/data/fsdd is not beside the repository")
def test_fsdd_real_recordings():
    d = load_dataset("fsdd", str(FSDD))
    assert d.x_train.shape == (2700, 1, 32, 32) and d.x_test.shape == (300, 1, 32, 32)
    assert np.bincount(d.y_test).tolist() == [30] * 10
    assert np.isfinite(d.x_train).all()


def test_dirichlet_partition_is_exact_disjoint_and_skewed():
    labels = np.repeat(np.arange(10), 100)
    sizes = np.array([20, 50, 80, 30] * 5)
    parts = dirichlet_partition(labels, sizes, 0.1, 10, np.random.default_rng(0))
    assert [len(p) for p in parts] == sizes.tolist()
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat)
    L = label_matrix(labels, parts, 10)
    assert np.median((L > 0).sum(axis=1)) <= 4                 # α = 0.1: a few labels per client
    again = dirichlet_partition(labels, sizes, 0.1, 10, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_partition_refuses_more_samples_than_exist():
    with pytest.raises(InputError, match="max_samples"):
        dirichlet_partition(np.zeros(10, dtype=int), np.array([6, 6]), 0.5, 1, np.random.default_rng(0))


def test_cifar10_batch_that_would_run_code_is_refused(tmp_path, code_running_payload):
    marker = tmp_path / "pwned"
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        blob = {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 9]}
        (d / name).write_bytes(pickle.dumps(blob, protocol=2))
    assert load_dataset("cifar10", str(tmp_path)).x_train.shape == (20, 3, 32, 32)   # real batches still load
    (d / "data_batch_3").write_bytes(pickle.dumps({b"data": code_running_payload(marker), b"labels": [0]}))
    with pytest.raises(InputError, match=r"data_batch_3 .*io\.open.*refusing") as err:
        load_dataset("cifar10", str(tmp_path))
    assert "\n" not in str(err.value)
    assert not marker.exists()
