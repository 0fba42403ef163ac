"""`spak report`'s figures (matplotlib, imported only when plotting):

* <metric>-<gpu>[-<family>]-<kernel>-<dtype>.png: the metric vs the family's size axis
  (sequence length for attention), grouped bars per provider, one panel per group of
  shapes (head dim x causal for attention: the FlashAttention papers' figure layout).
* heatmap-<gpu>[-<family>]-<kernel>-<dtype>-<group>.png: per group, one heatmap over the
  first two tile sizes (TILE_M x TILE_N) per shape; a cell holds the best figure over the
  other hints and knobs, annotated with the ones that reached it; the best cell framed.

The family is named in file names unless it is the FMHA forward (so earlier reports'
names stay).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from spak import families
from spak.report.load import section_peers
from spak.report.tables import group_cases
from spak.results.provenance import slug
from spak.results.rows import metric_field

__all__ = ["write_plots", "plot_providers", "plot_heatmaps", "providers"]

#: cuTile hints shown abbreviated in heatmap cells ("o2/c1")
HINT_ABBREV = (("occupancy", "o"), ("num_ctas", "c"))
PEER_COLORS = ("#2ca02c", "#ff7f0e", "#d62728", "#9467bd", "#8c564b")


def _mpl():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def providers(fam) -> list[tuple[str, str, str]]:
    """(key in a case, legend label, colour) of each bar series."""
    peers = section_peers(fam)
    return [("tuned", "SPAK tuned", "#1f77b4"), ("default", "SPAK default tiles", "#aec7e8"),
            *((p, fam.peer_label(p), PEER_COLORS[i % len(PEER_COLORS)])
              for i, p in enumerate(peers))]


def _short_size(label: str) -> str:
    """"2048" -> "2k" (multiples of 1024); other labels as they are."""
    try:
        n = int(label)
    except ValueError:
        return label
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _panel(ax, fam, cases: dict, group: list, series) -> None:
    """One panel: grouped bars per provider over the group's shapes."""
    width = 0.8 / len(series)
    labels = [_short_size(str(cases[x]["place"].size) if cases[x]["place"].sized
                          else cases[x]["meta"].shape) for x in group]
    top = 0.0
    for p, (key, label, color) in enumerate(series):
        vals = [(cases[x][key].measure(fam.metric) if cases[x][key] is not None else None)
                or 0.0 for x in group]
        xs = [n + (p - (len(series) - 1) / 2) * width for n in range(len(group))]
        bars = ax.bar(xs, vals, width, label=label, color=color)
        for b, v in zip(bars, vals):
            if v:
                ax.annotate(f"{v:.0f}", (b.get_x() + b.get_width() / 2, v),
                            ha="center", va="bottom", fontsize=6.5, rotation=90,
                            xytext=(0, 2), textcoords="offset points")
        top = max([top, *vals])
    ax.set_xticks(range(len(group)))
    ax.set_xticklabels(labels)
    ax.set_ylim(0, top * 1.18 + 1)
    if group:
        place = cases[group[0]]["place"]
        ax.set_xlabel(place.axis)
        ax.set_title(place.title, fontsize=10)
    ax.set_ylabel(f"Speed ({fam.metric})")
    ax.grid(axis="y", alpha=0.3)


def plot_providers(fam, cases: dict, path: Path, title: str) -> Path:
    """Grouped bars, the metric vs size per provider; a grid of panels, one per group (rows:
    the group's first field, e.g. head dim; columns: the rest, e.g. causal)."""
    plt = _mpl()
    groups = group_cases(cases)
    rows = sorted({g[:1] for g in groups})
    cols = sorted({g[1:] for g in groups})
    series = providers(fam)
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(6.2 * len(cols), 4.2 * len(rows)),
                             squeeze=False)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            _panel(axes[i][j], fam, cases, groups.get(r + c, []), series)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(series), fontsize=9,
               frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _hint(name: str, cfg: dict, fam) -> str:
    """What a heatmap cell says besides the two tile sizes: "default", "o2/c1", "auto"."""
    if name == "default":
        return "default"
    shown = set(fam.tile_keys[:2]) | {k for k, _ in HINT_ABBREV}
    return "/".join([f"{a}{cfg[k]}" for k, a in HINT_ABBREV if cfg.get(k) is not None]
                    + [f"{k}={v}" for k, v in sorted(cfg.items())
                       if v is not None and k not in shown]) or "auto"


