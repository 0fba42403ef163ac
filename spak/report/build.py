"""`spak report`: tables, plots and the leaderboard from sweep (and run) results.

    spak report results/sweep-*.jsonl                  # report.md + PNGs in results/report-.../
    spak report results/sweep-*.jsonl --update-leaderboard
    spak report --check results/sweep-new.jsonl --tolerance 0.05   # regression gate

Inputs: JSON-lines results of `spak sweep` (schema spak.tune.sweep/1) and of `spak run`
(spak.run/1); lines of other kinds are skipped. When a (shape, provider, config) was
measured more than once, the last line read counts (files in the order given).

Outputs, in --out-dir (default results/report-<gpu>-<date>/):

* report.md: per (GPU, kernel, dtype) the providers per shape (SPAK tuned = the best of
  SPAK's configs, the default tiles included; SPAK default tiles; SDPA cuDNN; SDPA flash)
  with ratios and geometric means; per (head dim, causal) a configs x shapes table of
  TFLOPS with the best per shape in bold and starred and failures abbreviated; the
  failures with their errors; the leaderboard.
* tflops-<gpu>-<kernel>-<dtype>.png: TFLOPS vs sequence length, grouped bars per provider,
  one panel per head dim x causal (the FlashAttention papers' figure layout).
* heatmap-<gpu>-<kernel>-<dtype>-d<D>-<causal>.png: per (head dim, causal), one TILE_M x
  TILE_N heatmap per shape (cell: the best TFLOPS over occupancy/num_ctas and kernel
  knobs, annotated with the ones that reached it; best cell framed).

The leaderboard (--leaderboard, default results/leaderboard.json) keeps the best SPAK
figure per (GPU, kernel, dtype, shape) with the config, the git commit that set it, the
date and the results file. --update-leaderboard merges the given results into it;
--check compares the given results with it and exits 1 when any shape's best SPAK figure
is more than --tolerance (a fraction) below the leaderboard's.

Plots need matplotlib (pip install -e ".[report]"); --no-plots writes the markdown only.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
from pathlib import Path
from typing import Iterable, Optional

from spak.results.jsonl import repo_path
from spak.core.stats import geomean
from spak.results.jsonl import read_results, row_problem
from spak.results.provenance import slug

__all__ = ["load_rows", "sections", "markdown", "plot_providers", "plot_heatmaps",
           "leaderboard_candidates", "load_leaderboard", "update_leaderboard",
           "check_regressions", "register", "cmd_report", "main", "PROVIDERS"]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LEADERBOARD = ROOT / "results" / "leaderboard.json"
LEADERBOARD_VERSION = 1
#: Series of the provider plot and table: (key, label).
PROVIDERS = (("tuned", "SPAK tuned"), ("default", "SPAK default tiles"),
             ("sdpa-cudnn", "SDPA cuDNN"), ("sdpa-flash", "SDPA flash"))
STATUS_ABBREV = {"compile_error": "CE", "launch_error": "LE", "wrong_result": "WR",
                 "timeout": "TO", "crash": "X", "oom": "OOM", "invalid_config": "INV",
                 "unsupported": "n/a", "error": "ERR"}
INSTALL_HINT = ('spak report: plots need matplotlib, which is not installed.\n'
                '  install it with:  pip install -e ".[report]"   (or: pip install matplotlib)\n'
                '  or pass --no-plots for the markdown tables only')


# ------------------------------------------------------------------ reading

def _norm(r: dict, source: str) -> Optional[dict]:
    """A result line in one shape: sweep rows as they are, run rows mapped onto them."""
    schema = r.get("schema") or ""
    if schema.startswith("spak.tune.sweep/"):
        if r.get("kind") != "result":
            return None
        row = dict(r)
    elif schema.startswith("spak.run/"):
        prov = str(r.get("provider", ""))
        if not (prov.startswith("spak-") or prov.startswith("sdpa-")) or "case" not in r \
                or r.get("skipped"):
            return None
        row = dict(r)
        if prov.startswith("spak-"):
            t = r.get("tiles") or {}
            row["config"] = {"TILE_M": t.get("TILE_M"), "TILE_N": t.get("TILE_N"),
                             "occupancy": None, "num_ctas": None} if t else None
            row["config_id"] = "run " + (f"{t.get('TILE_M')}x{t.get('TILE_N')}" if t else "?")
            row["kernel"] = r.get("kernel") or prov[5:]
            ok = bool(r.get("passed")) and not r.get("error")
        else:
            row["config_id"] = "-"
            ok = not r.get("error")
        row["status"] = "ok" if ok and r.get("tflops") else ("error" if r.get("error")
                                                              else "wrong_result")
    else:
        return None
    if "case" not in row or "provider" not in row:
        return None
    row["_source"] = source
    row.setdefault("config_id", "-")
    return row


def load_rows(paths: Iterable) -> list[dict]:
    """Result rows of every file, normalised; later duplicates replace earlier ones."""
    latest: dict = {}
    for p in paths:
        for n, r in enumerate(read_results(p, warn=lambda m: print("warning: " + m,
                                                                    file=sys.stderr)), 1):
            bad = row_problem(r)
            if bad:
                print(f"warning: {p}: skipping malformed row {n} ({bad})", file=sys.stderr)
                continue
            row = _norm(r, repo_path(p))
            if row is None:
                continue
            key = (row.get("gpu"), row.get("kernel") if str(row["provider"]).startswith("spak-")
                   else None, row["case"], row["provider"], row["config_id"])
            latest.pop(key, None)
            latest[key] = row
    return list(latest.values())


def _case_sort(r: dict):
    return (int(r.get("D") or 0), bool(r.get("causal")), int(r.get("Sk") or 0),
            int(r.get("Sq") or 0), int(r.get("B") or 0), r["case"])


def sections(rows: list[dict]) -> dict:
    """{(gpu, kernel, dtype): {case: {"meta": row, "tuned": row|None, "default": ...,
    "sdpa-cudnn": ..., "sdpa-flash": ..., "configs": {config_id: row}}}} in shape order.
    SDPA rows (kernel-independent) join every kernel of their GPU and dtype."""
    kernels: dict = {}
    for r in rows:
        if str(r["provider"]).startswith("spak-"):
            kernels.setdefault((r.get("gpu"), r.get("dtype")), set()).add(r.get("kernel"))
    out: dict = {}
    for r in sorted(rows, key=_case_sort):
        prov = str(r["provider"])
        ks = [r.get("kernel")] if prov.startswith("spak-") else \
            sorted(kernels.get((r.get("gpu"), r.get("dtype")), set()) or {r.get("kernel")})
        for k in ks:
            sec = out.setdefault((r.get("gpu"), k, r.get("dtype")), {})
            c = sec.setdefault(r["case"], {"meta": r, "tuned": None, "default": None,
                                           "sdpa-cudnn": None, "sdpa-flash": None,
                                           "configs": {}})
            if prov.startswith("sdpa-"):
                c[prov] = r
                continue
            name = "default" if prov.endswith("-default") else r["config_id"]
            c["configs"][name] = r
            if prov.endswith("-default"):
                c["default"] = r
            if r.get("status") == "ok" and r.get("tflops") and (
                    c["tuned"] is None or r["tflops"] > c["tuned"]["tflops"]):
                c["tuned"] = r
    return out


def _tf(r) -> Optional[float]:
    return float(r["tflops"]) if r and r.get("status") == "ok" and r.get("tflops") else None


def _cfg_label(r: dict) -> str:
    if r is None:
        return "-"
    if str(r["provider"]).endswith("-default"):
        c = r.get("config") or {}
        return f"default ({c.get('TILE_M')}x{c.get('TILE_N')})"
    return r["config_id"]


def _cfg_sort(r: dict) -> tuple:
    c = r.get("config") or {}
    return tuple(-1 if c.get(k) is None else int(c[k])
                 for k in ("TILE_M", "TILE_N", "occupancy", "num_ctas"))


# ------------------------------------------------------------------ markdown

def _fmt(x, f="{:.1f}") -> str:
    return "-" if x is None else f.format(x)


def _groups(cases: dict) -> dict:
    """(D, causal) -> [case, ...] in shape order."""
    g: dict = {}
    for case, c in cases.items():
        m = c["meta"]
        g.setdefault((int(m.get("D") or 0), bool(m.get("causal"))), []).append(case)
    return g


def _col_label(cases: list, c: dict, case: str) -> str:
    sks = [c[x]["meta"].get("Sk") for x in cases]
    m = c[case]["meta"]
    return f"S={m.get('Sk')}" if len(set(sks)) == len(sks) and m.get("Sq") == m.get("Sk") \
        else m.get("shape", case)


def markdown(rows: list[dict], *, sources: list, plots: dict, leaderboard: Optional[dict]) -> str:
    secs = sections(rows)
    gpus = sorted({str(r.get("gpu")) for r in rows})
    dates = sorted({str(r.get("date", ""))[:10] for r in rows if r.get("date")})
    commits = sorted({str(r.get("commit"))[:12] for r in rows if r.get("commit")})
    L = ["# SPAK sweep report", ""]
    L.append(f"Results: {', '.join(f'`{s}`' for s in sources)}  ")
    L.append(f"GPU: {', '.join(gpus)}; measured {', '.join(dates) or '?'}; commit "
             f"{', '.join(commits) or 'unknown'}.  ")
    L.append("TFLOPS = 4·B·Hq·Sq·Sk·D / time (halved for causal with Sq = Sk), median of "
             "timed batches (CUDA events). *SPAK tuned* is the best of SPAK's configs for the "
             "shape, the default tiles included; every config's output was checked against "
             "SDPA (relative L2) before it was timed.")
    L.append("")
    for (gpu, kernel, dtype), cases in secs.items():
        L += [f"## {gpu} · kernel `{kernel}` · {dtype}", ""]
        L += ["| shape | D | causal | SPAK tuned | config | SPAK default | SDPA cuDNN | "
              "SDPA flash | tuned/default | tuned/cuDNN | tuned/flash |",
              "|---|---:|:---:|---:|---|---:|---:|---:|---:|---:|---:|"]
        ratios = {"default": [], "sdpa-cudnn": [], "sdpa-flash": []}
        for case, c in cases.items():
            m = c["meta"]
            t = _tf(c["tuned"])
            cells = []
            for k in ratios:
                o = _tf(c[k])
                if t and o:
                    ratios[k].append(t / o)
                cells.append(_fmt(t / o if t and o else None, "{:.3f}"))
            L.append(f"| {m.get('shape', case)} | {m.get('D')} | "
                     f"{'yes' if m.get('causal') else 'no'} | **{_fmt(t)}** | "
                     f"{_cfg_label(c['tuned'])} | {_fmt(_tf(c['default']))} | "
                     f"{_fmt(_tf(c['sdpa-cudnn']))} | {_fmt(_tf(c['sdpa-flash']))} | "
                     + " | ".join(cells) + " |")
        gm = {k: geomean(v) for k, v in ratios.items()}
        L += ["", "Geometric means: " + ", ".join(
            f"tuned/{k.replace('sdpa-', '')} {_fmt(v, '{:.3f}')}x over {len(ratios[k])} shapes"
            for k, v in gm.items()) + "."]
        slower = [case for case, c in cases.items()
                  if _tf(c["tuned"]) and _tf(c["default"]) and
                  _tf(c["tuned"]) < _tf(c["default"])]
        with_default = sum(1 for c in cases.values() if _tf(c["default"]))
        if with_default:
            L.append(f"Tuned >= default tiles on {with_default - len(slower)}/{with_default} "
                     f"shapes" + (f" (slower: {', '.join(slower)})" if slower else "") + ".")
        L.append("")
        key = (gpu, kernel, dtype)
        if plots.get(("providers",) + key):
            L += [f"![TFLOPS vs sequence length]({plots[('providers',) + key]})", ""]
        for (d, causal), group in _groups(cases).items():
            cfgs: dict = {}
            for case in group:
                for name, r in cases[case]["configs"].items():
                    cfgs.setdefault(name, _cfg_label(r) if name == "default" else name)
            if len(cfgs) < 2 and all(n.startswith("run ") for n in cfgs):
                continue
            L += [f"### Configs x shapes: D={d}, {'causal' if causal else 'non-causal'} "
                  f"(TFLOPS; **bold★** = best per shape)", ""]
            L.append("| config | " + " | ".join(_col_label(group, cases, x) for x in group)
                     + " |")
            L.append("|---|" + "---:|" * len(group))
            best = {x: _tf(cases[x]["tuned"]) for x in group}
            order = sorted(cfgs, key=lambda n: (n != "default", _cfg_sort(
                next(cases[x]["configs"][n] for x in group if n in cases[x]["configs"])), n))
            for name in order:
                cells = []
                for x in group:
                    r = cases[x]["configs"].get(name)
                    if r is None:
                        cells.append("")
                    elif _tf(r):
                        v = f"{_tf(r):.1f}"
                        cells.append(f"**{v}★**" if best[x] and _tf(r) == best[x] else v)
                    else:
                        cells.append(STATUS_ABBREV.get(r.get("status"), r.get("status", "?")))
                L.append(f"| {cfgs[name]} | " + " | ".join(cells) + " |")
            L.append("")
            hk = ("heatmap",) + key + (d, causal)
            if plots.get(hk):
                L += [f"![TILE_M x TILE_N heatmaps]({plots[hk]})", ""]
        fails = [(case, n, r) for case, c in cases.items() for n, r in c["configs"].items()
                 if r.get("status") != "ok"]
        fails += [(case, k, c[k]) for case, c in cases.items()
                  for k in ("sdpa-cudnn", "sdpa-flash") if c[k] and c[k].get("status") != "ok"]
        if fails:
            L += ["### Failures", "", "Abbreviations: " + ", ".join(
                f"{v} {k}" for k, v in STATUS_ABBREV.items()) + ".", "",
                "| shape | config | status | error |", "|---|---|---|---|"]
            for case, n, r in fails:
                err = str(r.get("error") or "").strip().splitlines()
                err = err[0][:160].replace("|", "\\|") if err else ""
                L.append(f"| {case} | {n} | {r.get('status')} | {err} |")
            L.append("")
    if leaderboard is not None:
        L += ["## Leaderboard", "", "Best SPAK figure per shape (all runs merged with "
              "`spak report --update-leaderboard`), with the commit that set it.", "",
              "| GPU | kernel | dtype | shape | TFLOPS | config | commit | date | source |",
              "|---|---|---|---|---:|---|---|---|---|"]
        for e in sorted(leaderboard.get("entries", []),
                        key=lambda e: (e["gpu"], e["kernel"], e["dtype"], e.get("D", 0),
                                       e.get("causal", False), e.get("Sk", 0), e["case"])):
            L.append(f"| {e['gpu']} | {e['kernel']} | {e['dtype']} | {e['case']} | "
                     f"{e['tflops']:.1f} | {e.get('config_id', '-')} | "
                     f"{(e.get('commit') or 'unknown')[:12]} | {e.get('date', '')[:10]} | "
                     f"{e.get('source', '')} |")
        L.append("")
    return "\n".join(L)


# ------------------------------------------------------------------ plots

def _mpl():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_providers(cases: dict, path: Path, title: str) -> Path:
    """Grouped bars, TFLOPS vs sequence length per provider, one panel per (D, causal)."""
    plt = _mpl()
    groups = _groups(cases)
    ds = sorted({d for d, _ in groups})
    cs = sorted({c for _, c in groups})
    fig, axes = plt.subplots(len(ds), len(cs), figsize=(6.2 * len(cs), 4.2 * len(ds)),
                             squeeze=False)
    colors = {"tuned": "#1f77b4", "default": "#aec7e8", "sdpa-cudnn": "#2ca02c",
              "sdpa-flash": "#ff7f0e"}
    width = 0.8 / len(PROVIDERS)
    for i, d in enumerate(ds):
        for j, causal in enumerate(cs):
            ax = axes[i][j]
            group = groups.get((d, causal), [])
            labels = [str(cases[x]["meta"].get("Sk")) if cases[x]["meta"].get("Sq") ==
                      cases[x]["meta"].get("Sk") else cases[x]["meta"].get("shape", x)
                      for x in group]
            labels = [_k(lb) for lb in labels]
            top = 0.0
            for p, (key, label) in enumerate(PROVIDERS):
                vals = [_tf(cases[x][key]) or 0.0 for x in group]
                xs = [n + (p - (len(PROVIDERS) - 1) / 2) * width for n in range(len(group))]
                bars = ax.bar(xs, vals, width, label=label, color=colors[key])
                for b, v in zip(bars, vals):
                    if v:
                        ax.annotate(f"{v:.0f}", (b.get_x() + b.get_width() / 2, v),
                                    ha="center", va="bottom", fontsize=6.5, rotation=90,
                                    xytext=(0, 2), textcoords="offset points")
                top = max([top, *vals])
            ax.set_xticks(range(len(group)))
            ax.set_xticklabels(labels)
            ax.set_ylim(0, top * 1.18 + 1)
            ax.set_xlabel("Sequence length")
            ax.set_ylabel("Speed (TFLOPS)")
            ax.set_title(f"Forward, {'with' if causal else 'without'} causal mask, "
                         f"head dim {d}", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(PROVIDERS), fontsize=9,
               frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _k(label: str) -> str:
    try:
        n = int(label)
    except ValueError:
        return label
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def plot_heatmaps(cases: dict, group: list, path: Path, title: str) -> Optional[Path]:
    """One TILE_M x TILE_N heatmap per shape of one (D, causal) group; None if no configs."""
    plt = _mpl()
    import numpy as np
    per_case = []
    tms, tns = set(), set()
    for x in group:
        cells: dict = {}
        for name, r in cases[x]["configs"].items():
            cfg = r.get("config") or {}
            if cfg.get("TILE_M") is None or str(name).startswith("run "):
                continue
            tm, tn = int(cfg["TILE_M"]), int(cfg["TILE_N"])
            tms.add(tm)
            tns.add(tn)
            v = _tf(r)
            hint = "default" if name == "default" else "/".join(
                [f"{a}{cfg[k]}" for k, a in (("occupancy", "o"), ("num_ctas", "c"))
                 if cfg.get(k) is not None]
                + [f"{k}={v}" for k, v in sorted(cfg.items()) if v is not None and k not in
                   ("TILE_M", "TILE_N", "occupancy", "num_ctas")]) or "auto"
            prev = cells.get((tm, tn))
            if prev is None or (v or 0) > (prev[0] or 0):
                cells[(tm, tn)] = (v, hint)
        per_case.append((x, cells))
    if not tms or not any(c for _, c in per_case):
        return None
    tms, tns = sorted(tms), sorted(tns)
    n = len(group)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols + 1.2, 3.1 * rows + 0.5),
                             squeeze=False, layout="constrained")
    vmax = max((v for _, cells in per_case for v, _ in cells.values() if v), default=1.0)
    im = None
    for idx, (x, cells) in enumerate(per_case):
        ax = axes[idx // cols][idx % cols]
        grid = np.full((len(tms), len(tns)), np.nan)
        for (tm, tn), (v, _) in cells.items():
            if v:
                grid[tms.index(tm), tns.index(tn)] = v
        im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=vmax, origin="upper")
        best = np.nanmax(grid) if np.isfinite(grid).any() else None
        for (tm, tn), (v, hint) in cells.items():
            a, b = tms.index(tm), tns.index(tn)
            txt = f"{v:.0f}\n{hint}" if v else "fail"
            ax.text(b, a, txt, ha="center", va="center", fontsize=7,
                    color="white" if not v or v < 0.6 * vmax else "black")
            if v and best is not None and v == best:
                ax.add_patch(plt.Rectangle((b - 0.5, a - 0.5), 1, 1, fill=False,
                                           edgecolor="red", linewidth=2))
        m = cases[x]["meta"]
        ax.set_title(m.get("shape", x), fontsize=8)
        ax.set_xticks(range(len(tns)))
        ax.set_xticklabels(tns)
        ax.set_yticks(range(len(tms)))
        ax.set_yticklabels(tms)
        ax.set_xlabel("TILE_N", fontsize=8)
        ax.set_ylabel("TILE_M", fontsize=8)
    for idx in range(len(per_case), rows * cols):
        axes[idx // cols][idx % cols].axis("off")
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="TFLOPS")
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ leaderboard

def leaderboard_candidates(rows: list[dict]) -> dict:
    """(gpu, kernel, dtype, case) -> the best ok SPAK row of these results."""
    best: dict = {}
    for r in rows:
        if not str(r["provider"]).startswith("spak-") or not _tf(r):
            continue
        k = (r.get("gpu"), r.get("kernel"), r.get("dtype"), r["case"])
        if k not in best or _tf(r) > _tf(best[k]):
            best[k] = r
    return best


def load_leaderboard(path) -> dict:
    p = Path(path)
    if not p.exists():
        return {"version": LEADERBOARD_VERSION, "entries": []}
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{p}: cannot read the leaderboard ({type(e).__name__}: {e}); "
                         f"fix or delete it") from None
    if not isinstance(doc, dict) or doc.get("version") != LEADERBOARD_VERSION or \
            not isinstance(doc.get("entries"), list):
        raise ValueError(f"{p}: not a version-{LEADERBOARD_VERSION} SPAK leaderboard")
    for i, e in enumerate(doc["entries"]):
        if not isinstance(e, dict) or not all(isinstance(e.get(k), str) for k in
                                              ("gpu", "kernel", "dtype", "case")):
            raise ValueError(f"{p}: entries[{i}] must be an object with string gpu, kernel, "
                             f"dtype and case, got {e!r}"[:300])
        t = e.get("tflops")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ValueError(f"{p}: entries[{i}].tflops must be a positive number, got {t!r}")
    return doc


def _lb_key(e) -> tuple:
    return (e["gpu"], e["kernel"], e["dtype"], e["case"])


def update_leaderboard(lb: dict, rows: list[dict]) -> list[str]:
    """Merge the results' best figures into ``lb`` (in place); lines saying what changed."""
    index = {_lb_key(e): e for e in lb["entries"]}
    lines = []
    for k, r in leaderboard_candidates(rows).items():
        old = index.get(k)
        if old is not None and old["tflops"] >= _tf(r):
            continue
        e = {"gpu": k[0], "kernel": k[1], "dtype": k[2], "case": k[3],
             "D": r.get("D"), "causal": r.get("causal"), "Sk": r.get("Sk"),
             "tflops": round(_tf(r), 2), "config_id": _cfg_label(r),
             "commit": r.get("commit"), "date": str(r.get("date", ""))[:10],
             "source": r.get("_source"), "sweep_id": r.get("sweep_id")}
        lines.append(f"{k[3]}: {e['tflops']:.1f} TFLOPS ({e['config_id']})"
                     + (f", was {old['tflops']:.1f}" if old else ", new"))
        if old is not None:
            lb["entries"].remove(old)
        lb["entries"].append(e)
        index[k] = e
    return lines


