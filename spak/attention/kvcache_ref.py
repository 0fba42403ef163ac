"""Float64 reference of decode attention over a KV cache (contiguous or paged).

    decode_attention_f64(q, k_cache, v_cache, cache_seqlens, block_table=None,
                         causal=False, scale=None) -> float64 [B, Sq, Hq, Dv]

Layouts as in gpu/plan_decode.py (FlashAttention's flash_attn_with_kvcache): q [B, Sq, Hq, D];
k_cache/v_cache [B, Sk_max, Hkv, D] or, with block_table [B, max_pages], paged
[num_pages, page_size, Hkv, D]; cache_seqlens [B]. Each sequence's keys are gathered to a
plain [L, Hkv, D] array first, so the reference shares no indexing code with the kernels.
Causal is bottom-right: query i sees keys j <= i + L - Sq. Rows with no key give zeros.
varlen_attention_f64: the same over a packed variable-length batch (cu_seqlens).
numpy only.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["decode_attention_f64", "gather_cache", "varlen_attention_f64"]


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


def varlen_attention_f64(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal: bool = False,
                         scale=None) -> np.ndarray:
    """Float64 attention over a packed variable-length batch (FlashAttention's varlen
    layout): q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]; sequence b
    owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1]
    of k and v. Causal is bottom-right per sequence: query i of Lq sees keys
    j <= i + Lk - Lq. Rows with no key give zeros. Returns float64 [total_q, Hq, Dv]."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    cq, ck = np.asarray(cu_seqlens_q, np.int64), np.asarray(cu_seqlens_k, np.int64)
    Hq, D = q.shape[1], q.shape[2]
    group = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = np.zeros((q.shape[0], Hq, v.shape[2]), dtype=np.float64)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])
        Lq, Lk = q1 - q0, k1 - k0
        if Lq <= 0 or Lk <= 0:
            continue
        kb = np.repeat(k[k0:k1], group, axis=1)          # query head h reads kv head h//G
        vb = np.repeat(v[k0:k1], group, axis=1)
        s = np.einsum("qhd,khd->hqk", q[q0:q1], kb) * scale
        if causal:
            allowed = np.arange(Lk)[None, :] <= np.arange(Lq)[:, None] + (Lk - Lq)
            s = np.where(allowed[None], s, -np.inf)
        out[q0:q1] = _softmax_rows_times(s, vb)
    return out