def _cells(fam, case: dict) -> dict:
    """(tile 1, tile 2) -> (best figure or None, its hint) over one shape's configs."""
    t1, t2 = fam.tile_keys[:2]
    cells: dict = {}
    for name, r in case["configs"].items():
        cfg = r.config
        if cfg.get(t1) is None or str(name).startswith("run "):
            continue
        v = r.measure(fam.metric)
        prev = cells.get((int(cfg[t1]), int(cfg[t2])))
        if prev is None or (v or 0) > (prev[0] or 0):
            cells[(int(cfg[t1]), int(cfg[t2]))] = (v, _hint(name, cfg, fam))
    return cells


def _heatmap(plt, ax, cells: dict, tms: list, tns: list, vmax: float):
    import numpy as np
    grid = np.full((len(tms), len(tns)), np.nan)
    for (tm, tn), (v, _) in cells.items():
        if v:
            grid[tms.index(tm), tns.index(tn)] = v
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=vmax, origin="upper")
    best = np.nanmax(grid) if np.isfinite(grid).any() else None
    for (tm, tn), (v, hint) in cells.items():
        a, b = tms.index(tm), tns.index(tn)
        ax.text(b, a, f"{v:.0f}\n{hint}" if v else "fail", ha="center", va="center",
                fontsize=7, color="white" if not v or v < 0.6 * vmax else "black")
        if v and best is not None and v == best:
            ax.add_patch(plt.Rectangle((b - 0.5, a - 0.5), 1, 1, fill=False,
                                       edgecolor="red", linewidth=2))
    return im


def plot_heatmaps(fam, cases: dict, group: list, path: Path, title: str) -> Optional[Path]:
    """One tile x tile heatmap per shape of one group; None if no configs."""
    plt = _mpl()
    per_case = [(x, _cells(fam, cases[x])) for x in group]
    tms = sorted({tm for _, cells in per_case for tm, _ in cells})
    tns = sorted({tn for _, cells in per_case for _, tn in cells})
    if not tms or not any(c for _, c in per_case):
        return None
    ncols = min(3, len(group))
    nrows = math.ceil(len(group) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols + 1.2, 3.1 * nrows + 0.5),
                             squeeze=False, layout="constrained")
    vmax = max((v for _, cells in per_case for v, _ in cells.values() if v), default=1.0)
    im = None
    for idx, (x, cells) in enumerate(per_case):
        ax = axes[idx // ncols][idx % ncols]
        im = _heatmap(plt, ax, cells, tms, tns, vmax)
        ax.set_title(cases[x]["meta"].shape, fontsize=8)
        ax.set_xticks(range(len(tns)))
        ax.set_xticklabels(tns)
        ax.set_yticks(range(len(tms)))
        ax.set_yticklabels(tms)
        ax.set_xlabel(fam.tile_keys[1], fontsize=8)
        ax.set_ylabel(fam.tile_keys[0], fontsize=8)
    for idx in range(len(per_case), nrows * ncols):
        axes[idx // ncols][idx % ncols].axis("off")
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label=fam.metric)
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(secs: dict, out_dir: Path) -> dict:
    """Every figure of the sections into `out_dir`; their file names by section key
    (("providers", *key) and ("heatmap", *key, group)), as `tables.markdown` takes them."""
    plots: dict = {}
    for key, cases in secs.items():
        gpu, family, kernel, dtype = key
        fam = families.get(family)
        tag = "-".join([slug(gpu) or "x", *([] if family == families.DEFAULT else [family]),
                        kernel, dtype])
        p = plot_providers(fam, cases, out_dir / f"{metric_field(fam.metric)}-{tag}.png",
                           f"{gpu}: SPAK {kernel} vs {fam.peers_name}, {dtype}")
        plots[("providers",) + key] = p.name
        if len(fam.tile_keys) < 2:
            continue
        for group_key, group in group_cases(cases).items():
            place = cases[group[0]]["place"]
            hp = plot_heatmaps(fam, cases, group, out_dir / f"heatmap-{tag}-{place.tag}.png",
                               f"{gpu}, {kernel} {dtype}, {place.heading}: {fam.metric} per "
                               f"{' x '.join(fam.tile_keys[:2])} (best over hints and knobs)")
            if hp is not None:
                plots[("heatmap",) + key + (group_key,)] = hp.name
    return plots
