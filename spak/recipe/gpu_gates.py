"""The GPU gates of a plan's steps, judged on result rows of `spak run` (kernel steps) and
`spak sweep` (sweep steps), whether run here or recorded earlier on a GPU machine.

    kernel   error vs float64 per dtype and NaN/Inf; the fraction of output elements
             bit-identical to the simulator; the throughput of the timed shapes against
             the arch's floors (in the family's metric: TFLOPS or GB/s)
    sweep    the best config per shape against the default config and the floors

Each step reads only its own family's rows (rows without a "family" field are the FMHA
forward's) of its kernel's provider ("spak-<kernel>").
"""
from __future__ import annotations

import math
from typing import Optional

from spak.recipe.gates import FAIL, NOT_RUN, PASS, GateBook, floor_status, sci
from spak.recipe.model import sim_agreement_for
from spak.results.rows import ResultRow, tiles_label

__all__ = ["goals", "floor_goal", "placeholders", "judge_run_rows", "judge_sweep_rows"]


def _profile(gpu_info: Optional[dict]):
    from spak.device.archs import PROFILES
    return PROFILES.get((gpu_info or {}).get("profile") or "")


def goals(step) -> list[tuple[str, str, str]]:
    """(metric, goal, how) of the step's GPU gates other than its throughput floors."""
    g = step.gpu
    out = []
    if g.get("rel_l2"):
        out.append(("Numerical error (GPU vs float64)",
                    ", ".join(f"{k} <= {v:g}" for k, v in g["rel_l2"].items())
                    + f"; NaN/Inf <= {g.get('nonfinite', 0)}",
                    "spak run: relative L2 vs a float64 reference"))
    if "sim_agreement" in g:
        sa = g["sim_agreement"]
        goal = (", ".join(f"{a}: >= {x:g}" for a, x in sa.items()) + "; other archs 0"
                if isinstance(sa, dict) else f">= {sa:g}")
        out.append(("Correctness (simulator agrees with GPU)",
                    f"fraction bit-identical {goal}" + (" (measured and recorded)"
                                                       if sa == 0 else ""),
                    "spak run: simulator on the same inputs, the arch's numeric model"))
    if "tuned_vs_default" in g:
        out.append(("Tuned >= default tiles",
                    f"best config >= {g['tuned_vs_default']:g} x default, every shape",
                    "spak sweep: CUDA events, same run"))
    return out


def floor_goal(floor, metric: str) -> str:
    return (f">= {floor.floor:g} {metric} ({floor.label})"
            + ("" if floor.verified else " [unverified goal]"))


def placeholders(book: GateBook, plan, step, status: str, reason: str, archs) -> None:
    """A row per GPU gate of the step and arch, with a status saying why it was not judged."""
    fam = step.kernel_family
    for metric, goal, how in goals(step):
        for a in archs:
            t = plan.targets.get(a)
            if "simulator agrees" in metric and t is not None and t.sim_model is None:
                goal_a = goal + f"; the simulator has no {a} numeric model yet"
            else:
                goal_a = goal
            book.add(step, "gpu", metric, goal_a, how, reason, status, arch=a)
    for f in step.floors:
        if f.arch in archs:
            book.add(step, "gpu", "Throughput", floor_goal(f, fam.metric),
                     f"spak run / spak sweep: {fam.metric_definition or fam.metric}, time = "
                     f"the CUDA-event median", reason, status, arch=f.arch, source=f.source,
                     verified=f.verified)
    if not step.floors and step.gpu.get("timed_shapes"):
        for a in archs:
            book.add(step, "gpu", "Throughput", "measured, no floor", "spak run", reason,
                     status, arch=a)


# ------------------------------------------------------------------ spak run rows

def _our_rows(step, rows) -> list[ResultRow]:
    """The step's own rows: its family, its kernel's provider, not skipped."""
    provider = f"spak-{step.kernel}"
    return [r for r in map(ResultRow, rows)
            if r.provider == provider and r.family == step.family and not r.skipped]


def _planned_cases(step) -> set:
    g = step.gpu
    planned = {c.case_id for c in step.cases(g.get("shapes") or step.shapes,
                                             g.get("dtypes"), g.get("causal"))}
    if g.get("timed_shapes"):
        planned |= {c.case_id for c in step.cases(g["timed_shapes"],
                                                  [g.get("timed_dtype", "fp16")], "both")}
    return planned


