"""What a client sends and receives in one group round: the payload's model-sized vectors and
secure aggregation's key and share messages."""
from __future__ import annotations

# secure aggregation's messages (cost_models/secagg.py): two X25519 public keys per client
# (AdvertiseKeys), per peer one AES-GCM ciphertext of two Shamir shares over GF(2^521 - 1)
# (ShareKeys: 2 × 66 bytes + 12 nonce + 16 tag + 8 for the sender and recipient ids), and per peer
# one share revealed to the edge at unmasking (66 bytes)
KEYS_BYTES = 2 * 32
SHARE_CIPHERTEXT_BYTES = 2 * 66 + 12 + 16 + 8
UNMASK_SHARE_BYTES = 66


def payload_vectors(algorithm) -> int:
    """Model-sized vectors a client uploads per group round: 2 for SCAFFOLD (model + control
    variate), else 1; an algorithm may declare ``upload_vectors`` itself."""
    return int(getattr(algorithm, "upload_vectors", 2 if getattr(algorithm, "name", "") == "scaffold" else 1))


def client_bytes(model_bytes: int, group_size: int, vectors: int = 1, secagg: bool = False) -> tuple[int, int]:
    """(download, upload) bytes of one client in one group round of a group of ``group_size``.

    Download: the group model (and, under secure aggregation, every member's public keys and the
    n − 1 ciphertexts of shares addressed to it, relayed by the edge). Upload: ``vectors`` model-
    sized vectors (under secure aggregation masked in 32-bit words: 4 bytes a parameter, the
    float32 size) and its keys, its n − 1 share ciphertexts and n − 1 unmasking shares."""
    down, up = model_bytes, vectors * model_bytes
    if secagg:
        peers = max(group_size - 1, 0)
        down += group_size * KEYS_BYTES + peers * SHARE_CIPHERTEXT_BYTES
        up += KEYS_BYTES + peers * (SHARE_CIPHERTEXT_BYTES + UNMASK_SHARE_BYTES)
    return down, up
