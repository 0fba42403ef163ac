"""GPU checks that need no sweep: tuned vs default (issue 4), a fuzz vs float64 (issue 8),
and one shape past 2^31 elements (64-bit indexing, issue 8). One process, one GPU.

    source .carry/setup.sh && python ci/gpu_checks.py --out $OUT [--fuzz 200] [--big]

* tuned-vs-default: every standard shape (--dtype: fp16, bf16 or all), spak.fmha with the tuned-config store vs
  spak.fmha with the default tiles, timed alternately in the same process, plus SDPA cuDNN.
* fuzz: N random valid problems (batch, GQA group, Sq != Sk, S not a tile multiple, D,
  fp16/bf16, causal, additive/bool masks with fully masked rows, scales incl. 0 and < 0)
  against a float64 reference computed on the GPU; gate rel L2 <= 1e-3 fp16 / 8e-3 bf16,
  no NaN/Inf, rows with no allowed key exactly 0.
* big: B=1, H=80, S=262144, D=128, causal (Q alone is 2.7e9 elements): vs SDPA flash, and
  the last 128 rows of head 0 vs float64.
Rows are appended to JSON-lines files under --out (fsync'd); a summary prints last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spak.device.timing import time_alternating, time_events  # noqa: E402
from spak.core.metrics import GATES  # noqa: E402
from spak.attention.problems import ProblemSpec, select_cases  # noqa: E402


def _writer(path):
    f = open(path, "a")

    def emit(row):
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return emit


def ref_f64(q, k, v, mask, causal, scale):
    """float64 attention on the GPU, bottom-right causal, dead rows -> 0 (head by head)."""
    import torch
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    g = Hq // Hkv
    out = torch.zeros(B, Hq, Sq, v.shape[3], dtype=torch.float64, device=q.device)
    allowed = None
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        allowed = j <= i + (Sk - Sq)
    for b in range(B):
        for h in range(Hq):
            s = (q[b, h].double() @ k[b, h // g].double().T) * scale
            if mask is not None:
                mb = mask[b if mask.shape[0] > 1 else 0, h if mask.shape[1] > 1 else 0]
                s = s + (mb.double() if mb.dtype != torch.bool
                         else torch.where(mb, 0.0, -math.inf).double().to(q.device))
            if allowed is not None:
                s = s.masked_fill(~allowed, -math.inf)
            m = s.amax(-1, keepdim=True)
            dead = torch.isinf(m) & (m < 0)
            p = torch.exp(s - torch.where(dead, torch.zeros_like(m), m))
            l = p.sum(-1, keepdim=True)
            o = (p @ v[b, h // g].double()) / torch.where(l > 0, l, torch.ones_like(l))
            out[b, h] = torch.where(dead, torch.zeros_like(o), o)
    return out


def rel_l2(a, b):
    return float((a.double() - b).norm() / max(b.norm(), 1e-300))


def tuned_vs_default(out_dir, args):
    import torch
    import spak
    from spak.gpu.plan import default_tiles
    from torch.nn.attention import SDPBackend, sdpa_kernel
    emit = _writer(out_dir / "tuned-vs-default.jsonl")
    rows = []
    for spec in select_cases(["standard"], dtype=args.dtype, causal="both"):
        g = torch.Generator(device="cuda").manual_seed(spec.Sq * 7 + spec.D + spec.causal)
        dt = torch.float16 if spec.dtype == "fp16" else torch.bfloat16
        sets = [tuple(torch.randn(sh, device="cuda", dtype=dt, generator=g)
                      for sh in (spec.q_shape, spec.kv_shape, spec.kv_shape)) for _ in range(3)]
        dflt = default_tiles(spec.D, "sm_90", spec.causal)
        fns = {
            "tuned": lambda i: spak.fmha(*sets[i], is_causal=spec.causal),
            "default": lambda i: spak.fmha(*sets[i], is_causal=spec.causal, tiles=dflt),
        }
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            fns["sdpa_cudnn"] = lambda i: torch.nn.functional.scaled_dot_product_attention(
                *sets[i], is_causal=spec.causal)
            for fn in fns.values():                    # compile everything first
                fn(0)
            ms = time_alternating(fns, fns["sdpa_cudnn"], spec.Sq)   # order-debiased
        row = {"case": spec.case_id, "gpu": torch.cuda.get_device_name(),
               "date": time.strftime("%Y-%m-%d"), "default_tiles": dflt,
               **{f"{k}_ms": v for k, v in ms.items()},
               **{f"{k}_tflops": spec.flops / (v * 1e-3) / 1e12 for k, v in ms.items()}}
        row["tuned_over_default"] = ms["default"] / ms["tuned"]
        row["tuned_over_cudnn"] = ms["sdpa_cudnn"] / ms["tuned"]
        emit(row)
        rows.append(row)
        print(f"  {spec.case_id:<34} tuned {row['tuned_tflops']:6.1f}  default "
              f"{row['default_tflops']:6.1f}  cuDNN {row['sdpa_cudnn_tflops']:6.1f}  "
              f"tuned/default {row['tuned_over_default']:.3f}  tuned/cuDNN "
              f"{row['tuned_over_cudnn']:.3f}", flush=True)
        del sets
    for dtype in sorted({r["case"].split("/")[1] for r in rows}):
        mine = [r for r in rows if r["case"].split("/")[1] == dtype]
        worst = min(r["tuned_over_default"] for r in mine)
        ratios = [r["tuned_over_cudnn"] for r in mine]
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{dtype}: tuned vs default: worst {worst:.3f} over {len(mine)} shapes; "
              f"tuned/cuDNN geometric mean {gm:.3f} ({min(ratios):.3f} .. {max(ratios):.3f}), "
              f">= 1.0 on {sum(x >= 1.0 for x in ratios)}, >= 1.05 on "
              f"{sum(x >= 1.05 for x in ratios)}")


def fuzz(out_dir, n, seed=2026):
    import torch
    import spak
    emit = _writer(out_dir / "fuzz.jsonl")
    rnd = random.Random(seed)
    fails = 0
    for case in range(n):
        hkv = rnd.choice([1, 2, 4])
        spec = ProblemSpec(B=rnd.randint(1, 3), Hq=hkv * rnd.choice([1, 2, 4, 8]), Hkv=hkv,
                           Sq=rnd.choice([1, rnd.randint(2, 200), rnd.randint(200, 1500)]),
                           Sk=rnd.choice([1, rnd.randint(2, 200), rnd.randint(200, 1500)]),
                           D=rnd.choice([64, 128, 64, 128, 32, 96]),
                           dtype=rnd.choice(["fp16", "bf16"]), causal=rnd.random() < 0.5,
                           mask=rnd.choice([None, None, "additive", "bool"]))
        scale = rnd.choice([None, None, None, 0.0, -0.1, 0.02, 0.3])
        dt = torch.float16 if spec.dtype == "fp16" else torch.bfloat16
        g = torch.Generator(device="cuda").manual_seed(seed * 1000 + case)
        q, k, v = (torch.randn(sh, device="cuda", dtype=dt, generator=g)
                   for sh in (spec.q_shape, spec.kv_shape, spec.kv_shape))
        mask = None
        if spec.mask:
            keep = torch.rand((spec.B, 1, spec.Sq, spec.Sk), device="cuda", generator=g) >= 0.2
            keep[0, 0, spec.Sq // 2] = False
            mask = keep if spec.mask == "bool" else torch.randn(
                keep.shape, device="cuda", generator=g).masked_fill(~keep, -math.inf)
        row = {"case": spec.case_id, "scale": scale, "gate": GATES[spec.dtype]}
        try:
            o = spak.fmha(q, k, v, is_causal=spec.causal, scale=scale, attn_mask=mask,
                          enable_gqa=spec.Hq != spec.Hkv)
            s = 1 / math.sqrt(spec.D) if scale is None else scale
            r = ref_f64(q, k, v, mask, spec.causal, s)
            row.update(rel_l2=rel_l2(o, r), nonfinite=int((~torch.isfinite(o)).sum()),
                       dead_rows_nonzero=int(((r == 0).all(-1) & (o != 0).any(-1)).sum()))
            row["passed"] = (row["rel_l2"] <= row["gate"] and row["nonfinite"] == 0
                             and row["dead_rows_nonzero"] == 0)
        except Exception as e:  # noqa: BLE001 - a crash is a failed case, the fuzz goes on
            row.update(passed=False, error=f"{type(e).__name__}: {e}")
        fails += not row["passed"]
        emit(row)
        if not row["passed"]:
            print("  FAIL", row, flush=True)
    print(f"fuzz: {n - fails}/{n} passed")


def big(out_dir):
    import torch
    import spak
    from torch.nn.attention import SDPBackend, sdpa_kernel
    emit = _writer(out_dir / "big.jsonl")
    B, H, S, D = 1, 80, 262144, 128
    g = torch.Generator(device="cuda").manual_seed(31)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    row = {"case": f"{B}x{H}x{S}x{D}/fp16/causal", "elements_q": q.numel()}
    t0 = time.perf_counter()
    o = spak.fmha(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    row["spak_s"] = time.perf_counter() - t0
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        t0 = time.perf_counter()
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()
        row["sdpa_flash_s"] = time.perf_counter() - t0
    row["rel_l2_vs_sdpa_flash"] = rel_l2(o, ref.double())
    row["nonfinite"] = int((~torch.isfinite(o)).sum())
    rows = slice(S - 128, S)      # last rows of head 0 (and of head H-1): full key range
    for h in (0, H - 1):
        r = ref_f64(q[:, h:h + 1, rows], k[:, h:h + 1], v[:, h:h + 1], None, True, 1 / math.sqrt(D))
        row[f"rel_l2_f64_head{h}_last128"] = rel_l2(o[:, h:h + 1, rows], r)
    emit(row)
    print("big:", row)


def seed_graphs(out_dir):
    """Seed shapes (launch/occupancy-bound): us per call, eager and replayed from a CUDA
    graph, for spak.fmha and SDPA (default backend choice) in the same run."""
    import torch
    import spak
    emit = _writer(out_dir / "seed-graphs.jsonl")
    for (B, H, S, D), causal in [(s, c) for s in [(16, 16, 2048, 64), (2, 8, 512, 64),
                                                  (1, 8, 512, 64), (4, 16, 2048, 128)]
                                 for c in (False, True)]:
        g = torch.Generator(device="cuda").manual_seed(B * S + D)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16, generator=g)
                   for _ in range(3))
        row = {"case": f"{B}x{H}x{S}x{D}/fp16/{'causal' if causal else 'noncausal'}",
               "gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
        fns = {"spak": lambda: spak.fmha(q, k, v, is_causal=causal),
               "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
                   q, k, v, is_causal=causal)}
        for name, fn in fns.items():
            st = time_events(lambda i: fn(), 1, target_s=0.1)
            row[f"{name}_eager_us"] = st["ms_median"] * 1e3
            try:
                fn()
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
                graph.replay()
                torch.cuda.synchronize()
                st = time_events(lambda i: graph.replay(), 1, target_s=0.1)
                row[f"{name}_graph_us"] = st["ms_median"] * 1e3
            except Exception as e:  # noqa: BLE001 - recorded
                row[f"{name}_graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        emit(row)
        print("  " + "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in row.items() if k not in ("gpu", "date")), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--fuzz", type=int, default=200)
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--skip-tuned", action="store_true")
    ap.add_argument("--dtype", choices=("fp16", "bf16", "all"), default="fp16",
                    help="tuned-vs-default input dtype(s) (default fp16)")
    ap.add_argument("--seed-graphs", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    import torch
    print(torch.cuda.get_device_name(), time.strftime("%Y-%m-%d %H:%M"), flush=True)
    if not args.skip_tuned:
        tuned_vs_default(out, args)
    if args.fuzz:
        fuzz(out, args.fuzz)
    if args.big:
        big(out)
    if args.seed_graphs:
        seed_graphs(out)


if __name__ == "__main__":
    main()
