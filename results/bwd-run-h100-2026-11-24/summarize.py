"""The run's rows (run.jsonl) as markdown tables: per shape our gradients' errors vs
float64 (dQ, dK, dV), the peers' errors on the same inputs, the simulator agreement, and
the backward and forward+backward TFLOPS beside SDPA's; geomean ratios at the end.

    python summarize.py run.jsonl > summary.md
"""
from __future__ import annotations

import json
import math
import sys

PEERS = ("sdpa-cudnn", "sdpa-flash")
FB = ("fwd+bwd:spak-fused", "fwd+bwd:sdpa-cudnn")


def _f(x, fmt="{:.1f}"):
    return "-" if x is None else fmt.format(x)


def _cell(r, key="tflops"):
    if r is None:
        return "-"
    if r.get("skipped"):
        return "skip"
    if r.get("error"):
        return "ERR"
    return _f(r.get(key))


def _geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def main(path):
    rows = [json.loads(ln) for ln in open(path) if ln.strip()]
    cases: dict = {}
    for r in rows:
        if "case" in r and r.get("family") == "fmha_bwd":
            cases.setdefault(r["case"], {})[r["provider"]] = r
    print("| case | dQ | dK | dV | cuDNN err | flash err | sim bit-identical | ulp | "
          "bwd ms | bwd TFLOPS | cuDNN | flash | fwd+bwd TFLOPS | cuDNN fwd+bwd |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios = {k: [] for k in ("cudnn", "flash", "fb")}
    for case, by in cases.items():
        o = by.get("spak-fused", {})
        per = o.get("outputs") or {}
        sim = o.get("sim") or {}
        err = {p: _cell(by.get(p), "rel_l2") if by.get(p) and by[p].get("rel_l2") is None
               else _f(by.get(p, {}).get("rel_l2"), "{:.2e}") for p in PEERS}
        print(f"| {case} | " + " | ".join(_f(per.get(n, {}).get("rel_l2"), "{:.2e}")
                                         for n in ("dq", "dk", "dv"))
              + f" | {err['sdpa-cudnn']} | {err['sdpa-flash']} | "
              + _f(sim.get("fraction_bit_identical") and 100 * sim["fraction_bit_identical"],
                   "{:.4f}%") + f" | {_f(sim.get('max_ulp'), '{}')} | "
              + f"{_f(o.get('ms_median'), '{:.3f}')} | {_cell(o)} | "
              + " | ".join(_cell(by.get(p)) for p in PEERS + FB) + " |")
        t = o.get("tflops")
        for key, p in (("cudnn", "sdpa-cudnn"), ("flash", "sdpa-flash")):
            if t and by.get(p, {}).get("tflops"):
                ratios[key].append(t / by[p]["tflops"])
        a, b = by.get(FB[0], {}).get("tflops"), by.get(FB[1], {}).get("tflops")
        if a and b:
            ratios["fb"].append(a / b)
    print()
    for key, label in (("cudnn", "backward, SPAK / SDPA cuDNN"),
                       ("flash", "backward, SPAK / SDPA flash"),
                       ("fb", "forward+backward, SPAK / SDPA cuDNN")):
        g = _geomean(ratios[key])
        print(f"- {label}: geomean {_f(g, '{:.3f}')}x over {len(ratios[key])} shapes"
              + (f" (min {min(ratios[key]):.3f}, max {max(ratios[key]):.3f})"
                 if ratios[key] else ""))


if __name__ == "__main__":
    main(sys.argv[1])
