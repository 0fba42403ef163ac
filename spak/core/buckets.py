"""Size classes that tuned configs are filed under (the tuned-config store's buckets).

Cheap to import (no numpy, torch or cuTile): the store, the families' ``store_key`` and
spak.fmha's lookup all use it.
"""
from __future__ import annotations

__all__ = ["MIN_BUCKET", "seq_bucket"]

#: The smallest sequence bucket: shorter sequences share one class.
MIN_BUCKET = 128


def seq_bucket(seq_len: int) -> int:
    """The power of two >= seq_len, at least 128: 1000 -> 1024, 4096 -> 4096, 1 -> 128."""
    n = int(seq_len)
    if n < 0:
        raise ValueError(f"seq_len must be >= 0, got {seq_len}")
    return max(MIN_BUCKET, 1 << max(0, n - 1).bit_length())
