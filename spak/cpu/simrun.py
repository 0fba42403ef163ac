"""Run one FMHA problem through the CPU simulator and check it against float64.

problem spec -> inputs -> gpu.plan launches -> sim.launch each -> compare with
spak.attention.reference.attention_f64. This is the CPU loop's unit of work (`spak sim`, tests).
"""
from __future__ import annotations

import time

import numpy as np
import cuda.tile as ct

from spak import sim
from spak.gpu.plan import plan_fmha
from spak.core.metrics import gate_for, max_abs, nonfinite_count, passes_gate, rel_l2
from spak.attention.problems import ProblemSpec, make_inputs
from spak.attention.reference import attention_f64

_CT_DTYPE = {"fp16": ct.float16, "bf16": ct.bfloat16}


def tiles_dict(tiles) -> dict | None:
    """Accept None, (M, N) or {"TILE_M": M, "TILE_N": N} (gpu.plan checks the values)."""
    if tiles is None or isinstance(tiles, dict):
        return tiles
    if isinstance(tiles, (str, bytes)) or not hasattr(tiles, "__len__") or len(tiles) != 2:
        raise TypeError(f"tiles must be None, a (TILE_M, TILE_N) pair or a dict "
                        f"{{'TILE_M': .., 'TILE_N': ..}}, got {tiles!r}")
    m, n = tiles
    return {"TILE_M": m, "TILE_N": n}


def kernel_mask(mask: np.ndarray | None, B: int, Hq: int, Sq: int, Sk: int) -> np.ndarray | None:
    """The mask as the kernels take it: float32 [MB, MH, Sq, Sk], MB in {1,B}, MH in {1,Hq}.

    A bool mask (True = attend, SDPA's convention) becomes 0 / -inf. Batch and head
    broadcasts stay size 1 (the kernel indexes block 0); Sq and Sk are materialised.
    """
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        m = np.where(m, np.float32(0), np.float32(-np.inf))
    m = m.astype(np.float32).reshape((1,) * (4 - m.ndim) + m.shape)
    mb = B if m.shape[0] == B else 1
    mh = Hq if m.shape[1] == Hq else 1
    return np.ascontiguousarray(np.broadcast_to(m, (mb, mh, Sq, Sk)))


def simulate_fmha(kernel_name: str, q, k, v, *, mask=None, causal=False, scale=None,
                  tiles=None, model="sm_90", dtype="fp16") -> tuple[np.ndarray, list]:
    """Run the kernel's launches in the simulator; returns (out, launch reports).

    q/k/v: float16 arrays, or float32 arrays holding bf16 values with dtype="bf16".
    Raises ValueError/TypeError naming the argument (docs/errors.md) before anything runs;
    gpu.plan.plan_fmha checks the sizes, causal, scale and tiles.
    """
    ctd = _check_sim_inputs(q, k, v, mask, dtype)
    # copies: inputs are read-only here (bf16 rounding happens on the copy, never in place)
    Q, K, V = (sim.SimArray(np.array(x, order="C", copy=True), ctd, name=n)
               for x, n in ((q, "Q"), (k, "K"), (v, "V")))
    B, Hq, Sq, _ = q.shape
    Sk, Dv = k.shape[2], v.shape[3]
    # poison the output: an element no block writes stays NaN (and the checker says so)
    out = sim.SimArray(np.full((B, Hq, Sq, Dv), np.nan, Q.data.dtype), ctd, name="Out")
    km = kernel_mask(mask, B, Hq, Sq, Sk)

    def alloc(shape, kind):
        if kind == "input":
            return sim.SimArray(np.full(shape, np.nan, Q.data.dtype), ctd)
        return np.full(shape, np.nan, np.float32)

    launches = plan_fmha(kernel_name, Q, K, V, out, mask=km, causal=causal, scale=scale,
                         tiles=tiles_dict(tiles), alloc=alloc)
    reports = [sim.launch(L.kernel, L.grid, L.args, model=model) for L in launches]
    return out.data, reports


_STORAGE = {"fp16": np.float16, "bf16": np.float32}


def _check_sim_inputs(q, k, v, mask, dtype):
    """What simulate_fmha checks itself (array types, ndim, storage dtypes, mask); returns
    the cuTile dtype. Sizes, GQA, head dims, causal, scale and tiles: gpu.plan.plan_fmha."""
    if dtype not in _CT_DTYPE:
        raise ValueError(f"dtype must be one of {tuple(_CT_DTYPE)}, got {dtype!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name} must be 4D [batch, heads, seq, head_dim], got shape "
                             f"{x.shape}")
        want = np.dtype(_STORAGE[dtype])
        if x.dtype != want:
            held = "float32 arrays holding bf16 values" if dtype == "bf16" else "float16"
            raise TypeError(f"{name} dtype must be {want} for dtype={dtype!r} ({held}), "
                            f"got {x.dtype}")
    if mask is None:
        return _CT_DTYPE[dtype]
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"mask must be a numpy array or None, got {type(mask).__name__}")
    if mask.dtype != np.bool_ and mask.dtype.kind != "f":
        raise TypeError(f"mask dtype must be bool (True = attend) or a float dtype "
                        f"(additive), got {mask.dtype}")
    B, Hq, Sq, _ = q.shape
    Sk = k.shape[2]
    ok = mask.ndim <= 4
    if ok:
        try:
            np.broadcast_shapes(mask.shape, (B, Hq, Sq, Sk))
        except ValueError:
            ok = False
    if not ok:
        raise ValueError(f"mask shape {mask.shape} does not broadcast to [B, Hq, Sq, Sk] = "
                         f"{[B, Hq, Sq, Sk]}")
    return _CT_DTYPE[dtype]


def run_case(kernel_name: str, spec: ProblemSpec, *, tiles=None, model="sm_90", seed=0) -> dict:
    """One row of `spak sim`'s table: errors vs float64, NaN/Inf count, simulated seconds."""
    inp = make_inputs(spec, seed)
    t0 = time.perf_counter()
    out, reports = simulate_fmha(kernel_name, inp.q, inp.k, inp.v, mask=inp.mask,
                                 causal=spec.causal, tiles=tiles, model=model, dtype=spec.dtype)
    seconds = time.perf_counter() - t0
    ref = attention_f64(inp.q, inp.k, inp.v, mask=inp.mask, causal=spec.causal)
    rel, nonfinite = rel_l2(out, ref), nonfinite_count(out)
    return {"kernel": kernel_name, "shape": spec.display, "causal": spec.causal,
            "dtype": spec.dtype, "rel_l2": rel, "max_abs": max_abs(out, ref),
            "nonfinite": nonfinite, "seconds": seconds, "gate": gate_for(spec.dtype),
            "passed": passes_gate(rel, nonfinite, spec.dtype), "error": None,
            "launches": [{"kernel": r.kernel, "grid": list(r.grid), "groups": r.groups,
                          "splits": r.splits, "seconds": r.seconds} for r in reports]}
