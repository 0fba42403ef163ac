"""Replay `spak run --dump` slices in the simulator: does a numeric model reproduce them?

`spak run --dump FILE.npz` keeps, for every (kernel, shape) whose simulated slice was not
bit-identical to the GPU's output, the slice's inputs and the GPU's output. This re-runs
those slices here (no GPU) under any numeric model and reports bit% and the worst ulp,
so a model change can be checked against the hardware without another GPU session.

    python tools/agree_replay.py results/agreement-h200-2026-11-22b/dump.npz
    python tools/agree_replay.py DUMP.npz --model sm_90-v0 --show 3
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spak.core.metrics import fraction_bit_identical, max_ulp       # noqa: E402
from spak.cpu.simrun import simulate_fmha                          # noqa: E402


def load(path) -> list[dict]:
    """The dump's slices: dicts of q, k, v, gpu, optional mask, and the meta fields."""
    z = np.load(path)
    out = []
    for key in sorted(k for k in z.files if k.endswith("/meta")):
        n = key.split("/")[0]
        item = json.loads(bytes(z[key]).decode())
        for name in ("q", "k", "v", "gpu", "mask"):
            if f"{n}/{name}" in z.files:
                item[name] = z[f"{n}/{name}"]
        out.append(item)
    return out


def replay(item: dict, model: str) -> dict:
    kernel, case = item["case"].split("|", 1)
    t0 = time.perf_counter()
    sim_out, _ = simulate_fmha(kernel, item["q"], item["k"], item["v"], mask=item.get("mask"),
                               causal=item["causal"], scale=item["scale"],
                               tiles=item["tiles"], model=model, dtype=item["dtype"])
    gpu = item["gpu"]
    return {"kernel": kernel, "case": case, "elements": int(gpu.size),
            "bit": fraction_bit_identical(gpu, sim_out, item["dtype"]),
            "ulp": max_ulp(gpu, sim_out, item["dtype"]), "seconds": time.perf_counter() - t0,
            "sim": sim_out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dump", help="an NPZ written by `spak run --dump`")
    ap.add_argument("--model", default="sm_90", help="numeric model (default sm_90)")
    ap.add_argument("--show", type=int, default=0,
                    help="print the first N differing elements of each slice")
    ns = ap.parse_args(argv)
    items = load(ns.dump)
    if not items:
        print(f"{ns.dump}: no slices (every case was bit-identical when recorded)")
        return 0
    total = same = 0
    worst = 0
    for item in items:
        r = replay(item, ns.model)
        total += r["elements"]
        same += round(r["bit"] * r["elements"])
        worst = max(worst, r["ulp"])
        print(f"{r['kernel']:6} {r['case']:40} {100 * r['bit']:8.4f}%  worst {r['ulp']:5d} ulp"
              f"  ({r['elements']} elements, {r['seconds']:.1f} s)", flush=True)
        if ns.show and r["bit"] < 1:
            g, s = item["gpu"].astype(np.float32), r["sim"].astype(np.float32)
            bad = np.argwhere((g != s) & ~(np.isnan(g) & np.isnan(s)))[:ns.show]
            for idx in bad:
                print(f"    at {tuple(int(i) for i in idx)}: gpu {g[tuple(idx)]!r} "
                      f"sim {s[tuple(idx)]!r}")
    print(f"model {ns.model}: {100 * same / total:.4f}% of {total} elements bit-identical, "
          f"worst {worst} ulp, over {len(items)} recorded slice(s)")
    return 0 if same == total else 1


if __name__ == "__main__":
    sys.exit(main())
