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
        [--orders flash,spak.fmha,direct ...]

--orders (round 5, results/fwd-round5-h100-2026-11-24e): in the peers bench spak.fmha is
always timed right after SDPA flash (the rotation keeps neighbours), and there it read up to
19% slower than the same kernel launched directly, while SPAK's own timer agreed with the
direct launch. Each order is a comma list of providers (spak.fmha, direct, flash, cudnn)
timed by do_bench one after another, the whole list twice: if spak.fmha is slow only after
flash, the bench's reading is a neighbour effect, not the call path.
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


def _problem(B, H, S, D, causal, seed):
    """fp16 q, k, v [B, H, S, D] (random, seeded), an output buffer, spak.fmha's config."""
    import torch
    import fwd_peers_bench as fpb
    torch.manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))

    class Spec:                          # what fpb.spak_config reads
        pass
    spec = Spec()
    spec.dtype, spec.D, spec.causal, spec.Sk, spec.B, spec.Hq, spec.Sq = \
        "fp16", D, causal, S, B, H, S
    return q, k, v, torch.empty_like(q), fpb.spak_config(spec)


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
    q, k, v, out, config = _problem(B, H, S, D, causal, seed=0)
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


def sdpa_fn(q, k, v, causal: bool, backend_name: str):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    F = torch.nn.functional

    def fn():
        with sdpa_kernel(backend[backend_name]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fn


def order_probe(shape: str, bench, orders: list[str]) -> dict:
    """do_bench TFLOPS of each provider in each order (the list timed twice in a row)."""
    import spak
    import fwd_peers_bench as fpb
    import spak.gpu.kernels.fused as mod
    B, H, S, D, causal = parse_shape(shape)
    q, k, v, out, config = _problem(B, H, S, D, causal, seed=1)
    fns = {"spak.fmha": lambda: spak.fmha(q, k, v, is_causal=causal),
           "direct": fpb.variant_launch(mod, q, k, v, out, causal, 1.0 / math.sqrt(D), config),
           "flash": sdpa_fn(q, k, v, causal, "flash"), "cudnn": sdpa_fn(q, k, v, causal, "cudnn")}
    flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    row = {"shape": shape, "config": config, "orders": []}
    for order in orders:
        names = order.split(",")
        unknown = [n for n in names if n not in fns]
        if unknown:
            raise ValueError(f"--orders {order!r}: unknown provider(s) {unknown}; "
                             f"expected some of {sorted(fns)}")
        reps = [[(n, flops / bench(fns[n]) / 1e9) for n in names] for _ in range(2)]
        row["orders"].append({"order": order, "tflops": reps})
        print(f"  {order:32s} " + " | ".join(
            " ".join(f"{n} {t:.0f}" for n, t in rep) for rep in reps), flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--orders", nargs="+", default=None,
                    help="instead of the path probe: do_bench providers in these orders "
                         "(comma lists of spak.fmha, direct, flash, cudnn)")
    args = ap.parse_args(argv)
    for s in args.shapes:
        parse_shape(s)
    import torch
    import fwd_peers_bench as fpb
    name, bench = fpb.make_bench()
    rows = []
    print(f"GPU {torch.cuda.get_device_name()}, harness {name}")
    if args.orders:
        for s in args.shapes:
            print(s, flush=True)
            rows.append(order_probe(s, bench, args.orders))
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
        return 0
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
