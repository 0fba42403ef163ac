"""GPU-side helpers shared by the attention families (forward, backward, decode): random
inputs on the device, the check that rows seeing no key are zero, and the slice of a
problem the simulator re-computes. torch is imported inside the functions.

Problems are spak.attention.problems.ProblemSpec-like: B, Hq, Hkv, Sq, Sk, D, dtype,
causal, mask (None | "additive" | "bool"), case_id, q_shape, kv_shape.
"""
from __future__ import annotations

import zlib

from spak.device.agreement import DEFAULT_SIM_WORK
from spak.device.calls import SimSlice

__all__ = ["attention_gpu_inputs", "dead_row_check", "attention_slice", "attention_sim_slice",
           "torch_dtype"]


def torch_dtype(dtype: str):
    import torch
    return torch.float16 if dtype == "fp16" else torch.bfloat16


def attention_gpu_inputs(problem, seed: int = 0, set_index: int = 0, device="cuda") -> dict:
    """N(0, 1) q, k, v on ``device``, reproducible from (case_id, seed, set_index); set 0
    also the mask (when the problem has one; as spak.attention.problems.make_inputs:
    [B, 1, Sq, Sk], ~20% masked, row Sq // 2 of batch 0 fully masked) and "kmask", that
    mask as the kernels take it (float32 0 / -inf or bias, [MB, MH, Sq, Sk]). Timing sets
    (set_index >= 1) hold q, k, v only: they share set 0's mask."""
    import torch
    p = problem
    dt = torch_dtype(p.dtype)
    g = torch.Generator(device=device).manual_seed(
        (zlib.crc32(p.case_id.encode()) * 1000 + seed * 97 + set_index) % (2 ** 63))
    q = torch.randn(p.q_shape, device=device, dtype=dt, generator=g)
    k = torch.randn(p.kv_shape, device=device, dtype=dt, generator=g)
    v = torch.randn(p.kv_shape, device=device, dtype=dt, generator=g)
    if set_index:
        return {"q": q, "k": k, "v": v}
    mask = None
    if p.mask is not None:
        shape = (p.B, 1, p.Sq, p.Sk)
        keep = torch.rand(shape, device=device, generator=g) >= 0.2
        keep[0, 0, p.Sq // 2] = False
        if p.mask == "bool":
            mask = keep
        else:
            bias = torch.randn(shape, device=device, dtype=torch.float32, generator=g)
            mask = bias.masked_fill(~keep, float("-inf"))
    kmask = None
    if mask is not None:
        from spak.api import kernel_mask
        kmask = kernel_mask(mask, p.B, p.Hq, p.Sq, p.Sk)
    return {"q": q, "k": k, "v": v, "mask": mask, "kmask": kmask}


def dead_row_check(problem, inputs, out) -> dict:
    """Rows of ``out`` [B, Hq, Sq, Dv] that see no key (mask, or causal with Sq > Sk) must
    be zero: {"dead_rows": count, "masked_rows_zero": bool}, or {} when there are none
    by construction (no mask, not bottom-right causal)."""
    import torch
    from spak.device.sdpa import dead_rows, sdpa_args
    q = inputs["q"]
    dead = dead_rows(sdpa_args(problem, inputs.get("mask"), q.device, q.dtype)[0])
    if dead is None:
        return {}
    rows = torch.broadcast_to(dead, out.shape[:3] + (1,))
    sel = rows.expand(out.shape)
    return {"dead_rows": int(rows.sum()),
            "masked_rows_zero": bool((out.masked_select(sel) == 0).all())}


def attention_slice(B: int, Hq: int, Hkv: int, Sq: int, Sk: int, D: int, tile_m: int,
                    heads: int = 1, work: int = DEFAULT_SIM_WORK) -> dict:
    """Which part of an attention problem the simulator re-computes: batch 0, query heads
    [0, hq) with kv heads [0, hkv), query rows [r0, Sq) (r0 a multiple of tile_m, so the
    simulator's blocks are the GPU's blocks), all Sk keys. Taking the LAST rows keeps
    bottom-right causal exact (rows r0.. of Sq against Sk keys see what they see in the
    full problem)."""
    group = Hq // Hkv
    hq = max(1, min(heads, Hq))
    if hq <= group:
        hkv = 1
    else:
        hkv = hq // group
        hq = hkv * group
    per_row = max(1, Sk * max(D, 1) * hq)
    rows = max(tile_m, (work // per_row) // tile_m * tile_m)
    r0 = 0 if rows >= Sq else (Sq - rows) // tile_m * tile_m
    full = (B == 1 and hq == Hq and r0 == 0)
    return {"b": 0, "hq": hq, "hkv": hkv, "r0": r0, "rows": Sq - r0, "full": full,
            "text": "full problem" if full else
            f"b=0, q heads 0..{hq - 1} (kv 0..{hkv - 1}), rows {r0}..{Sq - 1} of {Sq}, "
            f"all {Sk} keys"}


def attention_sim_slice(problem, inputs, out, tiles: dict, *, heads: int = 1,
                        work: int = DEFAULT_SIM_WORK) -> SimSlice:
    """The forward's SimSlice: `attention_slice` rows (TILE_M-aligned) cut from the GPU
    inputs (the kernel-format mask "kmask") and ``out``, as numpy in make_inputs' form
    (bf16 as float32 holding bf16 values)."""
    import math
    from spak.attention.problems import Inputs
    p = problem
    sl = attention_slice(p.B, p.Hq, p.Hkv, p.Sq, p.Sk, p.D, tiles["TILE_M"], heads, work)
    r0, hq, hkv = sl["r0"], sl["hq"], sl["hkv"]
    cvt = (lambda t: t.cpu().numpy()) if p.dtype == "fp16" else \
        (lambda t: t.float().cpu().numpy())
    qs = cvt(inputs["q"][0:1, :hq, r0:].contiguous())
    ks = cvt(inputs["k"][0:1, :hkv].contiguous())
    vs = cvt(inputs["v"][0:1, :hkv].contiguous())
    km, ms = inputs.get("kmask"), None
    if km is not None:
        ms = km[0:1, :(hq if km.shape[1] > 1 else 1), r0:].contiguous().cpu().numpy()
    gpu = cvt(out[0:1, :hq, r0:].contiguous())
    sub = p.replace(B=1, Hq=hq, Hkv=hkv, Sq=p.Sq - r0)
    arrays = {"q": qs, "k": ks, "v": vs, "gpu": gpu, "mask": ms}
    meta = {"scale": 1.0 / math.sqrt(p.D), "causal": p.causal, "dtype": p.dtype,
            "tiles": dict(tiles)}
    return SimSlice(problem=sub, inputs=Inputs(qs, ks, vs, ms), gpu={"out": gpu},
                    tiles=tiles, text=sl["text"], full=sl["full"], dump_arrays=arrays,
                    dump_meta=meta)
