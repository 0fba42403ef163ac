"""Why does do_bench read spak.fmha slower than the same kernel launched directly (issue 17)?

In results/fwd-round4-ab-h100-2026-11-24d, at 16x16x2048x64 causal spak.fmha read 325 TFLOPS
and gpu/kernels/fused.py launched at spak.fmha's config through the bench's variant path
("same") 358, in one do_bench run; at 32x32x512x64 causal the two agreed. This probe times
both paths three ways on a few shapes, on one GPU, in one process:
  - kernel: the GPU kernel's own duration (torch.profiler, mean over the calls);
  - do_bench: triton.testing.do_bench median (L2 flush before each call), as the bench;
  - events: CUDA events around 20 back-to-back calls (no flush), per call.
If the kernels' durations agree and do_bench differs, the difference is in how the call
reaches the GPU (host path / what runs between the flush and the kernel), not the kernel.

    python ci/fwd_path_probe.py [--shapes 16x16x2048x64/causal ...] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "ci"))

DEFAULT_SHAPES = ["16x16x2048x64/causal", "8x32x2048x64/causal", "16x16x2048x64/noncausal",
                  "32x32x512x64/causal"]


def parse_shape(text: str):
    dims, _, mode = text.partition("/")
    B, H, S, D = (int(x) for x in dims.split("x"))
    if mode not in ("causal", "noncausal"):
        raise ValueError(f"shape {text!r}: expected BxHxSxD/causal or /noncausal")
    return B, H, S, D, mode == "causal"


def kernel_ms(fn, calls: int = 20) -> dict:
    """Mean GPU duration (ms) of each kernel name the calls launched, from torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" and ev.count >= calls:
            t = getattr(ev, "device_time_total", None) or ev.cuda_time_total
            out[ev.key[:60]] = t / ev.count / 1e3
    return out


def events_ms(fn, calls: int = 20) -> float:
    import torch
    fn()
    torch.cuda.synchronize()
    reps = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        reps.append(a.elapsed_time(b) / calls)
    return statistics.median(reps)


def probe(shape: str, bench) -> dict:
    import torch
    import spak
    import fwd_peers_bench as fpb
    B, H, S, D, causal = parse_shape(shape)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)

    class Spec:                          # what fpb.spak_config reads
        pass
    spec = Spec()
    spec.dtype, spec.D, spec.causal, spec.Sk, spec.B, spec.Hq, spec.Sq = "fp16", D, causal, S, B, H, S
    config = fpb.spak_config(spec)
    import spak.gpu.kernels.fused as mod         # the kernel spak.fmha launches (a package module)
    paths = {"spak.fmha": lambda: spak.fmha(q, k, v, is_causal=causal),
             "direct": fpb.variant_launch(mod, q, k, v, out, causal, 1.0 / math.sqrt(D), config)}
    flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    row = {"shape": shape, "config": config, "paths": {}}
    same = torch.equal(paths["spak.fmha"](), (paths["direct"](), out)[1])
    row["bits_equal"] = bool(same)
    for name, fn in paths.items():
        kms = kernel_ms(fn)
        dms = bench(fn)
        ems = events_ms(fn)
        row["paths"][name] = {"kernel_ms": kms, "do_bench_ms": dms, "events_ms": ems,
                              "do_bench_tflops": flops / dms / 1e9,
                              "events_tflops": flops / ems / 1e9}
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    for s in args.shapes:
        parse_shape(s)
    import torch
    import fwd_peers_bench as fpb
    name, bench = fpb.make_bench()
    rows = []
    print(f"GPU {torch.cuda.get_device_name()}, harness {name}")
    for s in args.shapes:
        row = probe(s, bench)
        rows.append(row)
        print(f"{s}  config {row['config']}  bits equal: {row['bits_equal']}")
        for p, r in row["paths"].items():
            ks = ", ".join(f"{k} {v * 1e3:.1f} us" for k, v in r["kernel_ms"].items())
            print(f"  {p:10s} do_bench {r['do_bench_tflops']:6.1f} TFLOPS  events "
                  f"{r['events_tflops']:6.1f}  kernels: {ks}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
