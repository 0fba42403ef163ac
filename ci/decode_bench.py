"""Decode attention over a KV cache on a GPU, in one go: correctness vs float64, agreement
with the CPU simulator, CUDA-graph capture and torch.compile, then bandwidth against SDPA's
backends and a device-to-device copy measured in the same run (issue 18).

    python ci/decode_bench.py --out DIR [--quick] [--jobs 8]

Writes DIR/rows.jsonl (one JSON object per check or timing), DIR/summary.md (tables) and
prints the summary last. Bandwidth = bytes of K and V read for every sequence's length,
plus Q and O, over the median time of one call; calls are timed as CUDA-graph replays over
enough rotated input copies that the working set passes the 50 MB L2. SDPA peers get the
cache already gathered to a contiguous [B, Hkv, L, D] (enable_gqa=True); for Sq > 1 they
run non-causal (SDPA's is_causal is top-left when Sq != Sk), ours bottom-right causal.

Before anything is timed, every kernel variant is compiled in parallel worker processes
(cuTile's disk cache is shared): each worker launches the real shapes with every length 0,
so no cache byte is read and the caches need no memory (as_strided views of one element).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KV_CAP = 4 * 2**30           # K+V bytes per timed case (SDPA's gathered copy doubles it)
L2_BYTES = 256 * 2**20       # rotate inputs until the working set passes this


# ------------------------------------------------------------------------------ shapes

def timing_grid(quick: bool) -> list[dict]:
    """Issue 18's grid, fp16: B 1/8/64, Hq 32, Hkv 32/8/1, D 128, Sq 1/4, caches 1k-128k,
    contiguous and paged (16, 256), K+V <= KV_CAP; bf16 on a slice of it."""
    cases = []
    for B in (1, 8, 64):
        for hkv in (32, 8, 1):
            for sq in (1, 4):
                for sk in (1024, 8192, 32768, 131072):
                    if B * sk * hkv * 128 * 4 > KV_CAP:
                        continue
                    if quick and (sk not in (8192, 32768) or B == 64):
                        continue
                    for page in (0, 16, 256):
                        cases.append(dict(B=B, Hq=32, Hkv=hkv, Sq=sq, Sk=sk, D=128,
                                          page=page, dtype="fp16"))
    for hkv in (8, 1):
        for sq in (1, 4):
            for page in (0, 16):
                cases.append(dict(B=8, Hq=32, Hkv=hkv, Sq=sq, Sk=32768, D=128, page=page,
                                  dtype="bf16"))
    # a few knobs beside the defaults (keys per step, split counts)
    extra = {"tn64": {"tiles": {"TILE_N": 64}}, "splits8": {"num_splits": 8},
             "splits32": {"num_splits": 32}, "splits64": {"num_splits": 64}}
    for B in (1, 8):
        for page in (0, 16):
            cases.append(dict(B=B, Hq=32, Hkv=8, Sq=1, Sk=32768, D=128, page=page,
                              dtype="fp16", extra=extra))
    return cases


def check_problems(quick: bool):
    from spak.families.fmha_decode import FAMILY
    items = ["default", "gates"] + ([] if quick else [
        "1x32:8x8192x128/page16/lens=8000", "4x32:8x4:4096x128/causal/page256/lens=4096:3000:17:1",
        "2x32x2048x128/lens=2048:1500", "3x32:1x4:2000x128/causal/lens=2000:1:999",
        "8x32:8x1024x128/page16",
        # the case that faulted (misaligned address) in the first GPU run, and neighbours
        "1x32:4x600x128/page64/splits=5", "1x32:4x600x128/page64/splits=4",
        "1x32:4x600x128/page64/splits=1", "1x32:4x600x128/splits=5",
        "2x32:4x600x128/page64/splits=5", "1x32:1x2048x128", "1x32:1x4:2048x128/causal/page16",
        "1x32x4096x128/page256", "2x32:8x4:3000x128/causal/page256/lens=3000:2999"])
    return FAMILY.select(items, dtype="all", causal="both")


# ------------------------------------------------------------------------------ helpers

def _torch(x, dev):
    import torch
    if x is None:
        return None
    if x.dtype == np.float32 and x.ndim == 4:          # bf16 values held in float32
        return torch.from_numpy(x).to(dev).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(x)).to(dev)


def _numpy(t):
    import torch
    if t.dtype == torch.bfloat16:
        return t.float().cpu().numpy()
    return t.cpu().numpy()


def _call_args(p):
    return dict(is_causal=p.causal, num_splits=p.splits)


# -------------------------------------------------------------------- warm-up (compile)

def _warm_case(spec):
    """Compile one variant: launch the real shapes with every length 0 (no cache byte is
    read; the caches are allocated but never written)."""
    t0 = time.perf_counter()
    try:
        _warm_launch(*spec)
        return spec[0], None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 -- reported, the run goes on
        return spec[0], f"{type(e).__name__}: {e}", time.perf_counter() - t0


def _warm_launch(kind, p):
    import torch
    import spak
    dev = torch.device("cuda")
    dt = torch.float16 if p["dtype"] == "fp16" else torch.bfloat16
    q = torch.randn(p["B"], p["Sq"], p["Hq"], p["D"], device=dev, dtype=dt)
    if p["page"]:
        per = -(-p["Sk"] // p["page"])
        k = torch.empty(p["B"] * per, p["page"], p["Hkv"], p["D"], device=dev, dtype=dt)
        bt = torch.zeros(p["B"], per, dtype=torch.int32, device=dev)
    else:
        k, bt = torch.empty(p["B"], p["Sk"], p["Hkv"], p["D"], device=dev, dtype=dt), None
    lens = torch.zeros(p["B"], dtype=torch.int32, device=dev)
    spak.fmha_kvcache(q, k, k, lens, block_table=bt, is_causal=p["causal"],
                      num_splits=p.get("splits") or p.get("num_splits"), tiles=p.get("tiles"))
    torch.cuda.synchronize()
    del q, k
    torch.cuda.empty_cache()


def warm_up(problems, grid, jobs, log):
    specs = [("check", dict(B=p.B, Hq=p.Hq, Hkv=p.Hkv, Sq=p.Sq, Sk=p.Sk, D=p.D, page=p.page,
                            dtype=p.dtype, causal=p.causal, splits=p.splits))
             for p in problems]
    specs += [("time", dict(c, causal=c["Sq"] > 1)) for c in grid]
    specs += [("time", dict(c, causal=c["Sq"] > 1, **cfg)) for c in grid
              for cfg in (c.get("extra") or {}).values()]
    t0 = time.perf_counter()
    errors = 0
    import multiprocessing as mp
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
        for kind, err, sec in ex.map(_warm_case, specs, chunksize=2):
            errors += err is not None
            if err:
                log(f"warm-up error ({kind}): {err[:300]}")
    log(f"warm-up: {len(specs)} launches in {jobs} processes, {time.perf_counter() - t0:.0f} s,"
        f" {errors} errors")


# ------------------------------------------------------------------------- correctness

def correctness(problems, emit, log):
    import torch
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for p in problems:
        _guarded(lambda p=p: _check_one(p, dev, sms, emit, log), emit, log)


def _check_one(p, dev, sms, emit, log):
    import torch
    import spak
    from spak.core.metrics import fraction_bit_identical, max_abs, nonfinite_count, rel_l2
    from spak.cpu.simrun_decode import simulate_decode
    from spak.families.fmha_decode import FAMILY
    inp = FAMILY.make_inputs(p, seed=1)
    t = {k: _torch(v, dev) for k, v in inp.items()}
    args = (t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"])
    out = spak.fmha_kvcache(*args, block_table=t["block_table"], **_call_args(p))
    again = spak.fmha_kvcache(*args, block_table=t["block_table"], **_call_args(p))
    got = _numpy(out)
    ref = FAMILY.reference(p, inp)["out"]
    sim, _ = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=p.splits,
                             num_sms=sms)
    row = dict(kind="check", case=p.case_id, rel_l2=rel_l2(got, ref),
               max_abs=max_abs(got, ref), nonfinite=nonfinite_count(got),
               gate=FAMILY.gate(p), sim_identical=fraction_bit_identical(got, sim, p.dtype),
               deterministic=bool(torch.equal(out, again)), elements=int(got.size))
    row["passed"] = (row["nonfinite"] == 0 and row["rel_l2"] <= row["gate"])
    emit(row)
    log(f"check {p.case_id:60s} rel {row['rel_l2']:.2e} sim {row['sim_identical']:.4%} "
        f"{'PASS' if row['passed'] else 'FAIL'}")


def graph_and_compile(emit, log):
    """The op under CUDA-graph capture (replayed with new inputs) and torch.compile."""
    import torch
    import spak
    dev = torch.device("cuda")
    B, Hq, Hkv, D, page, Sk = 4, 32, 8, 128, 16, 4096
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.float16)
    k = torch.randn(B * Sk // page, page, Hkv, D, device=dev, dtype=torch.float16)
    v = torch.randn_like(k)
    bt = torch.randperm(B * Sk // page, device=dev, dtype=torch.int32).view(B, -1)
    lens = torch.tensor([4096, 100, 1, 2049], device=dev, dtype=torch.int32)
    f = lambda: spak.fmha_kvcache(q, k, v, lens, block_table=bt)  # noqa: E731
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = f()
    q.copy_(torch.randn_like(q))
    lens.copy_(torch.tensor([7, 4000, 33, 0], device=dev, dtype=torch.int32))
    g.replay()
    eager = f()
    ok_graph = bool(torch.equal(out, eager))
    comp = torch.compile(lambda *a: spak.fmha_kvcache(*a[:4], block_table=a[4]),
                         backend="aot_eager")
    ok_compile = bool(torch.equal(comp(q, k, v, lens, bt), eager))
    emit(dict(kind="graph_compile", graph_replay_equal=ok_graph, compile_equal=ok_compile))
    log(f"CUDA graph replay == eager: {ok_graph}; torch.compile == eager: {ok_compile}")


# ------------------------------------------------------------------------------ timing

def _graph_time(fn_list, reps=20):
    """Median ms per call: the calls captured in one CUDA graph, replayed `reps` times;
    eager with events if capture fails."""
    import torch
    for fn in fn_list:
        fn()
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for fn in fn_list:
                fn()
        run, how = g.replay, "graph"
    except Exception:  # noqa: BLE001 -- eager fallback, recorded
        torch.cuda.synchronize()

        def run():
            for fn in fn_list:
                fn()
        how = "eager"
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / len(fn_list))
    return float(np.median(times)), how


def copy_ceiling(emit, log):
    import torch
    n = 2 * 2**30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.random_(0, 255)
    ms, _ = _graph_time([lambda: dst.copy_(src)], reps=10)
    gbs = 2 * n / ms / 1e6
    emit(dict(kind="copy", bytes=2 * n, ms=ms, gbs=gbs))
    log(f"device-to-device copy of 2 GiB: {ms:.3f} ms, {gbs:.0f} GB/s (read + write)")
    del src, dst
    return gbs


def _make_copies(c, n, dev):
    import torch
    dt = torch.float16 if c["dtype"] == "fp16" else torch.bfloat16
    B, Sq, Hq, Hkv, D, Sk, page = (c[k] for k in ("B", "Sq", "Hq", "Hkv", "D", "Sk", "page"))
    copies = []
    for _ in range(n):
        q = torch.randn(B, Sq, Hq, D, device=dev, dtype=dt)
        if page:
            per = -(-Sk // page)
            k = torch.randn(B * per, page, Hkv, D, device=dev, dtype=dt)
            v = torch.randn_like(k)
            bt = torch.randperm(B * per, device=dev, dtype=torch.int32).view(B, per)
            # the SDPA peer's contiguous gather of the same cache (outside the timing)
            kg = k[bt.long()].reshape(B, per * page, Hkv, D)[:, :Sk]
            vg = v[bt.long()].reshape(B, per * page, Hkv, D)[:, :Sk]
        else:
            k = torch.randn(B, Sk, Hkv, D, device=dev, dtype=dt)
            v = torch.randn_like(k)
            bt, kg, vg = None, k, v
        copies.append(dict(q=q, k=k, v=v, bt=bt, qs=q.transpose(1, 2).contiguous(),
                           ks=kg.transpose(1, 2).contiguous(), vs=vg.transpose(1, 2).contiguous()))
    lens = torch.full((B,), Sk, dtype=torch.int32, device=dev)
    return copies, lens


def time_case(c, emit, log, peers=True, extra=None):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import spak
    dev = torch.device("cuda")
    kv_bytes = c["B"] * c["Sk"] * c["Hkv"] * c["D"] * 4
    qo_bytes = 2 * c["B"] * c["Sq"] * c["Hq"] * c["D"] * 2
    n = max(1, min(8, math.ceil(L2_BYTES / kv_bytes)))
    copies, lens = _make_copies(c, n, dev)
    causal = c["Sq"] > 1
    label = (f"{c['B']}x{c['Hq']}:{c['Hkv']}x{c['Sq']}:{c['Sk']}x{c['D']}"
             f"{'/page%d' % c['page'] if c['page'] else ''}/{c['dtype']}")
    res = {}
    for name, cfg in [("spak", {})] + list((extra or {}).items()):
        fns = [lambda x=x, cfg=cfg: spak.fmha_kvcache(x["q"], x["k"], x["v"], lens,
                                                      block_table=x["bt"], is_causal=causal,
                                                      **cfg) for x in copies]
        try:
            res[name] = _graph_time(fns)
        except Exception as e:  # noqa: BLE001
            res[name] = (float("nan"), f"error {type(e).__name__}: {str(e)[:200]}")
    backends = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION,
                "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}
    # the peers read the same gathered [B, Hkv, L, D] cache whatever our layout: once
    for name, be in (backends.items() if peers and c["page"] == 0 else ()):
        def sdpa(x, be=be):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(x["qs"], x["ks"], x["vs"],
                                                      enable_gqa=c["Hq"] != c["Hkv"])
        try:
            res[name] = _graph_time([lambda x=x: sdpa(x) for x in copies])
        except Exception as e:  # noqa: BLE001
            res[name] = (float("nan"), f"error {type(e).__name__}: {str(e)[:120]}")
    row = dict(kind="time", label=label, **c, kv_bytes=kv_bytes, copies=n,
               ms={k: v[0] for k, v in res.items()}, how={k: v[1] for k, v in res.items()},
               gbs={k: (kv_bytes + qo_bytes) / v[0] / 1e6 for k, v in res.items()})
    emit(row)
    best = min((v[0] for k, v in res.items() if k.startswith("sdpa") and v[0] == v[0]),
               default=float("nan"))
    log(f"time {label:36s} spak {row['gbs']['spak']:7.0f} GB/s ({res['spak'][0] * 1e3:8.1f} us)"
        + (f"  best sdpa {(kv_bytes + qo_bytes) / best / 1e6:7.0f} GB/s" if best == best else "")
        + "".join(f"  {k} {row['gbs'][k]:7.0f}" for k in (extra or {})))
    del copies
    torch.cuda.empty_cache()
    return row


# ------------------------------------------------------------------------------ summary

def summary(rows, copy_gbs) -> str:
    lines = ["# decode bench summary", ""]
    checks = [r for r in rows if r["kind"] == "check"]
    if checks:
        n_ok = sum(r["passed"] for r in checks)
        el = sum(r["elements"] for r in checks)
        ident = sum(r["sim_identical"] * r["elements"] for r in checks) / max(el, 1)
        det = all(r["deterministic"] for r in checks)
        lines += [f"correctness: {n_ok}/{len(checks)} cases within the float64 gates, no NaN; "
                  f"simulator bit-identical {ident:.4%} of {el} output elements; "
                  f"run-to-run identical: {det}", ""]
        lines += ["| case | rel L2 | gate | sim identical | pass |", "|---|---|---|---|---|"]
        lines += [f"| {r['case']} | {r['rel_l2']:.2e} | {r['gate']:g} | {r['sim_identical']:.4%} "
                  f"| {'yes' if r['passed'] else 'NO'} |" for r in checks]
        lines.append("")
    times = [r for r in rows if r["kind"] == "time"]
    if times:
        lines += [f"copy ceiling (2 GiB device-to-device, read + write): {copy_gbs:.0f} GB/s", "",
                  "| shape | spak GB/s | / copy | best SDPA GB/s | SDPA / copy | spak / best SDPA |",
                  "|---|---|---|---|---|---|"]
        sdpa = {}
        for r in times:
            if r["page"] == 0:
                sdpa[_shape_key(r)] = max((v for k, v in r["gbs"].items()
                                           if k.startswith("sdpa") and v == v), default=float("nan"))
        for r in times:
            g, sd = r["gbs"], sdpa.get(_shape_key(r), float("nan"))
            lines.append(f"| {r['label']} | {g['spak']:.0f} | {g['spak'] / copy_gbs:.2f} | "
                         f"{sd:.0f} | {sd / copy_gbs:.2f} | {g['spak'] / sd:.2f} |")
    knobs = [r for r in times if len(r["gbs"]) > 4 or r.get("extra")]
    if knobs:
        names = [k for k in knobs[0]["gbs"] if not k.startswith("sdpa")]
        lines += ["", "knobs (GB/s): " + ", ".join(names), "",
                  "| shape | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        lines += [f"| {r['label']} | " + " | ".join(f"{r['gbs'].get(n, float('nan')):.0f}"
                                                  for n in names) + " |" for r in knobs]
    return "\n".join(lines)


def _task(task):
    """One task in the worker process: (rows, log lines)."""
    import torch
    rows, logs = [], []
    kind = task[0]
    if kind == "check":
        from spak.families.fmha_decode import FAMILY
        dev = torch.device("cuda")
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        _check_one(FAMILY.parse(task[1]), dev, sms, rows.append, logs.append)
    elif kind == "graph":
        graph_and_compile(rows.append, logs.append)
    elif kind == "copy":
        copy_ceiling(rows.append, logs.append)
    else:
        time_case(task[1], rows.append, logs.append, extra=task[1].get("extra"))
    torch.cuda.synchronize()
    return rows, logs


def run_tasks(tasks, emit, log):
    """Every task in one worker process; a CUDA fault poisons a process's context, so the
    worker is replaced after one and the run goes on with the next task."""
    import multiprocessing as mp
    from concurrent.futures.process import BrokenProcessPool
    ex = None
    for task in tasks:
        if ex is None:
            ex = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))
        try:
            rows, logs = ex.submit(_task, task).result(timeout=300)
            for r in rows:
                emit(r)
            for line in logs:
                log(line)
        except Exception as e:  # noqa: BLE001 -- recorded, the run goes on
            msg = f"{type(e).__name__}: {str(e)[:400]}"
            emit(dict(kind="error", task=str(task)[:300], error=msg))
            log(f"ERROR in {str(task)[:120]}: {msg}")
            if isinstance(e, BrokenProcessPool) or "CUDA" in msg or "Accelerator" in msg:
                ex.shutdown(wait=False, cancel_futures=True)
                ex = None
    if ex is not None:
        ex.shutdown()


def _guarded(phase, emit, log):
    """Run one phase; an exception is recorded and the run goes on."""
    if phase is None:
        return
    try:
        phase()
    except Exception as e:  # noqa: BLE001
        import traceback
        emit(dict(kind="error", error=f"{type(e).__name__}: {e}"))
        log("ERROR " + traceback.format_exc()[-1500:])


def _shape_key(r):
    return tuple(r[k] for k in ("B", "Hq", "Hkv", "Sq", "Sk", "D", "dtype"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--skip-checks", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import torch
    rows = []
    rows_f = open(os.path.join(args.out, "rows.jsonl"), "a")

    def emit(row):
        rows.append(row)
        rows_f.write(json.dumps(row, default=str) + "\n")
        rows_f.flush()

    def log(msg):
        print(msg, flush=True)

    from spak.results.provenance import commit_label
    props = torch.cuda.get_device_properties(0)
    emit(dict(kind="env", gpu=torch.cuda.get_device_name(0), sms=props.multi_processor_count,
              torch=torch.__version__, commit=commit_label(), date=time.strftime("%Y-%m-%d %H:%M"),
              argv=sys.argv[1:]))
    log(f"{rows[-1]}")
    problems = [] if args.skip_checks else check_problems(args.quick)
    grid = timing_grid(args.quick)
    if not args.no_warm:
        warm_up(problems, grid, args.jobs, log)
    tasks = [("check", p.case_id) for p in problems]
    tasks += [("graph",)] if problems else []
    tasks += [("copy",)] + [("time", c) for c in grid]
    run_tasks(tasks, emit, log)
    copies = [r["gbs"] for r in rows if r["kind"] == "copy"]
    copy_gbs = copies[-1] if copies else float("nan")
    text = summary(rows, copy_gbs)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
