"""Issue 34g on one GPU: every entry point's eager host cost per call beside SDPA's
backends and NVIDIA's sample, in one process, with the new paths A/B'd against the old.

    source .carry/setup.sh && python tools/host_cost_i34g.py --out DIR [--n 2000]
    python tools/host_cost_i34g.py --dry-run --n 20       # the rows on the CPU, CUDA faked

Parts, each written to DIR/host_cost.json + host_cost.md as soon as it is done, each row
failing soft:
  1. eager rows (tools/host_cost_bench.eager_us: n calls back to back, one synchronize,
     best of 3 loops after 50 warm-up calls): spak.fmha 1x2x16x64 and 4x16x512x64 causal
     (new inline path; old: api.INLINE off), spak.fmha_kvcache 1x32:8 x 256 keys and
     spak.fmha_varlen 2 seqs (the same A/B), forward + backward 1x2x16x64 causal (new; the gradients
     allocated by the backward again: bwd_ready.PREALLOC_BYTES 0; the old inline path off;
     autograd's multithreading off), each beside SDPA cuDNN / flash / default and, for
     spak.fmha, NVIDIA's sample (+ torch.empty_like(out)) when .peers has it;
  2. the floor: ct.launch alone (a trivial kernel, no argument and 5 tensors + 8 scalars;
     spak.fmha's fused launch with its prepared arguments) and one output allocation
     (torch.empty / empty_like / new_empty);
  3. checks against float64, once each: spak.fmha at both shapes (3 calls: the general
     path, then the inline one; bits equal), and tools/host_cost_bench.gpu_checks (fwd+bwd
     gradients over 3 steps with steps 1 and 3 bit-identical, decode at 256 / 512 keys,
     varlen);
  4. launches and tensor arguments per entry point call (ct.launch counted once).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import host_cost_bench as hb  # noqa: E402


def rows(torch, dev):
    """name -> row (hb.run_eager's forms) of part 1."""
    import spak
    from spak import api, bwd_ready
    F = torch.nn.functional
    old = hb._toggled([(api, "INLINE", False)])
    r = {}
    for B, H, S in ((1, 2, 16), (4, 16, 512)):
        q, k, v = (hb._rand(torch, dev, B, H, S, 64) for _ in range(3))
        t = f"fmha {B}x{H}x{S}x64 causal"
        fn = (lambda q=q, k=k, v=v: spak.fmha(q, k, v, is_causal=True))
        r[f"{t} | spak"] = fn
        r[f"{t} | spak old path (api.INLINE off)"] = hb._with(old, fn)
        r.update(hb._sdpa_rows(torch, F, t, lambda q=q, k=k, v=v:
                               F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        r[f"{t} | NVIDIA sample (+ torch.empty_like(out))"] = hb._sample_row(torch, q, k, v)
    qd = hb._rand(torch, dev, 1, 1, 32, 64)
    kc, vc = (hb._rand(torch, dev, 1, 256, 8, 64) for _ in range(2))
    lens = torch.tensor([256], dtype=torch.int32, device=dev)
    t = "kvcache 1x1x32:8 x256"
    r[f"{t} | spak"] = lambda: spak.fmha_kvcache(qd, kc, vc, lens)
    r[f"{t} | spak old path (api.INLINE off)"] = hb._with(
        old, lambda: spak.fmha_kvcache(qd, kc, vc, lens))
    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (qd, kc, vc))
    r.update(hb._sdpa_rows(torch, F, t, lambda: F.scaled_dot_product_attention(
        qs, ks, vs, enable_gqa=True)))
    qv, kv, vv = (hb._rand(torch, dev, 40, 2, 64) for _ in range(3))
    cu = torch.tensor([0, 16, 40], dtype=torch.int32, device=dev)
    t = "varlen 2 seqs (16, 24) x2x64 causal"
    r[f"{t} | spak"] = lambda: spak.fmha_varlen(qv, kv, vv, cu, cu, 24, 24, is_causal=True)
    r[f"{t} | spak old path (api.INLINE off)"] = hb._with(old, lambda: spak.fmha_varlen(
        qv, kv, vv, cu, cu, 24, 24, is_causal=True))
    qp, kp, vp = (hb._rand(torch, dev, 2, 2, 24, 64) for _ in range(3))
    r.update(hb._sdpa_rows(torch, F, f"{t} (SDPA: padded 2x2x24)",
                           lambda: F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)))
    r.update(_train_rows(torch, dev, spak, F, bwd_ready, old))
    r["fmha 1x2x16x64 causal | spak (again, last)"] = r["fmha 1x2x16x64 causal | spak"]
    return r


def _train_rows(torch, dev, spak, F, bwd_ready, old):
    qg, kg, vg = (hb._rand(torch, dev, 1, 2, 16, 64, grad=True) for _ in range(3))
    do = hb._rand(torch, dev, 1, 2, 16, 64)

    def step():
        spak.fmha(qg, kg, vg, is_causal=True).backward(do)

    def sdpa_step():
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do)
    t, r = "fwd+bwd 1x2x16x64 causal", {}
    no_pre = hb._toggled([(bwd_ready, "PREALLOC_BYTES", 0)])
    r[f"{t} | spak"] = step
    r[f"{t} | spak, grads allocated by the backward (PREALLOC_BYTES 0)"] = hb._with(
        no_pre, step)
    r[f"{t} | spak, api.INLINE off and PREALLOC_BYTES 0"] = hb._with(
        lambda: hb._both(old(), no_pre()), step)
    r.update(hb._sdpa_rows(torch, F, t, sdpa_step))
    no_mt = lambda: torch.autograd.set_multithreading_enabled(False)   # noqa: E731
    r[f"{t} | spak, autograd multithreading off"] = hb._with(no_mt, step)
    r[f"{t} | SDPA default, autograd multithreading off"] = hb._with(no_mt, sdpa_step)
    return r


