"""The fmha_bwd family's side of the GPU loop (`spak run`, the sweep's worker): input sets
with the forward's output and LSE, the float64 gradients on the device, a planned call of
the three backward launches, the tuned config, the sweep's compile units and the slices the
simulator re-computes. The peers (SDPA's backward through autograd, forward+backward rows)
are in spak.device.bwd_peers. torch and cuTile are imported inside the functions.

An input set is {"q", "k", "v", "mask", "kmask", "dout", "out", "lse"}: q, k, v, mask and
kmask as the forward's (spak.device.attention.attention_gpu_inputs), dout N(0, 1) like q,
and out / lse (float32 [B, Hq, Sq], +inf where a row sees no key) written once per set by
SPAK's fused forward with LSE, so that timing the backward times the backward alone.
"""
from __future__ import annotations

import math
import zlib

from spak.device.calls import GpuCall, SimSlice, distinct

__all__ = ["bwd_gpu_inputs", "bwd_input_sets", "forward_config", "forward_launches",
           "bwd_reference", "distinct", "hinted", "bwd_call", "bwd_config", "bwd_compile_unit", "bwd_compile_call",
           "zero_gradient_errors", "bwd_sim_slices", "CPU_REF_MAX_FLOPS"]

#: float64 gradients on the CPU (spak.attention.reference.attention_grads_f64) at or below
#: this many backward FLOPs (the family's ``flops``), on the inputs' device above
CPU_REF_MAX_FLOPS = 4e9
#: elements of one block of scores (query rows x Sk) in the device reference
_BLOCK_ELEMS = 1 << 24
#: the backward's launches that take the config's occupancy / num_ctas hints (the
#: memory-bound preprocess keeps its own occupancy)
HINTED_LAUNCHES = ("bwd.dkdv", "bwd.dq")


def _scale(p) -> float:
    return 1.0 / math.sqrt(p.D)


# ------------------------------------------------------------------ inputs

def _arch(device) -> str:
    """"sm_XY" of a CUDA device; "sm_90" for anything else (the CPU tests)."""
    import torch
    dev = torch.device(device)
    if dev.type != "cuda":
        return "sm_90"
    from spak.api import device_arch
    return device_arch(dev)


def forward_config(problem, device) -> dict:
    """The fused forward's config for ``problem`` on ``device``, as spak.fmha resolves it
    (the tuned store's entry for the GPU, else the default tiles); the sm_90 default tiles
    on a device that is not a GPU (the CPU tests)."""
    import torch
    if torch.device(device).type != "cuda":
        from spak.gpu.plan import default_tiles
        return default_tiles(problem.D, "sm_90", problem.causal)
    from spak.api import resolve_tiles
    from spak.device.attention import torch_dtype
    return resolve_tiles("fused", torch_dtype(problem.dtype), problem.D, problem.causal,
                         problem.Sk, device, rows=problem.B * problem.Hq * problem.Sq)


def forward_launches(problem, q, k, v, kmask, out, lse, config, alloc=None) -> list:
    """The fused forward with LSE (gpu.plan.plan_fmha(..., lse=)), hints applied."""
    import spak.gpu.launch as gl
    from spak.gpu.variants import apply_hints
    tiles, hints = _split(config)
    kw = dict(mask=kmask, causal=problem.causal, scale=_scale(problem), tiles=tiles, lse=lse)
    launches = gl.plan_torch("fused", q, k, v, out, **kw) if alloc is None else \
        gl.plan_fmha("fused", q, k, v, out, alloc=alloc, **kw)
    return apply_hints(launches, hints)


def _with_forward(problem, x: dict, config) -> dict:
    """x plus "out" and "lse": the fused forward run once on x (with x's kernel mask)."""
    import torch
    import spak.gpu.launch as gl
    q, v = x["q"], x["v"]
    out = torch.full(tuple(q.shape[:3]) + (v.shape[3],), float("nan"), dtype=q.dtype,
                     device=q.device)
    lse = torch.full(tuple(q.shape[:3]), float("nan"), dtype=torch.float32, device=q.device)
    gl.run(forward_launches(problem, q, x["k"], v, x.get("kmask"), out, lse, config))
    return {**x, "out": out, "lse": lse}


