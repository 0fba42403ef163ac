"""The float64 attention reference every kernel is judged against.

    O = softmax(Q K^T * scale + M) V

computed in float64 from the kernel's own (fp16 or bf16-valued) inputs, so the
only error left in a comparison is the kernel's. Conventions (ARCHITECTURE.md):

* GQA: query head h reads key/value head h // (Hq // Hkv).
* Causal is bottom-right aligned, as in prefill with a KV cache: query i sees
  key j iff j <= i + (Sk - Sq).
* A row with no allowed key (Sq > Sk under causal, or a mask row of all -inf)
  outputs zeros, never NaN.
* A boolean mask follows torch SDPA: True means "may attend".

It works one (batch, head) and one block of query rows at a time, so the
score matrix never exceeds ~64 MiB whatever S is.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["attention_f64", "attention_grads_f64", "validate_attention_args", "additive_mask",
           "allowed_keys"]

_CHUNK_ELEMS = 1 << 23  # float64 score elements per block of rows (64 MiB)


def additive_mask(mask) -> np.ndarray | None:
    """A mask as float64 additive biases: bool True -> 0, False -> -inf."""
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        return np.where(m, 0.0, -np.inf)
    if m.dtype.kind != "f":
        raise TypeError(f"mask must be a float (additive) or bool array, got dtype {m.dtype}")
    return m


def allowed_keys(rows: np.ndarray, Sq: int, Sk: int) -> np.ndarray:
    """Causal visibility [len(rows), Sk]: query i sees key j iff j <= i + Sk - Sq."""
    return np.arange(Sk)[None, :] <= (np.asarray(rows)[:, None] + (Sk - Sq))


def validate_attention_args(q, k, v, mask=None, scale=None):
    """Check shapes, dtypes, mask broadcast and scale; return the float scale.

    Raises ValueError/TypeError naming the offending argument, before any work.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if np.ndim(t) != 4:
            raise ValueError(f"{name} must be 4-D [B, H, S, D], got shape {np.shape(t)}")
        if np.asarray(t).dtype.kind != "f":
            raise TypeError(f"{name} must be a floating-point array, got {np.asarray(t).dtype}")
    B, Hq, Sq, D = q.shape
    Bk, Hkv, Sk, Dk = k.shape
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree in B, H, S: k {k.shape}, v {v.shape}")
    if Bk != B:
        raise ValueError(f"k/v batch {Bk} != q batch {B}")
    if Dk != D:
        raise ValueError(f"k head dim {Dk} != q head dim {D}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv})")
    if mask is not None:
        try:
            np.broadcast_shapes(np.shape(mask), (B, Hq, Sq, Sk))
        except ValueError:
            raise ValueError(f"mask of shape {np.shape(mask)} does not broadcast to "
                             f"[B, Hq, Sq, Sk] = {(B, Hq, Sq, Sk)}") from None
        if np.ndim(mask) > 4:
            raise ValueError(f"mask must have at most 4 dims, got shape {np.shape(mask)}")
    if scale is None:
        return 1.0 / math.sqrt(D) if D else 1.0
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def attention_f64(q, k, v, *, mask=None, causal: bool = False, scale=None) -> np.ndarray:
    """Exact attention in float64: q [B,Hq,Sq,D], k/v [B,Hkv,Sk,Dv] -> [B,Hq,Sq,Dv].

    `mask` is additive (float, may hold -inf) or boolean (True = attend),
    broadcastable to [B, Hq, Sq, Sk]. `scale` defaults to 1/sqrt(D).
    NaN in the inputs propagates to the rows it touches, as in torch SDPA.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    scale = validate_attention_args(q, k, v, mask, scale)
    B, Hq, Sq, _ = q.shape
    Hkv, Sk, Dv = k.shape[1], k.shape[2], v.shape[3]
    group = Hq // Hkv
    out = np.zeros((B, Hq, Sq, Dv), dtype=np.float64)
    if Sq == 0 or Sk == 0:
        return out  # no keys: every row is fully masked -> zeros
    m = additive_mask(mask)
    if m is not None:
        m = np.broadcast_to(m, (B, Hq, Sq, Sk))  # a view: no copy
    rows_per_chunk = max(1, _CHUNK_ELEMS // Sk)
    for b in range(B):
        for hk in range(Hkv):
            kt = k[b, hk].astype(np.float64).T  # [D, Sk]
            vv = v[b, hk].astype(np.float64)    # [Sk, Dv]
            for h in range(hk * group, (hk + 1) * group):
                qq = q[b, h].astype(np.float64)
                for r0 in range(0, Sq, rows_per_chunk):
                    rows = np.arange(r0, min(Sq, r0 + rows_per_chunk))
                    s = (qq[rows] @ kt) * scale
                    if m is not None:
                        s += m[b, h, rows[0]:rows[-1] + 1]
                    if causal:
                        s[~allowed_keys(rows, Sq, Sk)] = -np.inf
                    out[b, h, rows] = _softmax_rows_times(s, vv)
    return out


def _softmax_rows_times(s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(s, axis=-1) @ v with all -inf rows -> 0 (and no 0/0 NaN)."""
    mx = s.max(axis=1, keepdims=True)
    dead = np.isneginf(mx)                      # no allowed key in this row
    p = np.exp(s - np.where(dead, 0.0, mx))     # exp(-inf) = 0 for masked keys
    den = p.sum(axis=1, keepdims=True)
    o = (p @ v) / np.where(dead, 1.0, den)
    o[dead[:, 0]] = 0.0
    return o


