"""Named random streams: every random draw of a run comes from a seed derived from
(seed, stream, ids...), never from one running generator, so a resumed run draws exactly what
an uninterrupted one draws, and adding a draw to one stream never shifts another.

Each name maps to the integer tag the emulator has always used, so no draw changed when the
streams got names. Add a stream with a new, unused tag.
"""
from __future__ import annotations

import numpy as np

# stream name -> its tag, the second word of the SeedSequence entropy (None: no tag word)
STREAMS: dict[str, int | None] = {
    "sampling": 1,         # the cloud's group sample in round t: (t,)
    "client-seed": 2,      # a client's training seed in group round k of round t: (t, k, client)
    "grouping": 3,         # an edge's grouping at epoch e: (e, edge)
    "placement": 4,        # client sizes, data placement and devices: ()
    "probe": 5,            # a probe epoch's batch seeds (HCCT's gradients): (epoch, edge)
    "faults": 6,           # a client's dropout and slowdown in group round k of round t: (t, k, client)
    "local-split": 7,      # each client's local train / test split: ()
    "cluster-init": 8,     # the initial weights of cluster model m (IFCA): (m,)
    "update-probe": 9,     # a one-epoch update probe's batch seeds (FedCLAR): (t, edge)
    "personal": 10,        # a personal model's batch seeds (Ditto, Per-FedAvg), from the client's seed: (client seed,)
    "finetune": 11,        # a client's fine-tuning batch seeds at evaluation (Finetune; Per-FedAvg batches = "authors"): (client,)
    "independent": 20,     # MAXFL: batch seeds of a client's own model in group round k of round t: (t, k, client)
    "availability": 21,    # a client's on/off process (topology.availability): (client,)
    "heterogeneity": 22,   # a client's drawn bandwidth, latency and slowdown factor: (client,)
    "maxfl-prior": 31,     # MAXFL's w_prior, trained once (prior = "once"): (client,)
    "discriminators": None,  # FedCollab's discriminators at epoch e on an edge: (e, edge); sub-streams below
}
# streams derived from a key of "discriminators": the tag is appended last
SUB_STREAMS: dict[str, int] = {"discriminator-split": 7, "discriminator-init": 8, "discriminator-batches": 9}


def key(seed: int, stream: str, *ids: int) -> tuple[int, ...]:
    """The SeedSequence entropy of ``stream`` for ``ids``."""
    tag = STREAMS[stream]
    return (seed, *ids) if tag is None else (seed, tag, *ids)


def sub_key(parent: tuple[int, ...], stream: str) -> tuple[int, ...]:
    """A stream derived from another stream's key (see :data:`SUB_STREAMS`)."""
    return (*parent, SUB_STREAMS[stream])


def rng(seed: int, stream: str, *ids: int) -> np.random.Generator:
    """A generator for one event of one stream: ``rng(seed, "sampling", t)``."""
    return np.random.default_rng(key(seed, stream, *ids))


def seed_of(entropy: tuple[int, ...]) -> int:
    """One 32-bit seed (for torch) from a stream key."""
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])
