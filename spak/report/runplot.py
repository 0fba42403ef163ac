"""`spak run --plot`: one figure of a run's rows. Per timing mode one panel; per shape a
group of bars, one per provider (ours and each peer), the bar's height the family's metric
(TFLOPS, or GB/s for bandwidth-bound families) from that mode's median time. Skipped or
failed providers have no bar. matplotlib is imported only here.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["plot_run", "run_series"]


def _value(row: dict, st: dict):
    """The plotted figure of a row under one mode's stats: GB/s when the row has it, else
    TFLOPS; None without a time."""
    ms = st.get("ms_median")
    if not ms:
        return None
    if row.get("gb_per_s") is not None:
        return row["gb_per_s"] * row["ms_median"] / ms
    flops = row.get("flops")
    return flops / (ms * 1e-3) / 1e12 if flops else None


def run_series(rows: list[dict]) -> tuple[str, dict]:
    """(metric name, {mode: {case: {provider: value}}}) of `spak run` rows."""
    metric = "GB/s" if any(r.get("gb_per_s") is not None for r in rows) else "TFLOPS"
    out: dict = {}
    for r in rows:
        if "case" not in r or r.get("provider", "").startswith("matmul"):
            continue
        for mode, st in (r.get("modes") or {}).items():
            v = _value(r, st)
            if v is not None:
                out.setdefault(mode, {}).setdefault(r["case"], {})[r["provider"]] = v
    return metric, out


def plot_run(rows: list[dict], path) -> str:
    """Write the figure to ``path``; returns the path, or why nothing was drawn."""
    metric, series = run_series(rows)
    if not series:
        return "nothing timed: no plot"
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n_cases = max(len(c) for c in series.values())
    fig, axes = plt.subplots(len(series), 1, squeeze=False,
                             figsize=(max(6.0, 1.4 * n_cases + 2), 3.2 * len(series)))
    for ax, (mode, cases) in zip(axes[:, 0], series.items()):
        provs = list(dict.fromkeys(p for c in cases.values() for p in c))
        width = 0.8 / max(len(provs), 1)
        for j, prov in enumerate(provs):
            xs = [i + j * width for i, c in enumerate(cases) if prov in cases[c]]
            ys = [cases[c][prov] for c in cases if prov in cases[c]]
            ax.bar(xs, ys, width, label=prov)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
        ax.set_xticklabels(list(cases), rotation=20, ha="right", fontsize=7)
        ax.set_ylabel(metric)
        ax.set_title(f"timing mode: {mode}", fontsize=9)
        ax.legend(fontsize=7, ncol=min(len(provs), 4))
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
