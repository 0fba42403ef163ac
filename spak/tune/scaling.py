"""How a sweep scaled over the GPUs of one host, and whether its faults lost or doubled
anything: the analysis behind issue 36's GPU runs (.gpujobs/i36.sh writes the files).

    python -m spak.tune.scaling DIR        # prints the summary, writes DIR/analysis.json

DIR holds ``n1.jsonl``, ``n2.jsonl``, ``n4.jsonl`` (the same jobs with --gpus 0, 0,1 and
all; optional ``n4warm.jsonl``), and fault runs ``fa.jsonl`` / ``fb.jsonl`` with the jobs
they should hold in ``fa.expected.txt`` / ``fb.expected.txt`` (`spak sweep --list`).

- scaling: each run's wall (the sweep's own end line) against N=1's, the target being
  1.2 / N; the time breakdown (spak.tune.timeline) per run and GPU; rows per GPU;
- ranking: the best config per shape in each run against N=1's; where they differ, the
  margins (each run's TFLOPS of its winner over the other's winner) say whether the
  difference is beyond the noise (``NOISE``) and beyond the two rows' own spread (the
  (p75 - p25) / median of their timed batches);
- first launches: per GPU, each worker's first launch of a variant (~0.13 s on an H200
  even from the disk cache) and its later launches of it (spak.tune.slots keeps shapes
  that share variants on one GPU);
- per GPU: each GPU's TFLOPS over the N=1 run's (gpu0) for the same shape and config
  (median and range), and the measurements where GPUs disagree (spak.tune.merge);
- faults: nothing lost (every expected job has a row), nothing doubled (no job twice on
  one GPU, no swept config twice), each GPU that timed configs of a shape timed its peers
  and default; the retried jobs (hang timed out on one GPU and ran on another, the killed
  worker's job).
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

from spak.results.jsonl import read_results
from spak.tune.merge import disagreement_lines, merge_gpu_rows

__all__ = ["NOISE", "load_run", "scaling", "ranking", "per_gpu_speed", "fault_check",
           "expected_jobs", "first_launches", "analyze", "main"]

#: Two configs closer than this (relative TFLOPS) are a tie for the ranking check: runs of
#: one config on one H100 differed by up to ~7% at D=128 (results/sweep-gpus-one-h100-...).
NOISE = 0.03


def load_run(path) -> dict:
    """{"rows": result rows, "starts": start lines, "end": the last end line or None}."""
    lines = read_results(path) if Path(path).exists() else []
    return {"rows": [r for r in lines if r.get("kind") == "result"],
            "starts": [r for r in lines if r.get("kind") == "start"],
            "end": next((r for r in reversed(lines) if r.get("kind") == "end"), None)}


def _gpus(run: dict) -> int:
    return len({r.get("gpu_index") for r in run["rows"]}) or 1


def scaling(runs: dict) -> dict:
    """Per run: GPUs, rows per GPU, status, wall, breakdown; and wall / N=1's wall."""
    out = {}
    base = runs.get("n1", {}).get("end")
    for name, run in runs.items():
        end = run["end"] or {}
        n = len((end.get("gpus") or [])) or _gpus(run)
        wall = end.get("wall_s")
        b = end.get("breakdown") or {}
        out[name] = {"gpus": n, "status": end.get("status"), "wall_s": wall,
                     "rows": len(run["rows"]),
                     "rows_per_gpu": dict(sorted(Counter(str(r.get("gpu_index"))
                                                         for r in run["rows"]).items())),
                     "breakdown": b}
        if base and wall and base.get("wall_s"):
            out[name]["vs_n1"] = wall / base["wall_s"]
            out[name]["target"] = 1.2 / n
            bj = (base.get("breakdown") or {}).get("run_s")
            if bj and b.get("run_s"):
                out[name]["jobs_vs_n1"] = b["run_s"] / bj
    return out


def _best(rows) -> tuple[dict, dict]:
    """(case -> {config id: TFLOPS}, case -> {config id: spread}) of SPAK's ok rows (the
    default config as "default"); spread: the row's (p75 - p25) / median of its timed
    batches, 0 when absent."""
    by, spread = defaultdict(dict), defaultdict(dict)
    for r in merge_gpu_rows(rows):
        if r.get("status") == "ok" and r.get("tflops") and str(r["provider"]).startswith("spak-"):
            by[r["case"]][r["config_id"]] = float(r["tflops"])
            spread[r["case"]][r["config_id"]] = float(r.get("spread") or 0.0)
    return by, spread