def judge_run_rows(book: GateBook, step, arch: str, rows, *, gpu_info=None, rc: int = 0,
                   source: Optional[str] = None) -> None:
    """The kernel step's GPU gates on `spak run` rows (``source``: where recorded rows
    came from; None: a run of this invocation, exit status ``rc``)."""
    ours = _our_rows(step, rows)
    how = f"spak run --kernel {step.kernel}" + (f": {source}" if source else "")
    if not ours:
        provider = f"spak-{step.kernel}"
        msg = (f"no {provider} rows in {source}" if source else
               f"spak run produced no {provider} rows (exit status {rc})")
        for metric, goal, how_ in goals(step):
            book.add(step, "gpu", metric, goal, how_, msg, NOT_RUN if source else FAIL,
                     arch=arch)
        return
    _error_gate(book, step, arch, ours, how)
    if "sim_agreement" in step.gpu:
        _agreement_gate(book, step, arch, ours, how)
    _run_floor_gates(book, step, arch, ours, how, _profile(gpu_info))


def _error_gate(book, step, arch, ours, how) -> None:
    g = step.gpu
    gates = g.get("rel_l2") or step.cpu.get("rel_l2") or {}
    if not gates:
        return
    nf_max = g.get("nonfinite", 0)
    bad = [r for r in ours if r.error or r.rel_l2 is None
           or r.rel_l2 > gates.get(r.dtype, math.inf)
           or r.nonfinite > nf_max or r.masked_rows_zero is False]
    worst: dict = {}
    for r in ours:
        if r.rel_l2 is not None:
            worst[r.dtype] = max(worst.get(r.dtype, 0.0), r.rel_l2)
    planned = _planned_cases(step)
    have = {r.case for r in ours}
    book.add(step, "gpu", "Numerical error (GPU vs float64)",
             ", ".join(f"{k} <= {v:g}" for k, v in gates.items()) + f"; NaN/Inf <= {nf_max}",
             how, "; ".join(f"max {k} {sci(v)}" for k, v in sorted(worst.items()))
             + f"; {len(ours) - len(bad)}/{len(ours)} rows pass"
             + f"; {len(have & planned)} of {len(planned)} planned cases present"
             + (f"; first failure {bad[0].case}: {bad[0].error or sci(bad[0].rel_l2)}"
                if bad else ""),
             FAIL if bad else PASS, arch=arch)


def _agreement_gate(book, step, arch, ours, how) -> None:
    need = sim_agreement_for(step.gpu["sim_agreement"], arch)
    fr = [r.sim["fraction_bit_identical"] for r in ours if "fraction_bit_identical" in r.sim]
    errs = [r for r in ours if r.sim.get("error")]
    if fr:
        ulps = [r.sim["max_ulp"] for r in ours if r.sim.get("max_ulp") is not None]
        measured = (f"bit-identical: min {min(fr):.4f}, median {sorted(fr)[len(fr) // 2]:.4f} "
                    f"over {len(fr)} shapes" + (f"; max ulp {max(ulps)}" if ulps else "")
                    + (f"; {len(errs)} simulator errors" if errs else ""))
        status = PASS if min(fr) >= need and not errs else FAIL
    else:
        measured, status = "no simulator comparison in the run's rows", FAIL
    book.add(step, "gpu", "Correctness (simulator agrees with GPU)",
             f"fraction bit-identical >= {need:g}", how, measured, status, arch=arch)


def _matching(step, floor, rows: list[ResultRow]) -> list[ResultRow]:
    """The rows (with a figure) of the problems a floor judges."""
    fam = step.kernel_family
    out = []
    for r in rows:
        try:
            problem = fam.parse(r.case)
        except Exception:  # noqa: BLE001 -- a case this family cannot read: not judged
            continue
        if floor.applies(problem) and r.value(fam.metric):
            out.append(r)
    return out


def _floor_gates(book, step, arch, rows, how, nothing: str, describe) -> None:
    """One throughput gate per floor of the arch: the slowest of the rows whose problems
    the floor judges, against it (``describe(floor, slowest, matching)``: what was
    measured; ``nothing``: what to say when no row matches)."""
    unit = step.kernel_family.metric
    for f in (x for x in step.floors if x.arch == arch):
        match = _matching(step, f, rows)
        if not match:
            book.add(step, "gpu", "Throughput", floor_goal(f, unit), how, nothing,
                     floor_status(False, f.verified), arch=arch, source=f.source,
                     verified=f.verified)
            continue
        low = min(match, key=lambda r: r.value(unit))
        book.add(step, "gpu", "Throughput", floor_goal(f, unit), how, describe(f, low, match),
                 floor_status(low.value(unit) >= f.floor, f.verified), arch=arch,
                 source=f.source, verified=f.verified)


