"""Forward peers benchmark (issue 17): spak.fmha against NVIDIA's cuTile FMHA sample, SDPA
cuDNN and SDPA flash, all timed in one run on the same inputs by an independent harness;
and (--rank-check) whether the sweeper's timer ranks tile configs as that harness does.

    source .carry/setup.sh && python ci/fwd_peers_bench.py --out $OUT/peers \\
        [--shapes standard seed] [--dtypes fp16 bf16] [--variant NAME=PATH ...] [--rank-check]

Providers per shape (fp16 and bf16): `spak.fmha` (the public call, this GPU's tuned
store), the sample (ci/peers/cutile_sample_fmha.py, vendored from NVIDIA/cutile-python)
at each config of SAMPLE_CONFIGS for the head dim, the sample at spak.fmha's own config
("sample@spak"), SDPA cuDNN, SDPA flash, and each --variant (a copy of
gpu/kernels/fused.py with an `fmha_fwd_kernel` of the same signature, launched with
spak.fmha's launch arguments for the shape, its output bits compared with spak.fmha's).
"sample-best" is the fastest sample config of the shape.

Timing: triton.testing.do_bench (median, L2 flushed before every rep; a fallback of the
same method when triton is missing), providers in an order rotated by one per shape, the
GPU spun 1 s before the first shape; --repeats N times each shape N rounds (later rounds in
shuffled orders) and keeps each provider's median (ms_reps in the row: every reading).
spak.fmha and sample@spak are also timed with SPAK's own timer
(spak.device.timing.time_events, the method of `spak run` and the sweep).
Correctness: every provider's output on fresh random inputs vs a float64 reference (max
abs error printed); NaN, or an error above 10x cuDNN's, fails the shape loudly (exit 1).

--rank-check: for RANK_SHAPES (fp16), every config of plans/fmha.toml's space for the
GPU's arch is timed by the sweep worker's own code path (spak.tune.worker.GpuRunner with
`spak sweep`'s default timing options; jobs from spak.tune.sweep.plan_sweep) and by the
harness, in two passes (forward and reversed config order); per shape: both rankings,
Kendall tau (between the harnesses and each harness with itself across passes), whether
the best config agrees, and the time lost under the harness by taking the sweeper's pick.

Compiles run first, in parallel helper processes (cuTile's disk cache keeps the cubins),
so the timed loop does not wait on tileiras. Outputs under --out: peers.jsonl, peers.md,
rank.jsonl, rank.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SAMPLE_PATH = ROOT / "ci" / "peers" / "cutile_sample_fmha.py"
#: The sample's configs per head dim (issue 17): TILE_MxTILE_N/o<occupancy>[/c<num_ctas>]
SAMPLE_CONFIGS = {64: ("64x64/o4", "64x128/o2", "128x128/o2", "128x64/o2"),
                  128: ("64x128/o2", "128x128/o1", "128x128/o2", "128x64/o2")}
#: --rank-check shapes: D=64 and 128, S=512..8192, causal and not (B >= 2: no B=1 cubins)
RANK_SHAPES = ("32x32x512x64/causal", "8x32x2048x64/noncausal", "2x32x8192x64/causal",
               "32x16x512x128/noncausal", "8x16x2048x128/causal", "2x16x8192x128/noncausal")
#: a provider fails the shape when its max abs error exceeds this many times cuDNN's
ERR_FACTOR = 10.0
FIXED = ("spak", "cudnn", "flash")


# ------------------------------------------------------------------ pure parts (CPU-tested)

def parse_config(text: str) -> dict:
    """"64x128/o2" or "128x128/o2/c2" -> {TILE_M, TILE_N, occupancy, num_ctas (None: auto)};
    ValueError naming the text."""
    parts = text.strip().split("/")
    try:
        tm, tn = (int(x) for x in parts[0].split("x"))
        cfg = {"TILE_M": tm, "TILE_N": tn, "occupancy": None, "num_ctas": None}
        for p in parts[1:]:
            key = {"o": "occupancy", "c": "num_ctas"}[p[0]]
            cfg[key] = int(p[1:])
    except (ValueError, KeyError, IndexError):
        raise ValueError(f"config {text!r}: expected TILE_MxTILE_N/o<occupancy>[/c<num_ctas>],"
                         f" e.g. 64x128/o2") from None
    if any(v is not None and v <= 0 for v in cfg.values()):
        raise ValueError(f"config {text!r}: every value must be positive")
    return cfg


def config_label(cfg: dict) -> str:
    """The inverse of parse_config (keys that are None are left out)."""
    s = f"{cfg['TILE_M']}x{cfg['TILE_N']}"
    if cfg.get("occupancy"):
        s += f"/o{cfg['occupancy']}"
    if cfg.get("num_ctas"):
        s += f"/c{cfg['num_ctas']}"
    return s


def parse_variant(text: str) -> tuple[str, str]:
    """"NAME=PATH" -> (NAME, PATH); ValueError naming the argument."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"--variant {text!r}: expected NAME=PATH (NAME of letters, digits, "
                         f"'-' and '_')")
    if name in FIXED or name.startswith("sample"):
        raise ValueError(f"--variant {text!r}: the name {name!r} is taken by a provider")
    return name, path