def attention_grads_f64(q, k, v, dout, *, mask=None, causal: bool = False,
                        scale=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact gradients (dq, dk, dv) in float64 of attention_f64's output for the output
    gradient `dout` [B, Hq, Sq, Dv]: the analytic backward, per row block,

        P = softmax(Z), Z = q k^T * scale + mask (causal: -inf right of the diagonal)
        dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP))
        dQ = scale * dS K,  dK = scale * dS^T Q

    GQA: dk and dv of a kv head are summed over the query heads of its group. Rows with
    no allowed key have P = 0: zero gradients, never NaN. No gradient flows to the mask.
    Same arguments and conventions as attention_f64.
    """
    q, k, v, dout = (np.asarray(x) for x in (q, k, v, dout))
    scale = validate_attention_args(q, k, v, mask, scale)
    B, Hq, Sq, _ = q.shape
    Hkv, Sk, Dv = k.shape[1], k.shape[2], v.shape[3]
    if dout.shape != (B, Hq, Sq, Dv):
        raise ValueError(f"dout must have shape {(B, Hq, Sq, Dv)} [B, Hq, Sq, Dv], "
                         f"got {dout.shape}")
    group = Hq // Hkv
    dq = np.zeros(q.shape, np.float64)
    dk = np.zeros(k.shape, np.float64)
    dv = np.zeros(v.shape, np.float64)
    if Sq == 0 or Sk == 0:
        return dq, dk, dv
    m = additive_mask(mask)
    if m is not None:
        m = np.broadcast_to(m, (B, Hq, Sq, Sk))
    rows_per_chunk = max(1, _CHUNK_ELEMS // Sk)
    for b in range(B):
        for hk in range(Hkv):
            kk = k[b, hk].astype(np.float64)     # [Sk, D]
            vv = v[b, hk].astype(np.float64)     # [Sk, Dv]
            for h in range(hk * group, (hk + 1) * group):
                qq = q[b, h].astype(np.float64)
                do = dout[b, h].astype(np.float64)
                for r0 in range(0, Sq, rows_per_chunk):
                    rows = np.arange(r0, min(Sq, r0 + rows_per_chunk))
                    s = (qq[rows] @ kk.T) * scale
                    if m is not None:
                        s += m[b, h, rows[0]:rows[-1] + 1]
                    if causal:
                        s[~allowed_keys(rows, Sq, Sk)] = -np.inf
                    p = _softmax_rows(s)                          # [rows, Sk]
                    dv[b, hk] += p.T @ do[rows]
                    dp = do[rows] @ vv.T
                    ds = p * (dp - (p * dp).sum(axis=1, keepdims=True))
                    dq[b, h, rows] = scale * (ds @ kk)
                    dk[b, hk] += scale * (ds.T @ qq[rows])
    return dq, dk, dv


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    """softmax(s, axis=-1) with all -inf rows -> 0."""
    mx = s.max(axis=1, keepdims=True)
    dead = np.isneginf(mx)
    p = np.exp(s - np.where(dead, 0.0, mx))
    return p / np.where(dead, 1.0, p.sum(axis=1, keepdims=True))