def _dout(problem, seed: int, set_index: int, like):
    """N(0, 1) output gradient [B, Hq, Sq, D] from its own stream (q, k, v stay the
    forward family's draws)."""
    import torch
    g = torch.Generator(device=like.device).manual_seed(
        (zlib.crc32(problem.case_id.encode()) * 1000 + seed * 97 + set_index + 7919) % 2 ** 63)
    return torch.randn(tuple(like.shape), device=like.device, dtype=like.dtype, generator=g)


def bwd_gpu_inputs(problem, seed: int = 0, set_index: int = 0, device="cuda",
                   base: dict | None = None) -> dict:
    """One input set (see the module doc), reproducible from (case_id, seed, set_index).
    Timing sets (set_index >= 1) share set 0's mask: ``base`` is set 0 when the caller has
    it (else its mask is drawn again)."""
    from spak.device.attention import attention_gpu_inputs
    x = attention_gpu_inputs(problem, seed, set_index, device)
    if set_index:
        first = base if base is not None else attention_gpu_inputs(problem, seed, 0, device)
        x = {**x, "mask": first.get("mask"), "kmask": first.get("kmask")}
    x["dout"] = _dout(problem, seed, set_index, x["q"])
    return _with_forward(problem, x, forward_config(problem, device))


def bwd_input_sets(problem, seed: int, n_sets: int, device="cuda") -> list[dict]:
    """Input sets 0 .. n_sets-1, each complete (timing sets share set 0's mask)."""
    first = bwd_gpu_inputs(problem, seed, 0, device)
    return [first] + [bwd_gpu_inputs(problem, seed, i, device, base=first)
                      for i in range(1, n_sets)]


# ------------------------------------------------------------------ the float64 reference

def bwd_reference(fam, problem, inputs) -> dict:
    """float64 dq, dk, dv as tensors on the inputs' device: attention_grads_f64 on the CPU
    for small problems, torch float64 on the device (one row block at a time) above
    CPU_REF_MAX_FLOPS. Rows that see no key get zero gradients in both."""
    if fam.flops(problem) <= CPU_REF_MAX_FLOPS:
        return _reference_on_cpu(problem, inputs)
    return _reference_on_device(problem, inputs)


def _numpy(t, dtype: str):
    """A tensor as make_inputs' numpy form (bf16 as float32 holding bf16 values)."""
    return t.cpu().numpy() if dtype == "fp16" else t.float().cpu().numpy()


def _reference_on_cpu(problem, x) -> dict:
    import numpy as np
    import torch
    from spak.attention.reference import attention_grads_f64
    f = {n: _numpy(x[n], problem.dtype) for n in ("q", "k", "v", "dout")}
    mask = x.get("mask")
    grads = attention_grads_f64(f["q"], f["k"], f["v"], f["dout"],
                                mask=None if mask is None else mask.cpu().numpy(),
                                causal=problem.causal, scale=_scale(problem))
    dev = x["q"].device
    return {n: torch.from_numpy(np.ascontiguousarray(g)).to(dev)
            for n, g in zip(("dq", "dk", "dv"), grads)}