def ranking(a_rows, b_rows) -> dict:
    """Best config per shape in run a against run b (see the module doc). Where the
    winners differ: a tie when a margin is within NOISE; "within_spread" when a margin is
    within the larger spread of its run's two rows (the batches of one row vary more than
    the two configs differ: the issue's "margins exceed the spread" does not hold); else a
    real difference ("differ")."""
    (a, sa), (b, sb) = _best(a_rows), _best(b_rows)
    same, ties, noisy, differ = [], [], [], []
    for case in sorted(set(a) & set(b)):
        wa, wb = max(a[case], key=a[case].get), max(b[case], key=b[case].get)
        if wa == wb:
            same.append(case)
            continue
        ma = a[case][wa] / a[case].get(wb, float("nan")) - 1       # a's margin for wa
        mb = b[case][wb] / b[case].get(wa, float("nan")) - 1
        sp_a = max(sa[case].get(wa, 0.0), sa[case].get(wb, 0.0))
        sp_b = max(sb[case].get(wa, 0.0), sb[case].get(wb, 0.0))
        item = {"case": case, "a": wa, "b": wb, "margin_a": ma, "margin_b": mb,
                "spread_a": sp_a, "spread_b": sp_b}
        if not min(ma, mb) > NOISE:
            ties.append(item)
        elif not (ma > sp_a and mb > sp_b):
            noisy.append(item)
        else:
            differ.append(item)
    return {"shapes": len(set(a) & set(b)), "same": len(same), "ties": ties,
            "within_spread": noisy, "differ": differ}


def per_gpu_speed(rows, base_rows) -> dict:
    """gpu_index -> {n, median, min, max} of TFLOPS / the base run's, same measurement."""
    base = {(r["case"], r["provider"], r["config_id"]): float(r["tflops"])
            for r in base_rows if r.get("status") == "ok" and r.get("tflops")}
    ratios = defaultdict(list)
    for r in rows:
        k = (r["case"], r["provider"], r["config_id"])
        if r.get("status") == "ok" and r.get("tflops") and k in base:
            ratios[str(r.get("gpu_index"))].append(float(r["tflops"]) / base[k])
    return {g: {"n": len(v), "median": statistics.median(v), "min": min(v), "max": max(v)}
            for g, v in sorted(ratios.items())}


def expected_jobs(path) -> set:
    """(case, provider, config_id) of the jobs `spak sweep --list` printed."""
    out = set()
    if not Path(path).exists():
        return out
    for line in Path(path).read_text().splitlines():
        f = line.split()
        if len(f) == 3 and f[1].startswith(("spak-", "sdpa-")):
            out.add(tuple(f))
    return out


def fault_check(run: dict, expected: set) -> dict:
    """Nothing lost, nothing doubled, anchors beside configs; the retried rows."""
    rows = run["rows"]
    keys = {(r["case"], r["provider"], r["config_id"]) for r in rows}
    per_gpu = Counter((r["case"], r["provider"], r["config_id"], r.get("gpu_index"))
                      for r in rows)
    configs = Counter((r["case"], r["config_id"]) for r in rows
                      if str(r["provider"]).startswith("spak-")
                      and not str(r["provider"]).endswith("-default"))
    anchors = {k for k in keys if not k[1].startswith("spak-") or k[1].endswith("-default")}
    missing_anchor = sorted({(r["case"], r.get("gpu_index")) for r in rows
                             for a in anchors if a[0] == r["case"]
                             and (*a, r.get("gpu_index")) not in per_gpu}, key=str)
    return {"rows": len(rows), "invocations": len(run["starts"]),
            "lost": sorted(expected - keys) if expected else None,
            "doubled_on_one_gpu": [list(k) for k, n in per_gpu.items() if n > 1],
            "configs_twice": [list(k) for k, n in configs.items() if n > 1],
            "anchors_missing": [list(x) for x in missing_anchor],
            "not_ok": dict(Counter(r["status"] for r in rows if r["status"] != "ok")),
            "retried": [{"case": r["case"], "config_id": r["config_id"],
                         "status": r["status"], "gpu_index": r.get("gpu_index"),
                         "retried_from": r.get("retried_from"),
                         "retried_after": str(r.get("retried_after"))[:90]}
                        for r in rows if r.get("attempts")]}


def first_launches(rows) -> dict:
    """gpu_index -> {variants, first_s, first_median_s, repeat_s}: the first calls of the
    swept and default configs, split into each worker's first launch of a compile unit
    (a variant: cuTile's front end and disk-cache lookup run once per process) and
    launches of a variant that worker had launched before (another shape, same unit)."""
    from spak import families
    seen, out = set(), defaultdict(lambda: {"first": [], "repeat": []})
    for r in rows:
        fc = r.get("first_call_s")
        if not str(r.get("provider", "")).startswith("spak-") or not isinstance(fc, (int, float)):
            continue
        fam = families.get(r.get("family", families.DEFAULT))
        try:
            unit = fam.compile_unit(r["kernel"], fam.parse(r["case"]), r.get("config") or {},
                                    r["config_id"])
        except Exception:  # noqa: BLE001 -- a row this code cannot place: skipped
            continue
        if unit is None:
            continue
        g = str(r.get("gpu_index"))
        key = (g, unit["unit_id"])
        out[g]["repeat" if key in seen else "first"].append(float(fc))
        seen.add(key)
    return {g: {"variants": len(v["first"]), "first_s": sum(v["first"]),
                "first_median_s": statistics.median(v["first"]) if v["first"] else None,
                "repeat_s": sum(v["repeat"]), "repeats": len(v["repeat"])}
            for g, v in sorted(out.items())}


