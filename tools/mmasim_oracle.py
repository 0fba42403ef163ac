"""SPAK's tensor-core models against MMA-Sim, bit for bit (issue 22).

    python tools/mmasim_oracle.py                          # the agreement table, all models
    python tools/mmasim_oracle.py --model sm_89 --cases 2  # one model, fewer cases
    python tools/mmasim_oracle.py --out results/mmasim-2026-11-24   # + agreement.json/.md

MMA-Sim (Microsoft, arXiv 2511.10909, `pip install mmasim==2.1.1`, the `test` extra) is a
bit-accurate model of tensor-core instructions that its authors validated on hardware.
It is a test-time oracle here: the simulator never imports it.

What is compared: `ct.mma(a, b, acc)` of fp16 or bf16 [64, K] x [K, 64] tiles with an fp32
accumulator, run by the simulator (`sim.launch` of gpu/probes' mma_probe under the named
model) against MMA-Sim's instruction for that model's GPU, issued the way the compiler
issues `ct.mma` (read from the SASS: one instruction per 16 columns of K, in ascending K,
each one's fp32 result the next one's accumulator):

    sm_90   Hopper         wgmma m64n64k16.f32.{f16,bf16}
    sm_120  RTX Blackwell  mma.sync m16n8k16.f32.{f16,bf16}.{f16,bf16}.f32
    sm_89   Ada Lovelace   mma.sync m16n8k16.f32.{f16,bf16}.{f16,bf16}.f32

For mma.sync the [64, 64] tile is the 4 x 8 grid of m16n8 instructions; MMA-Sim's `dpa`
evaluates all of them in one batched call (what its `__call__` does for one m16n8 tile;
`same_as_instruction_tiles` checks that on a few tiles). Input classes: normal, wide
exponents (the whole fp16/bf16 range; bf16 sums overflow fp32), subnormals, special values
(inf, -inf, NaN, zeros), cancellation with large accumulators, and sparse/tiny (zeros next
to bf16 products below 2^-133: MMA-Sim's zero-term exponent decides those).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

#: SPAK model -> (MMA-Sim architecture, instruction family)
ARCHS = {"sm_90": ("Hopper", "wgmma"), "sm_120": ("RTX Blackwell", "mma"),
         "sm_89": ("Ada Lovelace", "mma")}
CLASSES = ("normal", "wide", "subnormal", "special", "cancel", "sparse")
DTYPES = ("fp16", "bf16")
KS = (16, 32, 64)
M = N = 64


def _round(x: np.ndarray, dt: str) -> np.ndarray:
    """float64 -> the nearest fp16 (as float16) or bf16 (as float32 holding bf16)."""
    import torch
    t = torch.from_numpy(np.asarray(x, np.float64))
    if dt == "fp16":
        return t.to(torch.float16).numpy()
    return t.to(torch.bfloat16).to(torch.float32).numpy()


def inputs(cls: str, dt: str, k: int, cases: int, rng: np.random.Generator):
    """(a [C,M,K], b [C,K,N] in the input format's storage, c [C,M,N] float32)."""
    sa, sb, sc = (cases, M, k), (cases, k, N), (cases, M, N)
    lo, hi = (-24, 16) if dt == "fp16" else (-133, 128)      # the format's exponent range
    g = rng.standard_normal
    if cls == "normal":
        a, b, c = g(sa), g(sb), g(sc)
    elif cls == "wide":
        a = g(sa) * 2.0 ** rng.integers(lo, hi, sa)
        b = g(sb) * 2.0 ** rng.integers(lo, hi, sb)
        c = g(sc) * 2.0 ** rng.integers(-149, 126, sc)
    elif cls == "subnormal":
        top = -10 if dt == "fp16" else -110
        a = g(sa) * 2.0 ** rng.integers(lo, top, sa)
        b = g(sb) * 2.0 ** rng.integers(lo, top, sb)
        c = np.where(rng.random(sc) < 0.5, 0.0, g(sc) * 2.0 ** rng.integers(-149, -120, sc))
    elif cls == "special":
        a, b, c = g(sa), g(sb), g(sc)
        for x in (a, b, c):
            u = rng.random(x.shape)
            x[u < 0.004] = np.inf
            x[(u >= 0.004) & (u < 0.008)] = -np.inf
            x[(u >= 0.008) & (u < 0.010)] = np.nan
            x[(u >= 0.010) & (u < 0.100)] = 0.0
            x[(u >= 0.100) & (u < 0.110)] = -0.0
    elif cls == "cancel":
        a, b = g(sa), g(sb)
        h = k // 2                               # second half cancels the first, nearly
        a[..., h:] = -a[..., :h]
        b[:, h:, :] = b[:, :h, :] * (1 + rng.integers(-2, 3, (cases, h, N)) * 2.0 ** -9)
        c = g(sc) * 2.0 ** rng.integers(-20, 30, sc)
    elif cls == "sparse":
        top = 2 if dt == "fp16" else -60
        a = g(sa) * 2.0 ** rng.integers(lo, top, sa)
        b = g(sb) * 2.0 ** rng.integers(lo, top, sb)
        a[rng.random(sa) < 0.5] = 0.0
        b[rng.random(sb) < 0.5] = 0.0
        c = np.where(rng.random(sc) < 0.7, 0.0, g(sc) * 2.0 ** rng.integers(-149, -100, sc))
    else:
        raise ValueError(f"unknown input class {cls!r}; choose one of {CLASSES}")
    return _round(a, dt), _round(b, dt), np.asarray(c, np.float32)


def _torch_in(x: np.ndarray, dt: str):
    import torch
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t if dt == "fp16" else t.to(torch.bfloat16)


def oracle(model: str, dt: str, a, b, c) -> np.ndarray:
    """MMA-Sim's result for every case, k16 instructions chained in ascending K."""
    import torch
    from mmasim.nv_ptx import MMA, WGMMA
    arch, kind = ARCHS[model]
    t = "f16" if dt == "fp16" else "bf16"
    A, B, C = _torch_in(a, dt), _torch_in(b, dt), torch.from_numpy(np.ascontiguousarray(c))
    out = []
    for i in range(a.shape[0]):
        acc = C[i]
        for k0 in range(0, a.shape[2], 16):
            ak, bk = A[i, :, k0:k0 + 16], B[i, k0:k0 + 16, :]
            if kind == "wgmma":                  # one m64n64k16 instruction
                acc = WGMMA(arch, f"m64n{N}k16.f32.{t}.{t}")(ak, bk, acc)
            else:                                # the 4 x 8 m16n8k16 instructions at once
                op = MMA(arch, f"m16n8k16.f32.{t}.{t}.f32")
                acc = op.dpa(ak[:, None, :].expand(-1, N, -1),
                             bk.T[None, :, :].expand(M, -1, -1), acc)
        out.append(acc.numpy())
    return np.stack(out)


def same_as_instruction_tiles(model: str, dt: str, a, b, c) -> bool:
    """The batched `dpa` equals MMA-Sim's own m16n8k16 `__call__` on a few tiles."""
    import torch
    from mmasim.nv_ptx import MMA
    arch, kind = ARCHS[model]
    if kind != "mma":
        return True
    t = "f16" if dt == "fp16" else "bf16"
    op = MMA(arch, f"m16n8k16.f32.{t}.{t}.f32")
    A, B = _torch_in(a[0, :, :16], dt), _torch_in(b[0, :16, :], dt)
    C = torch.from_numpy(np.ascontiguousarray(c[0]))
    whole = oracle(model, dt, a[:1, :, :16], b[:1, :16, :], c[:1])[0]
    for r0, c0 in ((0, 0), (16, 8), (48, 56)):
        tile = op(A[r0:r0 + 16], B[:, c0:c0 + 8], C[r0:r0 + 16, c0:c0 + 8]).numpy()
        if not (tile.view(np.uint32) == whole[r0:r0 + 16, c0:c0 + 8].view(np.uint32)).all():
            return False
    return True


def simulate(model: str, dt: str, a, b, c) -> np.ndarray:
    """The simulator's ct.mma under `model` (gpu/probes' mma_probe, one block per case)."""
    import cuda.tile as ct
    from spak import sim
    from spak.gpu.probes import kernels as P
    if dt == "bf16":
        a, b = sim.SimArray(a.copy(), ct.bfloat16), sim.SimArray(b.copy(), ct.bfloat16)
    out = np.full_like(c, np.nan)
    sim.launch(P.mma_probe, (c.shape[0],), (a, b, c.copy(), out, M, N, a.shape[-1]),
               model=model)
    return out


def compare(model: str, dt: str, cls: str, k: int, cases: int, seed: int = 0,
            oracle_model: str | None = None) -> dict:
    """One row: SPAK `model` vs MMA-Sim for `oracle_model`'s GPU (default: the same)."""
    rng = np.random.default_rng([seed, DTYPES.index(dt), CLASSES.index(cls), k])
    a, b, c = inputs(cls, dt, k, cases, rng)
    want = oracle(oracle_model or model, dt, a, b, c)
    got = simulate(model, dt, a, b, c)
    same = got.view(np.uint32) == want.view(np.uint32)
    bad = np.argwhere(~same)
    return {"model": model, "oracle": ARCHS[oracle_model or model][0], "dtype": dt,
            "class": cls, "k": k, "outputs": int(same.size), "identical": int(same.sum()),
            "first_diffs": [{"case": int(i), "row": int(r), "col": int(j),
                             "spak": f"{got.view(np.uint32)[i, r, j]:#010x}",
                             "mmasim": f"{want.view(np.uint32)[i, r, j]:#010x}"}
                            for i, r, j in bad[:3]]}


def table(rows) -> list[str]:
    """Markdown: per model, dtype and input class, identical share and count."""
    agg = {}
    for r in rows:
        key = (r["model"], r["oracle"], r["dtype"], r["class"])
        n, s = agg.get(key, (0, 0))
        agg[key] = (n + r["outputs"], s + r["identical"])
    out = ["| SPAK model | MMA-Sim | dtype | inputs | identical | outputs |",
           "|---|---|---|---|---|---|"]
    for (m, o, dt, cls), (n, s) in agg.items():
        out.append(f"| {m} | {o} | {dt} | {cls} | {100 * s / n:.4f}% | {s:,} / {n:,} |")
    totals = {}
    for (m, o, _, _), (n, s) in agg.items():
        tn, ts = totals.get((m, o), (0, 0))
        totals[(m, o)] = (tn + n, ts + s)
    for (m, o), (n, s) in totals.items():
        out.append(f"| **{m}** | **{o}** | all | all | **{100 * s / n:.4f}%** | "
                   f"**{s:,} / {n:,}** |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", choices=sorted(ARCHS) + ["sm_90-v0", "ieee"],
                    help="SPAK model(s) to check (default: sm_90, sm_120, sm_89); a model "
                         "that is no GPU's (sm_90-v0, ieee) needs --against")
    ap.add_argument("--cases", type=int, default=3,
                    help="64x64 outputs per (dtype, class, K) are 4096 x cases (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--against", default=None, choices=sorted(ARCHS),
                    help="compare with MMA-Sim's model of this arch's GPU instead")
    ap.add_argument("--out", default=None, help="directory for agreement.json and .md")
    ns = ap.parse_args(argv)
    if any(m not in ARCHS for m in ns.model or ()) and not ns.against:
        ap.error("--model sm_90-v0 / ieee: name the GPU to compare with, --against ARCH")
    rows = []
    t0 = time.perf_counter()
    for model in ns.model or list(ARCHS):
        for dt in DTYPES:
            for cls in CLASSES:
                for k in KS:
                    r = compare(model, dt, cls, k, ns.cases, ns.seed, ns.against)
                    rows.append(r)
                    flag = "" if r["identical"] == r["outputs"] else f"  << {r['first_diffs']}"
                    print(f"{model:7s} vs {r['oracle']:13s} {dt} {cls:9s} K={k:<3d} "
                          f"{100 * r['identical'] / r['outputs']:9.4f}% of {r['outputs']}{flag}")
    md = table(rows)
    print("\n".join(md))
    print(f"{time.perf_counter() - t0:.1f} s")
    if ns.out:
        d = Path(ns.out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "agreement.json").write_text(json.dumps(rows, indent=1))
        (d / "agreement.md").write_text("\n".join(md) + "\n")
    return 0 if all(r["identical"] == r["outputs"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