def floor_rows(torch, dev):
    """ct.launch alone and one output allocation (us per call)."""
    q1, k1, v1 = (hb._rand(torch, dev, 1, 2, 16, 64) for _ in range(3))
    r = hb.floor_rows(torch, dev, q1, k1, v1)
    shape = tuple(q1.shape)
    r["floor | torch.empty(shape, dtype=, device=)"] = lambda: torch.empty(
        shape, dtype=q1.dtype, device=q1.device)
    r["floor | torch.empty_like(q)"] = lambda: torch.empty_like(q1)
    r["floor | q.new_empty(shape)"] = lambda: q1.new_empty(shape)
    return r


def launch_counts(torch, cases) -> dict:
    """name -> {"launch": ct.launch calls, "tensor_arg": torch tensors passed} in one
    call (after two warm-up calls)."""
    import cuda.tile as ct
    real, seen, res = ct.launch, [], {}

    def count(stream, grid, kernel, args, **kw):
        seen.append(sum(isinstance(a, torch.Tensor) for a in args))
        return real(stream, grid, kernel, args, **kw)
    for name, fn in cases.items():
        try:
            fn()
            fn()
            seen.clear()
            ct.launch = count
            try:
                fn()
            finally:
                ct.launch = real
            res[f"launches | {name}"] = {"launch": len(seen), "tensor_arg": sum(seen)}
        except Exception as exc:                   # noqa: BLE001 -- the row says why
            res[f"launches | {name}"] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
        print(f"  launches | {name:<58} {res[f'launches | {name}']}", flush=True)
    return res


def fmha_checks(torch, dev) -> dict:
    """spak.fmha (1x2x16x64, 4x16x512x64 causal) against float64 SDPA: 3 calls (the
    general path, then the inline one), every output finite and within the fp16 gate,
    the bits of the three equal."""
    import spak
    from spak.core.metrics import gate_for
    res, F = {}, torch.nn.functional
    g = torch.Generator(device=dev).manual_seed(1)
    for B, H, S in ((1, 2, 16), (4, 16, 512)):
        name = f"check | fmha {B}x{H}x{S}x64 causal vs float64"
        try:
            q, k, v = (torch.randn(B, H, S, 64, device=dev, generator=g).half()
                       for _ in range(3))
            ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                 is_causal=True)
            outs = [spak.fmha(q, k, v, is_causal=True) for _ in range(3)]
            err = max(float((o.double() - ref).norm() / ref.norm()) for o in outs)
            ok = all(bool(torch.isfinite(o).all()) and torch.equal(o, outs[0]) for o in outs)
            res[name] = {"rel_l2_vs_f64": round(err, 6),
                         "pass": ok and err <= gate_for("fp16")}
        except Exception as exc:                   # noqa: BLE001
            res[name] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
        print(f"  {name:<58} {res[name]}", flush=True)
    return res