def rotate(seq, k: int) -> list:
    """seq rotated left by k (mod its length): shape i times its providers from the i-th."""
    seq = list(seq)
    if not seq:
        return seq
    k %= len(seq)
    return seq[k:] + seq[:k]


def timing_orders(names, idx: int, repeats: int) -> list[list]:
    """The provider orders of shape idx's `repeats` timing rounds: round 0 the rotation by
    idx, each later round a shuffle seeded by (idx, round), so providers change neighbours
    (round 5, results/fwd-round5-h100-2026-11-24e: one kernel's single do_bench readings in
    one process spread ~10%, and a rotation keeps every provider's neighbours)."""
    import random
    orders = [rotate(names, idx)]
    for r in range(1, repeats):
        orders.append(random.Random(idx * 1009 + r).sample(list(names), len(names)))
    return orders


def geomean(xs) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def sample_best(ms: dict) -> str | None:
    """The fastest "sample:<config>" provider of a row's times (sample@spak excluded: it is
    one of the configs only by coincidence)."""
    cands = {k: v for k, v in ms.items() if k.startswith("sample:") and v}
    return min(cands, key=cands.get) if cands else None


def ratios(ms: dict) -> dict:
    """Speed ratios of one shape from provider -> ms (> 1: the first named is faster):
    spak/sample-best, spak/cudnn, sample-best/cudnn, max(spak, sample-best)/cudnn,
    spak/flash; None where a time is missing."""
    def r(a, b):
        return b / a if a and b else None
    best = sample_best(ms)
    sb = ms.get(best) if best else None
    faster = min(x for x in (ms.get("spak"), sb) if x) if (ms.get("spak") or sb) else None
    return {"spak/sample_best": r(ms.get("spak"), sb), "spak/cudnn": r(ms.get("spak"), ms.get("cudnn")),
            "sample_best/cudnn": r(sb, ms.get("cudnn")),
            "max(spak,sample)/cudnn": r(faster, ms.get("cudnn")),
            "spak/flash": r(ms.get("spak"), ms.get("flash"))}


RATIO_KEYS = tuple(ratios({}))


def summarize(rows, standard_cases) -> dict:
    """Per dtype: geomean, min and where of each ratio over the rows whose case is in
    ``standard_cases`` (the 24 standard shapes; their case ids without the dtype)."""
    out = {}
    for dt in sorted({r["dtype"] for r in rows}):
        sel = [r for r in rows if r["dtype"] == dt and r["shape"] in standard_cases]
        d = {"n": len(sel)}
        for key in RATIO_KEYS:
            vals = [(r["ratios"][key], r["shape"]) for r in sel if r["ratios"].get(key)]
            if vals:
                lo = min(vals)
                d[key] = {"geomean": geomean(v for v, _ in vals), "min": lo[0], "min_at": lo[1],
                          "below_1": sum(v < 1.0 for v, _ in vals), "n": len(vals)}
        out[dt] = d
    return out


def correctness_failures(errs: dict, nonfinite: dict, baseline: str = "cudnn",
                         factor: float = ERR_FACTOR) -> list[str]:
    """Providers that fail a shape: any NaN/Inf, or a max abs error above ``factor`` x the
    baseline's (flash's when the baseline has none); a provider with no error measured
    (it did not run) is not judged here."""
    base = errs.get(baseline) if errs.get(baseline) is not None else errs.get("flash")
    bad = []
    for name, e in errs.items():
        if nonfinite.get(name):
            bad.append(f"{name}: {nonfinite[name]} NaN/Inf")
        elif e is None:
            continue
        elif not math.isfinite(e) or (base is not None and e > factor * max(base, 1e-12)):
            bad.append(f"{name}: max abs err {e:.3g} > {factor:g} x {baseline}'s {base:.3g}")
    return bad


