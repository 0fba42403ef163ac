"""Run decode attention over a KV cache through the CPU simulator (the fmha_decode family's
CPU loop): numpy inputs -> gpu.plan_decode launches -> sim.launch each, in order.
"""
from __future__ import annotations

import numpy as np
import cuda.tile as ct

from spak import sim
from spak.gpu.plan_decode import DEFAULT_SMS, plan_decode

_CT_DTYPE = {"fp16": ct.float16, "bf16": ct.bfloat16}
_STORAGE = {"fp16": np.float16, "bf16": np.float32}


def _sim_arrays(inputs: dict, names, dtype: str):
    """(cuTile dtype, {name: SimArray}) for the named inputs: each checked to be numpy in
    the dtype's storage (float16, or float32 holding bf16 values) and copied, so bf16
    rounding happens on the copy, never on the caller's array."""
    if dtype not in _CT_DTYPE:
        raise ValueError(f"dtype must be one of {tuple(_CT_DTYPE)}, got {dtype!r}")
    ctd = _CT_DTYPE[dtype]
    arrays = {}
    for name in names:
        x = inputs[name]
        if not isinstance(x, np.ndarray) or x.dtype != _STORAGE[dtype]:
            raise TypeError(f"{name} must be a numpy {np.dtype(_STORAGE[dtype])} array for "
                            f"dtype={dtype!r}, got {getattr(x, 'dtype', type(x).__name__)}")
        arrays[name] = sim.SimArray(np.array(x, order="C", copy=True), ctd, name=name)
    return ctd, arrays


def simulate_decode(inputs: dict, *, dtype: str = "fp16", causal: bool = False, scale=None,
                    num_splits=None, tiles=None, num_sms: int = DEFAULT_SMS,
                    model: str = "sm_90") -> tuple[np.ndarray, list]:
    """(out [B, Sq, Hq, Dv], launch reports) for inputs {q, k_cache, v_cache,
    cache_seqlens, block_table (or None)}: float16 arrays, or float32 holding bf16 values
    with dtype="bf16"; int32 lengths and table. The plan validates sizes and flags."""
    ctd, arrays = _sim_arrays(inputs, ("q", "k_cache", "v_cache"), dtype)
    B, Sq, Hq, _ = inputs["q"].shape
    Dv = inputs["v_cache"].shape[3]
    # poisoned: an element no block writes stays NaN (and the checker says so)
    out = sim.SimArray(np.full((B, Sq, Hq, Dv), np.nan, _STORAGE[dtype]), ctd, name="Out")

    def alloc(shape, kind):
        return np.full(shape, np.nan, np.float32)

    launches = plan_decode(arrays["q"], arrays["k_cache"], arrays["v_cache"],
                           inputs["cache_seqlens"], out, block_table=inputs.get("block_table"),
                           causal=causal, scale=scale, num_splits=num_splits, tiles=tiles,
                           num_sms=num_sms, alloc=alloc)
    reports = [sim.launch(L.kernel, L.grid, L.args, model=model) for L in launches]
    return out.data, reports


def simulate_varlen(inputs: dict, *, dtype: str = "fp16", causal: bool = False, scale=None,
                    tiles=None, model: str = "sm_90") -> tuple[np.ndarray, list]:
    """(out [total_q, Hq, Dv], launch reports) of the varlen kernel for inputs {q, k, v,
    cu_seqlens_q, cu_seqlens_k} (packed [total, heads, D] arrays as for simulate_decode;
    int32 [B+1] offsets), max_seqlen_q/k taken from the offsets. Rows no block writes
    stay NaN (the output is poisoned), so a missed row fails the NaN gate."""
    from spak.gpu.plan_decode import plan_varlen
    ctd, arrays = _sim_arrays(inputs, ("q", "k", "v"), dtype)
    cq, ck = (np.asarray(inputs[n], np.int32) for n in ("cu_seqlens_q", "cu_seqlens_k"))
    Tq, Hq, _ = inputs["q"].shape
    out_np = np.full((Tq, Hq, inputs["v"].shape[2]), np.nan, _STORAGE[dtype])
    out = sim.SimArray(out_np, ctd, name="Out")
    launches = plan_varlen(arrays["q"], arrays["k"], arrays["v"], cq, ck, out,
                           max_seqlen_q=int(np.diff(cq).max(initial=0)),
                           max_seqlen_k=int(np.diff(ck).max(initial=0)), causal=causal,
                           scale=scale, tiles=tiles)
    reports = [sim.launch(L.kernel, L.grid, L.args, model=model) for L in launches]
    data = out.data
    if not launches or inputs["k"].shape[0] == 0:
        data[:] = 0                       # nothing to attend to: every row is 0
    return data, reports
