"""Host-side launch plans for the FMHA backward: framework-agnostic, as gpu/plan.py.

``plan_fmha_bwd`` validates the inputs and returns the launches computing dQ, dK and dV
from the forward's inputs, its output ``out``, the output gradient ``dout`` and the
forward's row log-sum-exp ``lse`` (``plan_fmha(..., lse=...)`` writes it). It never
launches anything and never imports torch: numpy arrays and sim.SimArray for the CPU
simulator, torch tensors for cuTile on a GPU. The caller runs the launches in order.

    lse = alloc((B, Hq, Sq), "float32")
    run(plan_fmha("fused", q, k, v, out, causal=True, lse=lse, alloc=alloc))
    run(plan_fmha_bwd("fused", q, k, v, out, dout, lse, dq, dk, dv, causal=True,
                      alloc=alloc))

The kernels (gpu/kernels/fmha_bwd.py) are deterministic: no atomics; dK and dV of a GQA
group are summed over its query heads inside one block, in a fixed order.
"""
from __future__ import annotations

import os

from typing import Any, Callable, Optional

from .kernels import fmha_bwd as _bwd
from .plan import (Launch, _cdiv, _check_bool, _check_contiguous, _check_int, _check_mask,
                   _check_qkvo, _check_scale, _dtype_name, _launch, _resolve_alloc, _shape,
                   _tile_width, check_pow2_tiles, check_rows, merge_tiles)

__all__ = ["BWD_KERNELS", "BWD_LAUNCH_NAMES", "BWD_TILE_KEYS", "DKV_SPLITS", "DQ_FUSED_VALUES", "EXTRA_KEYS",
           "PARTIAL_WRITERS", "check_bwd_tiles", "launches_fused_dq",
           "default_bwd_tiles", "default_dkdv_split", "plan_fmha_bwd", "preprocess_tile_m"]

BWD_KERNELS = ("fused",)
#: Launch names, in launch order.
BWD_LAUNCH_NAMES = {"fused": ("bwd.preprocess", "bwd.dkdv", "bwd.dq")}
#: The backward's tile knobs: DKV_TILE_N keys per dK/dV block, DKV_TILE_M query rows per
#: step of its loop; DQ_TILE_M query rows per dQ block, DQ_TILE_N keys per step of its loop.
BWD_TILE_KEYS = ("DKV_TILE_M", "DKV_TILE_N", "DQ_TILE_M", "DQ_TILE_N")


def default_bwd_tiles(head_dim: int, arch: str = "sm_90",
                      causal: bool = False) -> dict[str, int]:
    """Default backward tiles {DKV_TILE_M, DKV_TILE_N, DQ_TILE_M, DQ_TILE_N}.

    Not yet timed on a GPU (the sweeper replaces them); chosen from the cubins tileiras
    builds on the CPU (gpu.resources) as the largest tiles that compile without register
    spills at the kernels' occupancy 2 on sm_90 (256 threads x 128 registers):
    sm_90 (and sm_10x): D <= 64: dK/dV 64 queries x 64 keys, dQ 64 queries x 128 keys;
    D <= 128: 64 x 64 both; D = 256: dK/dV 64 x 64 in two column parts (DKV_SPLIT 2,
    default_dkdv_split: each block keeps half of dK's and dV's columns; whole, the two
    [keys, 256] float32 accumulators spill at every tile: 32 x 32 1200 bytes a thread,
    64 x 64 1032; split, 64 x 64 compiles to 384 threads x 168 registers, 0 bytes), dQ
    64 x 64.
    Other archs (no wgmma; smaller shared memory): 64 x 64 up to D = 128, 32 x 32 beyond.
    ``causal`` is part of the store's key; the defaults do not depend on it yet.
    """
    d = _tile_width(_check_int("head_dim", head_dim, 1, 256))
    _check_bool("causal", causal)
    if arch == "sm_90" or arch.startswith("sm_10"):
        if d <= 64:
            return {"DKV_TILE_M": 64, "DKV_TILE_N": 64, "DQ_TILE_M": 64, "DQ_TILE_N": 128}
        if d <= 128:
            return {"DKV_TILE_M": 64, "DKV_TILE_N": 64, "DQ_TILE_M": 64, "DQ_TILE_N": 64}
        return {"DKV_TILE_M": 64, "DKV_TILE_N": 64, "DQ_TILE_M": 64, "DQ_TILE_N": 64}
    if d <= 128:
        return {"DKV_TILE_M": 64, "DKV_TILE_N": 64, "DQ_TILE_M": 64, "DQ_TILE_N": 64}
    return {"DKV_TILE_M": 32, "DKV_TILE_N": 32, "DQ_TILE_M": 32, "DQ_TILE_N": 32}