def _peak_share(t: float, profile, unit: str, dtype: str) -> Optional[str]:
    """"44% of NVIDIA H200 SXM 141GB peak" (TFLOPS on a known GPU), else None."""
    from spak.device.archs import percent_of_peak
    if profile is None or unit != "TFLOPS":
        return None
    return f"{percent_of_peak(t, profile, dtype):.0f}% of {profile.name} peak"


def _run_floor_gates(book, step, arch, ours, how, profile) -> None:
    from spak.device.archs import percent_of_ceiling
    unit = step.kernel_family.metric

    def describe(f, low, match):
        t = low.value(unit)
        pc = percent_of_ceiling(t, low.ceiling_tflops) if unit == "TFLOPS" else None
        extra = [x for x in (_peak_share(t, profile, unit, f.dtype),
                             None if pc is None else f"{pc:.0f}% of the run's matmul ceiling")
                 if x]
        return (f"min {t:.1f} {unit} ({low.case}) over {len(match)} shapes, max "
                f"{max(r.value(unit) for r in match):.1f}"
                + (f"; {', '.join(extra)}" if extra else ""))
    _floor_gates(book, step, arch, ours, how, "no timed shape matches this floor", describe)
    if not any(f.arch == arch for f in step.floors) and step.gpu.get("timed_shapes"):
        timed = [r for r in ours if r.value(unit)]
        if timed:
            best = max(timed, key=lambda r: r.value(unit))
            book.add(step, "gpu", "Throughput", "measured, no floor", how,
                     f"max {best.value(unit):.1f} {unit} ({best.case})", PASS, arch=arch)


# ------------------------------------------------------------------ spak sweep rows

def _best_per_case(step, rows) -> tuple[dict, dict, int]:
    """(best row per case, the default config's row per case, configs that failed)."""
    unit = step.kernel_family.metric
    tuned_p, default_p = f"spak-{step.kernel}", f"spak-{step.kernel}-default"
    best, default, failed = {}, {}, 0
    for r in map(ResultRow, rows):
        if r.line_kind != "result" or r.provider not in (tuned_p, default_p) \
                or r.family != step.family:
            continue
        t = r.value(unit)
        if not t or not r.ok:
            failed += 1
            continue
        if r.case not in best or t > best[r.case].value(unit):
            best[r.case] = r
        if r.provider == default_p:
            default[r.case] = r
    return best, default, failed


def judge_sweep_rows(book: GateBook, step, arch: str, rows, *, gpu_info=None) -> None:
    """The sweep step's GPU gates on `spak sweep` rows: tuned vs default, and the floors
    on the best config per shape."""
    fam = step.kernel_family
    unit = fam.metric
    how = f"spak sweep --kernel {step.kernel}"
    best, default, failed = _best_per_case(step, rows)
    if "tuned_vs_default" in step.gpu:
        _tuned_gate(book, step, arch, best, default, failed, how)
    profile = _profile(gpu_info)

    def describe(f, low, match):
        t = low.value(unit)
        share = _peak_share(t, profile, unit, f.dtype)
        tiles = tiles_label({k: low.config.get(k) for k in fam.tile_keys})
        return (f"min best {t:.1f} {unit} ({low.case}, {tiles}) over {len(match)} shapes, "
                f"max {max(r.value(unit) for r in match):.1f}" + (f"; {share}" if share else ""))
    _floor_gates(book, step, arch, list(best.values()), how,
                 "no swept shape matches this floor", describe)


def _tuned_gate(book, step, arch, best, default, failed, how) -> None:
    unit = step.kernel_family.metric
    need = step.gpu["tuned_vs_default"]
    ratios = {c: best[c].value(unit) / default[c].value(unit) for c in default if c in best}
    if ratios:
        worst = min(ratios, key=ratios.get)
        ok = ratios[worst] >= need
        measured = (f"min best/default {ratios[worst]:.3f} ({worst}) over "
                    f"{len(ratios)} shapes; {failed} configs failed")
    else:
        ok, measured = False, "no shape has both a default and a tuned result"
    book.add(step, "gpu", "Tuned >= default tiles",
             f"best config >= {need:g} x default, every shape", how, measured,
             PASS if ok else FAIL, arch=arch)
