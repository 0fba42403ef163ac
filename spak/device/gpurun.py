"""`spak run`: the GPU loop. Check, compare with the simulator, and time, on the local GPU.

For every selected kernel and shape:

* correctness vs a float64 reference (relative L2, max abs, NaN/Inf count; the gates of
  spak.core.metrics) and vs PyTorch SDPA (relative L2 between the two outputs). The reference
  is spak.attention.reference.attention_f64 on the CPU for small problems, torch float64 on the GPU
  (one head and a block of rows at a time) for big ones;
* agreement with the CPU simulator on the same inputs under the matching numeric model:
  fraction of output elements bit-identical and the largest difference in ulps. The
  simulator is slow on big shapes, so it runs on a slice: batch 0, the first query head(s)
  with their kv head, and the LAST query rows (aligned to TILE_M, all keys; the causal
  diagonal is kept exact), sized by --sim-work. The row's "sim.slice" says which;
* timing with CUDA events: warm-up, then many runs rotating among several input sets (so
  the L2 cache does not flatter small shapes; never zeros), median and spread; TFLOPS from
  ProblemSpec.flops and percent of an fp16 8192^3 torch.matmul ceiling measured in the same
  run; PyTorch SDPA's flash, cuDNN and efficient backends timed on the same inputs (a
  backend that refuses a shape is recorded as skipped). All providers of a shape are
  checked first, then timed in turns (time_turns: forward, backward and shuffled order,
  each provider's best turn), since whichever is timed first after a pause runs a few %
  fast; a row's "timing" says "in turns" or "alone".

Output: a table (or --json), and one JSON line per (shape, provider) appended to --out as
it finishes (fsync'd: a killed run keeps every finished row). Each row records the GPU,
date, torch/cuTile/SPAK versions and the command.

torch and cuTile are imported inside cmd_run: `spak --help` works anywhere.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import math
import shlex
import sys
import time
import zlib
from pathlib import Path
from typing import Optional

from spak.gpu.variants import apply_hints, split_config
from spak.core.stats import stats
from spak.results.jsonl import append_jsonl
from spak.results.provenance import commit_label, slug

from spak import __version__
from spak.core.metrics import GATES
from spak.attention.problems import GRAMMAR_HELP, ShapeError, select_cases
from spak.results.jsonl import jsonable as _jsonable

__all__ = ["register", "cmd_run", "sim_slice", "time_events", 
           "failure_text", "guarded_case", "PROVIDERS_SDPA"]

PROVIDERS_SDPA = ("flash", "cudnn", "efficient")
KERNELS = ("fused", "naive")
CPU_REF_MAX_FLOPS = 4e9          # float64 reference on the CPU below this, on the GPU above
DEFAULT_SIM_WORK = 1 << 29       # simulated Sq_slice * Sk * D * heads (~1 s per case)


# ------------------------------------------------------------------ small pure helpers

def sim_slice(B: int, Hq: int, Hkv: int, Sq: int, Sk: int, D: int, tile_m: int,
              heads: int = 1, work: int = DEFAULT_SIM_WORK) -> dict:
    """Which part of a problem the simulator re-computes: batch 0, query heads [0, hq) with
    kv heads [0, hkv), query rows [r0, Sq) (r0 a multiple of tile_m, so the simulator's blocks
    are the GPU's blocks), all Sk keys. Taking the LAST rows keeps bottom-right causal exact
    (rows r0.. of Sq against Sk keys see what they see in the full problem)."""
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


def failure_text(exc: BaseException) -> str:
    """An exception as a row's "error"; a CUDA out-of-memory error also frees torch's cached
    blocks, so the next shape starts with what memory is left."""
    if type(exc).__name__ == "OutOfMemoryError":
        try:
            import torch
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 -- best effort
            pass
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"OutOfMemoryError: {first}"
    return f"{type(exc).__name__}: {exc}"


def guarded_case(spec, kernels, run, emit, base: dict) -> list[dict]:
    """``run(emit)`` -> the rows of one shape. A failure outside the per-kernel guards of
    run_case (making the inputs, the float64 and SDPA references: a CUDA OOM on a huge
    shape) becomes an error row for each kernel that has none yet, emitted, and the batch
    goes on with the next shape. KeyboardInterrupt and SystemExit still end the run."""
    done: list[dict] = []

    def emit_seen(row):
        done.append(row)
        emit(row)
    try:
        return run(emit_seen)
    except Exception as exc:  # noqa: BLE001 -- one shape's failure is rows, not the end
        err = failure_text(exc)
    rows = list(done)
    have = {r.get("provider") for r in done}
    for kernel in kernels:
        if f"spak-{kernel}" in have:
            continue
        row = {**base, "case": spec.case_id, "shape": spec.display, "B": spec.B,
               "Hq": spec.Hq, "Hkv": spec.Hkv, "Sq": spec.Sq, "Sk": spec.Sk, "D": spec.D,
               "dtype": spec.dtype, "causal": spec.causal, "mask": spec.mask,
               "flops": spec.flops, "provider": f"spak-{kernel}", "kernel": kernel,
               "tiles": None, "error": err, "passed": False, "gate": GATES[spec.dtype]}
        emit(row)
        rows.append(row)
    return rows




# ------------------------------------------------------------------ timing

def time_events(fn, n_sets: int, *, warmup: int = 3, min_runs: int = 10, max_runs: int = 200,
                target_s: float = 0.3) -> dict:
    """Median/spread of fn(i) in ms, one CUDA event pair per call, i rotating over sets."""
    import torch
    for i in range(warmup):
        fn(i % n_sets)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn(0)
    e.record()
    torch.cuda.synchronize()
    est = max(s.elapsed_time(e), 1e-3) / 1e3
    n = int(min(max_runs, max(min_runs, target_s / est)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        starts[i].record()
        fn(i % n_sets)
        ends[i].record()
    torch.cuda.synchronize()
    return stats([a.elapsed_time(b) for a, b in zip(starts, ends)])


def time_turns(fns: dict, spin, seed: int, *, n_sets: int = 3, reps: int = 3,
               target_s: float = 0.12, spin_s: float = 1.0, contexts=None) -> dict:
    """Timing stats (time_events) of each provider fn(i), i over n_sets input sets, timed
    in turns; per provider the turn with the lowest median counts.

    The provider timed first after a pause runs a few % fast (GPU cool, clocks high; two
    copies of one kernel measured 5% apart, results/ab-h100-2026-11-22): so spin the GPU
    with ``spin(0)`` for ``spin_s`` seconds, then time every provider in forward, backward and shuffled
    order (``seed`` fixes the shuffle). Compile (call each fn once) before this.
    ``contexts``: provider -> a factory of a context manager held around that provider's
    timing (SDPA's backend choice: entered per call it would cost more than a short kernel).
    """
    import contextlib
    import random
    import torch
    contexts = contexts or {}
    t0 = time.time()
    while time.time() - t0 < spin_s:
        spin(0)
    torch.cuda.synchronize()
    best: dict = {}
    order = list(fns)
    for rep in range(reps):
        seq = order if rep == 0 else order[::-1] if rep == 1 else \
            random.Random(seed + rep).sample(order, len(order))
        for name in seq:
            with contexts.get(name, contextlib.nullcontext)():
                st = time_events(fns[name], n_sets, target_s=target_s)
            if name not in best or st["ms_median"] < best[name]["ms_median"]:
                best[name] = st
    return best


def time_alternating(fns: dict, spin, seed: int, *, reps: int = 3,
                     target_s: float = 0.12) -> dict:
    """Best median ms of each provider fn(i) (i over 3 input sets): time_turns' medians."""
    return {k: st["ms_median"] for k, st in
            time_turns(fns, spin, seed, reps=reps, target_s=target_s).items()}


def matmul_ceiling(n: int = 8192, runs: int = 20) -> dict:
    """fp16 n^3 torch.matmul on random data: the practical tensor-core ceiling (TFLOPS)."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(1234)
    a = torch.randn(n, n, device="cuda", dtype=torch.float16, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16, generator=g)
    c = torch.empty(n, n, device="cuda", dtype=torch.float16)
    st = time_events(lambda i: torch.matmul(a, b, out=c), 1, warmup=5, min_runs=runs,
                     max_runs=runs)
    st["tflops"] = 2.0 * n ** 3 / (st["ms_median"] * 1e-3) / 1e12
    st["n"] = n
    del a, b, c
    return st


# ------------------------------------------------------------------ inputs & references

def _make_gpu_inputs(spec, seed: int, set_index: int):
    """Fresh N(0,1) q, k, v (and mask, if the spec has one) on the GPU, reproducible."""
    import torch
    dt = torch.float16 if spec.dtype == "fp16" else torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(
        (zlib.crc32(spec.case_id.encode()) * 1000 + seed * 97 + set_index) % (2 ** 63))
    q = torch.randn(spec.q_shape, device="cuda", dtype=dt, generator=g)
    k = torch.randn(spec.kv_shape, device="cuda", dtype=dt, generator=g)
    v = torch.randn(spec.kv_shape, device="cuda", dtype=dt, generator=g)
    mask = None
    if spec.mask is not None:       # as spak.attention.problems.make_inputs: [B,1,Sq,Sk], ~20% masked,
        shape = (spec.B, 1, spec.Sq, spec.Sk)          # row Sq//2 of batch 0 fully masked
        keep = torch.rand(shape, device="cuda", generator=g) >= 0.2
        keep[0, 0, spec.Sq // 2] = False
        if spec.mask == "bool":
            mask = keep
        else:
            bias = torch.randn(shape, device="cuda", dtype=torch.float32, generator=g)
            mask = bias.masked_fill(~keep, float("-inf"))
    return q, k, v, mask


def _bottom_right(Sq: int, Sk: int, device):
    import torch
    i = torch.arange(Sq, device=device)[:, None]
    j = torch.arange(Sk, device=device)[None, :]
    return j <= i + (Sk - Sq)


def reference_f64(spec, q, k, v, mask, scale: float):
    """float64 attention as a CUDA float64 tensor: spak.attention.reference on the CPU when small,
    else torch float64 on the GPU, one (batch, head) and a block of rows at a time."""
    import numpy as np
    import torch
    if spec.flops <= CPU_REF_MAX_FLOPS:
        from spak.attention.reference import attention_f64
        cvt = (lambda t: t.cpu().numpy()) if spec.dtype == "fp16" else \
            (lambda t: t.float().cpu().numpy())
        m = None if mask is None else mask.cpu().numpy()
        ref = attention_f64(cvt(q), cvt(k), cvt(v), mask=m, causal=spec.causal, scale=scale)
        return torch.from_numpy(np.ascontiguousarray(ref)).to("cuda")
    B, Hq, Sq, _ = q.shape
    Sk, Dv = k.shape[2], v.shape[3]
    group = Hq // k.shape[1]
    out = torch.empty((B, Hq, Sq, Dv), dtype=torch.float64, device="cuda")
    rows = max(1, (1 << 26) // max(Sk, 1))
    m = None if mask is None else torch.broadcast_to(mask, (B, Hq, Sq, Sk))
    for b in range(B):
        for h in range(Hq):
            kk = k[b, h // group].double()
            vv = v[b, h // group].double()
            for r0 in range(0, Sq, rows):
                r1 = min(Sq, r0 + rows)
                s = (q[b, h, r0:r1].double() @ kk.T) * scale
                if m is not None:
                    mm = m[b, h, r0:r1]
                    s = s.masked_fill(~mm, float("-inf")) if mm.dtype == torch.bool \
                        else s + mm.double()
                if spec.causal:
                    i = torch.arange(r0, r1, device="cuda")[:, None]
                    j = torch.arange(Sk, device="cuda")[None, :]
                    s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
                mx = s.amax(dim=1, keepdim=True)
                dead = torch.isneginf(mx)
                p = torch.exp(s - torch.where(dead, torch.zeros_like(mx), mx))
                den = p.sum(dim=1, keepdim=True)
                o = (p @ vv) / torch.where(dead, torch.ones_like(den), den)
                out[b, h, r0:r1] = torch.where(dead, torch.zeros_like(o), o)
    return out


def _dead_rows(sdpa_mask):
    """[.., Sq, 1] True where SDPA's mask lets a query row see no key, or None.

    SDPA's output on such rows is not zero (NaN, or in recent versions a mean of V);
    SPAK's convention is zero. Comparisons with SDPA zero those rows on SDPA's side."""
    import torch
    if sdpa_mask is None:
        return None
    if sdpa_mask.dtype == torch.bool:
        return ~sdpa_mask.any(dim=-1, keepdim=True)
    return torch.isneginf(sdpa_mask).all(dim=-1, keepdim=True)


def _zero_dead(o, dead):
    import torch
    o = torch.nan_to_num(o, nan=0.0)
    return o if dead is None else o.masked_fill(dead, 0.0)


def _rel_l2(a, b) -> float:
    import torch
    a, b = a.double(), b.double()
    den = float(torch.linalg.vector_norm(b))
    num = float(torch.linalg.vector_norm(a - b))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def _sdpa_args(spec, mask, device, dtype=None):
    """(attn_mask, is_causal) giving bottom-right causal semantics in SDPA.

    An additive mask is handed to SDPA in the query's dtype (``dtype``): SDPA documents
    attn_mask as bool or the query's dtype, and on CUDA (torch 2.11) a float32 mask with
    fp16/bf16 queries gave wrong outputs (seen on an H200, 2026-11-22)."""
    import torch
    if mask is not None and mask.dtype != torch.bool and dtype is not None:
        mask = mask.to(dtype)
    if not spec.causal:
        return mask, False
    if spec.Sq == spec.Sk and mask is None:
        return None, True
    br = _bottom_right(spec.Sq, spec.Sk, device)
    if mask is None:
        return br, False
    if mask.dtype == torch.bool:
        return mask & br, False
    return mask.masked_fill(~br, float("-inf")), False


# ------------------------------------------------------------------ one case

class _Env:
    """Run-wide facts recorded on every row."""

    def __init__(self, args, argv):
        import torch
        import cuda.tile as ct
        self.gpu = torch.cuda.get_device_name()
        major, minor = torch.cuda.get_device_capability()
        self.arch = f"sm_{major}{minor}"
        props = torch.cuda.get_device_properties(0)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 50 << 20))
        self.dump: dict = {}            # --dump: disagreeing slices (_dump_slice)
        self.base = {
            "schema": "spak.run/1", "gpu": self.gpu, "arch": self.arch,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_tile": getattr(ct, "__version__", None), "spak": __version__,
            "commit": commit_label(), "command": "spak " + shlex.join(argv),
        }


def _tiles_for(kernel, spec, args, device):
    if args.tiles is not None:
        return {"TILE_M": args.tiles[0], "TILE_N": args.tiles[1]}
    from spak.api import resolve_tiles
    import torch
    dt = torch.float16 if spec.dtype == "fp16" else torch.bfloat16
    return resolve_tiles(kernel, dt, spec.D, spec.causal, spec.Sk, device)


def _shared_alloc(like):
    """alloc for plan_fmha that hands every plan the same workspaces (one per shape/kind):
    the timed plans run one after another on one stream, so sharing is safe and naive's
    S/P workspaces exist once, not once per input set."""
    import torch
    cache = {}

    def alloc(shape, kind):
        key = (tuple(int(n) for n in shape), kind)
        if key not in cache:
            dt = torch.float32 if kind == "float32" else like.dtype
            cache[key] = torch.empty(key[0], dtype=dt, device=like.device)
        return cache[key]
    return alloc


#: --dump: slices whose simulation differs from the GPU, for offline replay
#: (ci/agree_replay.py). Capped so the file stays small enough to bring home.
DUMP_MAX_BYTES = 15 * 2 ** 20


def _simulate(kernel, spec, q, k, v, kmask, out, scale, tiles, model, heads, work,
              dump=None):
    """Run the simulator on a slice; compare bit for bit with the GPU's output slice.
    dump: a dict collecting (inputs, GPU output) of slices that are not bit-identical."""
    import numpy as np
    from spak.core.metrics import fraction_bit_identical, max_ulp
    from spak.cpu.simrun import simulate_fmha
    sl = sim_slice(spec.B, spec.Hq, spec.Hkv, spec.Sq, spec.Sk, spec.D, tiles["TILE_M"],
                   heads, work)
    r0, hq, hkv = sl["r0"], sl["hq"], sl["hkv"]
    cvt = (lambda t: t.cpu().numpy()) if spec.dtype == "fp16" else \
        (lambda t: t.float().cpu().numpy())
    qs = cvt(q[0:1, :hq, r0:].contiguous())
    ks, vs = cvt(k[0:1, :hkv].contiguous()), cvt(v[0:1, :hkv].contiguous())
    ms = None
    if kmask is not None:
        ms = kmask[0:1, :(hq if kmask.shape[1] > 1 else 1), r0:].contiguous().cpu().numpy()
    t0 = time.perf_counter()
    sim_out, _ = simulate_fmha(kernel, qs, ks, vs, mask=ms, causal=spec.causal, scale=scale,
                               tiles=tiles, model=model, dtype=spec.dtype)
    secs = time.perf_counter() - t0
    gpu = cvt(out[0:1, :hq, r0:].contiguous())
    frac = fraction_bit_identical(gpu, sim_out, spec.dtype)
    if dump is not None and frac < 1.0:
        _dump_slice(dump, f"{kernel}|{spec.case_id}", qs, ks, vs, ms, gpu, scale,
                    spec.causal, spec.dtype, tiles)
    return {"fraction_bit_identical": frac,
            "max_ulp": max_ulp(gpu, sim_out, spec.dtype), "elements": int(np.size(gpu)),
            "slice": sl["text"], "model": model, "seconds": secs}


def _dump_slice(dump: dict, key, q, k, v, mask, gpu, scale, causal, dtype, tiles) -> None:
    """Keep one disagreeing slice (all it takes to re-simulate it) while under the cap."""
    import numpy as np
    arrays = {"q": q, "k": k, "v": v, "gpu": gpu}
    if mask is not None:
        arrays["mask"] = mask
    size = sum(a.nbytes for a in arrays.values())
    if dump.get("_bytes", 0) + size > DUMP_MAX_BYTES:
        dump["_skipped"] = dump.get("_skipped", 0) + 1
        return
    dump["_bytes"] = dump.get("_bytes", 0) + size
    meta = {"case": key, "scale": scale, "causal": causal, "dtype": dtype,
            "tiles": dict(tiles)}
    n = sum(1 for x in dump if x.endswith("/meta"))
    for name, arr in arrays.items():
        dump[f"{n:03d}/{name}"] = arr
    dump[f"{n:03d}/meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)


def run_case(spec, kernels, args, env: _Env, ceiling: Optional[float], emit) -> list[dict]:
    """All rows for one shape: our kernels (checked, simulated, timed) and SDPA's backends."""
    import torch
    from spak.gpu.launch import plan_torch, run as run_plan
    from spak.gpu.plan import plan_fmha
    from spak.api import kernel_mask
    from spak.device import env as gpu_env

    case = {"case": spec.case_id, "shape": spec.display, "B": spec.B, "Hq": spec.Hq,
            "Hkv": spec.Hkv, "Sq": spec.Sq, "Sk": spec.Sk, "D": spec.D, "dtype": spec.dtype,
            "causal": spec.causal, "mask": spec.mask, "flops": spec.flops,
            "ceiling_tflops": ceiling}
    rows = []
    scale = 1.0 / math.sqrt(spec.D)
    q, k, v, mask = _make_gpu_inputs(spec, args.seed, 0)
    kmask = None if mask is None else kernel_mask(mask, spec.B, spec.Hq, spec.Sq, spec.Sk)
    set_bytes = sum(t.numel() * t.element_size() for t in (q, k, v)) * 2
    n_sets = 1 if args.no_time else int(min(args.max_sets, max(2, math.ceil(
        3 * env.l2_bytes / max(set_bytes, 1)))))
    sets = [(q, k, v)] + [_make_gpu_inputs(spec, args.seed, i)[:3] for i in range(1, n_sets)]

    ref = reference_f64(spec, q, k, v, mask, scale)
    sdpa_mask, sdpa_causal = _sdpa_args(spec, mask, q.device, q.dtype)
    gqa = spec.Hq != spec.Hkv
    sdpa_ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=sdpa_mask, is_causal=sdpa_causal, scale=scale, enable_gqa=gqa)
    dead = _dead_rows(sdpa_mask)
    sdpa_ref = _zero_dead(sdpa_ref, dead)

    def finish(row):
        row = {**env.base, **case, **row}
        if row.get("ms_median"):
            row["tflops"] = spec.flops / (row["ms_median"] * 1e-3) / 1e12
            row["pct_ceiling"] = 100.0 * row["tflops"] / ceiling if ceiling else None
        rows.append(row)
        emit(row)
        return row

    # Providers are checked one by one, then timed together in turns (time_turns): timed
    # one after the other, the first one gained a few % (results/ab-h100-2026-11-22).
    done: list[dict] = []          # rows in provider order, finished after the timing
    timers: dict = {}              # provider -> fn(i) over the input sets
    contexts: dict = {}            # provider -> context held while it is timed (SDPA backend)

    for kernel in kernels:
        row = {"provider": f"spak-{kernel}", "kernel": kernel, "tiles": None, "error": None,
               "passed": False, "gate": GATES[spec.dtype]}
        try:
            if kernel == "naive":
                ws = spec.B * spec.Hq * spec.Sq * spec.Sk * 6
                if ws > args.naive_max_gb * 2 ** 30:
                    row["skipped"] = (f"naive workspace {ws / 2 ** 30:.1f} GiB > "
                                      f"--naive-max-gb {args.naive_max_gb}")
                    finish(row)
                    continue
            config = _tiles_for(kernel, spec, args, q.device)
            row["tiles"] = config
            tiles, hints = split_config(config)        # kernel constants / decorator hints
            if kernel != "fused":
                tiles = {k: tiles[k] for k in ("TILE_M", "TILE_N")}
            out = torch.full((spec.B, spec.Hq, spec.Sq, spec.D), float("nan"),
                             dtype=q.dtype, device=q.device)   # poison: unwritten stays NaN
            t0 = time.perf_counter()
            try:
                run_plan(apply_hints(plan_torch(kernel, q, k, v, out, mask=kmask,
                                                causal=spec.causal, scale=scale, tiles=tiles),
                                     hints))
                torch.cuda.synchronize()
            except Exception as exc:
                if gpu_env.is_compile_error(exc):
                    raise gpu_env.explain(exc, arch=env.arch) from exc
                raise
            row["first_call_s"] = time.perf_counter() - t0      # includes the compile
            row["nonfinite"] = int((~torch.isfinite(out)).sum())
            row["rel_l2"] = _rel_l2(out, ref)
            row["max_abs"] = float((out.double() - ref).abs().max()) if out.numel() else 0.0
            row["rel_l2_vs_sdpa"] = _rel_l2(out, sdpa_ref)
            if dead is not None:     # rows that see no key (mask, or causal Sq > Sk)
                sel = torch.broadcast_to(dead, out.shape[:3] + (1,)).expand(out.shape)
                row["dead_rows"] = int(torch.broadcast_to(dead, out.shape[:3] + (1,)).sum())
                row["masked_rows_zero"] = bool((out.masked_select(sel) == 0).all())
            row["passed"] = (row["nonfinite"] == 0 and row["rel_l2"] <= GATES[spec.dtype]
                             and row.get("masked_rows_zero", True))
            if not args.no_sim:
                try:
                    row["sim"] = _simulate(kernel, spec, q, k, v, kmask, out, scale, tiles,
                                           args.model or _sim_model(env.arch),
                                           args.sim_heads, args.sim_work,
                                           env.dump if args.dump else None)
                except Exception as exc:  # noqa: BLE001 -- recorded, run goes on
                    row["sim"] = {"error": f"{type(exc).__name__}: {exc}"}
            if not args.no_time:
                alloc = _shared_alloc(q)
                outs = [torch.empty_like(out) for _ in sets]
                plans = [apply_hints(plan_fmha(kernel, *s, o, mask=kmask, causal=spec.causal,
                                               scale=scale, tiles=tiles, alloc=alloc), hints)
                         for s, o in zip(sets, outs)]
                timers[row["provider"]] = lambda i, plans=plans: run_plan(plans[i])
            del out
        except Exception as exc:  # noqa: BLE001 -- one failure (OOM too) is a row, not the end
            row["error"] = failure_text(exc)
        done.append(row)

    if not args.no_sdpa and not args.no_time:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends = {"flash": SDPBackend.FLASH_ATTENTION,
                    "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION}
        F = torch.nn.functional.scaled_dot_product_attention
        for name in PROVIDERS_SDPA:
            row = {"provider": f"sdpa-{name}", "kernel": None, "error": None}
            try:
                with sdpa_kernel([backends[name]]):
                    try:
                        o = F(q, k, v, attn_mask=sdpa_mask, is_causal=sdpa_causal,
                              scale=scale, enable_gqa=gqa)
                        torch.cuda.synchronize()
                    except RuntimeError as exc:
                        row["skipped"] = str(exc).strip().splitlines()[0][:300]
                        done.append(row)
                        continue
                    row["nonfinite"] = int((~torch.isfinite(o)).sum())
                    row["rel_l2"] = _rel_l2(_zero_dead(o, dead), ref)
                    del o
                    timers[row["provider"]] = lambda i: F(
                        *sets[i], attn_mask=sdpa_mask, is_causal=sdpa_causal, scale=scale,
                        enable_gqa=gqa)
                    contexts[row["provider"]] = functools.partial(sdpa_kernel, [backends[name]])
            except Exception as exc:  # noqa: BLE001 -- OOM too: a row, not the end
                row["error"] = failure_text(exc)
            done.append(row)

    _time_providers(done, timers, n_sets, seed=args.seed, contexts=contexts)
    for row in done:
        finish(row)
    del sets, q, k, v, mask, kmask, ref, sdpa_ref
    torch.cuda.empty_cache()
    return rows


def _time_providers(rows: list[dict], timers: dict, n_sets: int, *, seed: int,
                    contexts=None) -> None:
    """Add time_turns' stats to the rows of the timed providers (``contexts`` as there).
    If timing them together fails (out of memory, say), each is timed alone and a failure
    is that row's error."""
    import contextlib
    contexts = contexts or {}
    if not timers:
        return
    by_name = {r["provider"]: r for r in rows}
    how = "in turns" if len(timers) > 1 else "alone"
    try:
        spin = next(iter(timers.values()))
        found = time_turns(timers, spin, seed, n_sets=n_sets, contexts=contexts)
    except Exception:  # noqa: BLE001 -- fall back to one provider at a time
        found, how = {}, "alone"
        for name, fn in timers.items():
            try:
                with contexts.get(name, contextlib.nullcontext)():
                    found[name] = time_events(fn, n_sets)
            except Exception as exc:  # noqa: BLE001
                by_name[name]["error"] = failure_text(exc)
    for name, st in found.items():
        by_name[name].update(st)
        by_name[name]["input_sets"] = n_sets
        by_name[name]["timing"] = how


def _sim_model(arch: str) -> str:
    try:
        from spak import sim
        return arch if arch in sim.MODELS else "sm_90"
    except ImportError:
        return "sm_90"


# ------------------------------------------------------------------ table

def _f(x, fmt):
    return "-" if x is None else fmt.format(x)


HEADER = (f"{'kernel':6} {'shape':22} {'causal':6} {'dtype':5} {'tiles':7} {'relL2':8} "
          f"{'vsSDPA':8} {'NaN':>4} {'sim bit%':>8} {'ulp':>5} {'ms':>8} {'TFLOPS':>7} "
          f"{'%ceil':>5} | {'flash':>6} {'cudnn':>6} {'effic':>6}  result")


def format_case(rows: list[dict]) -> list[str]:
    """Table lines for one case: one per SPAK kernel, SDPA TFLOPS alongside."""
    sd = {r["provider"]: r for r in rows if r["provider"].startswith("sdpa-")}

    def tf(p):
        r = sd.get(p)
        if r is None:
            return "-"
        if r.get("skipped"):
            return "skip"
        if r.get("error"):
            return "ERR"
        return _f(r.get("tflops"), "{:.0f}")
    lines = []
    for r in rows:
        if not r["provider"].startswith("spak-"):
            continue
        sim = r.get("sim") or {}
        t = r.get("tiles")
        tiles = f"{t['TILE_M']}x{t['TILE_N']}" if t else "-"
        res = ("SKIP" if r.get("skipped") else "PASS" if r.get("passed") else "FAIL")
        lines.append(
            f"{r['kernel']:6} {r['shape']:22} {'yes' if r['causal'] else 'no':6} "
            f"{r['dtype']:5} {tiles:7} "
            f"{_f(r.get('rel_l2'), '{:.2e}'):8} {_f(r.get('rel_l2_vs_sdpa'), '{:.2e}'):8} "
            f"{_f(r.get('nonfinite'), '{}'):>4} "
            f"{_f(None if 'fraction_bit_identical' not in sim else 100 * sim['fraction_bit_identical'], '{:.2f}'):>8} "
            f"{_f(sim.get('max_ulp'), '{}'):>5} {_f(r.get('ms_median'), '{:.3f}'):>8} "
            f"{_f(r.get('tflops'), '{:.0f}'):>7} {_f(r.get('pct_ceiling'), '{:.0f}'):>5} | "
            f"{tf('sdpa-flash'):>6} {tf('sdpa-cudnn'):>6} {tf('sdpa-efficient'):>6}  {res}")
        for key, label in (("error", "error"), ("skipped", "skipped")):
            if r.get(key):
                lines.append(f"    {label}: " + str(r[key]).strip().replace("\n", "\n    "))
        if sim.get("error"):
            lines.append(f"    sim error: {sim['error'].splitlines()[0]}")
    return lines


def summary(rows: list[dict]) -> str:
    ours = [r for r in rows if r["provider"].startswith("spak-") and not r.get("skipped")]
    ok = sum(bool(r.get("passed")) for r in ours)
    parts = [f"{ok}/{len(ours)} SPAK kernel cases passed"]
    sims = [r["sim"] for r in ours if isinstance(r.get("sim"), dict)
            and "fraction_bit_identical" in r["sim"]]
    if sims:
        n = sum(s["elements"] for s in sims)
        frac = sum(s["fraction_bit_identical"] * s["elements"] for s in sims) / max(n, 1)
        parts.append(f"simulator bit-identical {100 * frac:.2f}% of {n} elements "
                     f"(worst {max(s['max_ulp'] for s in sims)} ulp)")
    by_case = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["provider"]] = r
    for other in ("sdpa-cudnn", "sdpa-flash"):
        ratios = [c["spak-fused"]["tflops"] / c[other]["tflops"] for c in by_case.values()
                  if c.get("spak-fused", {}).get("tflops") and c.get(other, {}).get("tflops")]
        if ratios:
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            parts.append(f"fused/{other[5:]} {gm:.2f}x geomean over {len(ratios)}")
    return "; ".join(parts)


# ------------------------------------------------------------------ command

def cmd_run(args: argparse.Namespace) -> int:
    try:
        specs = select_cases(args.shapes, dtype=args.dtype, causal=args.causal)
    except ShapeError as e:
        print(f"spak run: error: argument --shapes: {e}", file=sys.stderr)
        return 2
    if not specs:
        print("spak run: error: argument --shapes: no case matches", file=sys.stderr)
        return 2
    kernels = KERNELS if args.kernel == "all" else (args.kernel,)
    if args.list:
        for s in specs:
            print(s.case_id)
        return 0
    try:
        import torch
    except ImportError as e:
        print(f"spak run: needs PyTorch with CUDA ({e}); see README, GPU section",
              file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("spak run: no CUDA GPU visible to PyTorch (torch.cuda.is_available() is False); "
              "on a CPU-only machine use `spak sim`", file=sys.stderr)
        return 1
    from spak.device import env as gpu_env
    env = _Env(args, args.argv if args.argv is not None else sys.argv[1:])
    problems = gpu_env.diagnose(arch=env.arch)
    if problems:
        print(gpu_env.format_problems(problems), file=sys.stderr)
        if any(p.code in ("tileiras-missing", "arch-unsupported") for p in problems):
            return 1
    out_path = None
    if args.out != "-":
        out_path = Path(args.out if args.out != "auto" else
                        f"results/run-{(slug(env.gpu) or 'gpu')}-{env.base['date'][:10]}.jsonl")
        out_path.parent.mkdir(parents=True, exist_ok=True)
    log = sys.stderr if args.json else sys.stdout
    all_rows = []

    def emit(row):
        append_jsonl(out_path, row)
        all_rows.append(row)

    ceiling = None
    if not args.no_time:
        mm = matmul_ceiling()
        ceiling = mm["tflops"]
        emit({**env.base, "provider": "matmul-fp16-8192", "case": "matmul 8192^3 fp16",
              **mm})
    print(f"spak run on {env.gpu} ({env.arch}), torch {env.base['torch']}, cuTile "
          f"{env.base['cuda_tile']}, {len(specs)} shapes x {len(kernels)} kernel(s)"
          + (f"; fp16 matmul ceiling {ceiling:.0f} TFLOPS" if ceiling else "")
          + (f"; rows -> {out_path}" if out_path else ""), file=log, flush=True)
    if not args.no_sim:
        print("simulator check on a slice per shape (batch 0, first query head(s), last query "
              "rows, all keys; see each row's sim.slice); bit% = simulator output bits equal "
              "to the GPU's", file=log)
    print(HEADER, file=log, flush=True)
    t0 = time.perf_counter()
    for spec in specs:
        rows = guarded_case(spec, kernels,
                            lambda em: run_case(spec, kernels, args, env, ceiling, em),
                            emit, env.base)
        for line in format_case(rows):
            print(line, file=log, flush=True)
    wall = time.perf_counter() - t0
    line = summary(all_rows) + f"; {wall:.0f} s"
    print(line, file=log, flush=True)
    if args.dump:
        import numpy as np
        kept = {k: v for k, v in env.dump.items() if not k.startswith("_")}
        np.savez_compressed(args.dump, **kept)
        print(f"dump: {len(kept) and sum(k.endswith('/meta') for k in kept)} disagreeing "
              f"slice(s) -> {args.dump}" + (f" ({env.dump['_skipped']} over the size cap "
                                             "left out)" if env.dump.get("_skipped") else ""),
              file=log, flush=True)
    if args.json:
        print(json.dumps(_jsonable({"spak": __version__, "command": "run", "env": env.base,
                                    "ceiling_tflops": ceiling, "rows": all_rows,
                                    "summary": line}), indent=1))
    ours = [r for r in all_rows if r.get("provider", "").startswith("spak-")
            and not r.get("skipped")]
    return 0 if all(r.get("passed") for r in ours) else 1


DESCRIPTION = """\
Run SPAK's kernels on the local CUDA GPU: check them against float64 and PyTorch SDPA,
compare them bit for bit with the CPU simulator (on a slice), and time them next to
SDPA's flash, cuDNN and efficient backends and an fp16 matmul ceiling.

    spak run                                   # standard + seed shapes, fp16, fused
    spak run --kernel all --shapes gates --dtype all --no-time   # correctness sweep
    spak run --shapes 4x16x2048x128/causal --json

Gates: relative L2 vs float64 <= {fp16:g} (fp16), <= {bf16:g} (bf16), no NaN/Inf, fully
masked rows zero. Exit status: 0 all pass, 1 a case fails or errors, 2 bad usage.
"""


def register(subparsers) -> None:
    """Add `spak run`."""
    from spak.cli.args import describe_sets as _describe_sets, model_arg, parse_tiles, shape_arg
    p = subparsers.add_parser(
        "run", help="check, simulate-compare and time the kernels on the local GPU",
        description=DESCRIPTION.format(**GATES),
        epilog=GRAMMAR_HELP.format(sets=_describe_sets()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=(*KERNELS, "all"), default="fused",
                   help="which kernel(s) (default: fused)")
    p.add_argument("--shapes", nargs="+", type=shape_arg, default=["standard", "seed"],
                   metavar="SHAPE", help="named sets and/or shapes (default: standard seed)")
    p.add_argument("--dtype", choices=("fp16", "bf16", "all"), default="fp16",
                   help="input dtype (default: fp16)")
    p.add_argument("--causal", choices=("yes", "no", "both"), default="both")
    p.add_argument("--tiles", type=parse_tiles, default=None, metavar="MxN",
                   help="TILE_M x TILE_N (default: tuned store, else the arch default)")
    p.add_argument("--model", type=model_arg, default=None,
                   help="simulator numeric model (default: the GPU's arch, e.g. sm_90)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-sim", action="store_true", help="skip the simulator comparison")
    p.add_argument("--sim-heads", type=int, default=1,
                   help="query heads the simulator re-computes (default 1)")
    p.add_argument("--sim-work", type=int, default=DEFAULT_SIM_WORK,
                   help="simulated rows*keys*D*heads budget per shape; fewer query rows "
                        "are simulated when a shape is bigger (default 2^29)")
    p.add_argument("--dump", default=None, metavar="NPZ",
                   help="write the slices the simulator does not reproduce bit for bit "
                        "(inputs + GPU output, <= 15 MiB) to NPZ, for offline replay with "
                        "ci/agree_replay.py")
    p.add_argument("--no-time", action="store_true", help="correctness only, no timing")
    p.add_argument("--no-sdpa", action="store_true", help="do not time SDPA's backends")
    p.add_argument("--max-sets", type=int, default=8,
                   help="most input sets rotated while timing (default 8)")
    p.add_argument("--naive-max-gb", type=float, default=16.0,
                   help="skip the naive kernel when its S+P workspace exceeds this (GiB)")
    p.add_argument("--out", default="auto", metavar="PATH",
                   help="results JSONL, appended line by line (default: "
                        "results/run-<gpu>-<date>.jsonl; '-' for none)")
    p.add_argument("--json", action="store_true", help="print one JSON document at the end "
                   "(the table goes to stderr)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.set_defaults(func=cmd_run, argv=None)
