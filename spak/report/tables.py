"""`spak report`'s markdown: per (GPU, family, kernel, dtype) the providers per shape
(SPAK tuned = the best of SPAK's configs, the default config included; SPAK default; the
family's peers) with ratios and geometric means; key lengths off the 16-grid against their
aligned neighbours; per group of shapes (e.g. head dim x causal) a configs x shapes table
with the best per shape in bold and starred and failures abbreviated; the failures with
their errors; the leaderboard. Figures are in each family's metric (TFLOPS or GB/s)."""
from __future__ import annotations

from typing import Optional

from spak import families
from spak.core.stats import geomean
from spak.report.load import (config_label, config_order, fwd_bwd_providers,
                              section_families, section_peers, sections)
from spak.results.rows import ResultRow

__all__ = ["markdown", "STATUS_ABBREV", "group_cases", "column_label"]

STATUS_ABBREV = {"compile_error": "CE", "launch_error": "LE", "wrong_result": "WR",
                 "timeout": "TO", "crash": "X", "oom": "OOM", "invalid_config": "INV",
                 "unsupported": "n/a", "error": "ERR"}


def _num(x, f="{:.1f}") -> str:
    return "-" if x is None else f.format(x)


def _measure(row: Optional[ResultRow], metric: str) -> Optional[float]:
    return row.measure(metric) if row is not None else None


def group_cases(cases: dict) -> dict:
    """Group key -> [case, ...] in shape order (one configs x shapes table, one plot panel)."""
    g: dict = {}
    for case, c in cases.items():
        g.setdefault(c["place"].group, []).append(case)
    return g


def column_label(group: list, cases: dict, case: str) -> str:
    """A shape's column in a configs x shapes table: "S=512" when the size names it in its
    group, else the shape."""
    sizes = [cases[x]["place"].size for x in group]
    place = cases[case]["place"]
    return f"S={place.size}" if len(set(sizes)) == len(sizes) and place.sized \
        else cases[case]["meta"].shape


def _intro(rows, secs, sources) -> list[str]:
    gpus = sorted({str(r.gpu) for r in rows})
    dates = sorted({r.date[:10] for r in rows if r.date})
    commits = sorted({str(r.commit)[:12] for r in rows if r.commit})
    fams = [families.get(f) for f in section_families(secs)] or [families.get()]
    define = "; ".join(f.metric_definition or f.metric for f in fams) if len(fams) == 1 else \
        "; ".join(f"{f.name}: {f.metric_definition or f.metric}" for f in fams)
    return ["# SPAK sweep report", "",
            f"Results: {', '.join(f'`{s}`' for s in sources)}  ",
            f"GPU: {', '.join(gpus)}; measured {', '.join(dates) or '?'}; commit "
            f"{', '.join(commits) or 'unknown'}.  ",
            f"{define}, median of timed batches (CUDA events). *SPAK tuned* is the best of "
            "SPAK's configs for the shape, the default tiles included; every config's output "
            "was checked against SDPA (relative L2) before it was timed.", ""]


