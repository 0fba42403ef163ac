"""Plot spak.fmha / cuDNN per standard shape from a ci/gpu_checks.py tuned-vs-default.jsonl.

    python ci/plot_vs_cudnn.py results/gpu-checks-h100-2026-11-22b/tuned-vs-default.jsonl

One bar per shape and dtype (time ratio cuDNN / spak.fmha: above 1, spak is faster), with
issue 7's lines: 1.05x (target) and 0.95x (floor). Writes vs-cudnn.png next to the input.
Needs matplotlib (pip install -e ".[report]").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spak.results.jsonl import read_results  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jsonl", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="PNG path (default: beside input)")
    args = ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('needs matplotlib: pip install -e ".[report]"', file=sys.stderr)
        return 2
    rows = read_results(args.jsonl)                   # .jsonl or .jsonl.gz
    shapes = list(dict.fromkeys(r["case"].replace("/fp16", "").replace("/bf16", "")
                                for r in rows))
    dtypes = sorted({r["case"].split("/")[1] for r in rows})
    ratio = {(r["case"].replace("/" + r["case"].split("/")[1], ""), r["case"].split("/")[1]):
             r["tuned_over_cudnn"] for r in rows}
    fig, ax = plt.subplots(figsize=(max(8, len(shapes) * 0.55), 4.5))
    width = 0.8 / len(dtypes)
    for i, dt in enumerate(dtypes):
        xs = [j + (i - (len(dtypes) - 1) / 2) * width for j in range(len(shapes))]
        ax.bar(xs, [ratio.get((s, dt), 0.0) for s in shapes], width, label=dt)
    ax.axhline(1.05, color="green", ls="--", lw=1, label="target 1.05x")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(0.95, color="red", ls=":", lw=1, label="floor 0.95x")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([s.replace("/noncausal", "").replace("/causal", " c") for s in shapes],
                       rotation=60, ha="right", fontsize=8)
    ax.set_ylim(min(0.7, min(ratio.values()) - 0.02), max(1.1, max(ratio.values()) + 0.02))
    ax.set_ylabel("cuDNN time / spak.fmha time")
    ax.set_title(f"spak.fmha (tuned) vs SDPA cuDNN, {rows[0]['gpu']}, {rows[0]['date']} "
                 f"(' c' = causal)", fontsize=10)
    ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    out = args.out or args.jsonl.with_name("vs-cudnn.png")
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
