"""Pairwise-masking secure aggregation (Bonawitz et al., CCS 2017, semi-honest variant), timed.

The group operation whose per-client cost O_g(|g|) the paper measures on Raspberry Pis (Sec. 2.3,
Fig. 9, Eq. 5). Protocol, for a group of n clients with threshold t = ⌊n/2⌋ + 1:

0. AdvertiseKeys: each client u makes two X25519 key pairs, (c_u) for encrypting shares and
   (s_u) for masks.
1. ShareKeys: u draws a self-mask seed b_u, Shamir-shares b_u and s_u's private key t-of-n over
   GF(2^521 − 1) and sends each peer v its two shares, AES-GCM-encrypted under KA(c_u, c_v).
2. MaskedInput: u sends y_u = x_u + PRG(b_u) + Σ_{v>u} PRG(s_uv) − Σ_{v<u} PRG(s_uv) mod 2^32,
   with s_uv = HKDF(KA(s_u, s_v)) and PRG = ChaCha20 keystream; x_u is the quantised update.
   Clients that drop out stop before this step.
3. Unmasking: each survivor decrypts the shares it holds and reveals b_v for survivors and
   s_v's private key for dropped clients. The aggregator reconstructs them (Lagrange at 0),
   removes the self-masks, and regenerates the dropped clients' pairwise masks to cancel them
   ("dropout recovery"). The pairwise masks of survivors cancel in the sum by construction.

Per-client work is O(n² + n·m) (Shamir sharing and n − 1 mask expansions), the aggregator's
O(n·m) plus O(d·n·m) to recover d dropouts — the quadratic O_g of Sec. 2.3.
"""
from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PRIME = 2**521 - 1  # a Mersenne prime: one field element holds a 256-bit key or seed
KEY_BYTES = 32


# ---- Shamir secret sharing over GF(PRIME) ------------------------------------------------------

def shamir_share(secret: int, n: int, t: int) -> list[tuple[int, int]]:
    """Split ``secret`` into n shares (x, p(x)), x = 1..n, any t of which reconstruct it."""
    if not 1 <= t <= n:
        raise ValueError(f"threshold t = {t} must be in 1..n = {n}")
    if not 0 <= secret < PRIME:
        raise ValueError("secret must lie in the field [0, PRIME)")
    coeffs = [secret] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coeffs):   # Horner
            y = (y * x + c) % PRIME
        shares.append((x, y))
    return shares


def shamir_reconstruct(shares: Sequence[tuple[int, int]]) -> int:
    """p(0) by Lagrange interpolation; needs at least t shares with distinct x."""
    xs = [x for x, _ in shares]
    if len(set(xs)) != len(xs):
        raise ValueError("shares must have distinct x")
    secret = 0
    for i, (xi, yi) in enumerate(shares):
        num = den = 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * -xj % PRIME
                den = den * (xi - xj) % PRIME
        secret = (secret + yi * num * pow(den, -1, PRIME)) % PRIME
    return secret


# ---- quantisation: floats <-> integers mod 2^32 ------------------------------------------------

def quantize(x: np.ndarray, scale: float) -> np.ndarray:
    """Fixed-point x·scale as uint32 (two's complement); sums stay exact mod 2^32."""
    return np.round(np.asarray(x, dtype=np.float64) * scale).astype(np.int64).astype(np.uint32)


def dequantize(q: np.ndarray, scale: float) -> np.ndarray:
    return q.astype(np.uint32).view(np.int32).astype(np.float64) / scale


# ---- primitives ------------------------------------------------------------------------------

def _kdf(shared: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def prg(seed: bytes, m: int) -> np.ndarray:
    """m uint32 words of ChaCha20 keystream under key ``seed`` (the mask PRG)."""
    enc = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor()
    return np.frombuffer(enc.update(bytes(4 * m)), dtype=np.uint32)


def _raw(key: X25519PrivateKey) -> int:
    return int.from_bytes(key.private_bytes_raw(), "big")


def _key(value: int) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(value.to_bytes(KEY_BYTES, "big"))


def _pair_mask(s_sk: X25519PrivateKey, peer: X25519PublicKey, m: int) -> np.ndarray:
    return prg(_kdf(s_sk.exchange(peer), b"groupfel secagg pairwise mask"), m)


@dataclass
class Timings:
    """Seconds spent by each client (client-side steps) and by the aggregator, on ``now``."""

    client: np.ndarray
    aggregator: float = 0.0
    recovery: float = 0.0  # aggregator time spent regenerating dropped clients' masks
    phases: dict[str, float] = field(default_factory=dict)
    # CPU time of this thread by default: the protocol is single-threaded, so this is the work
    # done, and other processes on a shared machine do not inflate it as they do wall-clock time.
    # A device whose CPU is capped (a cgroup quota, thermal throttling) waits too: time it on
    # time.monotonic (CLOCKS["wall"]).
    now: Callable[[], float] = time.thread_time

    @contextmanager
    def clock(self, phase: str, client: int | None = None, recovery: bool = False):
        t0 = self.now()
        yield
        dt = self.now() - t0
        self.phases[phase] = self.phases.get(phase, 0.0) + dt
        if client is not None:
            self.client[client] += dt
        elif recovery:
            self.recovery += dt
        else:
            self.aggregator += dt


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.monotonic}


