"""Test numeric-model hypotheses against the GPU's probe data (docs/numerics-sm90.md).

    python tools/numerics_fit.py /path/to/probe-data [--only mma,sum,exp2,div]

Prints, per hypothesis and case group, the share of outputs bit-identical to the GPU.
Plain numpy (float64 is exact for every intermediate used here); slow but independent of
the simulator's numba implementation, so it also cross-checks sim/numerics.py.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

GROUPS = ("random", "wide", "cancel", "bigacc")


def pct(got, want):
    return np.mean(np.ascontiguousarray(got, np.float32).view(np.uint32)
                   == np.ascontiguousarray(want, np.float32).view(np.uint32)) * 100


# ----------------------------------------------------------------------------- mma

def _expo(x, emin):
    _, e = np.frexp(x)
    e = np.maximum(e.astype(np.int64) - 1, emin)
    return np.where(x == 0, -99999, e)


def _rz32(v):
    f = v.astype(np.float32)
    bad = np.abs(f.astype(np.float64)) > np.abs(v)
    f[bad] = np.nextafter(f[bad], np.float32(0))
    return f


def _step(a, b, c, emin, F, rnd, norm_exp):
    """One fused step: a [n,M,k], b [n,k,N], c [n,M,N] (float64)."""
    p = a[:, :, :, None] * b[:, None, :, :]
    if norm_exp:
        ep = _expo(p, -100000)
    else:
        ea, eb = _expo(a, emin)[:, :, :, None], _expo(b, emin)[:, None, :, :]
        ep = np.where((ea < -9000) | (eb < -9000), -99999, ea + eb)
    E = np.maximum(ep.max(axis=2), _expo(c, -126))
    sc = np.ldexp(1.0, F - E)
    s = np.trunc(p * sc[:, :, None, :]).sum(axis=2) + np.trunc(c * sc)
    v = s / sc
    return _rz32(v) if rnd == "RZ" else v.astype(np.float32)


def mma_model(a, b, c, emin, kstep=16, F=25, rnd="RZ", norm_exp=False, reverse=False):
    a, b, d = a.astype(np.float64), b.astype(np.float64), c.astype(np.float32)
    K = a.shape[2]
    starts = list(range(0, K, kstep))
    for k0 in (starts[::-1] if reverse else starts):
        d = _step(a[:, :, k0:k0 + kstep], b[:, k0:k0 + kstep], d.astype(np.float64), emin, F, rnd, norm_exp)
    return d


def fit_mma(data):
    hyps = [("v0: exact sum, one RN", None)]
    hyps += [(f"k-step 16, F={F}, RZ", dict(F=F)) for F in (23, 24, 25, 26)]
    hyps += [("k-step 16, F=25, RN", dict(rnd="RN")),
             ("k-step 8, F=25, RZ", dict(kstep=8)), ("k-step 4, F=25, RZ", dict(kstep=4)),
             ("k-step 32, F=25, RZ", dict(kstep=32)), ("one step over K, F=25, RZ", dict(kstep=64)),
             ("k-step 16, normalised product exponents", dict(norm_exp=True)),
             ("k-step 16, reverse K order", dict(reverse=True))]
    for dt in ("fp16", "bf16"):
        emin = -14 if dt == "fp16" else -126
        for k in (16, 64):
            f = np.load(data / f"probe_mma_{dt}_k{k}.npz")
            base = f"mma_{dt}_k{k}"
            a, b, c, d = (f[base + s] for s in ("_a", "_b", "_c", "_d"))
            for name, kw in hyps:
                if kw and kw.get("kstep", 16) > k:
                    continue
                if kw is None:
                    got = (np.matmul(a.astype(np.float64), b.astype(np.float64)) + c).astype(np.float32)
                else:
                    got = mma_model(a, b, c, emin, **kw)
                per = [pct(g, w) for g, w in zip(np.array_split(got, 4), np.array_split(d, 4))]
                print(f"mma {dt} K={k:<3d} {name:42s} all {pct(got, d):8.3f}  "
                      + "  ".join(f"{g} {p:7.3f}" for g, p in zip(GROUPS, per)))


# ----------------------------------------------------------------------------- row sums

def _tree(a, adjacent):
    while a.shape[-1] > 1:
        if adjacent:
            a = (a[..., 0::2] + a[..., 1::2]).astype(np.float32)
        else:
            h = a.shape[-1] // 2
            a = (a[..., :h] + a[..., h:]).astype(np.float32)
    return a[..., 0]


def _seq(a):
    s = a[..., 0].copy()
    for i in range(1, a.shape[-1]):
        s = (s + a[..., i]).astype(np.float32)
    return s


def fit_sum(data):
    e = np.load(data / "probe_elementwise.npz")
    X, Y = e["sum_x"].reshape(-1, 128), e["sum_y"].reshape(-1)
    res = [("float64 sum, one rounding", pct(X.astype(np.float64).sum(1), Y)),
           ("sequential", pct(_seq(X), Y))]
    for c in (2, 4, 8, 16, 32, 64, 128):
        for layout in ("contig", "strided"):
            A = X.reshape(-1, 128 // c, c) if layout == "contig" else X.reshape(-1, c, 128 // c).transpose(0, 2, 1)
            for inner in ("seq", "adjacent", "halving"):
                s = _seq(A) if inner == "seq" else _tree(A, inner == "adjacent")
                for outer in ("halving", "adjacent"):
                    res.append((f"chunks of {c} {layout}, {inner} inside, {outer} across",
                                pct(_tree(s, outer == "adjacent"), Y)))
    for name, p in sorted(res, key=lambda r: -r[1])[:12]:
        print(f"sum {name:55s} {p:8.3f}")


# ----------------------------------------------------------------------------- exp2, div

def fit_exp2(data):
    e = np.load(data / "probe_elementwise.npz")
    x, y = e["x"].astype(np.float64), e["y"]

    def ftz(v):
        return np.where(v < 2.0 ** -126, 0.0, v)
    xa = np.abs(x)
    m = np.floor(xa)
    rt = np.floor((xa - m) * 2 ** 23)
    F = np.where(x < 0, (2 ** 23 - 1) - rt, rt)
    N = np.where(x < 0, -m - 1, m)
    print(f"exp2 RN(2^x) (v0)                                 {pct(ftz(np.exp2(x)), y):8.3f}")
    for d in (0.0, 0.25, 0.35, 0.5):
        g = np.exp2((F + d) / 2 ** 23).astype(np.float32).astype(np.float64)
        g = np.where(F == 2 ** 23 - 1, 2.0, g)
        got = ftz(np.exp2(N) * g)
        s = np.ascontiguousarray(got, np.float32).view(np.uint32) == y.view(np.uint32)
        print(f"exp2 one's complement F, RN(2^((F+{d:.2f})/2^23))     {s.mean() * 100:8.3f}"
              f"  (even {s[0::2].mean() * 100:.3f} / odd {s[1::2].mean() * 100:.3f})")
    # the rule itself: same F -> same G, non-decreasing
    ok = y > 0
    G = y[ok] / np.exp2(N[ok])
    o = np.lexsort((G, F[ok]))
    fs, gs = F[ok][o], G[o]
    same = fs[1:] == fs[:-1]
    print(f"exp2 rule check: conflicts {np.sum(same & (gs[1:] != gs[:-1]))}, "
          f"inversions {np.sum(~same & (gs[1:] < gs[:-1]))} over {ok.sum()} samples")


def fit_div(data):
    e = np.load(data / "probe_elementwise.npz")
    x, y, q = e["div_x"], e["div_y"], e["div_q"]
    r = (np.float32(1) / y).astype(np.float32)
    print(f"div x*RN(1/y) (v0)                                 {pct(x * r, q):8.3f}")
    print(f"div correctly rounded x/y                          {pct(x.astype(np.float64) / y, q):8.3f}")
    C = np.stack([(x * (r.view(np.int32) + d).view(np.float32)).astype(np.float32).view(np.int32)
                  == q.view(np.int32) for d in range(-3, 4)], 1)
    mant = y.view(np.int32) & 0x7FFFFF
    o = np.argsort(mant)
    ms, Cs = mant[o], C[o]
    same = np.flatnonzero(ms[1:] == ms[:-1])
    print(f"div some R within 3 ulp of RN(1/y) explains {C.any(1).mean() * 100:.3f}%; "
          f"equal mantissas ({len(same)} pairs) consistent {(Cs[same] & Cs[same + 1]).any(1).mean() * 100:.3f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", nargs="?", default="/work/probe-data")
    ap.add_argument("--only", default="mma,sum,exp2,div")
    args = ap.parse_args()
    data = Path(args.data)
    for part in args.only.split(","):
        {"mma": fit_mma, "sum": fit_sum, "exp2": fit_exp2, "div": fit_div}[part](data)


if __name__ == "__main__":
    main()
