"""The CPU gates of a plan's steps, judged on any machine without a GPU.

    prototype   spak.cpu.softmax_proto.check_prototype: online vs global softmax (float64)
    kernel      the step's kernel on its shapes in the CPU simulator, through the step's
                kernel family (`KernelFamily.sim_case`), for each numeric model: error vs
                float64 per dtype, NaN/Inf count, the simulator's checker clean; then the
                compile gate: every variant compiles for every arch (tileiras, CPU)
    sweep       every tile combination of every target's sweep space runs correctly in the
                simulator (sim_shapes), so the GPU sweep has only speed left to find
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from spak.recipe.gates import FAIL, PASS, SKIPPED, GateBook, sci
from spak.results.rows import tiles_label

__all__ = ["CpuGates"]


class CpuGates:
    """Judges the CPU gates of one step at a time into a GateBook; what was simulated and
    compiled goes into ``evidence[step id]`` ("prototype", "cases", "compile")."""

    def __init__(self, plan, book: GateBook, evidence: dict, *, log: Callable = print,
                 run_case: Optional[Callable] = None, compile: bool = True, jobs: int = 1,
                 compile_one: Optional[Callable] = None, seed: Optional[int] = None,
                 verbose: bool = False):
        self.plan = plan
        self.book = book
        self.evidence = evidence
        self.log = log
        self.run_case = run_case          # None: the step's family's sim_case
        self.do_compile = compile
        self.jobs = jobs
        self.compile_one = compile_one
        self.seed = seed
        self.verbose = verbose

    def judge(self, step) -> bool:
        """Every CPU gate of the step, in order; False at the first that fails."""
        return {"prototype": self.prototype, "kernel": self.kernel,
                "sweep": self.sweep_tiles}[step.kind](step)

    def _seed(self, step) -> int:
        return self.seed if self.seed is not None else step.seed

    # ---------------------------------------------------------------- the steps
    def prototype(self, step) -> bool:
        from spak.cpu.softmax_proto import check_prototype
        gate = step.cpu["max_abs"]
        r = check_prototype(seed=self._seed(step))
        worst = max(r["softmax_max_abs"], r["attention_max_abs"])
        ok = worst <= gate
        self.evidence.setdefault(step.id, {})["prototype"] = r
        row = self.book.add(step, "cpu", "Numerical error: online vs global softmax",
                            f"max abs <= {gate:g} (float64)",
                            "spak.cpu.softmax_proto.check_prototype: softmax rows of length "
                            "1..1000 in blocks, attention with GQA, mask, causal Sq != Sk, "
                            "dead rows",
                            f"softmax {sci(r['softmax_max_abs'])}, attention "
                            f"{sci(r['attention_max_abs'])}", PASS if ok else FAIL)
        if not ok:
            self.book.stop(step, row, f"max abs {worst:.3e} > {gate:g}")
        return ok

    def kernel(self, step) -> bool:
        problems = step.cases()
        self.log(f"  simulator: kernel {step.kernel}, {len(problems)} cases x models "
                 f"{', '.join(step.models)}")
        rows = self._simulate(step, problems, [step.tiles], step.models)
        self.evidence.setdefault(step.id, {})["cases"] = rows
        how = (f"spak sim --family {step.family}: kernel '{step.kernel}' on the CPU simulator, "
               f"shapes {', '.join(step.shapes)} ({len(problems)} cases), numeric models "
               f"{', '.join(step.models)}")
        if not self._judge_simulation(step, rows, "", how):
            return False
        return self.compile(step)

    def sweep_tiles(self, step) -> bool:
        tiles: dict = {}                 # tile config label -> config, over every target
        for arch, space in self.plan.sweep.items():
            if arch in self.plan.targets:
                for t in space.tile_configs():
                    tiles.setdefault(tiles_label(t), t)
        problems = step.cases(step.sim_shapes) if step.sim_shapes else []
        self.log(f"  simulator: kernel {step.kernel}, {len(tiles)} tile pairs from the "
                 f"sweep spaces x {len(problems)} cases x models {', '.join(step.models)}")
        rows = self._simulate(step, problems, list(tiles.values()), step.models) \
            if problems else []
        self.evidence.setdefault(step.id, {})["cases"] = rows
        how = (f"spak sim --family {step.family} per sweep tile pair: {len(tiles)} pairs "
               f"({', '.join(tiles)}) from sweep.{', sweep.'.join(self.plan.sweep)}, on "
               f"shapes {', '.join(step.sim_shapes)}")
        if not rows:
            self.book.add(step, "cpu", "Sweep tiles: numerical error (simulator)", "-", how,
                          "no sim_shapes: nothing checked", SKIPPED)
        elif not self._judge_simulation(step, rows, "Sweep tiles: ", how):
            return False
        return self.compile(step)

    # ---------------------------------------------------------------- simulation
    def _simulate(self, step, problems, tiles_list, models) -> list[dict]:
        """Run every (tiles, model, problem) in the simulator; one result dict each."""
        run_case = self.run_case or step.kernel_family.sim_case
        rows = []
        total = len(problems) * len(models) * len(tiles_list)
        t0 = time.perf_counter()
        for tiles in tiles_list:
            for model in models:
                for problem in problems:
                    rows.append(self._simulate_one(run_case, step, problem, tiles, model))
                    if self.verbose or len(rows) % 25 == 0 or len(rows) == total:
                        self.log(f"    simulated {len(rows)}/{total} cases "
                                 f"({time.perf_counter() - t0:.1f} s)")
        return rows

    def _simulate_one(self, run_case, step, problem, tiles, model) -> dict:
        row = {"kernel": step.kernel, "case": problem.case_id, "dtype": problem.dtype,
               "model": model, "tiles": tiles, "rel_l2": None, "nonfinite": None,
               "error": None, "checker": None, "seconds": None}
        try:
            r = run_case(step.kernel, problem, tiles=tiles, model=model, seed=self._seed(step))
            row.update(rel_l2=r.get("rel_l2"), max_abs=r.get("max_abs"),
                       nonfinite=r.get("nonfinite"), seconds=r.get("seconds"),
                       checker="clean", error=r.get("error"))
        except Exception as e:  # noqa: BLE001 -- a failing case is a result
            msg = f"{type(e).__name__}: {e}"
            row["error"] = msg
            row["checker"] = "findings" if "checker found" in msg else "error"
        return row

    def _judge_simulation(self, step, rows, metric_prefix, how) -> bool:
        """The numerical-error gate, then (if the step asks) the checker gate, on the
        simulated rows (each gets "passed")."""
        gates = step.cpu["rel_l2"]
        nf_max = step.cpu.get("nonfinite", 0)
        worst: dict = {}
        for r in rows:
            g, rel = gates.get(r["dtype"]), r["rel_l2"]
            r["passed"] = bool(r["error"] is None and rel is not None and g is not None
                               and rel <= g and (r["nonfinite"] or 0) <= nf_max)
            if rel is not None and (r["dtype"] not in worst or rel > worst[r["dtype"]][0]):
                worst[r["dtype"]] = (rel, r["case"])
        bad = [r for r in rows if not r["passed"]]
        goal = ", ".join(f"{k} <= {v:g}" for k, v in gates.items())
        goal = f"rel L2 vs float64: {goal}; NaN/Inf <= {nf_max}"
        measured = "; ".join(f"max {dt} {sci(v[0])}" for dt, v in sorted(worst.items()))
        measured += (f"; NaN/Inf {sum(r['nonfinite'] or 0 for r in rows)}; "
                     f"{len(rows) - len(bad)}/{len(rows)} cases pass "
                     f"(models {', '.join(sorted({r['model'] for r in rows}))})")
        numeric_bad = [r for r in bad if r["checker"] != "findings"]
        row = self.book.add(step, "cpu", f"{metric_prefix}Numerical error (simulator vs "
                                         f"float64)", goal, how, measured,
                            FAIL if numeric_bad else PASS)
        if numeric_bad:
            w = numeric_bad[0]
            self.book.stop(step, row, f"{len(numeric_bad)} of {len(rows)} cases fail; first: "
                                      f"{w['case']} (model {w['model']}"
                                      + (f", tiles {tiles_label(w['tiles'])}"
                                         if w.get("tiles") else "")
                                      + f"): {_failure_reason(w, gates, nf_max)}")
            return False
        if step.cpu.get("checker", True):
            findings = [r for r in rows if r["checker"] == "findings"]
            row = self.book.add(step, "cpu", f"{metric_prefix}Correctness (simulator checker)",
                                "no out-of-bounds access, no double or missing write",
                                "sim.launch checker: on every launch of every case above",
                                f"clean on {len(rows) - len(findings)}/{len(rows)} cases",
                                FAIL if findings else PASS)
            if findings:
                self.book.stop(step, row, f"{findings[0]['case']}: {findings[0]['error']}")
                return False
        return True

    # ---------------------------------------------------------------- compiles
    def compile(self, step) -> bool:
        """Every compile variant of the step for every arch it names (tileiras, CPU)."""
        variants, archs = step.compile_variants, step.compile_archs
        if not variants:
            return True
        goal = f"every variant compiles to a cubin ({len(variants)} variant(s): " \
               f"{'; '.join(v.label for v in variants)})"
        how = "gpu.compile.compile_variant: cuTile front end + tileiras, on the CPU"
        if not self.do_compile:
            for a in archs:
                self.book.add(step, "cpu", "Compiles (tileiras)", goal, how,
                              "--no-compile given (CI compiles with `spak compile`)", SKIPPED,
                              arch=a)
            return True
        rows = self._compile_rows(step, variants, archs)
        self.evidence.setdefault(step.id, {})["compile"] = rows
        all_ok = True
        for a in archs:
            ra = [r for r in rows if r["arch"] == a]
            ok = all(r["ok"] for r in ra)
            measured = (f"{sum(r['ok'] for r in ra)}/{len(ra)} ok, "
                        f"{sum(r['seconds'] for r in ra):.1f} s, "
                        f"{sum(r['cubin_bytes'] for r in ra) / 1024:.0f} KiB of cubin"
                        if not any(r["status"] == "unsupported" for r in ra) else
                        "arch not supported by this tileiras")
            row = self.book.add(step, "cpu", "Compiles (tileiras)", goal, how, measured,
                                PASS if ok else FAIL, arch=a)
            if not ok and all_ok:
                from spak.device.compile_report import CompileItem
                bad = next(r for r in ra if not r["ok"])
                self.book.stop(step, row, f"{CompileItem(bad).label} for {a}: {bad['error']}")
                all_ok = False
        return all_ok

    def _compile_rows(self, step, variants, archs) -> list[dict]:
        from spak.device.compile_report import CompileItem, compile_items, supported_archs
        step_tiles = dict(step.tiles) if step.tiles else None
        items = [CompileItem(family=step.family, kernel=step.kernel, arch=a, dtype=v.dtype,
                             head_dim=v.head_dim, causal=v.causal, mask=v.mask,
                             tiles=dict(v.tiles) if v.tiles else step_tiles,
                             source=f"steps[{step.index}] {step.id}")
                 for v in variants for a in archs]
        supported, tool = supported_archs()
        self.log(f"  compile: {len(items)} variant(s) for {', '.join(archs)}; tileiras: {tool}")
        kw = {"compile_one": self.compile_one} if self.compile_one else {}
        return compile_items(items, jobs=self.jobs, supported=supported,
                             progress=lambda r, i, n: self.log(_compile_line(r)), **kw)


def _compile_line(r: dict) -> str:
    from spak.device.compile_report import CompileItem
    return (f"    {r['status']:<5} {CompileItem(r).label:<34} {r['arch']:<7}"
            f" {r['seconds']:6.2f} s {r['cubin_bytes']:>9,} B"
            + (f"  {str(r['error']).splitlines()[0][:160]}" if r.get("error") else ""))


def _failure_reason(row: dict, gates: dict, nf_max: int) -> str:
    """Why one simulated case failed its numerical gate, in a few words."""
    if row["error"]:
        return row["error"]
    if row["dtype"] not in gates:
        return f"the plan has no rel_l2 gate for {row['dtype']}"
    if row["rel_l2"] is None:
        return "no result"
    if (row["nonfinite"] or 0) > nf_max:
        return f"{row['nonfinite']} NaN/Inf elements"
    return f"rel L2 {sci(row['rel_l2'])} > {gates[row['dtype']]:g}"
