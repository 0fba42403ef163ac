"""Run the FMHA backward through the CPU simulator (the kernels' own source, sim.launch).

    grads, reports = simulate_fmha_bwd("fused", q, k, v, dout, causal=True, dtype="fp16")
    grads["dq"], grads["dk"], grads["dv"]        # plus grads["out"], grads["lse"]

The forward with LSE (gpu.plan.plan_fmha(..., lse=)) runs first in the simulator unless
the caller passes the forward's ``out`` and ``lse`` (e.g. a GPU's, to check the backward
kernels alone bit for bit), then the backward's launches (gpu.plan_bwd.plan_fmha_bwd).
The numpy-level mirror of spak.cpu.simrun.simulate_fmha.
"""
from __future__ import annotations

import numpy as np

from spak import sim
from spak.cpu.simrun import _CT_DTYPE, _STORAGE, _check_sim_inputs, kernel_mask, tiles_dict
from spak.gpu.plan import plan_fmha
from spak.gpu.plan_bwd import PARTIAL_WRITERS, plan_fmha_bwd

__all__ = ["simulate_fmha_bwd"]


def simulate_fmha_bwd(kernel_name: str, q, k, v, dout, *, mask=None, causal=False,
                      scale=None, tiles=None, fwd_tiles=None, model="sm_90", dtype="fp16",
                      out=None, lse=None) -> tuple[dict, list]:
    """Gradients of the fused attention, simulated: ({"dq", "dk", "dv", "out", "lse"},
    the sim.LaunchReport of every launch, forward first when it ran).

    q, k, v, dout: float16 arrays, or float32 arrays holding bf16 values with
    dtype="bf16"; mask: None, bool (True = attend) or additive float, broadcastable to
    [B, Hq, Sq, Sk]. tiles: the backward's (gpu.plan_bwd.BWD_TILE_KEYS); fwd_tiles: the
    forward's (TILE_M/TILE_N dict or pair). out, lse: the forward's output ([B, Hq, Sq, Dv],
    q's storage dtype) and float32 [B, Hq, Sq] LSE; both or neither (then the forward runs
    here first). Raises ValueError/TypeError naming the argument before anything runs.
    """
    ctd = _check_sim_inputs(q, k, v, mask, dtype)
    B, Hq, Sq, _ = q.shape
    Sk, Dv = k.shape[2], v.shape[3]
    store = np.dtype(_STORAGE[dtype])
    _check_array("dout", dout, (B, Hq, Sq, Dv), store)
    if (out is None) != (lse is None):
        raise ValueError("pass both out and lse (the forward's) or neither")
    if out is not None:
        _check_array("out", out, (B, Hq, Sq, Dv), store)
        _check_array("lse", lse, (B, Hq, Sq), np.dtype(np.float32))

    # copies: the caller's arrays are never written (bf16 rounding happens on the copy)
    def wrap(x, name):
        return sim.SimArray(np.array(x, order="C", copy=True), ctd, name=name)

    def poisoned(shape, name):     # an element no block writes stays NaN
        return sim.SimArray(np.full(shape, np.nan, store), ctd, name=name)

    def alloc(shape, kind):
        if kind == "input":
            return sim.SimArray(np.full(shape, np.nan, store), ctd)
        return np.full(shape, np.nan, np.float32)

    Q, K, V, dO = wrap(q, "Q"), wrap(k, "K"), wrap(v, "V"), wrap(dout, "dOut")
    km = kernel_mask(mask, B, Hq, Sq, Sk)
    reports = []
    if out is None:
        O = poisoned((B, Hq, Sq, Dv), "Out")
        L = np.full((B, Hq, Sq), np.nan, np.float32)
        for launch in plan_fmha(kernel_name, Q, K, V, O, mask=km, causal=causal, scale=scale,
                                tiles=tiles_dict(fwd_tiles), alloc=alloc, lse=L):
            reports.append(sim.launch(launch.kernel, launch.grid, launch.args, model=model))
    else:
        O, L = wrap(out, "Out"), np.array(lse, np.float32, order="C", copy=True)
    dQ, dK, dV = (poisoned(x.shape, n) for x, n in ((q, "dQ"), (k, "dK"), (v, "dV")))
    for launch in plan_fmha_bwd(kernel_name, Q, K, V, O, dO, L, dQ, dK, dV, mask=km,
                                causal=causal, scale=scale, tiles=tiles, alloc=alloc):
        # the fused-dQ pass leaves parts of its workspaces unwritten by design (a dQ tile
        # that one key tile sees never passes through the accumulator); its outputs are
        # NaN-poisoned above, so an unwritten gradient still shows (the gates count it)
        reports.append(sim.launch(launch.kernel, launch.grid, launch.args, model=model,
                                  check_unwritten=launch.kernel not in PARTIAL_WRITERS))
    return {"dq": dQ.data, "dk": dK.data, "dv": dV.data, "out": O.data, "lse": L}, reports


def _check_array(name, x, shape, dtype):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {x.shape}")
    if x.dtype != dtype:
        raise TypeError(f"{name} dtype must be {dtype}, got {x.dtype}")