def _providers_table(fam, cases: dict) -> list[str]:
    """One row per shape: SPAK tuned, its config, SPAK default, the peers, the ratios."""
    unit, peers = fam.metric, section_peers(fam)
    cols = next(iter(cases.values()))["place"].columns
    labels = [fam.peer_label(p) for p in peers]
    lines = ["| shape | " + "".join(f"{h} | " for h, _, _ in cols) + "SPAK tuned | config | "
             "SPAK default | " + "".join(f"{x} | " for x in labels) + "tuned/default | "
             + " | ".join(f"tuned/{x.split()[-1]}" for x in labels) + " |",
             "|---|" + "".join(f"{a}|" for _, _, a in cols) + "---:|---|---:|"
             + "---:|" * len(peers) + "---:|" + "---:|" * len(peers)]
    ratios: dict = {k: [] for k in ("default", *peers)}
    for case, c in cases.items():
        t = _measure(c["tuned"], unit)
        cells = []
        for k in ratios:
            o = _measure(c[k], unit)
            if t and o:
                ratios[k].append(t / o)
            cells.append(_num(t / o if t and o else None, "{:.3f}"))
        lines.append(f"| {c['meta'].shape} | "
                     + "".join(f"{x} | " for _, x, _ in c["place"].columns)
                     + f"**{_num(t)}** | {config_label(c['tuned'])} | "
                     + f"{_num(_measure(c['default'], unit))} | "
                     + "".join(f"{_num(_measure(c[p], unit))} | " for p in peers)
                     + " | ".join(cells) + " |")
    lines += ["", "Geometric means: " + ", ".join(
        f"tuned/{k.split('-', 1)[-1]} {_num(geomean(v), '{:.3f}')}x over {len(v)} shapes"
        for k, v in ratios.items()) + "."]
    slower = [case for case, c in cases.items()
              if _measure(c["tuned"], unit) and _measure(c["default"], unit)
              and _measure(c["tuned"], unit) < _measure(c["default"], unit)]
    with_default = sum(1 for c in cases.values() if _measure(c["default"], unit))
    if with_default:
        lines.append(f"Tuned >= default tiles on {with_default - len(slower)}/{with_default} "
                     f"shapes" + (f" (slower: {', '.join(slower)})" if slower else "") + ".")
    return lines + [""]


def _fwd_bwd_table(fam, cases: dict) -> list[str]:
    """Forward + backward (a training step's attention) per shape: SPAK's and the peers'
    figures and SPAK / peer; [] when the rows have none (only `spak run` times them)."""
    names = fwd_bwd_providers(fam)
    have = [c for c in cases.values() if any(c.get(n) is not None for n in names)]
    if len(names) < 2 or not have:
        return []
    from spak.attention.problems import train_model
    unit, ours, peers = fam.metric, names[0], names[1:]
    label = lambda n: n.split(":", 1)[-1]                       # noqa: E731
    lines = ["### Forward + backward", "",
             f"One training step's attention (forward with LSE, then backward), {unit} at "
             "3.5x the forward's FLOPs; model: whose heads the shape has (`--shapes train`).",
             "", f"| shape | causal | model | {label(ours)} | "
             + "".join(f"{label(p)} | " for p in peers)
             + " | ".join(f"{label(ours)}/{label(p)}" for p in peers) + " |",
             "|---|---|---|---:|" + "---:|" * len(peers) + "---:|" * len(peers)]
    ratios: dict = {p: [] for p in peers}
    for case, c in cases.items():
        t = _measure(c.get(ours), unit)
        cells = []
        for p in peers:
            o = _measure(c.get(p), unit)
            if t and o:
                ratios[p].append(t / o)
            cells.append(_num(t / o if t and o else None, "{:.3f}"))
        try:
            model = train_model(fam.parse(c["meta"].case)) or "-"
        except Exception:  # noqa: BLE001 -- a case the family cannot read
            model = "-"
        causal = "yes" if c["meta"].get("causal") else "no"
        lines.append(f"| {c['meta'].shape} | {causal} | {model} | **{_num(t)}** | "
                     + "".join(f"{_num(_measure(c.get(p), unit))} | " for p in peers)
                     + " | ".join(cells) + " |")
    lines += ["", "Geometric means: " + ", ".join(
        f"{label(ours)}/{label(p)} {_num(geomean(v), '{:.3f}')}x over {len(v)} shapes"
        for p, v in ratios.items()) + ".", ""]
    return lines


#: issue 35's target: a key length off the 16-grid within 5% of its aligned neighbour
OFF_GRID_TARGET = 0.95


def _attention_problem(fam, case: str):
    """The problem of an attention case (B, Hq, Hkv, D, Sk, causal, mask), or None."""
    try:
        p = fam.parse(case)
    except Exception:  # noqa: BLE001 -- a case the family cannot read
        return None
    return p if all(hasattr(p, a) for a in ("B", "Hq", "Hkv", "D", "Sk", "mask")) else None