def _cases(torch, dev):
    """One call of each entry point (launch_counts' cases)."""
    import spak
    q, k, v = (hb._rand(torch, dev, 1, 2, 16, 64) for _ in range(3))
    qg, kg, vg = (hb._rand(torch, dev, 1, 2, 16, 64, grad=True) for _ in range(3))
    qd = hb._rand(torch, dev, 1, 1, 32, 64)
    kc, vc = (hb._rand(torch, dev, 1, 256, 8, 64) for _ in range(2))
    lens = torch.tensor([256], dtype=torch.int32, device=dev)
    qv, kv, vv = (hb._rand(torch, dev, 40, 2, 64) for _ in range(3))
    cu = torch.tensor([0, 16, 40], dtype=torch.int32, device=dev)
    return {"spak.fmha 1x2x16x64 causal": lambda: spak.fmha(q, k, v, is_causal=True),
            "fwd+bwd 1x2x16x64 causal": lambda: spak.fmha(
                qg, kg, vg, is_causal=True).backward(torch.ones_like(q)),
            "spak.fmha_kvcache 1x1x32:8 x256": lambda: spak.fmha_kvcache(qd, kc, vc, lens),
            "spak.fmha_varlen 2 seqs": lambda: spak.fmha_varlen(qv, kv, vv, cu, cu, 24, 24,
                                                               is_causal=True)}


def _rounds(torch, table: dict, args, eager: dict, checks: dict) -> None:
    """Every row timed in ``args.rounds`` interleaved rounds; each row's best in ``eager``,
    every round's figure in ``checks`` ("rounds | row")."""
    seen: dict = {}
    for r in range(max(1, args.rounds)):
        order = dict(reversed(list(table.items()))) if r % 2 else table
        for name, us in hb.run_eager(torch, order, args.n).items():
            seen.setdefault(name, []).append(us)
    for name in table:
        nums = [u for u in seen.get(name, []) if isinstance(u, (int, float))]
        eager[name] = min(nums) if nums else seen.get(name, ["failed"])[-1]
        checks[f"rounds | {name}"] = seen.get(name, [])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="host_cost_out")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--dry-run", action="store_true", help="the rows on the CPU, CUDA faked")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every row this many times, rounds interleaved (odd rounds in "
                         "reverse order), and keep each row's best: the first rows of a "
                         "single pass read slower (H200 09:30: the same spak.fmha call 21.2 "
                         "us first, 12.4 us last)")
    args = ap.parse_args(argv)
    import torch
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        return _dry_run(torch, args.n)
    dev = torch.device("cuda")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "n": args.n,
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(f"{meta['gpu']} torch {meta['torch']} {meta['date']}; us per eager call:")
    eager, checks = {}, {}
    for part in (lambda: _rounds(torch, rows(torch, dev), args, eager, checks),
                 lambda: eager.update(hb.run_eager(torch, floor_rows(torch, dev), args.n)),
                 lambda: checks.update(fmha_checks(torch, dev)),
                 lambda: checks.update(hb.gpu_checks(torch, dev)),
                 lambda: checks.update(launch_counts(torch, _cases(torch, dev)))):
        try:
            part()
        except Exception:                          # noqa: BLE001 -- the next part runs
            traceback.print_exc()
        hb.write(out, meta, eager, checks)
    print("\n" + hb.markdown(meta, eager, checks))
    return 0


def _dry_run(torch, n) -> int:
    """Parts 1 and 3 on CPU tensors under spak.cpu.host_cost.fake_cuda (SDPA's pinned
    backends, the sample and the floor's kernels need a GPU: those rows fail soft)."""
    from spak.cpu import host_cost as hc
    dev = torch.device("cpu")
    with hc.fake_cuda():
        res = hb.run_eager(torch, rows(torch, dev), n, sync=lambda: None)
        cnt = launch_counts(torch, _cases(torch, dev))
    print(json.dumps({**res, **cnt}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
