"""Record MUFU.EX2 and MUFU.RCP exhaustively on a GPU: the tables that make the sm_90
model's exp2(flush_to_zero=True) and approximate division bit-exact (issue 6).

    source .carry/setup.sh && python tools/numerics_tables.py --out $OUT      # on the GPU
    python tools/numerics_tables.py --sim --out /tmp/t                         # dry run here

Both functions depend on 2^23 values only (docs/numerics-sm90.md, sections 4 and 5):
  * exp2: y = 2^N * G(F), F the 23-bit fraction (one's complement for x < 0). One launch
    of gpu/probes `exp2_probe` on every fp32 x in [1, 2) gives G(F) = y / 2 for all F;
    a second on x in [-2, -1) checks the one's-complement rule on every F.
  * rcp: div.approx is RN(x * R(y)) with R a function of y's mantissa. `div_approx_probe`
    with x = 1 and every fp32 y in [1, 2) gives R exactly; y in [2, 4) checks the scaling.
Writes sm90_mufu.npz: exp2_off / rcp_off, int8[2^23], the measured values minus the
model's formulas in units of 2^-23 (G) and 2^-24 (R). Copy it to sim/data/sm90_mufu.npz;
`tests/test_numerics_model.py` then holds the model to the probe fixtures bit for bit.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N23 = 1 << 23
T = 1024


def run_probes(backend):
    """Return (y_pos, y_neg, q1, q2): exp2 of x in [1,2) and in [-2,-1), 1/y for y in [1,2)
    and in [2,4), each indexed by the 23-bit fraction."""
    frac = np.arange(N23, dtype=np.uint32)
    x_pos = (np.uint32(0x3F800000) | frac).view(np.float32)
    x_neg = -x_pos
    y2 = (np.uint32(0x40000000) | frac).view(np.float32)
    ones = np.ones(N23, np.float32)
    return (backend.exp2(x_pos), backend.exp2(x_neg),
            backend.div(ones, x_pos), backend.div(ones, y2))


class GpuBackend:
    def __init__(self):
        import torch
        import cuda.tile as ct
        from spak.gpu.probes import kernels as P
        self.torch, self.ct, self.P = torch, ct, P
        self.st = torch.cuda.current_stream()

    def _launch(self, kernel, *args):
        self.ct.launch(self.st, (N23 // T, 1, 1), kernel, args)
        self.torch.cuda.synchronize()

    def exp2(self, x):
        X = self.torch.tensor(x, device="cuda")
        Y = self.torch.empty_like(X)
        self._launch(self.P.exp2_probe, X, Y, T)
        return Y.cpu().numpy()

    def div(self, x, y):
        X, Z = self.torch.tensor(x, device="cuda"), self.torch.tensor(y, device="cuda")
        Q = self.torch.empty_like(X)
        self._launch(self.P.div_approx_probe, X, Z, Q, T)
        return Q.cpu().numpy()


class SimBackend:
    """The same probe kernels in the simulator (a dry run: offsets come out all zero)."""

    def __init__(self):
        from spak import sim
        from spak.sim.numerics import Sm90
        from spak.gpu.probes import kernels as P
        self.sim, self.P = sim, P
        self.model = Sm90(tables=None)

    def exp2(self, x):
        y = np.zeros_like(x)
        self.sim.launch(self.P.exp2_probe, (N23 // T,), (x, y, T), model=self.model, check=False)
        return y

    def div(self, x, z):
        q = np.zeros_like(x)
        self.sim.launch(self.P.div_approx_probe, (N23 // T,), (x, z, q, T), model=self.model,
                        check=False)
        return q


def tables(y_pos, y_neg, q1, q2):
    import cuda.tile as ct
    from spak.sim.numerics import Sm90
    ref = Sm90(tables=None)
    frac = np.arange(N23, dtype=np.uint32)
    x_pos = (np.uint32(0x3F800000) | frac).view(np.float32)
    g_ref = ref.exp2(x_pos, ct.float32, True).astype(np.float64) / 2
    off_e = (y_pos.astype(np.float64) / 2 - g_ref) * 2.0 ** 23
    r_ref = ref.truediv(np.ones(N23, np.float32), x_pos, ct.float32, ct.RoundingMode.APPROX, True)
    off_r = (q1.astype(np.float64) - r_ref) * 2.0 ** 24
    for name, off in (("exp2", off_e), ("rcp", off_r)):
        if not (np.all(off == np.round(off)) and np.abs(off).max() <= 127):
            raise SystemExit(f"{name}: offsets are not small integers; the rule does not hold")
    off_e, off_r = off_e.astype(np.int8), off_r.astype(np.int8)
    # checks of the rules the model relies on
    neg_pred = (g_ref + off_e.astype(np.float64) * 2.0 ** -23)[::-1] * 2.0 ** -2   # F' = 2^23-1-F
    ok_neg = np.mean(neg_pred == y_neg.astype(np.float64)) * 100
    ok_scale = np.mean(q2.astype(np.float64) * 2 == q1.astype(np.float64)) * 100
    return off_e, off_r, ok_neg, ok_scale


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--sim", action="store_true", help="dry run in the simulator")
    args = ap.parse_args()
    backend = SimBackend() if args.sim else GpuBackend()
    off_e, off_r, ok_neg, ok_scale = tables(*run_probes(backend))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "sm90_mufu.npz", exp2_off=off_e, rcp_off=off_r)
    for name, off in (("exp2", off_e), ("rcp", off_r)):
        v, c = np.unique(off, return_counts=True)
        print(f"{name} offsets from the formula: " + ", ".join(f"{a:+d}: {b}" for a, b in zip(v, c)))
    print(f"exp2 one's-complement rule holds for {ok_neg:.4f}% of x in [-2, -1)")
    print(f"rcp exponent scaling holds for {ok_scale:.4f}% of y in [2, 4)")
    print("wrote", out / "sm90_mufu.npz", (out / "sm90_mufu.npz").stat().st_size, "bytes")


if __name__ == "__main__":
    main()
