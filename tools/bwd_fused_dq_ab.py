"""The fused-dQ backward (issue 35: tiles DQ_FUSED, kernel fused_dq of the fmha_bwd family)
against the three-launch backward and SDPA's cuDNN and flash backward, in one run on one
GPU, on the training shapes. On a GPU:

    python tools/bwd_fused_dq_ab.py [--dtypes fp16 bf16] [--target-s 0.12] [--reps 2]
        [--shapes SHAPE ...] [--no-check] [--out results.jsonl] [--budget-s 100]

Per problem (the family's input set: the fused forward's out and LSE, N(0, 1) dout):
providers "cur" (the three-launch backward at the tuned store's config, what spak.fmha
runs), "fused1" (the same config with DQ_FUSED 1; with --parts2 also "fused2", DQ_FUSED 2:
dQ's columns in two parts), "sdpa-cudnn", "sdpa-flash" (the harness's peers: SDPA's backward through
autograd, its forward run once). Timing: do_bench's method (spak.device.timing.
time_flushed: an L2 flush before each call, the call alone between CUDA events), in
``--reps`` rounds of rotated provider order; a provider's time is the median over rounds
of each round's median. Checks: each fused provider called twice into fresh NaN-filled
gradients gives the same bits (deterministic); fused1 and fused2 give the same bits (the
simulator says so; --parts2); with the float64 reference (not --no-check) every provider's worst
relative L2 over dQ, dK, dV and the fused ones' ratio to cuDNN's. The simulator's bits
are `spak run --family fmha_bwd --kernel fused_dq`'s (.gpujobs/i35.sh runs both).

The prediction recorded before any GPU ran it is in docs/fmha-training.md ("The fused-dQ
backward").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the backward sweep's training shapes (docs/fmha-training.md) less D 256, where the fused
#: pass does not apply (it needs DKV_SPLIT 1)
SHAPES = ["4x32:8x4096x128/causal", "1x32:8x16384x128/causal", "16x32:8x1000x128/causal",
          "4x28:4x4096x128/causal", "16x12x1024x64/causal", "32x12x512x64/noncausal",
          "4x32x4096x96/causal"]
OURS = {"cur": ("fused", {}), "fused1": ("fused_dq", {"DQ_FUSED": 1}),
        "fused1e": ("fused_dq", {"DQ_FUSED": 1, "DQ_EARLY": 1})}
#: --parts2: also DQ_FUSED 2 (dQ's columns in two parts; tileiras 13.4 fails to compile it
#: non-causal at D 128)
PARTS2 = {"fused2": ("fused_dq", {"DQ_FUSED": 2})}
PEERS = ("sdpa-cudnn", "sdpa-flash")


def _bits_equal(a: dict, b: dict) -> bool:
    import torch
    return all(torch.equal(a[n].view(torch.int16), b[n].view(torch.int16))
               for n in ("dq", "dk", "dv"))


def _providers(fam, p, x, device):
    """{name: (timed fn, outputs fn, context)}: our calls planned once; the peers'."""
    base = fam.gpu_config("fused", p, device)
    out = {}
    for name, (kernel, extra) in OURS.items():
        call = fam.gpu_call(kernel, p, x, {**base, **extra})
        out[name] = (call, lambda c=call: c.outputs, None)
    for name, peer in fam.peer_calls(p, x, names=PEERS).items():
        box = {}

        def run(peer=peer, box=box):
            box["raw"] = peer.run(x)
        out[name] = (run, lambda peer=peer, box=box: peer.conform(peer.outputs(box["raw"])),
                     peer.context)
    return out


def _check(fam, p, x, prov, row, with_ref: bool, device):
    """First calls, determinism, fused1 == fused2, errors vs float64."""
    import torch
    outs = {}
    for name, (fn, get, ctx) in prov.items():
        try:
            if ctx is None:
                fn()
            else:
                with ctx():
                    fn()
            torch.cuda.synchronize()
            outs[name] = {k: v.clone() for k, v in get().items()}
        except Exception as e:  # noqa: BLE001 -- a provider that fails is a row note
            row.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:300]
    base = fam.gpu_config("fused", p, device)
    for name in ("fused1", "fused1e", "fused2"):
        if name in outs:
            again = fam.gpu_call(OURS[name][0], p, x, {**base, **OURS[name][1]})
            again()
            torch.cuda.synchronize()
            row[f"{name}_deterministic"] = _bits_equal(outs[name], again.outputs)
    if "fused1" in outs and "fused2" in outs:
        row["fused1_eq_fused2"] = _bits_equal(outs["fused1"], outs["fused2"])
    if with_ref:
        ref = fam.gpu_reference(p, x)
        from spak.core.metrics import rel_l2
        err = {n: max(rel_l2(o[g].double().cpu().numpy(), ref[g].cpu().numpy())
                      for g in ("dq", "dk", "dv")) for n, o in outs.items()}
        row["rel_l2"] = err
        if err.get("sdpa-cudnn"):
            row["err_ratio_vs_cudnn"] = {n: err[n] / err["sdpa-cudnn"] for n in err
                                         if n in OURS}
    return outs