def analyze(d) -> dict:
    d = Path(d)
    runs = {n: load_run(d / f"{n}.jsonl") for n in ("n1", "n2", "n4", "n4warm")
            if (d / f"{n}.jsonl").exists()}
    res = {"scaling": scaling(runs), "ranking": {}, "per_gpu": {}, "faults": {}}
    base = runs.get("n1", {}).get("rows", [])
    for n, run in runs.items():
        if n != "n1" and base:
            res["ranking"][n] = ranking(run["rows"], base)
        if base:
            res["per_gpu"][n] = per_gpu_speed(run["rows"], base)
    res["first_launches"] = {n: first_launches(run["rows"]) for n, run in runs.items()}
    res["disagree"] = disagreement_lines(merge_gpu_rows(
        r for n in ("n1", "n2", "n4") if n in runs for r in runs[n]["rows"]))
    for f in ("fa", "fb"):
        if (d / f"{f}.jsonl").exists():
            res["faults"][f] = fault_check(load_run(d / f"{f}.jsonl"),
                                           expected_jobs(d / f"{f}.expected.txt"))
    return res


def _s(x, f="{:.1f}") -> str:
    return "-" if x is None else f.format(x)


def summary_lines(res: dict) -> list[str]:
    lines = ["run      GPUs status     wall_s  vs_n1 (target)  jobs_vs_n1  rows per GPU"]
    for n, s in res["scaling"].items():
        lines.append(f"{n:<8} {s['gpus']:>4} {str(s['status']):<10} {_s(s['wall_s']):>6}  "
                     f"{_s(s.get('vs_n1'), '{:.3f}'):>5} ({_s(s.get('target'), '{:.3f}')})"
                     f"  {_s(s.get('jobs_vs_n1'), '{:.3f}'):>10}  {s['rows_per_gpu']}")
    from spak.tune.timeline import breakdown_lines
    for n, s in res["scaling"].items():
        if s["breakdown"]:
            lines += [f"[{n}] " + x for x in breakdown_lines(s["breakdown"])]
    for n, r in res["ranking"].items():
        lines.append(f"ranking {n} vs n1: {r['same']}/{r['shapes']} shapes same best config;"
                     f" {len(r['ties'])} differ within {NOISE:.0%} (ties), "
                     f"{len(r.get('within_spread', ()))} beyond {NOISE:.0%} but within the "
                     f"rows' spread, {len(r['differ'])} beyond both")
        lines += [f"  {x['case']}: {x['a']} vs {x['b']} (margins {x['margin_a']:+.1%}, "
                  f"{x['margin_b']:+.1%}; rows' spread {x['spread_a']:.1%}, "
                  f"{x['spread_b']:.1%})"
                  for x in r["differ"] + r.get("within_spread", []) + r["ties"]]
    for n, g in res["per_gpu"].items():
        lines.append(f"per-GPU TFLOPS / n1's ({n}): " + "; ".join(
            f"gpu{k} x{v['median']:.3f} [{v['min']:.3f}, {v['max']:.3f}] n={v['n']}"
            for k, v in g.items()))
    for n, fl in res.get("first_launches", {}).items():
        lines.append(f"first launches of a variant per worker ({n}): " + "; ".join(
            f"gpu{g} {v['variants']} in {v['first_s']:.1f} s (median "
            f"{_s(v['first_median_s'] and 1e3 * v['first_median_s'], '{:.0f}')} ms), "
            f"{v['repeats']} repeats {v['repeat_s']:.1f} s" for g, v in fl.items()))
    lines.append(f"GPUs that disagree beyond the spread (n1+n2+n4 merged): "
                 f"{len(res['disagree'])}")
    lines += ["  " + x for x in res["disagree"][:20]]
    for f, c in res["faults"].items():
        lines.append(f"fault run {f}: {c['rows']} rows, {c['invocations']} invocation(s); "
                     f"lost {c['lost'] if c['lost'] is None else len(c['lost'])}, doubled "
                     f"{len(c['doubled_on_one_gpu'])}, configs twice {len(c['configs_twice'])},"
                     f" anchors missing {len(c['anchors_missing'])}; not ok {c['not_ok']}")
        lines += [f"  retried: {x}" for x in c["retried"]]
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m spak.tune.scaling DIR", file=sys.stderr)
        return 2
    res = analyze(argv[0])
    (Path(argv[0]) / "analysis.json").write_text(json.dumps(res, indent=1, default=str))
    print("\n".join(summary_lines(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