def _fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def markdown(rows, summary: dict, providers_note: str = "") -> str:
    """TFLOPS per provider and the ratios per shape, then the geomeans over the standard
    shapes (per dtype)."""
    names = []
    for r in rows:
        names += [n for n in r["tflops"] if n not in names]
    order = [n for n in ("spak", "sample@spak") if n in names] + \
        sorted(n for n in names if n.startswith("sample:")) + \
        [n for n in ("cudnn", "flash") if n in names] + \
        [n for n in names if n not in FIXED and not n.startswith("sample")]
    lines = [providers_note] if providers_note else []
    head = ["shape", "dtype", *order, "sample-best", *RATIO_KEYS]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        best = sample_best(r["ms"]) or "-"
        cells = [r["shape"], r["dtype"], *(_fmt(r["tflops"].get(n), ".1f") for n in order),
                 best.removeprefix("sample:"), *(_fmt(r["ratios"].get(k)) for k in RATIO_KEYS)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for dt, d in summary.items():
        lines.append(f"Geomeans over the {d['n']} standard shapes, {dt} (> 1: the first "
                     f"named is faster):")
        for key in RATIO_KEYS:
            if key in d:
                s = d[key]
                lines.append(f"- {key}: {s['geomean']:.3f} (min {s['min']:.3f} at {s['min_at']};"
                             f" below 1.0 on {s['below_1']} of {s['n']})")
        lines.append("")
    return "\n".join(lines)


def kendall_tau(a: dict, b: dict) -> float | None:
    """Kendall's tau-b between two score maps over their common keys (None: < 2 keys)."""
    keys = [k for k in a if k in b and a[k] is not None and b[k] is not None]
    conc = disc = ta = tb = 0
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            da = a[keys[i]] - a[keys[j]]
            db = b[keys[i]] - b[keys[j]]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ta += 1
            elif db == 0:
                tb += 1
            elif (da > 0) == (db > 0):
                conc += 1
            else:
                disc += 1
    n = conc + disc
    denom = math.sqrt((n + ta) * (n + tb))
    return (conc - disc) / denom if denom else None


def rank_summary(sweep_ms: dict, bench_ms: dict) -> dict:
    """Rankings (fastest first) of two timers' ms per config, their Kendall tau, whether
    the best agrees and the time lost under ``bench_ms`` by taking ``sweep_ms``'s pick
    (bench time of the sweeper's best / bench time of the bench's best - 1)."""
    common = [k for k in sweep_ms if sweep_ms[k] and bench_ms.get(k)]
    rs = sorted(common, key=lambda k: sweep_ms[k])
    rb = sorted(common, key=lambda k: bench_ms[k])
    if not common:
        return {"sweep_rank": [], "bench_rank": [], "tau": None, "best_agrees": None,
                "lost": None}
    return {"sweep_rank": rs, "bench_rank": rb,
            "tau": kendall_tau({k: sweep_ms[k] for k in common}, {k: bench_ms[k] for k in common}),
            "best_agrees": rs[0] == rb[0], "sweep_best": rs[0], "bench_best": rb[0],
            "lost": bench_ms[rs[0]] / bench_ms[rb[0]] - 1.0}


# ------------------------------------------------------------------ GPU helpers

def load_module(path, name: str):
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _params(kernel) -> list[str]:
    code = kernel._annotated_function.pyfunc.__code__
    return list(code.co_varnames[:code.co_argcount])


def sample_launch(sample, q, k, v, out, cfg: dict, causal: bool, scale: float):
    """Our launcher of the sample's kernel (its host wrapper is not vendored): grid and
    arguments as its `cutile_fmha` builds them, input_pos 0; occupancy and num_ctas applied
    by re-wrapping the kernel (spak.gpu.variants.with_hints -> cuTile's replace_hints)."""
    import torch
    import cuda.tile as ct
    from spak.gpu.variants import with_hints
    B, Hq, Sq, D = q.shape
    Sk = k.shape[2]
    tm, tn = cfg["TILE_M"], cfg["TILE_N"]
    kern = with_hints(sample.fmha_kernel, occupancy=cfg.get("occupancy"),
                      num_ctas=cfg.get("num_ctas"))
    grid = (math.ceil(Sq / tm), B * Hq, 1)
    if hasattr(sample, "sample_grid"):      # round 6 (ci/fwd_sample_variants.py): SPAK's grid
        grid = sample.sample_grid(grid[0], B, Hq)
    args = (q, k, v, out, scale, 0, D, Hq, tm, tn, Hq // k.shape[1], causal, Sk % tn == 0)
    if hasattr(sample, "sample_args"):      # round 6b: a variant with spak's extra parameters
        args = sample.sample_args(args)
    return lambda: ct.launch(torch.cuda.current_stream(), grid, kern, args)


def variant_launch(mod, q, k, v, out, causal: bool, scale: float, config: dict):
    """A fused.py copy launched with spak.fmha's own launch for the shape (plan_torch with
    the resolved config), its arguments matched to ours by parameter name."""
    import dataclasses
    from spak.gpu.launch import plan_torch, run
    from spak.gpu.variants import split_config, with_hints
    tiles, hints = split_config(config)
    L = plan_torch("fused", q, k, v, out, causal=causal, scale=scale, tiles=tiles)[0]
    given = dict(zip(_params(L.kernel), L.args))
    args = tuple(given[n] for n in _params(mod.fmha_fwd_kernel))
    L = dataclasses.replace(L, kernel=with_hints(mod.fmha_fwd_kernel, **hints), args=args)
    if hasattr(mod, "variant_grid"):     # round 5 (ci/fwd_variants.py): its own launch grid
        L = dataclasses.replace(L, grid=mod.variant_grid(L.grid))
    return lambda: run([L])


def make_bench():
    """(name, bench(fn) -> median ms): triton.testing.do_bench if importable, else the
    same method written here (estimate, warm-up, reps each after a 256 MiB L2 flush,
    CUDA events per rep, median)."""
    try:
        from triton.testing import do_bench

        def bench(fn):
            try:
                return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
            except TypeError:                       # older triton: no return_mode
                return float(do_bench(fn, warmup=25, rep=100, quantiles=[0.5]))
        import triton
        return f"triton.testing.do_bench (triton {triton.__version__})", bench
    except ImportError:
        return "fallback do_bench (triton not importable)", _bench_fallback


def _bench_fallback(fn, warmup_ms: float = 25.0, rep_ms: float = 100.0) -> float:
    import torch
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(5):
        cache.zero_()
        fn()
    e.record()
    torch.cuda.synchronize()
    est = max(s.elapsed_time(e) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    n = max(1, int(rep_ms / est))
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(n)]
    for a, b in ev:
        cache.zero_()
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in ev)
    return t[len(t) // 2] if n % 2 else 0.5 * (t[n // 2 - 1] + t[n // 2])


def spin(seconds: float) -> None:
    """Keep the GPU busy (fp16 matmuls) for ``seconds``: clocks settle before timing."""
    import torch
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


# ------------------------------------------------------------------ compile ahead

def _tiny(shape, keep_heads: bool):
    from spak.tune.worker import tiny_dim
    B, H, S, D = shape
    return (tiny_dim(B), H if keep_heads else tiny_dim(H), tiny_dim(S), D)


def compile_unit(unit: dict) -> dict:
    """Build one cubin by launching on tiny arrays with the real launch's specialisation
    (run in a helper process; the cubin lands in cuTile's disk cache)."""
    import torch
    t0 = time.time()
    try:
        if unit["kind"] == "sweep":                   # the sweep's own compile path
            from spak.tune.worker import GpuRunner
            r = GpuRunner({}).compile(unit["unit"])
            r["seconds"] = time.time() - t0
            return r
        dt = getattr(torch, unit["torch_dtype"])
        keep = unit["kind"] == "sample"               # the sample's H is a constant
        qs, ks = _tiny(unit["q"], keep), _tiny(unit["k"], keep)
        if unit["q"][1] % unit["k"][1] == 0 and qs[1] % ks[1]:
            ks = (ks[0], qs[1], ks[2], ks[3])
        q = torch.randn(qs, device="cuda", dtype=dt)
        k, v = (torch.randn(ks, device="cuda", dtype=dt) for _ in range(2))
        out = torch.empty(qs, device="cuda", dtype=dt)
        scale = 1.0 / math.sqrt(q.shape[3])
        if unit["kind"] == "sample":
            fn = sample_launch(load_module(unit.get("path", SAMPLE_PATH), "cutile_sample_fmha"),
                               q, k, v, out, unit["config"], unit["causal"], scale)
        elif unit["kind"] == "variant":
            fn = variant_launch(load_module(unit["path"], "variant"), q, k, v, out,
                                unit["causal"], scale, unit["config"])
        else:   # spak.fmha's eager body with the shape's resolved config (its `tiles`
            # argument takes no hints, and the tiny shape's own lookup could differ)
            from spak.api import _impl
            c = unit["config"]
            args = [int(c.get(key) or 0) for key in ("TILE_M", "TILE_N", "LAT_K", "LAT_V",
                                                      "occupancy", "num_ctas")]
            fn = lambda: _impl(q, k, v, None, unit["causal"], scale, "fused", *args)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        return {"status": "ok", "seconds": time.time() - t0}
    except Exception as exc:  # noqa: BLE001 -- reported, the provider is skipped
        return {"status": "compile_error", "error": f"{type(exc).__name__}: {exc}"[:400],
                "seconds": time.time() - t0}


def unit_key(unit: dict) -> str:
    """What a unit's cubin depends on: for the sweep's units their unit_id; for ours the
    kind, dtype, causal, config (and path) plus, per array, what ct.launch specialises on
    (spak.tune.jobs' bits: two shapes of one class share a cubin) and, for the sample,
    its head count (a kernel constant there)."""
    if unit["kind"] == "sweep":
        return "sweep|" + unit["unit"]["unit_id"]
    from spak.tune.jobs import _spec_bits
    key = {k: v for k, v in unit.items() if k not in ("q", "k")}
    key["bits"] = [_spec_bits(unit["q"], 2), _spec_bits(unit["k"], 2)]
    key["D"] = unit["q"][3]
    if unit["kind"] == "sample":
        key["H"] = unit["q"][1]
    return json.dumps(key, sort_keys=True)


def compile_all(units: list[dict], jobs: int) -> dict:
    """unit_key -> result, the units built by ``jobs`` spawned helper processes."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp
    todo = {}
    for u in units:
        todo.setdefault(unit_key(u), u)
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=mp.get_context("spawn")) as ex:
        futs = {k: ex.submit(compile_unit, u) for k, u in todo.items()}
        res = {}
        for k, f in futs.items():
            try:
                res[k] = f.result()
            except Exception as exc:  # noqa: BLE001 -- a helper died
                res[k] = {"status": "compile_error", "error": f"helper died: {exc}"}
    bad = sum(r["status"] != "ok" for r in res.values())
    print(f"compiled {len(res)} units with {jobs} helpers in {time.time() - t0:.0f} s "
          f"({bad} failed)", flush=True)
    return res


# ------------------------------------------------------------------ the peers benchmark

def _torch_dtype(dt: str):
    import torch
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]


def spak_config(spec) -> dict:
    """The config spak.fmha launches for the shape (its tuned store for this GPU)."""
    from spak.api import resolve_tiles
    return resolve_tiles("fused", _torch_dtype(spec.dtype), spec.D, spec.causal, spec.Sk,
                         __import__("torch").device("cuda", 0),
                         rows=spec.B * spec.Hq * spec.Sq)     # small-grid entries, as spak.fmha


def peer_units(spec, variants: dict) -> list[tuple[str, dict]]:
    """(provider name, compile unit) of every cuTile provider of one shape: spak.fmha at
    its resolved config, the sample at each SAMPLE_CONFIGS entry and at spak's config
    ("sample@spak"), each variant at spak's config. `variants`: name -> ("variant", path)
    (a fused.py copy) or ("sample", path) (a copy of the sample, launched as sample@spak)."""
    base = {"torch_dtype": {"fp16": "float16", "bf16": "bfloat16"}[spec.dtype],
            "q": list(spec.q_shape), "k": list(spec.kv_shape), "causal": spec.causal}
    ours = spak_config(spec)
    units = [("spak", {**base, "kind": "spak", "config": ours})]
    for c in SAMPLE_CONFIGS.get(spec.D, ()):
        units.append(("sample:" + c, {**base, "kind": "sample", "config": parse_config(c)}))
    at_ours = {k: ours.get(k) for k in ("TILE_M", "TILE_N", "occupancy", "num_ctas")}
    units.append(("sample@spak", {**base, "kind": "sample", "config": at_ours}))
    for name, (kind, p) in variants.items():
        units.append((name, {**base, "kind": kind, "path": str(p),
                             "config": ours if kind == "variant" else at_ours}))
    return units


def _providers(spec, sample, variants, q, k, v, outs) -> tuple[dict, dict]:
    """(name -> (fn, context factory or None, unit key or None), spak's config) for one
    shape; each fn writes its output into outs[name]."""
    import torch
    import spak
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    scale = 1.0 / math.sqrt(spec.D)
    units = peer_units(spec, variants)
    ours = units[0][1]["config"]
    prov = {"spak": (lambda: outs.__setitem__("spak", spak.fmha(q, k, v, is_causal=spec.causal)),
                     None, unit_key(units[0][1]))}
    for name, u in units[1:]:
        outs[name] = torch.empty_like(q)
        if u["kind"] == "sample":
            mod = load_module(u["path"], f"sample_{name}") if "path" in u else sample
            fn = sample_launch(mod, q, k, v, outs[name], u["config"], spec.causal, scale)
        else:
            fn = variant_launch(load_module(u["path"], f"variant_{name}"), q, k, v, outs[name],
                                spec.causal, scale, ours)
        prov[name] = (fn, None, unit_key(u))
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION)):
        prov[name] = (lambda n=name: outs.__setitem__(n, F.scaled_dot_product_attention(
            q, k, v, is_causal=spec.causal)), (lambda b=backend: sdpa_kernel(b)), None)
    return prov, ours


# long: one shape's whole protocol (inputs, compile check, correctness, rotated timing,
# our timer, the row) reads best in one place
def bench_shape(spec, idx, sample, variants, compiled, bench, meta, repeats: int = 1) -> dict:
    import contextlib
    import torch
    from spak import families
    from spak.device.gpu_reference import attention_reference
    from spak.device.timing import input_sets_for, time_events
    fam = families.get("fmha_fwd")
    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 50 << 20)
    n_sets = input_sets_for(fam, spec, l2, 4)
    sets = fam.gpu_input_sets(spec, 1000 + idx, n_sets, "cuda")
    q, k, v = sets[0]["q"], sets[0]["k"], sets[0]["v"]
    outs: dict = {}
    prov, ours = _providers(spec, sample, variants, q, k, v, outs)
    row = {"shape": spec.case_id.replace(f"/{spec.dtype}", ""), "case": spec.case_id,
           "dtype": spec.dtype, **meta, "spak_config": ours, "ms": {}, "tflops": {},
           "max_abs_err": {}, "nonfinite": {}, "skipped": {}}
    ref = attention_reference(spec, q, k, v, None, 1.0 / math.sqrt(spec.D))
    for name, (fn, ctx, uk) in list(prov.items()):          # compile check + correctness
        if uk is not None and compiled.get(uk, {}).get("status") not in (None, "ok"):
            row["skipped"][name] = compiled[uk]["error"]
            print(f"    {name}: skipped, failed to compile: {compiled[uk]['error'][:160]}")
            del prov[name]
            continue
        try:
            with (ctx or contextlib.nullcontext)():
                fn()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 -- an SDPA backend may refuse the shape
            row["skipped"][name] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"    {name}: skipped: {row['skipped'][name][:160]}")
            del prov[name]
            continue
        o = outs[name]
        row["nonfinite"][name] = int((~torch.isfinite(o)).sum())
        row["max_abs_err"][name] = float((o.double() - ref).abs().max())
    def differ(n, base):
        return n in prov and base in prov and not torch.equal(outs[n].view(torch.int16),
                                                              outs[base].view(torch.int16))
    row["bits_differ_from_spak"] = [n for n, (kind, _) in variants.items()
                                    if kind == "variant" and differ(n, "spak")]
    row["bits_differ_from_sample"] = [n for n, (kind, _) in variants.items()
                                      if kind == "sample" and differ(n, "sample@spak")]
    row["failed"] = correctness_failures(row["max_abs_err"], row["nonfinite"])
    del ref
    orders = timing_orders(list(prov), idx, repeats)
    row["order"] = orders[0]
    reps: dict = {name: [] for name in prov}
    for order in orders:
        for name in order:
            fn, ctx, _ = prov[name]
            with (ctx or contextlib.nullcontext)():
                reps[name].append(bench(fn))
    row["ms"] = {name: statistics.median(reps[name]) for name in orders[0]}
    if repeats > 1:
        row["ms_reps"] = reps
    row["ours_timer_ms"] = {}
    for name in [n for n in ("spak", "sample@spak") if n in prov]:
        fn, ctx, _ = prov[name]
        fns = _set_fns(name, spec, sets, sample, ours, fn)
        with (ctx or contextlib.nullcontext)():
            row["ours_timer_ms"][name] = time_events(fns, len(sets), target_s=0.15)["ms_median"]
    row["tflops"] = {n: spec.flops / (ms * 1e-3) / 1e12 for n, ms in row["ms"].items()}
    row["ratios"] = ratios(row["ms"])
    row["sample_best"] = sample_best(row["ms"])
    return row


def _set_fns(name, spec, sets, sample, ours, fn0):
    """fn(i) over the input sets for our timer (it rotates sets like `spak run`)."""
    import torch
    import spak
    if name == "spak":
        return lambda i: spak.fmha(sets[i]["q"], sets[i]["k"], sets[i]["v"],
                                   is_causal=spec.causal)
    cfg = {k: ours.get(k) for k in ("TILE_M", "TILE_N", "occupancy", "num_ctas")}
    fns = [fn0] + [sample_launch(sample, s["q"], s["k"], s["v"], torch.empty_like(s["q"]), cfg,
                                 spec.causal, 1.0 / math.sqrt(spec.D)) for s in sets[1:]]
    return lambda i: fns[i]()


def print_row(row) -> None:
    tf = row["tflops"]
    print(f"  {row['shape']:<26} {row['dtype']} " + " ".join(
        f"{n} {tf[n]:.0f}" for n in row["order"] if n in tf), flush=True)
    ot = row["ours_timer_ms"]
    print("    " + " ".join(f"{k} {v:.3f}" for k, v in row["ratios"].items() if v is not None)
          + " | spak timer / harness: " + " ".join(
              f"{n} {ot[n] / row['ms'][n]:.3f}" for n in ot if row["ms"].get(n))
          + " | max abs err: " + " ".join(f"{n} {e:.1e}" for n, e in row["max_abs_err"].items()),
          flush=True)
    if row["bits_differ_from_spak"]:
        print(f"    BITS DIFFER from spak.fmha: {row['bits_differ_from_spak']}")
    for f in row["failed"]:
        print(f"    FAIL {row['case']}: {f}", flush=True)


# ------------------------------------------------------------------ the rank check

def rank_plan():
    """(runner opts, SweepPlan) for RANK_SHAPES on this GPU's arch, as `spak sweep` would
    build them (its CLI defaults for the timing options; no peers, no default row)."""
    from spak import families
    from spak.api import device_arch
    from spak.cli.sweep import add_arguments
    from spak.tune.sweep import plan_sweep, select_problems
    p = argparse.ArgumentParser()
    add_arguments(p)
    opts = {k: p.get_default(k) for k in ("warmup", "batches", "batch_ms", "max_sets")}
    fam = families.get("fmha_fwd")
    problems, _ = select_problems(fam, list(RANK_SHAPES), dtype="fp16", causal="both")
    arch = device_arch(0) if _has_cuda() else "sm_90"
    return opts, plan_sweep(fam, "fused", problems, arch, default=False, peers=())


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def rank_units(plan) -> list[dict]:
    return [{"kind": "sweep", "unit": j.unit} for j in plan.jobs if j.unit]


def _time_config(runner, fam, job, sets, bench, sweep_first: bool) -> tuple:
    """(sweeper ms, harness ms, status) of one config: the worker's job path and the
    harness on the same launches, in the given order."""
    res = {}

    def by_sweep():
        r = runner.run(job.payload())
        res["sweep"] = r.get("ms_median") if r["status"] == "ok" else None
        res["status"] = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error')}"

    def by_bench():
        call = fam.gpu_call("fused", job.spec, sets[0], job.config)
        res["bench"] = bench(lambda: runner._launch(call))
    for f in ((by_sweep, by_bench) if sweep_first else (by_bench, by_sweep)):
        try:
            f()
        except Exception as exc:  # noqa: BLE001 -- recorded per config
            res.setdefault("status", f"error: {type(exc).__name__}: {exc}"[:300])
    return res.get("sweep"), res.get("bench"), res.get("status", "ok")


# long: the whole rank-check protocol (two passes per shape, then the per-shape summary)
def rank_check(plan, opts, compiled, bench, meta, out_dir: Path, deadline: float) -> list[dict]:
    import torch
    from spak import families
    from spak.tune.worker import GpuRunner
    fam = families.get("fmha_fwd")
    runner = GpuRunner(opts)
    rows = []
    by_case: dict = {}
    for j in plan.jobs:
        by_case.setdefault(j.case, []).append(j)
    spin(1.0)
    for case, jobs in by_case.items():
        jobs = [j for j in jobs if not j.unit or compiled.get(
            unit_key({"kind": "sweep", "unit": j.unit}), {}).get("status") in (None, "ok")]
        if not jobs or time.time() > deadline:
            print(f"  {case}: skipped ({'no config compiled' if not jobs else 'budget'})")
            continue
        try:
            row = _rank_shape(runner, fam, case, jobs, bench, meta)
        except Exception as exc:  # noqa: BLE001 -- the other shapes still run
            print(f"  ERROR {case}: {type(exc).__name__}: {exc}"[:500], flush=True)
            continue
        rows.append(row)
        print(f"  {case}: tau {_fmt(row['tau'])} (sweep vs itself "
              f"{_fmt(row['tau_sweep_self'])}, harness vs itself {_fmt(row['tau_bench_self'])});"
              f" best: sweep {row.get('sweep_best')} harness {row.get('bench_best')}; lost "
              f"{_fmt(row['lost'] and 100 * row['lost'], '.1f')}%", flush=True)
        with open(out_dir / "rank.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        torch.cuda.empty_cache()
    (out_dir / "rank.md").write_text(rank_markdown(rows))
    return rows


def _rank_shape(runner, fam, case, jobs, bench, meta) -> dict:
    """One shape of the rank check: two passes over its configs (forward, reversed), each
    config timed by the sweeper's path and the harness (which goes first alternates)."""
    sets = runner._inputs(fam, jobs[0].spec)["sets"]
    passes = []
    for p, seq in enumerate((jobs, jobs[::-1])):
        sw, be, st = {}, {}, {}
        for i, j in enumerate(seq):
            sw[j.config_id], be[j.config_id], st[j.config_id] = _time_config(
                runner, fam, j, sets, bench, sweep_first=(i + p) % 2 == 0)
        passes.append((sw, be, st))
    (sw0, be0, st0), (sw1, be1, _) = passes
    sw = {c: min(x for x in (sw0[c], sw1.get(c)) if x) if sw0[c] or sw1.get(c) else None
          for c in sw0}
    be = {c: min(x for x in (be0[c], be1.get(c)) if x) if be0[c] or be1.get(c) else None
          for c in be0}
    s = rank_summary(sw, be)
    row = {"case": case, **meta, "sweep_ms": sw, "bench_ms": be, "status": st0,
           "passes": [{"sweep_ms": a, "bench_ms": b} for a, b, _ in passes],
           "tau_sweep_self": kendall_tau(sw0, sw1), "tau_bench_self": kendall_tau(be0, be1),
           "flops": jobs[0].flops, **s}
    return row


def pass_spread(passes: list, key: str) -> dict:
    """How far one timer's two passes lie apart per config: the median and max over the
    configs of |pass1 - pass2| / min(pass1, pass2) (the noise the rankings sit on)."""
    a, b = passes[0][key], passes[1][key]
    d = sorted(abs(a[c] - b[c]) / min(a[c], b[c]) for c in a if a[c] and b.get(c))
    if not d:
        return {"median": None, "max": None}
    return {"median": d[len(d) // 2] if len(d) % 2 else 0.5 * (d[len(d) // 2 - 1] + d[len(d) // 2]),
            "max": d[-1]}


def rank_markdown(rows) -> str:
    lines = ["| shape | tau (sweep vs harness) | tau sweep pass1 vs pass2 | tau harness pass1 vs "
             "pass2 | sweep best | harness best | agree | lost under harness | pass-to-pass "
             "spread per config, sweep (median / max) | same, harness |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = [pass_spread(r["passes"], k) for k in ("sweep_ms", "bench_ms")]
        lines.append(f"| {r['case']} | {_fmt(r['tau'])} | {_fmt(r['tau_sweep_self'])} | "
                     f"{_fmt(r['tau_bench_self'])} | {r.get('sweep_best')} | "
                     f"{r.get('bench_best')} | {r.get('best_agrees')} | "
                     f"{_fmt(r['lost'] and 100 * r['lost'], '.1f')}% | "
                     + " | ".join(f"{_fmt(x['median'] and 100 * x['median'], '.1f')}% / "
                                  f"{_fmt(x['max'] and 100 * x['max'], '.1f')}%" for x in sp)
                     + " |")
    lines.append("")
    for r in rows:
        lines.append(f"{r['case']} (TFLOPS, sweeper / harness, harness order):")
        for c in r["bench_rank"]:
            lines.append(f"- {c}: {r['flops'] / r['sweep_ms'][c] / 1e9:.1f} / "
                         f"{r['flops'] / r['bench_ms'][c] / 1e9:.1f}")
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------ main

def _meta(harness: str) -> dict:
    import torch
    return {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "commit": os.environ.get("SPAK_COMMIT"), "torch": torch.__version__,
            "harness": harness}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", default="fwd-peers", help="output folder (created)")
    ap.add_argument("--shapes", nargs="+", default=["standard", "seed"],
                    help="shape sets or shapes of the grammar (default: standard seed)")
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=["fp16", "bf16"])
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PATH",
                    help="a copy of gpu/kernels/fused.py to time beside spak.fmha (repeatable)")
    ap.add_argument("--sample-variant", action="append", default=[], metavar="NAME=PATH",
                    help="a copy of the sample's kernel (ci/fwd_sample_variants.py) launched "
                         "as sample@spak; its bits compared with sample@spak's (repeatable)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="timing rounds per shape (round 0 rotated, later rounds shuffled); ms "
                         "is each provider's median over the rounds")
    ap.add_argument("--rank-check", action="store_true", help="also run the ranking check")
    ap.add_argument("--no-peers", action="store_true", help="skip the peers benchmark")
    ap.add_argument("--compile-jobs", type=int, default=max(1, (os.cpu_count() or 4) - 2))
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no peers shape after this many seconds (default 420)")
    ap.add_argument("--rank-budget-s", type=float, default=120.0,
                    help="the rank check starts no shape after --budget-s plus this")
    args = ap.parse_args(argv)
    try:
        variants = {n: ("variant", p) for n, p in map(parse_variant, args.variant)}
        samples = {n: ("sample", p) for n, p in map(parse_variant, args.sample_variant)}
    except ValueError as e:
        ap.error(str(e))
    if set(variants) & set(samples):
        ap.error(f"--variant and --sample-variant share names: "
                 f"{sorted(set(variants) & set(samples))}")
    variants.update(samples)
    return run(args, variants)


# long: the run's sequence (select, compile everything ahead, peers loop, rank check, files)
def run(args, variants) -> int:
    import torch
    from spak.attention.problems import select_cases
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    harness, bench = make_bench()
    meta = _meta(harness)
    print(f"{meta['gpu']} {meta['date']} commit {meta['commit']}; harness: {harness}", flush=True)
    specs = [] if args.no_peers else [
        s for dt in args.dtypes for s in select_cases(args.shapes, dtype=dt, causal="both")
        if s.mask is None]
    standard = {s.case_id.replace("/fp16", "") for s in
                select_cases(["standard"], dtype="fp16", causal="both")}
    units = [u for s in specs for _, u in peer_units(s, variants)]
    plan = opts = None
    if args.rank_check:
        opts, plan = rank_plan()
        units += rank_units(plan)
    compiled = compile_all(units, args.compile_jobs) if units else {}
    sample = load_module(SAMPLE_PATH, "cutile_sample_fmha")
    rows, failed = [], []
    if specs:
        spin(1.0)
    for idx, spec in enumerate(specs):
        if time.time() - t0 > args.budget_s:
            print(f"budget reached: {len(specs) - idx} shapes not run", flush=True)
            break
        try:
            row = bench_shape(spec, idx, sample, variants, compiled, bench, meta, args.repeats)
        except Exception as exc:  # noqa: BLE001 -- said loudly, counted as a failure
            msg = f"{spec.case_id}: {type(exc).__name__}: {exc}"[:500]
            print(f"  ERROR {msg}", flush=True)
            failed.append(msg)
            torch.cuda.empty_cache()
            continue
        rows.append(row)
        failed += row["failed"]
        print_row(row)
        with open(out / "peers.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        torch.cuda.empty_cache()
    if rows:
        summary = summarize(rows, standard)
        note = (f"{meta['gpu']}, {meta['date']}, commit {meta['commit']}, {harness}; TFLOPS "
                f"(FLOPs 4*B*H*S^2*D, halved for causal); ratios > 1: the first named is "
                f"faster\n")
        (out / "peers.md").write_text(markdown(rows, summary, note))
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(markdown([], summary), flush=True)
    if args.rank_check:
        print("rank check: sweeper timer vs harness", flush=True)
        rank_check(plan, opts, compiled, bench, meta, out, t0 + args.budget_s + args.rank_budget_s)
    if failed:
        print(f"FAILED correctness on {len(failed)} provider-shapes:\n  " + "\n  ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
