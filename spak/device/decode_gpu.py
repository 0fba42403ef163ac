"""The fmha_decode family's side of the GPU loop (`spak run`, the sweep's worker): inputs
on the device, the float64 reference there, a planned call of the split-KV kernels, SDPA
peers and the slice the simulator re-computes. torch is imported inside the functions.

Input sets are {"q", "k_cache", "v_cache", "cache_seqlens", "block_table"} (block_table
None for a contiguous cache), as spak.families.fmha_decode.make_inputs gives on the CPU.
"""
from __future__ import annotations

import math
import zlib

from spak.device.calls import GpuCall, PeerCall, SimSlice, distinct

__all__ = ["decode_gpu_inputs", "decode_reference", "decode_call", "decode_launches",
           "decode_sim_slice",
           "decode_peers", "split_count", "varlen_gpu_inputs", "host_arrays",
           "varlen_call", "varlen_sim_slice"]


def _dtype(p):
    import torch
    return torch.float16 if p.dtype == "fp16" else torch.bfloat16


def decode_gpu_inputs(p, seed: int = 0, set_index: int = 0, device="cuda") -> dict:
    """N(0, 1) q and caches on ``device``, reproducible from (case_id, seed, set_index);
    cache slots past a sequence's length NaN and table entries past its pages -1, as on
    the CPU. A paged cache's table is a shuffle of its pages."""
    import torch
    g = torch.Generator(device=device).manual_seed(
        (zlib.crc32(p.case_id.encode()) * 1000 + seed * 97 + set_index) % (2 ** 63))
    dt = _dtype(p)
    lens = torch.tensor(p.seq_lens, dtype=torch.int32, device=device)
    q = torch.randn((p.B, p.Sq, p.Hq, p.D), device=device, dtype=dt, generator=g)
    if not p.page:
        k, v = (torch.randn((p.B, p.Sk, p.Hkv, p.D), device=device, dtype=dt, generator=g)
                for _ in range(2))
        dead = torch.arange(p.Sk, device=device)[None, :] >= lens[:, None]      # [B, Sk]
        k[dead], v[dead] = float("nan"), float("nan")
        return {"q": q, "k_cache": k, "v_cache": v, "cache_seqlens": lens, "block_table": None}
    per = -(-p.Sk // p.page)
    k, v = (torch.randn((p.B * per + 1, p.page, p.Hkv, p.D), device=device, dtype=dt,
                        generator=g) for _ in range(2))
    table = torch.randperm(p.B * per + 1, device=device, generator=g)[:p.B * per]
    table = table.view(p.B, per).to(torch.int32)
    rows = torch.arange(per * p.page, device=device).view(per, p.page)
    used = torch.zeros(k.shape[:2], dtype=torch.bool, device=device)
    for b, n in enumerate(p.seq_lens):
        used[table[b].long()] = rows < n
        table[b, -(-n // p.page):] = -1
    k[~used], v[~used] = float("nan"), float("nan")
    return {"q": q, "k_cache": k, "v_cache": v, "cache_seqlens": lens, "block_table": table}


def _sequence(cache, table, b, n):
    """Sequence b's first n cache rows, [n, Hkv, D]."""
    if table is None:
        return cache[b, :n]
    pages = table[b, :-(-n // cache.shape[1])].long()
    return cache[pages].flatten(0, 1)[:n]


def decode_reference(p, inputs) -> dict:
    """float64 on the inputs' device, one sequence at a time."""
    import torch
    q = inputs["q"]
    out = torch.zeros((p.B, p.Sq, p.Hq, inputs["v_cache"].shape[3]), dtype=torch.float64,
                      device=q.device)
    group, scale = p.Hq // p.Hkv, 1.0 / math.sqrt(p.D)
    for b, n in enumerate(p.seq_lens):
        if n == 0:
            continue
        k = _sequence(inputs["k_cache"], inputs["block_table"], b, n).double()
        v = _sequence(inputs["v_cache"], inputs["block_table"], b, n).double()
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[b].double(), k) * scale
        if p.causal:
            allowed = (torch.arange(n, device=q.device)[None, :]
                       <= torch.arange(p.Sq, device=q.device)[:, None] + (n - p.Sq))
            s = s.masked_fill(~allowed, float("-inf"))
        w = torch.softmax(s, dim=-1).nan_to_num(0.0)          # rows that see no key: 0
        out[b] = torch.einsum("hqk,khd->qhd", w, v)
    return {"out": out}


def _split_config(config):
    from spak.gpu.variants import split_config
    tiles, hints = split_config({k: v for k, v in config.items() if k != "num_splits"})
    return tiles, hints, config.get("num_splits")


def decode_call(p, inputs, config, *, alloc=None) -> GpuCall:
    """The planned split-KV (and combine) launches into a NaN-filled output. ``alloc`` may
    be shared with calls run one after another (spak.device.calls.shared_alloc): the
    running max and sum workspaces have one shape and must stay two tensors (`distinct`;
    without it the sweep's every config was wrong on an H100, results/decode-h100-2026-11-24c)."""
    import torch
    import spak.gpu.launch as gl
    tiles, hints, _ = _split_config(config)
    q = inputs["q"]
    out = torch.full((p.B, p.Sq, p.Hq, inputs["v_cache"].shape[3]), float("nan"),
                     dtype=q.dtype, device=q.device)
    sms = (torch.cuda.get_device_properties(q.device).multi_processor_count
           if q.device.type == "cuda" else 132)
    launches = decode_launches(p, dict(inputs, out=out), config, sms,
                               distinct(alloc or gl.torch_alloc(q)))
    return GpuCall({"out": out}, launches, tiles, hints)


def decode_launches(p, arrays, config, num_sms: int, alloc) -> list:
    """plan_decode's launches (hints applied) for problem ``p`` with ``config`` on
    ``arrays`` {q, k_cache, v_cache, cache_seqlens, block_table, out}: torch tensors
    (decode_call) or shape stand-ins (the family's stand_in_launches, for the sweep's CPU
    compile helpers: no torch here)."""
    from spak.gpu.plan_decode import plan_decode
    from spak.gpu.variants import apply_hints
    tiles, hints, splits = _split_config(config)
    launches = plan_decode(arrays["q"], arrays["k_cache"], arrays["v_cache"],
                           arrays["cache_seqlens"], arrays["out"],
                           block_table=arrays["block_table"], causal=p.causal,
                           num_splits=splits or p.splits, tiles=tiles, num_sms=num_sms,
                           alloc=alloc)
    return apply_hints(launches, hints)


def split_count(p, inputs, config) -> int:
    """The key splits decode_call plans for this problem and config on the inputs' device."""
    import torch
    from spak.gpu.plan_decode import planned_splits
    tiles, _, splits = _split_config(config)
    if splits or p.splits:
        return int(splits or p.splits)
    dev = inputs["q"].device
    sms = torch.cuda.get_device_properties(dev).multi_processor_count \
        if dev.type == "cuda" else 132
    k, bt = inputs["k_cache"], inputs["block_table"]
    page = 0 if bt is None else k.shape[1]
    cap = k.shape[1] * (1 if bt is None else bt.shape[1])
    # the plan's own rule: sequence 0's batch range (INDEX32) and fitted TILE_N (TN_FIT)
    return planned_splits(p.B, p.Sq, p.Hq, p.Hkv, p.D, inputs["v_cache"].shape[3], cap,
                          page, tiles, sms)


def decode_sim_slice(p, inputs, out, config, *, splits: int, work: int) -> SimSlice:
    """Sequence 0 and query heads of kv head 0 (as many as fit ``work`` = rows x keys x D,
    at least one head tile), every key of it, with the GPU call's tiles and split count:
    the same tiles, partition and order as on the GPU, so the bits must agree."""
    import torch
    from spak.gpu.plan_decode import default_decode_tiles, row_tiles
    tiles, _, _ = _split_config(config)
    tiles = {**default_decode_tiles(p.D), **tiles}
    group = p.Hq // p.Hkv
    gt, _ = row_tiles(p.Hq, p.Hkv, p.Sq, tiles["MAX_ROWS"], bool(tiles["GROUP_PAD"]))
    n = p.seq_lens[0]
    heads = group
    # fewer heads keep the GPU call's tiling: a multiple of GT (the power-of-two tiles),
    # or, for a padded group (GT does not divide it), the group's first GT heads
    while heads > gt and p.Sq * heads * max(n, 1) * p.D > work:
        heads = heads // 2 if group % gt == 0 else gt
    sub = p.__class__(**{**p.__dict__, "B": 1, "Hq": heads, "Hkv": 1, "lens": (n,),
                         "splits": splits})
    cvt = (lambda t: t.cpu().numpy()) if p.dtype == "fp16" else \
        (lambda t: t.float().cpu().numpy())
    table = inputs["block_table"]
    ks, vs = inputs["k_cache"], inputs["v_cache"]
    if table is None:
        ks, vs, bt = ks[0:1, :, 0:1], vs[0:1, :, 0:1], None
    else:                             # this sequence's pages, renumbered in order
        pages = table[0].clamp(min=0).long()
        ks, vs = ks[pages, :, 0:1], vs[pages, :, 0:1]
        bt = table[0:1].clone()
        valid = bt >= 0                   # a prefix: the pages the sequence uses
        bt[valid] = torch.arange(int(valid.sum()), dtype=bt.dtype, device=bt.device)
        bt = bt.cpu().numpy()
    x = {"q": cvt(inputs["q"][0:1, :, :heads].contiguous()), "k_cache": cvt(ks.contiguous()),
         "v_cache": cvt(vs.contiguous()), "cache_seqlens": inputs["cache_seqlens"][0:1].cpu().numpy(),
         "block_table": bt}
    gpu = cvt(out[0:1, :, :heads].contiguous())
    text = ("full problem" if (p.B, p.Hkv, heads) == (1, 1, group) else
            f"batch 0, heads 0-{heads - 1} (kv head 0), {n} keys, {splits} splits")
    return SimSlice(problem=sub, inputs=x, gpu={"out": gpu}, tiles=tiles, text=text,
                    full=text == "full problem", dump_arrays={**{k: v for k, v in x.items()
                                                                if v is not None}, "gpu": gpu},
                    dump_meta={"case": sub.case_id, "tiles": tiles, "splits": splits})


def decode_peers(p, names=None) -> dict:
    """SDPA's backends on the cache seen as [B, Hkv, Sk, D] (a strided view of a
    contiguous cache, no copy), enable_gqa. Only where SDPA computes the same function:
    contiguous cache, every sequence full, and Sq = 1 or non-causal (SDPA's is_causal is
    top-left when Sq != Sk). Paged caches: none (the bench times SDPA on a gathered copy)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
                "sdpa-flash": SDPBackend.FLASH_ATTENTION,
                "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}
    wanted = list(backends) if names is None else list(names)
    unknown = [n for n in wanted if n not in backends]
    if unknown:
        raise ValueError(f"unknown peer(s) {unknown} for fmha_decode; known: {list(backends)}")
    # seq_lens, not lens: a `ragged` problem has lens None and shorter sequences (the
    # cache past them NaN), and SDPA on it gave NaN rows (H200, phi3-mini, 2026-11-28)
    same = not p.page and p.seq_lens == (p.Sk,) * p.B and (p.Sq == 1 or not p.causal)
    if not same:
        return {}

    def run(x):
        return torch.nn.functional.scaled_dot_product_attention(
            x["q"].transpose(1, 2), x["k_cache"].transpose(1, 2), x["v_cache"].transpose(1, 2),
            enable_gqa=p.Hq != p.Hkv).transpose(1, 2)
    return {n: PeerCall(run=run, context=lambda be=backends[n]: sdpa_kernel(be))
            for n in wanted}


# ------------------------------------------------------------------ varlen prefill

def varlen_gpu_inputs(p, host: dict, device="cuda") -> dict:
    """The family's packed varlen inputs ``host`` (numpy: q, k, v [total, heads, D],
    cu_seqlens_q/k int32 [B+1]) on ``device``."""
    import torch
    dt = _dtype(p)
    out = {n: torch.from_numpy(host[n]).to(device=device, dtype=dt) for n in ("q", "k", "v")}
    for n in ("cu_seqlens_q", "cu_seqlens_k"):
        out[n] = torch.from_numpy(host[n]).to(device)
    return out


def host_arrays(inputs: dict) -> dict:
    """numpy copies of device inputs (floating point as float32: bf16 values exactly)."""
    return {n: t.cpu().float().numpy() if t.is_floating_point() else t.cpu().numpy()
            for n, t in inputs.items()}


def varlen_call(p, inputs, config) -> GpuCall:
    """spak.fmha_varlen's launch (gpu.plan_decode.plan_varlen, its default tiles: the
    decode tiles of ``config`` do not apply to the prefill kernel) into a NaN-filled
    output; no key in the whole batch: every row 0, as the simulator's run."""
    import torch
    from spak.gpu.plan_decode import plan_varlen
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    out = torch.full((q.shape[0], q.shape[1], v.shape[2]), float("nan"), dtype=q.dtype,
                     device=q.device)
    cq, ck = (int(x) for x in (max(p.qlens, default=0), max(p.seq_lens, default=0)))
    launches = plan_varlen(q, k, v, inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], out,
                           max_seqlen_q=cq, max_seqlen_k=ck, causal=p.causal)
    if not launches or k.shape[0] == 0:
        out.zero_()
    return GpuCall({"out": out}, launches, {}, {})


def varlen_sim_slice(p, inputs, out) -> SimSlice:
    """The whole problem (varlen cases are small): the simulator runs the same kernel with
    the same default tiles, so the bits must agree."""
    x = host_arrays(inputs)
    if p.dtype == "fp16":
        x = {n: a.astype("float16") if n in ("q", "k", "v") else a for n, a in x.items()}
    gpu = out.cpu().float().numpy() if p.dtype != "fp16" else out.cpu().numpy()
    return SimSlice(problem=p, inputs=x, gpu={"out": gpu}, tiles=None, text="full problem",
                    full=True, dump_arrays={**x, "gpu": gpu}, dump_meta={"case": p.case_id})