def preprocess_tile_m(head_dim_v: int) -> int:
    """Rows per preprocess block: two float32 [rows, Dv] tiles of 8192 elements in all
    (memory-bound; kept small enough not to spill at Dv = 256)."""
    return max(16, min(128, 4096 // _tile_width(head_dim_v)))


def plan_fmha_bwd(kernel_name: str, q, k, v, out, dout, lse, dq, dk, dv, *,
                  mask=None,
                  causal: bool = False,
                  scale: Optional[float] = None,
                  tiles: Optional[dict] = None,
                  alloc: Optional[Callable[[tuple, str], Any]] = None) -> list[Launch]:
    """Launches computing the gradients of ``out = softmax(q k^T * scale + mask) v``.

    q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], out and dout [B, Hq, Sq, Dv],
    all fp16 or all bf16, contiguous; lse float32 [B, Hq, Sq] from the forward
    (``plan_fmha(..., lse=)``: natural log, +inf for rows that see no key).
    dq, dk, dv: outputs, same shapes and dtype as q, k, v, every element written by the
    launches (dK/dV summed over the query heads of each GQA group).
    mask, causal, scale: exactly as given to the forward (plan_fmha): mask None or float32
    [MB, MH, Sq, Sk] additive, MB in {1, B}, MH in {1, Hq}; no gradient flows to it.
    tiles: {DKV_TILE_M, DKV_TILE_N, DQ_TILE_M, DQ_TILE_N} (any subset; powers of two in
    [16, 256]); default ``default_bwd_tiles(D, causal=causal)``; and DKV_SPLIT (1, 2, 4:
    column parts of dK/dV; default ``default_dkdv_split(D)``).
    alloc(shape, kind), kind "float32" or "input": the workspaces (delta and lse in log2
    units, float32 [B, Hq, Sq] each; the (1,1,1,1) dummy mask when mask is None). May be
    omitted when q is a numpy array.

    Returns [] when there is nothing to compute (every output empty).
    """
    if kernel_name not in BWD_KERNELS:
        raise ValueError(f"kernel_name must be one of {BWD_KERNELS}, got {kernel_name!r}")
    B, Hq, Sq, D, Hkv, Sk, Dv = _check_qkvo(q, k, v, out)
    dtype = _dtype_name(q)
    _check_like("dout", dout, out)
    check_rows("lse", lse, B, Hq, Sq)
    for name, x, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        _check_like(name, x, like)
    causal = _check_bool("causal", causal)
    scale = _check_scale(scale, D)
    split = _check_split(tiles, D)
    fused_dq = _check_fused_dq(tiles, split)
    early = _check_dq_early(tiles, fused_dq)
    t = check_bwd_tiles({k: x for k, x in (tiles or {}).items() if k not in EXTRA_KEYS}
                        if isinstance(tiles, dict) else tiles, D, causal)
    has_mask = mask is not None
    if has_mask:
        _check_mask(mask, B, Hq, Sq, Sk)

    if B * Hq * Sq == 0 and B * Hkv * Sk == 0:
        return []
    alloc = _resolve_alloc(alloc, q, dtype)
    if not has_mask:
        mask = alloc((1, 1, 1, 1), "float32")       # never read: HAS_MASK=False
    head_dim, head_dim_v = _tile_width(D), _tile_width(Dv)
    delta = alloc((B, Hq, Sq), "float32")
    lse2 = alloc((B, Hq, Sq), "float32")
    if fused_dq and B * Hq * Sq > 0 and B * Hkv * Sk > 0:
        return launches_fused_dq(q, k, v, out, dout, lse, dq, dk, dv, mask, delta, lse2,
                                 scale, head_dim, head_dim_v, t, causal, has_mask, alloc,
                                 parts=max(1, min(fused_dq, head_dim // 16)), early=early)
    launches = []
    if B * Hq * Sq > 0:
        pre_m = preprocess_tile_m(Dv)
        launches.append(_launch(_bwd.fmha_bwd_preprocess_kernel, (_cdiv(Sq, pre_m), B * Hq, 1),
                                (out, dout, lse, delta, lse2, head_dim_v, pre_m),
                                "bwd.preprocess"))
    if B * Hkv * Sk > 0:       # with Sq == 0 it writes zeros (no query tile to visit)
        split = split if min(head_dim, head_dim_v) // split >= 16 else 1
        launches.append(_launch(_bwd.fmha_bwd_dkdv_kernel,
                                (_cdiv(Sk, t["DKV_TILE_N"]), B * Hkv, split),
                                (q, k, v, dout, lse2, delta, mask, dk, dv, scale, head_dim,
                                 head_dim_v, t["DKV_TILE_M"], t["DKV_TILE_N"], causal,
                                 has_mask, split),
                                "bwd.dkdv"))
    if B * Hq * Sq > 0:        # with Sk == 0 it writes zeros (no key tile to visit)
        launches.append(_launch(_bwd.fmha_bwd_dq_kernel,
                                (_cdiv(Sq, t["DQ_TILE_M"]), B * Hq, 1),
                                (q, k, v, dout, lse2, delta, mask, dq, scale, head_dim,
                                 head_dim_v, t["DQ_TILE_M"], t["DQ_TILE_N"], causal,
                                 has_mask),
                                "bwd.dq"))
    return launches


def check_bwd_tiles(tiles, head_dim: int, causal: bool = False) -> dict[str, int]:
    """The defaults updated with ``tiles`` (None values keep the default), validated."""
    t = merge_tiles(tiles, default_bwd_tiles(head_dim, causal=causal), BWD_TILE_KEYS,
                    f"keys among {BWD_TILE_KEYS}")
    return check_pow2_tiles(t, BWD_TILE_KEYS)


def launches_fused_dq(q, k, v, out, dout, lse, dq, dk, dv, mask, delta, lse2, scale,
                      head_dim, head_dim_v, t, causal, has_mask, alloc,
                      parts: int = 1, early: bool = False) -> list[Launch]:
    """DQ_FUSED 1: the preprocess (which also zeroes the counters and the ticket), then
    dK, dV and dQ in one pass (gpu/kernels/fmha_bwd.py, section 4). Workspaces: the float32
    dQ accumulator [B, Hq, Sq, D], a counter per query row [B, Hq, Sq] and the ticket (1,).
    dQ's tiles are the dK/dV pass's DKV_TILE_M rows; DQ_TILE_M/N are not used."""
    if getattr(q, "is_cuda", False) and os.environ.get("SPAK_BWD_FUSED_DQ_GPU") != "1":
        raise RuntimeError(
            "tiles['DQ_FUSED']: the fused-dQ backward is 2-2.8x slower than the three-launch "
            "one on an H200 and its long timing loops stalled (2026-11-28e); use DQ_FUSED 0, or "
            "set SPAK_BWD_FUSED_DQ_GPU=1 to launch it anyway (docs/fmha-training.md)")
    B, Hq, Sq, D = _shape("q", q)
    Hkv, Sk = _shape("k", k)[1:3]
    blocks = _cdiv(Sk, t["DKV_TILE_N"]) * B * Hkv
    if blocks >= 1 << 24:       # the float32 ticket counts blocks exactly below 2^24
        raise ValueError(f"tiles['DQ_FUSED']: {blocks} dK/dV blocks (B * Hkv * key tiles) "
                         f"exceed the fused pass's 2^24; use DQ_FUSED 0")
    acc = alloc((B, Hq, Sq, D), "float32")
    count = alloc((B, Hq, Sq), "float32")
    start = alloc((1,), "float32")
    pre_m = preprocess_tile_m(head_dim_v)
    return [
        _launch(_bwd.fmha_bwd_preprocess_dq_kernel, (_cdiv(Sq, pre_m), B * Hq, 1),
                (out, dout, lse, delta, lse2, count, start, head_dim_v, pre_m),
                "bwd.preprocess"),
        _launch(_bwd.fmha_bwd_dkdvdq_kernel, (_cdiv(Sk, t["DKV_TILE_N"]), B * Hkv, 1),
                (q, k, v, dout, lse2, delta, mask, dk, dv, dq, acc, count, start, scale,
                 head_dim, head_dim_v, t["DKV_TILE_M"], t["DKV_TILE_N"], causal, has_mask,
                 parts, early), "bwd.dkdv"),
    ]


#: kernels whose workspaces are partly left unwritten by design (the simulator's
#: unwritten-output check does not apply to them; their outputs are checked as gradients)
PARTIAL_WRITERS = (_bwd.fmha_bwd_dkdvdq_kernel,)


#: tiles keys beside BWD_TILE_KEYS: DKV_SPLIT (dK/dV column parts), DQ_FUSED (0: the
#: three-launch backward, the default; 1, 2, 4: dQ accumulated in the dK/dV pass) and
#: DQ_EARLY (0, 1; with DQ_FUSED: the dS K product before the wait, _dq_add)
EXTRA_KEYS = ("DKV_SPLIT", "DQ_FUSED", "DQ_EARLY")


#: tiles["DQ_FUSED"]: 0 (or absent) the three-launch backward; 1, 2, 4 the fused-dQ pass
#: with dQ's columns added in that many parts
DQ_FUSED_VALUES = (0, 1, 2, 4)


def _check_fused_dq(tiles, split: int) -> int:
    v = tiles.get("DQ_FUSED", 0) if isinstance(tiles, dict) else 0
    if v is None:
        v = 0
    if isinstance(v, bool) or v not in DQ_FUSED_VALUES:
        raise ValueError(f"tiles['DQ_FUSED'] must be one of {DQ_FUSED_VALUES}, got {v!r}")
    if v and split != 1:
        raise ValueError(f"tiles['DQ_FUSED'] needs DKV_SPLIT 1 (the default for head "
                         f"dims <= 128), got DKV_SPLIT {split}")
    return v


def _check_dq_early(tiles, fused_dq: int) -> bool:
    v = tiles.get("DQ_EARLY", 0) if isinstance(tiles, dict) else 0
    v = 0 if v is None else v
    if isinstance(v, bool) or v not in (0, 1):
        raise ValueError(f"tiles['DQ_EARLY'] must be 0 or 1, got {v!r}")
    if v and not fused_dq:
        raise ValueError("tiles['DQ_EARLY'] = 1 needs DQ_FUSED (the fused-dQ pass)")
    return bool(v)


#: dK/dV column parts (tiles["DKV_SPLIT"]): 1, 2 or 4; 0 or absent: default_dkdv_split(D)
DKV_SPLITS = (1, 2, 4)


def default_dkdv_split(head_dim: int) -> int:
    """Column parts of the dK/dV pass: 2 for head dims past 128 (tile width 256: the
    accumulators do not fit whole, see default_bwd_tiles), else 1. Issue 35's prediction,
    before a GPU run times it: the D 256 dK/dV pass at 64 x 64 split 2 takes 0.6-0.75x the
    time of 32 x 32 whole (spills gone, 4x the tile, for 1.5x the matmul work), the whole
    backward 0.7-0.85x. The old kernel: tiles {"DKV_TILE_M": 32, "DKV_TILE_N": 32,
    "DKV_SPLIT": 1}."""
    return 2 if _tile_width(head_dim) > 128 else 1


def _check_split(tiles, head_dim: int) -> int:
    v = tiles.get("DKV_SPLIT") if isinstance(tiles, dict) else None
    if v is None or v == 0:
        return default_dkdv_split(head_dim)
    if isinstance(v, bool) or not isinstance(v, int) or v not in DKV_SPLITS:
        raise ValueError(f"tiles['DKV_SPLIT'] must be one of {DKV_SPLITS} (or 0: the "
                         f"default), got {v!r}")
    return v


def _check_like(name, x, like):
    """x has like's shape and dtype and is contiguous."""
    shape, want = _shape(name, x), _shape("like", like)
    if shape != want:
        raise ValueError(f"{name} must have shape {want}, got {shape}")
    dt, want_dt = _dtype_name(x), _dtype_name(like)
    if dt != want_dt:
        raise TypeError(f"{name} dtype ({dt}) must match q dtype ({want_dt})")
    _check_contiguous(name, x)