def secure_sum(q: np.ndarray, dropped: Sequence[int] = (), threshold: int | None = None,
               clock: str = "cpu") -> tuple[np.ndarray, Timings]:
    """Run the protocol on quantised updates q (n × m, uint32); return the sum mod 2^32 of the
    survivors' rows as the aggregator computes it, and the time each party spent on ``clock``
    (``CLOCKS``: "cpu", this thread's CPU time, or "wall", CLOCK_MONOTONIC)."""
    q = np.asarray(q, dtype=np.uint32)
    n, m = q.shape
    t = threshold or n // 2 + 1
    drop = set(int(d) for d in dropped)
    alive = [u for u in range(n) if u not in drop]
    if len(alive) < t:
        raise ValueError(f"{len(alive)} survivors cannot reach the threshold t = {t}")
    tm = Timings(np.zeros(n), now=CLOCKS[clock])

    # 0. AdvertiseKeys
    c_sk, s_sk = [], []
    for u in range(n):
        with tm.clock("advertise", u):
            c_sk.append(X25519PrivateKey.generate())
            s_sk.append(X25519PrivateKey.generate())
    c_pk = [k.public_key() for k in c_sk]
    s_pk = [k.public_key() for k in s_sk]

    # 1. ShareKeys: box[u][v] is u's encrypted pair of shares for v; u keeps the box keys
    #    (KA(c_u, c_v) is symmetric, so the same key opens v's box for u in step 3)
    b_seed, box, box_key = [], [], []
    for u in range(n):
        with tm.clock("share", u):
            b_seed.append(os.urandom(KEY_BYTES))
            s_shares = shamir_share(_raw(s_sk[u]), n, t)
            b_shares = shamir_share(int.from_bytes(b_seed[u], "big"), n, t)
            keys = {v: AESGCM(_kdf(c_sk[u].exchange(c_pk[v]), b"groupfel secagg share box"))
                    for v in range(n) if v != u}
            box_key.append(keys)
            row = {}
            for v, aead in keys.items():
                plain = b"".join(s.to_bytes(66, "big") for s in (s_shares[v][1], b_shares[v][1]))
                nonce = u.to_bytes(6, "big") + v.to_bytes(6, "big")
                row[v] = aead.encrypt(nonce, plain, None)
            box.append((row, s_shares[u], b_shares[u]))   # u keeps its own shares

    # 2. MaskedInput (survivors only)
    y = {}
    for u in alive:
        with tm.clock("mask", u):
            acc = q[u] + prg(b_seed[u], m)
            for v in range(n):
                if v != u:
                    mask = _pair_mask(s_sk[u], s_pk[v], m)
                    acc = acc + mask if u < v else acc - mask
            y[u] = acc

    # 3. Unmasking: survivors decrypt what they hold; reveal b_v (survivors) or s_v (dropped)
    revealed_s: dict[int, list] = {v: [] for v in drop}
    revealed_b: dict[int, list] = {v: [] for v in alive}
    for u in alive:
        with tm.clock("unmask", u):
            for v in range(n):
                if v == u:
                    s_share, b_share = box[u][1], box[u][2]
                else:
                    plain = box_key[u][v].decrypt(v.to_bytes(6, "big") + u.to_bytes(6, "big"), box[v][0][u], None)
                    s_share = (u + 1, int.from_bytes(plain[:66], "big"))
                    b_share = (u + 1, int.from_bytes(plain[66:], "big"))
                (revealed_s[v] if v in drop else revealed_b[v]).append(s_share if v in drop else b_share)

    with tm.clock("aggregate"):
        total = np.sum(np.stack([y[u] for u in alive]), axis=0, dtype=np.uint32)
        for u in alive:
            seed = shamir_reconstruct(revealed_b[u][:t]).to_bytes(KEY_BYTES, "big")
            total -= prg(seed, m)
    for v in drop:
        with tm.clock("recovery", recovery=True):
            sk = _key(shamir_reconstruct(revealed_s[v][:t]))
            for u in alive:   # u added +mask(u,v) if u < v, so the sum holds that; take it back
                mask = _pair_mask(sk, s_pk[u], m)
                total = total - mask if u < v else total + mask
    return total, tm


def time_secagg(n: int, m: int, dropped: int = 0, seed: int = 0, clock: str = "cpu") -> tuple[float, float]:
    """One client's share of a group's SecAgg, in seconds: (mean client-side time of a survivor
    + the aggregator's time / survivors, recovery time / survivors per dropped client).

    Splitting the aggregator's work among the members charges the whole protocol to the group,
    as a measurement on devices that play every role (the paper's Raspberry Pi testbed) does.
    """
    client, server, recovery = time_secagg_parts(n, m, dropped, seed, clock)
    survivors = n - dropped
    return client + server / survivors, recovery / survivors


def time_secagg_parts(n: int, m: int, dropped: int = 0, seed: int = 0,
                      clock: str = "cpu") -> tuple[float, float, float]:
    """One group's SecAgg in seconds, by party: (mean client-side time of a survivor, the
    aggregator's unmasking and sum, its dropout recovery per dropped client). The aggregator's
    parts are what an edge server spends (``measure secagg --server``)."""
    rng = np.random.default_rng(seed)
    q = quantize(rng.normal(0, 0.01, (n, m)), 2.0**16)
    _, tm = secure_sum(q, dropped=range(dropped), clock=clock)
    return float(tm.client[dropped:].mean()), tm.aggregator, tm.recovery / dropped if dropped else 0.0