def _off_grid_lines(fam, cases: dict) -> list[str]:
    """Each shape whose key length is off the 16-grid against its aligned neighbour in the
    section (same heads, D, causal flag and mask; nearest Sk, then the same batch): SPAK's
    figure over the neighbour's, and the forward + backward's where timed."""
    unit = fam.metric
    probs = {case: _attention_problem(fam, case) for case in cases}
    probs = {c: p for c, p in probs.items() if p is not None}
    both = fwd_bwd_providers(fam)[:1]
    lines = []
    for case, p in probs.items():
        if p.Sk % 16 == 0:
            continue
        like = [(abs(a.Sk - p.Sk), a.B != p.B, c) for c, a in probs.items() if a.Sk % 16 == 0
                and (a.Hq, a.Hkv, a.D, a.causal, a.mask) == (p.Hq, p.Hkv, p.D, p.causal, p.mask)]
        if not like:
            continue
        near = min(like)[2]
        parts = []
        for label, key in (("", "tuned"), *(("forward + backward ", b) for b in both)):
            x, y = _measure(cases[case].get(key), unit), _measure(cases[near].get(key), unit)
            if x and y:
                parts.append(f"{label}{x / y:.3f}" + ("" if x / y >= OFF_GRID_TARGET
                                                      else " (below 0.95)"))
        if parts:
            lines.append(f"- {cases[case]['meta'].shape} / {cases[near]['meta'].shape}: "
                         + ", ".join(parts))
    if not lines:
        return []
    return ["### Lengths off the 16-grid", "",
            f"SPAK's {unit} at a key length off the 16-grid over its aligned neighbour's "
            f"(target >= {OFF_GRID_TARGET}):", "", *lines, ""]


def _configs_table(fam, cases: dict, group: list) -> list[str]:
    """Configs x shapes for one group of shapes; [] when only `spak run` tiles are known."""
    unit = fam.metric
    cfgs: dict = {}
    for case in group:
        for name, r in cases[case]["configs"].items():
            cfgs.setdefault(name, config_label(r) if name == "default" else name)
    if len(cfgs) < 2 and all(n.startswith("run ") for n in cfgs):
        return []
    lines = [f"### Configs x shapes: {cases[group[0]]['place'].heading} "
             f"({unit}; **bold★** = best per shape)", "",
             "| config | " + " | ".join(column_label(group, cases, x) for x in group) + " |",
             "|---|" + "---:|" * len(group)]
    best = {x: _measure(cases[x]["tuned"], unit) for x in group}
    order = sorted(cfgs, key=lambda n: (n != "default", config_order(
        next(cases[x]["configs"][n] for x in group if n in cases[x]["configs"])), n))
    for name in order:
        cells = []
        for x in group:
            r = cases[x]["configs"].get(name)
            v = _measure(r, unit)
            if r is None:
                cells.append("")
            elif v:
                cells.append(f"**{v:.1f}★**" if best[x] and v == best[x] else f"{v:.1f}")
            else:
                cells.append(STATUS_ABBREV.get(r.status, r.status or "?"))
        lines.append(f"| {cfgs[name]} | " + " | ".join(cells) + " |")
    return lines + [""]


def _failures(fam, cases: dict) -> list[str]:
    fails = [(case, n, r) for case, c in cases.items() for n, r in c["configs"].items()
             if r.status != "ok"]
    fails += [(case, k, c[k]) for case, c in cases.items()
              for k in section_peers(fam) if c[k] and c[k].status != "ok"]
    if not fails:
        return []
    lines = ["### Failures", "", "Abbreviations: " + ", ".join(
        f"{v} {k}" for k, v in STATUS_ABBREV.items()) + ".", "",
        "| shape | config | status | error |", "|---|---|---|---|"]
    for case, n, r in fails:
        err = str(r.error or "").strip().splitlines()
        err = err[0][:160].replace("|", "\\|") if err else ""
        lines.append(f"| {case} | {n} | {r.status} | {err} |")
    return lines + [""]