def _time(prov, reps: int, target_s: float, device, errors: dict) -> dict:
    from spak.device.timing import time_flushed
    names = [n for n in prov]
    per = {n: [] for n in names}
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            fn, _, ctx = prov[n]
            try:
                if ctx is None:
                    st = time_flushed(lambda i: fn(), 1, target_s=target_s, device=device)
                else:
                    with ctx():
                        st = time_flushed(lambda i: fn(), 1, target_s=target_s,
                                          device=device)
                per[n].append(st["ms_median"])
            except Exception as e:  # noqa: BLE001 -- a row note
                errors[n] = f"timing: {type(e).__name__}: {e}"[:300]
    return {n: statistics.median(v) for n, v in per.items() if v}


def _line(text, dt, row) -> str:
    ms, tf = row.get("ms", {}), row.get("tflops", {})
    ours = [n for n in OURS if n != "cur"]
    parts = [f"{n} {tf[n]:.0f}" for n in ("cur", *ours, "sdpa-cudnn", "sdpa-flash") if n in tf]
    s = f"{dt} {text}: TFLOPS " + ", ".join(parts)
    if "cur" in ms:
        s += "; time/cur " + ", ".join(f"{n} {ms[n] / ms['cur']:.3f}" for n in ours if n in ms)
    if "sdpa-cudnn" in tf:
        s += "; /cuDNN " + ", ".join(f"{n} {tf[n] / tf['sdpa-cudnn']:.3f}"
                                     for n in ("cur", *ours) if n in tf)
    for k in (*(f"{n}_deterministic" for n in ours), "fused1_eq_fused2"):
        if k in row:
            s += f"; {k} {row[k]}"
    if "err_ratio_vs_cudnn" in row:
        s += "; err/cuDNN " + ", ".join(f"{n} {v:.2f}"
                                        for n, v in row["err_ratio_vs_cudnn"].items())
    if row.get("errors"):
        s += f"; errors {row['errors']}"
    return s


def _precompile(fam, a) -> int:
    """tools/precompile.py's build (one process and CUDA context per worker) on the compile
    units of every (problem, our provider) at the exact config the timing run uses."""
    import multiprocessing as mp
    from spak.tune.space import config_id
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import precompile
    units = {}
    for dt in a.dtypes:
        for text in a.shapes:
            p = fam.parse(f"{text}/{dt}")
            base = fam.gpu_config("fused", p, a.device)
            for kernel, extra in OURS.values():
                cfg = {**base, **extra}          # as _providers plans it
                u = fam.compile_unit(kernel, p, cfg, config_id(cfg, fam.space_keys))
                if u is not None:
                    units.setdefault(u["unit_id"], {**u, "family": fam.name})
    todo = list(units.values())
    t0, bad = time.time(), 0
    print(f"{len(todo)} compile units, {a.precompile} processes", flush=True)
    with mp.get_context("spawn").Pool(max(1, min(a.precompile, len(todo)))) as pool:
        for case, status, secs in pool.imap_unordered(precompile.build, todo):
            bad += status != "ok"
            print(f"{secs:6.1f} s  {status:<4} {case}", flush=True)
    print(f"precompiled {len(todo) - bad}/{len(todo)} in {time.time() - t0:.1f} s", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--target-s", type=float, default=0.12)
    ap.add_argument("--no-check", action="store_true", help="no float64 reference")
    ap.add_argument("--parts2", action="store_true", help="also time DQ_FUSED 2")
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="start no new problem after this many seconds")
    ap.add_argument("--out", default=None, help="append one JSON row per problem")
    ap.add_argument("--precompile", type=int, default=0, metavar="JOBS",
                    help="only fill cuTile's disk cache with every provider's kernels, "
                    "JOBS processes (tools/precompile.py's build on the exact configs)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only under the tests' "
                    "simulated launch (tests/test_bwd_loop_cpu.py)")
    a = ap.parse_args(argv)
    if a.parts2:
        OURS.update(PARTS2)
    import torch
    from spak import families
    fam = families.get("fmha_bwd")
    if a.precompile:
        return _precompile(fam, a)
    t0 = time.time()
    gpu = torch.cuda.get_device_name(0) if a.device == "cuda" else a.device
    print(gpu, torch.__version__, flush=True)
    for dt in a.dtypes:
        for text in a.shapes:
            if time.time() - t0 > a.budget_s:
                print(f"{dt} {text}: not run (budget)", flush=True)
                continue
            p = fam.parse(f"{text}/{dt}")
            row = {"case": p.case_id, "dtype": dt, "gpu": gpu}
            x = prov = None
            try:
                x = fam.gpu_input_sets(p, 0, 1, a.device)[0]
                prov = _providers(fam, p, x, a.device)
                _check(fam, p, x, prov, row, not a.no_check, a.device)
                row["ms"] = _time(prov, a.reps, a.target_s, a.device,
                                  row.setdefault("errors", {}))
                row["tflops"] = {n: fam.flops(p) / (ms * 1e9) for n, ms in row["ms"].items()}
            except Exception as e:  # noqa: BLE001 -- one problem failing stops nothing
                row.setdefault("errors", {})["problem"] = f"{type(e).__name__}: {e}"[:300]
            print(_line(text, dt, row), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            del x, prov
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
