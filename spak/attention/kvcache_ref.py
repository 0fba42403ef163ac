"""Float64 reference of decode attention over a KV cache (contiguous or paged).

    decode_attention_f64(q, k_cache, v_cache, cache_seqlens, block_table=None,
                         causal=False, scale=None) -> float64 [B, Sq, Hq, Dv]

Layouts as in gpu/plan_decode.py (FlashAttention's flash_attn_with_kvcache): q [B, Sq, Hq, D];
k_cache/v_cache [B, Sk_max, Hkv, D] or, with block_table [B, max_pages], paged
[num_pages, page_size, Hkv, D]; cache_seqlens [B]. Each sequence's keys are gathered to a
plain [L, Hkv, D] array first, so the reference shares no indexing code with the kernels.
Causal is bottom-right: query i sees keys j <= i + L - Sq. Rows with no key give zeros.
numpy only.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["decode_attention_f64", "gather_cache"]


def gather_cache(cache: np.ndarray, b: int, length: int, block_table=None) -> np.ndarray:
    """Sequence b's first `length` cache rows as float64 [length, Hkv, D]."""
    cache = np.asarray(cache)
    if block_table is None:
        return cache[b, :length].astype(np.float64)
    page = cache.shape[1]
    pages = np.asarray(block_table)[b, :-(-length // page)]
    rows = cache[pages].reshape(-1, *cache.shape[2:])
    return rows[:length].astype(np.float64)


def decode_attention_f64(q, k_cache, v_cache, cache_seqlens, block_table=None, *,
                         causal: bool = False, scale=None) -> np.ndarray:
    q = np.asarray(q, dtype=np.float64)
    B, Sq, Hq, D = q.shape
    Hkv, Dv = k_cache.shape[2], v_cache.shape[3]
    group = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = np.zeros((B, Sq, Hq, Dv), dtype=np.float64)
    for b in range(B):
        L = int(np.asarray(cache_seqlens)[b])
        if L <= 0:
            continue
        k = gather_cache(k_cache, b, L, block_table)      # [L, Hkv, D]
        v = gather_cache(v_cache, b, L, block_table)
        k = np.repeat(k, group, axis=1)                   # query head h reads kv head h//G
        v = np.repeat(v, group, axis=1)
        s = np.einsum("qhd,khd->hqk", q[b], k) * scale    # [Hq, Sq, L]
        if causal:
            allowed = np.arange(L)[None, :] <= np.arange(Sq)[:, None] + (L - Sq)
            s = np.where(allowed[None], s, -np.inf)
        out[b] = _softmax_rows_times(s, v)
    return out


def _softmax_rows_times(s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(s) v per head, [Sq, Hq, Dv]; rows of all -inf give 0."""
    m = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)
    p = np.exp(s - np.where(seen, m, 0.0))
    p = np.where(seen, p / np.where(seen, p.sum(axis=-1, keepdims=True), 1.0), 0.0)
    return np.einsum("hqk,khd->qhd", p, v)