def _section(key, cases: dict, plots: dict, several_families: bool) -> list[str]:
    gpu, fam_name, kernel, dtype = key
    fam = families.get(fam_name)
    lines = [f"## {gpu} · " + (f"{fam_name} · " if several_families else "")
             + f"kernel `{kernel}` · {dtype}", ""]
    lines += _providers_table(fam, cases)
    lines += _fwd_bwd_table(fam, cases)
    lines += _off_grid_lines(fam, cases)
    if plots.get(("providers",) + key):
        lines += [f"![{fam.metric} vs {next(iter(cases.values()))['place'].axis.lower()}]"
                  f"({plots[('providers',) + key]})", ""]
    for group_key, group in group_cases(cases).items():
        table = _configs_table(fam, cases, group)
        lines += table
        if table and plots.get(("heatmap",) + key + (group_key,)):
            lines += [f"![{' x '.join(fam.tile_keys[:2])} heatmaps]"
                      f"({plots[('heatmap',) + key + (group_key,)]})", ""]
    return lines + _failures(fam, cases)


def _leaderboard(lb: dict) -> list[str]:
    entries = lb.get("entries", [])
    fams = {e.get("family") or families.DEFAULT for e in entries} or {families.DEFAULT}
    several = len(fams) > 1
    unit = families.get(next(iter(fams))).metric if len(fams) == 1 else "figure"
    lines = ["## Leaderboard", "", "Best SPAK figure per shape (all runs merged with "
             "`spak report --update-leaderboard`), with the commit that set it.", "",
             "| GPU | " + ("family | " if several else "") + "kernel | dtype | shape | "
             f"{unit} | config | commit | date | source |",
             "|---|" + ("---|" if several else "") + "---|---|---|---:|---|---|---|---|"]
    from spak.report.leaderboard import entry_order, entry_value
    for e in sorted(entries, key=entry_order):
        value, metric = entry_value(e)
        lines.append(f"| {e['gpu']} | " + (f"{e.get('family') or families.DEFAULT} | "
                                            if several else "")
                     + f"{e['kernel']} | {e['dtype']} | {e['case']} | "
                     + (f"{value:.1f} {metric}" if several else f"{value:.1f}")
                     + f" | {e.get('config_id', '-')} | "
                     f"{(e.get('commit') or 'unknown')[:12]} | {e.get('date', '')[:10]} | "
                     f"{e.get('source', '')} |")
    return lines + [""]


def markdown(rows: list[ResultRow], *, sources: list, plots: dict,
             leaderboard: Optional[dict]) -> str:
    """The whole report.md (``plots``: the PNG file names by section/group key)."""
    secs = sections(rows)
    several = len(section_families(secs)) > 1
    lines = _intro(rows, secs, sources)
    for key, cases in secs.items():
        lines += _section(key, cases, plots, several)
    lines += _gpus_disagree(rows)
    if leaderboard is not None:
        lines += _leaderboard(leaderboard)
    return "\n".join(lines)


def _gpus_disagree(rows) -> list[str]:
    """Measurements whose GPUs of one model differ beyond the run-to-run spread (rows
    merged by spak.tune.merge), with each GPU's figure: a slow or fast GPU shows here."""
    odd = [r for r in rows if r.get("gpus_disagree")]
    if not odd:
        return []
    lines = ["## GPUs of one model that disagree", "",
             "| GPU | shape | provider | config | per GPU (TFLOPS) | spread |",
             "|---|---|---|---|---|---|"]
    for r in odd:
        per = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["gpu_tflops"].items()))
        lines.append(f"| {r.get('gpu')} | {r.get('case')} | {r.get('provider')} | "
                     f"{r.get('config_id')} | {per} | {r['tflops_spread']:.1%} |")
    return lines + [""]