def write_leaderboard(lb: dict, path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    lb["entries"].sort(key=lambda e: (e["gpu"], e["kernel"], e["dtype"], e.get("D") or 0,
                                      bool(e.get("causal")), e.get("Sk") or 0, e["case"]))
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(lb, indent=1) + "\n")
    os.replace(tmp, p)


def check_regressions(rows: list[dict], lb: dict, tolerance: float) -> tuple[bool, list[str]]:
    """(passed, lines): every shape of the results whose best SPAK figure is more than
    ``tolerance`` below the leaderboard's fails; shapes the leaderboard lacks pass."""
    index = {_lb_key(e): e for e in lb["entries"]}
    cands = leaderboard_candidates(rows)
    lines, ok = [], True
    if not cands:
        return False, ["no successful SPAK measurement in the results: nothing to check"]
    for k, r in sorted(cands.items(), key=lambda kv: _case_sort(kv[1])):
        new = _tf(r)
        e = index.get(k)
        if e is None:
            lines.append(f"  new   {k[3]:<32} {new:7.1f} TFLOPS (not on the leaderboard)")
            continue
        ratio = new / e["tflops"]
        bad = ratio < 1.0 - tolerance
        ok &= not bad
        lines.append(f"  {'FAIL' if bad else 'ok  '}  {k[3]:<32} {new:7.1f} vs {e['tflops']:7.1f}"
                     f" TFLOPS ({ratio:.3f}x; leaderboard {e.get('config_id')} at "
                     f"{(e.get('commit') or 'unknown')[:12]})")
    return ok, lines