def _reference_on_device(problem, x) -> dict:
    """The analytic backward in float64 per (batch, query head, row block): P from the
    block's scores, dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = scale dS K,
    dK += scale dS^T Q."""
    import torch
    q, k, v, dout = x["q"], x["k"], x["v"], x["dout"]
    B, Hq, Sq, _ = q.shape
    Sk, group = k.shape[2], Hq // k.shape[1]
    scale = _scale(problem)
    dq = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    mask = x.get("mask")
    m = None if mask is None else torch.broadcast_to(mask, (B, Hq, Sq, Sk))
    rows = max(1, _BLOCK_ELEMS // max(Sk, 1))
    for b in range(B):
        for h in range(Hq):
            kv = h // group
            kk, vv = k[b, kv].double(), v[b, kv].double()
            for r0 in range(0, Sq, rows):
                r1 = min(Sq, r0 + rows)
                qq, do = q[b, h, r0:r1].double(), dout[b, h, r0:r1].double()
                s = _masked_scores(problem, qq @ kk.T * scale,
                                   None if m is None else m[b, h, r0:r1], r0, Sq, Sk)
                p = _probabilities(s)
                dp = do @ vv.T
                ds = p * (dp - (p * dp).sum(dim=1, keepdim=True))
                dq[b, h, r0:r1] = scale * (ds @ kk)
                dk[b, kv] += scale * (ds.T @ qq)
                dv[b, kv] += p.T @ do
    return {"dq": dq, "dk": dk, "dv": dv}


def _masked_scores(problem, s, mask, r0: int, Sq: int, Sk: int):
    """Scores of rows r0.. with the caller's mask and bottom-right causal applied."""
    import torch
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool \
            else s + mask.double()
    if problem.causal:
        i = torch.arange(r0, r0 + s.shape[0], device=s.device)[:, None]
        j = torch.arange(Sk, device=s.device)[None, :]
        s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
    return s


def _probabilities(s):
    """softmax over keys; a row of all -inf is zero (it sees no key)."""
    import torch
    mx = s.amax(dim=1, keepdim=True)
    dead = torch.isneginf(mx)
    p = torch.exp(s - torch.where(dead, torch.zeros_like(mx), mx))
    den = p.sum(dim=1, keepdim=True)
    return torch.where(dead, torch.zeros_like(p), p / torch.where(dead, torch.ones_like(den),
                                                                    den))


# ------------------------------------------------------------------ our kernel

def _split(config) -> tuple[dict, dict]:
    from spak.gpu.variants import split_config
    return split_config(config)


def hinted(launches, hints) -> list:
    """The launches with ``hints`` applied to the dK/dV and dQ launches (HINTED_LAUNCHES)."""
    from spak.gpu.variants import apply_hints
    return [apply_hints([L], hints)[0] if L.name in HINTED_LAUNCHES else L for L in launches]




def bwd_call(problem, inputs, config, *, alloc=None) -> GpuCall:
    """The backward's three launches (preprocess, dK/dV, dQ) on one input set, from its
    out and lse, into NaN-filled dq, dk, dv: the forward is not part of the call.
    alloc: workspaces to share with calls run one after another (see `distinct`)."""
    import torch
    import spak.gpu.launch as gl
    from spak.gpu.plan_bwd import plan_fmha_bwd
    tiles, hints = _split(config)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    grads = {n: torch.full(t.shape, float("nan"), dtype=t.dtype, device=t.device)
             for n, t in (("dq", q), ("dk", k), ("dv", v))}
    launches = plan_fmha_bwd("fused", q, k, v, inputs["out"], inputs["dout"], inputs["lse"],
                             grads["dq"], grads["dk"], grads["dv"], mask=inputs.get("kmask"),
                             causal=problem.causal, scale=_scale(problem), tiles=tiles,
                             alloc=distinct(alloc or gl.torch_alloc(q)))
    return GpuCall(grads, hinted(launches, hints), tiles, hints)


def bwd_config(fam, kernel: str, problem, device) -> dict:
    """The tuned store's config of the family for the device's GPU (spak.tune.store.
    lookup_key under the family's store_key), filled up from the default tiles; the
    default tiles when the store has none or the device is not a GPU."""
    import torch
    base = fam.default_config(problem, _arch(device))
    dev = torch.device(device)
    if dev.type != "cuda":
        return base
    from spak.tune.store import lookup_key
    found = lookup_key(fam.name, torch.cuda.get_device_name(dev), kernel,
                       fam.store_key(problem))
    return {**base, **found} if found else base


# ------------------------------------------------------------------ the sweep's compile units

def bwd_compile_unit(kernel: str, problem, config: dict, cid: str):
    """The forward's compile unit (spak.tune.jobs.attention_compile_unit: tiny q, k with
    the real launch's JIT specialisation) plus the tiny kernel mask's shape of a masked
    problem; None where the stand-ins cannot mirror the launch."""
    from spak.tune.jobs import _spec_bits, attention_compile_unit
    from spak.tune.worker import tiny_dim
    unit = attention_compile_unit(kernel, problem, config, cid)
    if unit is None or problem.mask is None:
        return unit
    mask = [tiny_dim(problem.B), 1, tiny_dim(problem.Sq), tiny_dim(problem.Sk)]
    full = (problem.B, 1, problem.Sq, problem.Sk)
    return {**unit, "mask": mask, "unit_id": unit["unit_id"] + "|mask " + _spec_bits(full, 4)}


def bwd_compile_call(fam, unit, device="cuda") -> GpuCall:
    """The fused forward with LSE and the backward on small stand-ins with the unit's
    specialisation (see bwd_compile_unit): launching it once puts all four cubins in
    cuTile's disk cache (the forward's: the worker's inputs need it)."""
    import torch
    from spak.device.attention import torch_dtype
    p = fam.parse(unit["case"])
    dt = torch_dtype(unit["dtype"])
    q, k, v, out, dout = (torch.randn(unit[n], device=device, dtype=dt)
                          for n in ("q", "k", "k", "q", "q"))
    lse = torch.zeros(tuple(unit["q"][:3]), dtype=torch.float32, device=device)
    kmask = torch.zeros(unit["mask"], dtype=torch.float32, device=device) \
        if unit.get("mask") else None
    x = {"q": q, "k": k, "v": v, "kmask": kmask, "dout": dout, "out": out, "lse": lse}
    fwd = forward_launches(p, q, k, v, kmask, torch.empty_like(out), torch.empty_like(lse),
                           forward_config(p, device))
    call = bwd_call(p, x, unit["config"])
    return GpuCall(call.outputs, fwd + call.launches, call.tiles, call.hints)


# ------------------------------------------------------------------ checks

def zero_gradient_errors(fam, problem, inputs, outputs, reference, per: dict) -> bool:
    """Where a reference gradient is exactly zero while ours is rounding noise (dQ and dK
    when every row sees one key: rel_l2 is inf), replace the output's rel_l2 with the
    family's ``error`` (the noise against the gradient's general size) and its verdict;
    True when anything changed."""
    import types
    changed = False
    for name, e in per.items():
        if name == "dv" or not math.isinf(e["rel_l2"]):
            continue
        host = types.SimpleNamespace(**{n: _numpy(inputs[n], problem.dtype).astype("float32")
                                        for n in ("q", "k", "v", "dout")})
        e["rel_l2"] = fam.error(name, outputs[name].double().cpu().numpy(),
                                reference[name].cpu().numpy(), host, _scale(problem))
        e["passed"] = e["nonfinite"] == 0 and e["rel_l2"] <= e["gate"]
        changed = True
    return changed


# ------------------------------------------------------------------ the simulator's slices

def bwd_sim_slices(problem, inputs, outputs, tiles, make_inputs, *, heads: int = 1,
                   work: int = 1 << 29) -> list[SimSlice]:
    """What the simulator re-computes from the GPU's out and lse (the backward alone), bit
    for bit: batch 0, one kv head with its GQA group (more kv heads when ``heads`` asks for
    more query heads than a group), and within ``work`` (query rows x keys x D x query heads):

    * the whole head group (every row and key) when it fits: dQ, dK, dV compared;
    * else two cuts. A key's dK/dV sums over every query row, so the first keeps all rows
      and the LAST keys [k0, Sk) (k0 a multiple of DKV_TILE_N: the GPU's blocks), and
      compares dK, dV; a row's dQ sums over every key, so the second keeps all keys and the
      LAST rows [r0, Sq) (r0 a multiple of DQ_TILE_M), and compares dQ. Cutting from the
      front keeps bottom-right causal exact (index differences are unchanged); each cut
      gets half the work. The other gradients of a cut lack rows or keys: not compared.

    make_inputs(q, k, v, mask, dout, out, lse): the family's numpy inputs of a slice.
    """
    from spak.gpu.plan_bwd import EXTRA_KEYS, check_bwd_tiles
    p = problem
    extra = {k: v for k, v in (tiles or {}).items() if k in EXTRA_KEYS}
    t = {**check_bwd_tiles({k: v for k, v in (tiles or {}).items() if k not in EXTRA_KEYS},
                           p.D, p.causal), **extra}
    group = p.Hq // p.Hkv
    hkv = max(1, min(p.Hkv, heads // group))
    hq = hkv * group
    # the fused-dQ pass (DQ_FUSED) sums dQ in tiles of the dK/dV pass's query rows
    n, m = t["DKV_TILE_N"], t["DKV_TILE_M" if extra.get("DQ_FUSED") else "DQ_TILE_M"]
    half = work // 2
    keys = max(n, half // max(1, p.Sq * p.D * hq) // n * n)
    rows = max(m, half // max(1, p.Sk * p.D * hq) // m * m)
    k0 = 0 if keys >= p.Sk else (p.Sk - keys) // n * n
    r0 = 0 if rows >= p.Sq else (p.Sq - rows) // m * m
    if p.Sq * p.Sk * p.D * hq <= work or k0 == 0 or r0 == 0:
        return [_cut(p, inputs, outputs, t, make_inputs, hq, hkv, 0, 0, ("dq", "dk", "dv"))]
    return [_cut(p, inputs, outputs, t, make_inputs, hq, hkv, 0, k0, ("dk", "dv")),
            _cut(p, inputs, outputs, t, make_inputs, hq, hkv, r0, 0, ("dq",))]


def _cut(p, x, outputs, tiles, make_inputs, hq, hkv, r0, k0, names) -> SimSlice:
    """Batch 0, query heads [0, hq) (kv heads [0, hkv)), query rows [r0, Sq), keys [k0, Sk)
    of the GPU's inputs, out, lse and gradients, as numpy (bf16 as float32 holding bf16)."""
    rows = lambda t: _numpy(t[0:1, :hq, r0:].contiguous(), p.dtype)          # noqa: E731
    keys = lambda t: _numpy(t[0:1, :hkv, k0:].contiguous(), p.dtype)         # noqa: E731
    km, ms = x.get("kmask"), None
    if km is not None:
        ms = km[0:1, :(hq if km.shape[1] > 1 else 1), r0:, k0:].contiguous().cpu().numpy()
    inputs = make_inputs(rows(x["q"]), keys(x["k"]), keys(x["v"]), ms, rows(x["dout"]),
                         rows(x["out"]), x["lse"][0:1, :hq, r0:].contiguous().cpu().numpy())
    gpu = {n: rows(outputs[n]) if n == "dq" else keys(outputs[n]) for n in names}
    sub = p.replace(B=1, Hq=hq, Hkv=hkv, Sq=p.Sq - r0, Sk=p.Sk - k0)
    full = p.B == 1 and hkv == p.Hkv and r0 == 0 and k0 == 0
    heads = f"b=0, q heads 0..{hq - 1} (kv 0..{hkv - 1})"
    if full:
        text = "full problem"
    elif r0 == k0 == 0:
        text = f"{heads}, all {p.Sq} rows and {p.Sk} keys"
    elif k0:
        text = f"{'/'.join(names)}: {heads}, keys {k0}..{p.Sk - 1} of {p.Sk}, all rows"
    else:
        text = f"{'/'.join(names)}: {heads}, rows {r0}..{p.Sq - 1} of {p.Sq}, all keys"
    arrays = {**inputs._asdict(), **{f"gpu_{n}": a for n, a in gpu.items()}}
    meta = {"scale": _scale(p), "causal": p.causal, "dtype": p.dtype, "tiles": dict(tiles),
            "rows_from": r0, "keys_from": k0, "compared": list(names)}
    return SimSlice(problem=sub, inputs=inputs, gpu=gpu, tiles=dict(tiles), text=text,
                    full=full, dump_arrays=arrays, dump_meta=meta)
