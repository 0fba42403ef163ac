"""The plan report: `report.md` (for people) and `report.json` (every gate and the evidence
behind it) from the document `PlanRunner.run` returns.

The markdown opens with the recipe's "Evaluation Metrics" table (metric, goal per arch,
how verified, result; steps and archs merged), then every gate, the targets this machine
could not check, the sources of the throughput goals, the plan's warnings, the compile
checks and a summary of the simulated cases.
"""
from __future__ import annotations

import datetime as _dt
import json
import socket
from pathlib import Path

from spak.recipe.gates import (ADVISORY_FAIL, ADVISORY_PASS, CATEGORIES, FAIL, PASS,
                               STOPPED, sci)
from spak.results.rows import tiles_label
from spak.results.jsonl import jsonable

__all__ = ["merged_gates", "summary_rows", "gpu_line", "format_markdown", "write_report",
           "default_out_dir"]


def merged_gates(gates: list[dict]) -> list[dict]:
    """Gates sorted by step (CPU before GPU), rows that differ only in arch merged."""
    out: dict = {}
    order = sorted(range(len(gates)), key=lambda i: (gates[i]["step_index"],
                                                      gates[i]["loop"] != "cpu", i))
    for i in order:
        g = gates[i]
        key = (g["step"], g["metric"], g["goal"], g["how"], g["measured"], g["status"])
        if key in out:
            out[key]["arch"] += ", " + g["arch"]
        else:
            out[key] = dict(g)
    return list(out.values())


def _status_of(gs: list[dict]) -> str:
    """Several gates' statuses in a few words: "PASS", "FAIL (1 of 3)", "not run here"."""
    st = [g["status"] for g in gs]
    judged = [x for x in st if x in (PASS, FAIL)]
    adv = [x for x in st if x in (ADVISORY_PASS, ADVISORY_FAIL)]
    parts = []
    if FAIL in judged:
        parts.append(f"FAIL ({judged.count(FAIL)} of {len(judged)})")
    elif judged:
        parts.append(PASS)
    if adv:
        parts.append(f"advisory: {adv.count(ADVISORY_PASS)} of {len(adv)} pass")
    parts += sorted({x for x in st if x not in (PASS, FAIL, ADVISORY_PASS, ADVISORY_FAIL)})
    return ", ".join(parts) or "-"


def summary_rows(doc: dict) -> list[dict]:
    """The recipe's table: one row per (metric, goal, how, result), steps and archs merged."""
    gates = [g for g in doc["gates"] if g["status"] != STOPPED or g["metric"] != "CPU gates"]
    groups: dict = {}
    for g in gates:
        groups.setdefault((g["category"], g["loop"], g["metric"], g["arch"]), []).append(g)
    rows: dict = {}
    order = {c: i for i, c in enumerate(CATEGORIES)}
    for (cat, loop, metric, arch), gs in sorted(groups.items(), key=lambda kv: (
            order[kv[0][0]], kv[0][1] != "cpu")):
        goals = list(dict.fromkeys(g["goal"] for g in gs))
        steps = list(dict.fromkeys(g["step"] for g in gs))
        if len(goals) > 1:
            goal = "; ".join(f"{g['step']}: {g['goal']}" for g in gs)
        else:
            goal = goals[0]
        how = gs[0]["how"].split(":")[0] + f" ({', '.join(steps)})"
        key = (cat, metric, goal, how, _status_of(gs))
        if key in rows:
            rows[key]["arch"] += ", " + arch
        else:
            rows[key] = {"category": cat, "metric": metric, "goal": goal, "how": how,
                         "arch": arch, "result": key[-1]}
    return list(rows.values())


def _cells(*values) -> str:
    """One markdown table row; "|" and newlines inside a cell escaped."""
    return "| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ")
                             for v in values) + " |"


def gpu_line(gpu: dict) -> str:
    if not gpu.get("present"):
        return f"none ({gpu.get('reason')}): GPU gates not run here"
    s = f"{gpu.get('name')} ({gpu.get('arch')})"
    if gpu.get("recorded"):
        s += (" -- GPU gates judged from results recorded on that GPU by `spak run`/`spak "
              "sweep` (" + ", ".join(f"`{f}`" for f in gpu["recorded"]) + "), not run by this "
              "invocation")
    return s


def _header(doc: dict) -> list[str]:
    m = doc["machine"]
    stopped = doc.get("stopped")
    return [f"# `spak plan` report: {doc['name']}", "",
            f"{doc['title']}", "",
            f"- plan: `{doc['plan']}`",
            f"- machine: `{m['host']}`, {m['platform']}, {m['cpu_count']} CPU cores, "
            f"Python {m['python']}",
            f"- GPU: {gpu_line(doc.get('gpu') or {})}",
            f"- software: numpy {m['numpy']}, numba {m['numba']}, cuda-tile {m['cuda_tile']}, "
            f"tileiras {m['tileiras']}, torch {m['torch']}",
            f"- commit: {m['commit']}{' (with uncommitted changes)' if m['dirty'] else ''}",
            f"- started {doc['started']}, {doc['wall_seconds']:.1f} s in all "
            f"({', '.join(f'{k} {v:.1f} s' for k, v in doc['step_seconds'].items())})",
            f"- result: **{doc['status']}**"
            + ("" if not stopped else
               f", stopped at step {stopped['step_index'] + 1} ({stopped['step']}), gate "
               f"'{stopped['metric']}': {stopped['reason']}"), ""]