# ------------------------------------------------------------------ command

def cmd_report(args) -> int:
    missing = [f for f in args.results if not Path(f).exists()]
    if missing:
        print(f"spak report: no such results file: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = load_rows(args.results)
    if args.gpu:
        rows = [r for r in rows if r.get("gpu") == args.gpu]
    if args.kernel:
        rows = [r for r in rows if r.get("kernel") == args.kernel
                or str(r["provider"]).startswith("sdpa-")]
    if not rows:
        print("spak report: no result rows in the given files", file=sys.stderr)
        return 1
    lb_path = Path(args.leaderboard)
    try:
        lb = load_leaderboard(lb_path)
    except (ValueError, json.JSONDecodeError) as e:
        print(f"spak report: {e}", file=sys.stderr)
        return 2

    if args.check:
        if not lb_path.exists():
            print(f"spak report --check: no leaderboard at {lb_path}; create it with "
                  f"`spak report RESULTS --update-leaderboard`", file=sys.stderr)
            return 2
        ok, lines = check_regressions(rows, lb, args.tolerance)
        print(f"spak report --check: {len(lines)} shape(s) against {lb_path}, tolerance "
              f"{args.tolerance:g}")
        print("\n".join(lines))
        print("PASS: no shape more than {:.1%} below the leaderboard".format(args.tolerance)
              if ok else "FAIL: regression(s) beyond the tolerance")
        return 0 if ok else 1

    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(INSTALL_HINT, file=sys.stderr)
            return 1
    gpus = sorted({str(r.get("gpu")) for r in rows})
    date = max((str(r.get("date", ""))[:10] for r in rows), default="") or \
        _dt.date.today().isoformat()
    out_dir = Path(args.out_dir) if args.out_dir else ROOT / "results" / (
        f"report-{(slug(gpus[0]) or 'x') if len(gpus) == 1 else 'multi'}-{date}")
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.update_leaderboard:
        for line in update_leaderboard(lb, rows):
            print("  leaderboard: " + line)
        write_leaderboard(lb, lb_path)
    plots: dict = {}
    if not args.no_plots:
        for (gpu, kernel, dtype), cases in sections(rows).items():
            tag = f"{(slug(gpu) or 'x')}-{kernel}-{dtype}"
            p = plot_providers(cases, out_dir / f"tflops-{tag}.png",
                               f"{gpu}: SPAK {kernel} vs PyTorch SDPA, {dtype}")
            plots[("providers", gpu, kernel, dtype)] = p.name
            for (d, causal), group in _groups(cases).items():
                hp = plot_heatmaps(cases, group, out_dir / f"heatmap-{tag}-d{d}-"
                                   f"{'causal' if causal else 'noncausal'}.png",
                                   f"{gpu}, {kernel} {dtype}, D={d}, "
                                   f"{'causal' if causal else 'non-causal'}: TFLOPS per "
                                   f"TILE_M x TILE_N (best over hints and knobs)")
                if hp is not None:
                    plots[("heatmap", gpu, kernel, dtype, d, causal)] = hp.name
    md = markdown(rows, sources=[repo_path(f) for f in args.results], plots=plots,
                  leaderboard=lb if (lb["entries"] or args.update_leaderboard) else None)
    (out_dir / "report.md").write_text(md + "\n")
    print(f"spak report: {out_dir / 'report.md'}" + (f" and {len(plots)} PNG(s)" if plots
                                                     else ""))
    return 0


def add_arguments(p) -> None:
    p.add_argument("results", nargs="+", help="results files (JSONL) of spak sweep / spak run")
    p.add_argument("--out-dir", default=None,
                   help="where report.md and the PNGs go (default results/report-<gpu>-<date>)")
    p.add_argument("--no-plots", action="store_true", help="markdown only (no matplotlib)")
    p.add_argument("--gpu", default=None, help="only rows of this GPU name")
    p.add_argument("--kernel", default=None, help="only this kernel (SDPA rows kept)")
    p.add_argument("--leaderboard", default=str(DEFAULT_LEADERBOARD),
                   help="leaderboard JSON (default results/leaderboard.json)")
    p.add_argument("--update-leaderboard", action="store_true",
                   help="merge these results' best figures into the leaderboard")
    p.add_argument("--check", action="store_true",
                   help="regression gate: exit 1 if a shape's best SPAK figure is more than "
                        "--tolerance below the leaderboard (writes nothing)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="allowed fraction below the leaderboard for --check (default 0.05)")


def register(subparsers) -> None:
    """Add `spak report`."""
    p = subparsers.add_parser(
        "report", help="markdown tables, plots and the leaderboard from sweep/run results",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_report)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m spak.report.build",
                                description=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return cmd_report(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
