"""The recipe's step 1: online softmax, prototyped in float64.

Before any kernel exists, check the algebra the fused kernel relies on: a row
can be normalised block by block, keeping only a running max `m` and a running
sum `l`, and rescaling what was summed so far whenever the max grows:

    m' = max(m, max(x_blk))
    l' = l * exp(m - m') + sum(exp(x_blk - m'))
    acc' = acc * exp(m - m') + exp(x_blk - m') @ V_blk        (attention)

The prototype mirrors the kernel's choices so a bug in them shows here first:
the scale is folded into a base-2 exponent (exp2(x * scale * log2 e)), and a
row whose keys are all masked keeps m = -inf, which must never turn into
exp(-inf - -inf) = NaN: such rows end with l = 0 and output zeros.

`check_prototype` is the step's gate: online vs global softmax <= 1e-12.
"""
from __future__ import annotations

import math

import numpy as np

from spak.attention.reference import additive_mask, allowed_keys, attention_f64, validate_attention_args

__all__ = [
    "LOG2E", "softmax_f64", "online_softmax_stats", "online_softmax_f64",
    "online_attention_f64", "check_prototype", "PROTOTYPE_GATE",
]

LOG2E = 1.0 / math.log(2.0)
#: Step 1's gate: online and global softmax agree to this (max abs, float64).
PROTOTYPE_GATE = 1e-12


def softmax_f64(x, axis: int = -1) -> np.ndarray:
    """Global (two-pass, whole-row) softmax in float64; all -inf rows -> 0."""
    x = np.asarray(x, dtype=np.float64)
    mx = np.max(x, axis=axis, keepdims=True)
    dead = np.isneginf(mx)
    p = np.exp(x - np.where(dead, 0.0, mx))
    den = np.sum(p, axis=axis, keepdims=True)
    return np.where(dead, 0.0, p / np.where(dead, 1.0, den))


def _safe(m: np.ndarray) -> np.ndarray:
    """The max to subtract: -inf (nothing seen yet) becomes 0 so exp2 stays 0, not NaN."""
    return np.where(np.isneginf(m), 0.0, m)


def online_softmax_stats(x, block: int) -> tuple[np.ndarray, np.ndarray]:
    """One pass over the last axis in blocks of `block`: running (max, sum).

    Works in the log2 domain like the kernel: returns m2 = max(x) * log2 e and
    l = sum(exp2(x * log2 e - m2)) = sum(exp(x - max x)).
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    x2 = np.asarray(x, dtype=np.float64) * LOG2E
    m = np.full(x2.shape[:-1], -np.inf)
    l = np.zeros(x2.shape[:-1])
    for j0 in range(0, x2.shape[-1], block):
        blk = x2[..., j0:j0 + block]
        m_new = np.maximum(m, blk.max(axis=-1))
        l = l * np.exp2(m - _safe(m_new)) + np.exp2(blk - _safe(m_new)[..., None]).sum(axis=-1)
        m = m_new
    return m, l


def online_softmax_f64(x, block: int) -> np.ndarray:
    """Softmax over the last axis from the online statistics (all -inf rows -> 0)."""
    x = np.asarray(x, dtype=np.float64)
    m, l = online_softmax_stats(x, block)
    p = np.exp2(x * LOG2E - _safe(m)[..., None])
    return np.where((l > 0)[..., None], p / np.where(l > 0, l, 1.0)[..., None], 0.0)


def online_attention_f64(q, k, v, *, mask=None, causal: bool = False, scale=None,
                         block_n: int = 64) -> np.ndarray:
    """Attention as the fused kernel computes it: one pass over key blocks.

    Same contract as `spak.attention.reference.attention_f64` (GQA, additive or bool
    mask, bottom-right causal, fully masked rows -> 0); only the algorithm
    differs, which is the point of comparing the two.
    """
    if block_n < 1:
        raise ValueError(f"block_n must be >= 1, got {block_n}")
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    scale = validate_attention_args(q, k, v, mask, scale)
    B, Hq, Sq, _ = q.shape
    Hkv, Sk, Dv = k.shape[1], k.shape[2], v.shape[3]
    group = Hq // Hkv
    qk_scale = scale * LOG2E  # folded into the exponent, as the kernel does
    madd = additive_mask(mask)
    madd = None if madd is None else np.broadcast_to(madd, (B, Hq, Sq, Sk))
    vis = allowed_keys(np.arange(Sq), Sq, Sk) if causal else None
    out = np.zeros((B, Hq, Sq, Dv))
    for b in range(B):
        for h in range(Hq):
            qq = q[b, h].astype(np.float64)
            kk = k[b, h // group].astype(np.float64)
            vv = v[b, h // group].astype(np.float64)
            m = np.full(Sq, -np.inf)
            l = np.zeros(Sq)
            acc = np.zeros((Sq, Dv))
            for j0 in range(0, Sk, block_n):
                j1 = min(Sk, j0 + block_n)
                s = (qq @ kk[j0:j1].T) * qk_scale
                if madd is not None:
                    s = s + madd[b, h, :, j0:j1] * LOG2E
                if vis is not None:
                    s = np.where(vis[:, j0:j1], s, -np.inf)
                m_new = np.maximum(m, s.max(axis=1))
                alpha = np.exp2(m - _safe(m_new))          # rescales the old sums
                p = np.exp2(s - _safe(m_new)[:, None])
                l = l * alpha + p.sum(axis=1)
                acc = acc * alpha[:, None] + p @ vv[j0:j1]
                m = m_new
            live = l > 0
            out[b, h] = np.where(live[:, None], acc / np.where(live, l, 1.0)[:, None], 0.0)
    return out


def check_prototype(seed: int = 0) -> dict:
    """Step 1's gate on a few fresh random cases: returns errors and `passed`.

    Softmax rows of awkward lengths in awkward blocks (with a fully masked row),
    and attention with GQA, a mask, causal Sq != Sk, against the global forms.
    """
    rng = np.random.default_rng(seed)
    sm_err = 0.0
    for n, block in ((1, 1), (17, 4), (100, 64), (1000, 128), (257, 256)):
        x = rng.standard_normal((5, n)) * 4.0
        x[2] = -np.inf
        sm_err = max(sm_err, float(np.max(np.abs(online_softmax_f64(x, block) - softmax_f64(x)))))
    at_err = 0.0
    for (B, Hq, Hkv, Sq, Sk, D, causal, bn) in ((1, 4, 1, 17, 100, 64, True, 16),
                                                 (2, 2, 2, 100, 33, 32, True, 64),
                                                 (1, 2, 1, 64, 64, 128, False, 7)):
        q = rng.standard_normal((B, Hq, Sq, D))
        k = rng.standard_normal((B, Hkv, Sk, D))
        v = rng.standard_normal((B, Hkv, Sk, D))
        mask = np.where(rng.random((B, 1, Sq, Sk)) < 0.2, -np.inf, rng.standard_normal((B, 1, Sq, Sk)))
        mask[0, 0, Sq // 2] = -np.inf
        got = online_attention_f64(q, k, v, mask=mask, causal=causal, block_n=bn)
        want = attention_f64(q, k, v, mask=mask, causal=causal)
        at_err = max(at_err, float(np.max(np.abs(got - want))))
    return {"softmax_max_abs": sm_err, "attention_max_abs": at_err, "gate": PROTOTYPE_GATE,
            "passed": bool(sm_err <= PROTOTYPE_GATE and at_err <= PROTOTYPE_GATE)}