def _gate_tables(doc: dict) -> list[str]:
    lines = ["## Evaluation metrics", "",
             "The recipe's table (seeds/001, section 3), one row per goal and target arch "
             "(\"all\": checked once for every target). Details per gate below.", "",
             "| metric | gate | arch | goal | how verified | result |",
             "|---|---|---|---|---|---|"]
    lines += [_cells(r["category"], r["metric"], r["arch"], r["goal"], r["how"], r["result"])
              for r in summary_rows(doc)]
    lines += ["", "## Every gate", "",
              "| step | metric | arch | goal | how verified | measured | result |",
              "|---|---|---|---|---|---|---|"]
    lines += [_cells(f"{g['step_index'] + 1} {g['step']}", g["metric"], g["arch"], g["goal"],
                     g["how"], g["measured"], g["status"]) for g in merged_gates(doc["gates"])]
    lines += ["", "## Targets not checked on this machine", ""]
    lines += [f"- {x}" for x in doc["not_checked"]] or ["- none"]
    return lines


def _sources(doc: dict) -> list[str]:
    srcs = [g for g in doc["gates"] if g.get("source")]
    if not srcs:
        return []
    lines = ["", "## Sources of the TFLOPS goals", ""]
    seen = set()
    for g in srcs:
        key = (g["step"], g["arch"], g["goal"])
        if key in seen:
            continue
        seen.add(key)
        lines.append(f"- {g['step']}, {g['arch']}, {g['goal']}: {g['source']}"
                     + ("" if g.get("verified") else " (unverified: reported, does not "
                        "decide the exit status)"))
    return lines


def _compile_checks(doc: dict) -> list[str]:
    comp = [(sid, r) for sid, ev in doc["evidence"].items() for r in ev.get("compile", [])]
    if not comp:
        return []
    from spak.device.compile_report import CompileItem
    lines = ["", "## Compile checks (tileiras, CPU)", "",
             "| step | variant | arch | tiles | result | seconds | cubin bytes |",
             "|---|---|---|---|---|---|---|"]
    for sid, r in comp:
        lines.append(f"| {sid} | {CompileItem(r).label} | {r['arch']} | "
                     f"{tiles_label(r.get('tiles') or {})} | {r['status']} | "
                     f"{r['seconds']:.2f} | {r['cubin_bytes']:,} |")
    return lines


def _simulated_cases(doc: dict) -> list[str]:
    sims = [(sid, ev["cases"]) for sid, ev in doc["evidence"].items() if ev.get("cases")]
    if not sims:
        return []
    lines = ["", "## Simulator cases (summary per step, model and dtype)", "",
             "| step | model | dtype | cases | pass | max rel L2 | simulated s |",
             "|---|---|---|---|---|---|---|"]
    for sid, rows in sims:
        for model, dt in sorted({(r["model"], r["dtype"]) for r in rows}):
            rs = [r for r in rows if r["model"] == model and r["dtype"] == dt]
            rels = [r["rel_l2"] for r in rs if r["rel_l2"] is not None]
            lines.append(f"| {sid} | {model} | {dt} | {len(rs)} | "
                         f"{sum(bool(r.get('passed')) for r in rs)} | "
                         f"{sci(max(rels) if rels else None)} | "
                         f"{sum(r['seconds'] or 0 for r in rs):.1f} |")
    return lines


def format_markdown(doc: dict) -> str:
    lines = _header(doc) + _gate_tables(doc) + _sources(doc)
    if doc.get("warnings"):
        lines += ["", "## Plan warnings", ""] + [f"- {w}" for w in doc["warnings"]]
    lines += _compile_checks(doc) + _simulated_cases(doc)
    lines += ["", "Full per-case evidence: `report.json` next to this file.", ""]
    return "\n".join(lines)


def write_report(doc: dict, out_dir: Path) -> tuple[Path, Path]:
    """report.md and report.json in `out_dir` (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "report.json", out_dir / "report.md"
    js.write_text(json.dumps(jsonable(doc), indent=1, allow_nan=False) + "\n")
    md.write_text(format_markdown(doc))
    return md, js


def default_out_dir() -> Path:
    """results/plan-<host>-<date>."""
    host = "".join(c if c.isalnum() or c in "-_." else "-" for c in socket.gethostname())
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    return Path("results") / f"plan-{host}-{date}"
