"""`spak plan [PLAN]`: carry out a plan file as the dual loop, and report it.

CPU loop (any machine, no GPU): for every step in order, its CPU gates

    prototype   spak.cpu.softmax_proto.check_prototype: online vs global softmax (float64)
    kernel      spak.cpu.simrun.run_case on the step's shapes, for each numeric model: error
                vs float64 per dtype, NaN/Inf count, the simulator's checker clean; then
                the compile gate: every variant compiles for every arch (tileiras, CPU)
    sweep       every (TILE_M, TILE_N) of every target's sweep space runs correctly on the
                simulator (sim_shapes), so the GPU sweep has only speed left to find

It stops at the first failed gate and says why. Then, when PyTorch sees a CUDA GPU whose
arch is a plan target, the GPU loop: `spak run` for each kernel step (error vs float64,
agreement with the simulator, TFLOPS against the arch's floors), and the sweeper for the
sweep step. Either part may be missing (another issue builds it): the report then says
"not available" for those gates, which is not a failure.

With --gpu-results FILE..., the GPU gates are judged on result lines recorded earlier by
`spak run` / `spak sweep` on a GPU machine instead (the report names the files and says the
GPU loop was not run by this invocation).

The report (markdown + JSON, in --out, default results/plan-<host>-<date>/) holds a status
table in the shape of the recipe's "Evaluation Metrics" table -- metric, goal per arch,
how verified, measured value, result -- and names the targets this machine could not check.

Call boundaries with the GPU side (kept small on purpose):

* GPU run: the `spak run` command line (spak.device.gpurun), in a subprocess:
  ``python -m spak run --kernel K --shapes ... --dtype D --causal C [--no-time]
  --out FILE.jsonl``; its JSON lines (schema "spak.run/1": provider, case, rel_l2,
  nonfinite, passed, sim.fraction_bit_identical, tflops, ceiling_tflops, error, skipped)
  are what the gates read.
* Sweep: the `spak sweep` command line (spak.tune.sweep), in a subprocess:
  ``python -m spak sweep --kernel K --shapes ... --dtype D --causal C --plan PLAN
  --out FILE.jsonl``; it reads its search space from this plan's [sweep.<arch>]. Its
  result lines (schema "spak.tune.sweep/1": kind "result", provider "spak-K" for a swept
  config or "spak-K-default" for the default tiles, case, config, status, tflops) give
  the best config per shape, compared with the floors and with the default tiles.

Exit status: 0 every gate that ran passed (the CPU gates always run), 1 a gate failed,
2 bad usage or a malformed plan (rejected before anything runs).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from spak.results.jsonl import jsonable as _jsonable
from spak.results.jsonl import read_results
from spak.recipe.schema import sim_agreement_for

__all__ = ["register", "cmd_plan", "PlanRunner", "write_report", "format_markdown"]

PASS, FAIL = "PASS", "FAIL"
NOT_RUN, NOT_AVAILABLE, SKIPPED = "not run here", "not available", "skipped"
STOPPED = "not run (stopped earlier)"
ADVISORY_PASS, ADVISORY_FAIL = "PASS (advisory)", "FAIL (advisory)"


def _fmt(x, spec=".2e") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec)




# ------------------------------------------------------------------- machine facts

def _version(dist: str) -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git(*args) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parents[2])
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    info = {"host": socket.gethostname(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "numpy": _version("numpy"), "numba": _version("numba"),
            "cuda_tile": _version("cuda-tile"), "tileiras": _version("nvidia-cuda-tileiras"),
            "torch": _version("torch"), "commit": _git("rev-parse", "--short", "HEAD"),
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}
    return info


def detect_gpu() -> dict:
    """{"present", "name", "arch", "profile" (key or None), "reason"} of torch's CUDA GPU."""
    try:
        import torch
    except ImportError as e:
        return {"present": False, "reason": f"PyTorch is not installed ({e})"}
    try:
        ok = torch.cuda.is_available()
    except Exception as e:  # noqa: BLE001
        return {"present": False, "reason": f"torch.cuda.is_available() raised {e!r}"}
    if not ok:
        return {"present": False, "reason": "no CUDA GPU (torch.cuda.is_available() is False)"}
    from spak.device.archs import arch_for_capability, lookup
    name = torch.cuda.get_device_name()
    cap = torch.cuda.get_device_capability()
    prof = lookup(name, cap)
    return {"present": True, "name": name, "arch": arch_for_capability(cap),
            "capability": list(cap), "profile": prof.key if prof else None, "reason": None}


def _rel(path) -> str:
    """`path` relative to the working directory when it lies below it (stable in reports)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_jsonl(paths) -> list[dict]:
    """Every row of the files (a .gz name is read through gzip); a torn line is skipped."""
    for p in paths:
        if not Path(p).is_file():            # a missing file is the caller's error
            raise FileNotFoundError(f"no such results file: {p}")
    return [r for p in paths for r in read_results(p)]


def recorded_gpu_info(rows: list[dict], files) -> dict:
    """The GPU that recorded `rows` (their "gpu"/"arch" fields), as detect_gpu() reports."""
    from spak.device.archs import lookup
    gpus = {(r.get("gpu"), r.get("arch")) for r in rows if r.get("gpu") and r.get("arch")}
    if len(gpus) != 1:
        return {"present": False, "reason": f"the recorded results name {len(gpus)} GPUs "
                                            f"({sorted(map(str, gpus))}); give one GPU's files"}
    name, arch = gpus.pop()
    prof = lookup(name)
    return {"present": True, "name": name, "arch": arch, "profile": prof.key if prof else None,
            "recorded": [_rel(f) for f in files], "reason": None}


def _importable(mod: str) -> tuple[bool, Optional[str]]:
    try:
        importlib.import_module(mod)
        return True, None
    except Exception as e:  # noqa: BLE001 -- absent or broken: both "not available"
        return False, f"{mod} cannot be imported ({type(e).__name__}: {e})"


# ------------------------------------------------------------------------ the runner

class PlanRunner:
    """Runs a validated Plan; collects gate rows ("results") and the evidence behind them."""

    def __init__(self, plan, *, out_dir: Path, log: Callable[[str], None] = print,
                 compile: bool = True, gpu: bool = True, jobs: int = 1, seed: Optional[int] = None,
                 run_case: Optional[Callable] = None, compile_one: Optional[Callable] = None,
                 gpu_info: Optional[dict] = None, verbose: bool = False,
                 recorded: Optional[list] = None, recorded_files: Optional[list] = None):
        self.plan = plan
        self.out_dir = Path(out_dir)
        self.log = log
        self.do_compile = compile
        self.do_gpu = gpu
        self.jobs = jobs
        self.seed = seed
        self.verbose = verbose
        self._run_case = run_case
        self._compile_one = compile_one
        self.gpu_info = gpu_info
        self.gates: list[dict] = []
        self.evidence: dict = {}       # step id -> {"cases": [...], "compile": [...], "gpu": [...]}
        self.stopped: Optional[dict] = None
        self.step_seconds: dict = {}
        self.gpu_runs: list[dict] = []     # the `spak run` / `spak sweep` subprocesses
        # --gpu-results: rows recorded by `spak run` / `spak sweep` on a GPU machine, judged
        # instead of running anything (the report says so on every GPU gate)
        self.recorded = recorded
        self.recorded_files = list(recorded_files or [])

    # ---------------------------------------------------------------- helpers
    def gate(self, step, loop, metric, goal, how, measured, status, arch="all", **extra) -> dict:
        row = {"step": step.id, "step_index": step.index, "loop": loop, "metric": metric,
               "category": category_of(metric), "arch": arch, "goal": goal, "how": how,
               "measured": measured, "status": status, **extra}
        self.gates.append(row)
        if status in (PASS, FAIL, ADVISORY_FAIL, ADVISORY_PASS):
            self.log(f"    {status:<16} {metric}: {measured}")
        return row

    def _fail(self, step, row, reason):
        self.stopped = {"step": step.id, "step_index": step.index, "metric": row["metric"],
                        "reason": reason}
        self.log(f"  STOPPED at step {step.index + 1} ({step.id}), gate '{row['metric']}': "
                 f"{reason}")

    def run_case_fn(self):
        if self._run_case is None:
            from spak.cpu.simrun import run_case
            self._run_case = run_case
        return self._run_case

    # ---------------------------------------------------------------- CPU loop
    def run_cpu(self) -> bool:
        n = len(self.plan.steps)
        for step in self.plan.steps:
            t0 = time.perf_counter()
            self.log(f"[{step.index + 1}/{n} {step.id}] {step.title} (CPU)")
            ok = {"prototype": self.cpu_prototype, "kernel": self.cpu_kernel,
                  "sweep": self.cpu_sweep}[step.kind](step)
            self.step_seconds[step.id] = time.perf_counter() - t0
            self.log(f"  {step.id}: CPU gates {'passed' if ok else 'FAILED'} in "
                     f"{self.step_seconds[step.id]:.1f} s")
            if not ok:
                return False
        return True

    def cpu_prototype(self, step) -> bool:
        from spak.cpu.softmax_proto import check_prototype
        gate = step.cpu["max_abs"]
        r = check_prototype(seed=self.seed if self.seed is not None else step.seed)
        worst = max(r["softmax_max_abs"], r["attention_max_abs"])
        ok = worst <= gate
        self.evidence.setdefault(step.id, {})["prototype"] = r
        row = self.gate(step, "cpu", "Numerical error: online vs global softmax",
                        f"max abs <= {gate:g} (float64)",
                        "spak.cpu.softmax_proto.check_prototype: softmax rows of length 1..1000 in "
                        "blocks, attention with GQA, mask, causal Sq != Sk, dead rows",
                        f"softmax {_fmt(r['softmax_max_abs'])}, attention "
                        f"{_fmt(r['attention_max_abs'])}", PASS if ok else FAIL)
        if not ok:
            self._fail(step, row, f"max abs {worst:.3e} > {gate:g}")
        return ok

    def _simulate(self, step, specs, tiles_list, models) -> list[dict]:
        """Run every (tiles, model, spec) on the simulator; one result dict each."""
        run_case = self.run_case_fn()
        rows = []
        total = len(specs) * len(models) * len(tiles_list)
        t0 = time.perf_counter()
        seed = self.seed if self.seed is not None else step.seed
        for tiles in tiles_list:
            for model in models:
                for spec in specs:
                    base = {"kernel": step.kernel, "case": spec.case_id, "dtype": spec.dtype,
                            "model": model, "tiles": tiles, "rel_l2": None, "nonfinite": None,
                            "error": None, "checker": None, "seconds": None}
                    try:
                        r = run_case(step.kernel, spec, tiles=tiles, model=model, seed=seed)
                        base.update(rel_l2=r.get("rel_l2"), max_abs=r.get("max_abs"),
                                    nonfinite=r.get("nonfinite"), seconds=r.get("seconds"),
                                    checker="clean", error=r.get("error"))
                    except Exception as e:  # noqa: BLE001 -- a failing case is a result
                        msg = f"{type(e).__name__}: {e}"
                        base["error"] = msg
                        base["checker"] = "findings" if "checker found" in msg else "error"
                    rows.append(base)
                    if self.verbose or len(rows) % 25 == 0 or len(rows) == total:
                        self.log(f"    simulated {len(rows)}/{total} cases "
                                 f"({time.perf_counter() - t0:.1f} s)")
        return rows

    def _judge_sim(self, step, rows, metric_prefix, how) -> bool:
        gates = step.cpu["rel_l2"]
        nf_max = step.cpu.get("nonfinite", 0)
        bad = []
        worst: dict = {}
        for r in rows:
            g = gates.get(r["dtype"])
            rel = r["rel_l2"]
            r["passed"] = bool(r["error"] is None and rel is not None and g is not None
                               and rel <= g and (r["nonfinite"] or 0) <= nf_max)
            if not r["passed"]:
                bad.append(r)
            if rel is not None and (r["dtype"] not in worst or rel > worst[r["dtype"]][0]):
                worst[r["dtype"]] = (rel, r["case"])
        models = sorted({r["model"] for r in rows})
        nf = sum(r["nonfinite"] or 0 for r in rows)
        goal = ", ".join(f"{k} <= {v:g}" for k, v in gates.items())
        goal = f"rel L2 vs float64: {goal}; NaN/Inf <= {nf_max}"
        measured = "; ".join(f"max {dt} {_fmt(v[0])}" for dt, v in sorted(worst.items()))
        measured += f"; NaN/Inf {nf}; {len(rows) - len(bad)}/{len(rows)} cases pass " \
                    f"(models {', '.join(models)})"
        numeric_bad = [r for r in bad if r["checker"] != "findings"]
        row = self.gate(step, "cpu", f"{metric_prefix}Numerical error (simulator vs float64)",
                        goal, how, measured, FAIL if numeric_bad else PASS)
        if numeric_bad:
            w = numeric_bad[0]
            if w["error"]:
                why = w["error"]
            elif w["dtype"] not in gates:
                why = f"the plan has no rel_l2 gate for {w['dtype']}"
            elif w["rel_l2"] is None:
                why = "no result"
            elif (w["nonfinite"] or 0) > nf_max:
                why = f"{w['nonfinite']} NaN/Inf elements"
            else:
                why = f"rel L2 {_fmt(w['rel_l2'])} > {gates[w['dtype']]:g}"
            self._fail(step, row, f"{len(numeric_bad)} of {len(rows)} cases fail; first: "
                                  f"{w['case']} (model {w['model']}"
                                  + (f", tiles {w['tiles']['TILE_M']}x{w['tiles']['TILE_N']}"
                                     if w.get("tiles") else "") + f"): {why}")
            return False
        if step.cpu.get("checker", True):
            findings = [r for r in rows if r["checker"] == "findings"]
            row = self.gate(step, "cpu", f"{metric_prefix}Correctness (simulator checker)",
                            "no out-of-bounds access, no double or missing write",
                            "sim.launch checker: on every launch of every case above",
                            f"clean on {len(rows) - len(findings)}/{len(rows)} cases",
                            FAIL if findings else PASS)
            if findings:
                self._fail(step, row, f"{findings[0]['case']}: {findings[0]['error']}")
                return False
        return True

    def cpu_kernel(self, step) -> bool:
        specs = step.cases()
        self.log(f"  simulator: kernel {step.kernel}, {len(specs)} cases x models "
                 f"{', '.join(step.models)}")
        rows = self._simulate(step, specs, [step.tiles], step.models)
        self.evidence.setdefault(step.id, {})["cases"] = rows
        how = (f"spak.cpu.simrun.run_case: kernel '{step.kernel}' on the CPU simulator, shapes "
               f"{', '.join(step.shapes)} ({len(specs)} cases), numeric models "
               f"{', '.join(step.models)}")
        if not self._judge_sim(step, rows, "", how):
            return False
        return self.cpu_compile(step)

    def cpu_sweep(self, step) -> bool:
        pairs: dict = {}
        for arch, space in self.plan.sweep.items():
            if arch in self.plan.targets:
                for tm, tn in space.tile_pairs():
                    pairs.setdefault((tm, tn), []).append(arch)
        tiles_list = [{"TILE_M": tm, "TILE_N": tn} for tm, tn in pairs]
        specs = step.cases(step.sim_shapes) if step.sim_shapes else []
        self.log(f"  simulator: kernel {step.kernel}, {len(tiles_list)} tile pairs from the "
                 f"sweep spaces x {len(specs)} cases x models {', '.join(step.models)}")
        rows = self._simulate(step, specs, tiles_list, step.models) if specs else []
        self.evidence.setdefault(step.id, {})["cases"] = rows
        how = (f"spak.cpu.simrun.run_case per sweep tile pair: {len(pairs)} pairs "
               f"({', '.join(f'{a}x{b}' for a, b in pairs)}) from sweep."
               f"{', sweep.'.join(self.plan.sweep)}, on shapes {', '.join(step.sim_shapes)}")
        if not rows:
            self.gate(step, "cpu", "Sweep tiles: numerical error (simulator)", "-", how,
                      "no sim_shapes: nothing checked", SKIPPED)
        elif not self._judge_sim(step, rows, "Sweep tiles: ", how):
            return False
        return self.cpu_compile(step)

    def cpu_compile(self, step) -> bool:
        variants, archs = step.compile_variants, step.compile_archs
        if not variants:
            return True
        from spak.device.compile_report import CompileItem, compile_items, supported_archs
        items = [CompileItem(kernel=step.kernel, arch=a, dtype=v.dtype, head_dim=v.head_dim,
                             causal=v.causal, mask=v.mask,
                             tiles=dict(v.tiles) if v.tiles else (dict(step.tiles)
                                                                   if step.tiles else None),
                             source=f"steps[{step.index}] {step.id}")
                 for v in variants for a in archs]
        goal = f"every variant compiles to a cubin ({len(variants)} variant(s): " \
               f"{'; '.join(v.label for v in variants)})"
        how = "gpu.compile.compile_variant: cuTile front end + tileiras, on the CPU"
        if not self.do_compile:
            for a in archs:
                self.gate(step, "cpu", "Compiles (tileiras)", goal, how,
                          "--no-compile given (CI compiles with `spak compile`)", SKIPPED,
                          arch=a)
            return True
        supported, tool = supported_archs()
        self.log(f"  compile: {len(items)} variant(s) for {', '.join(archs)}; tileiras: {tool}")
        kw = {"compile_one": self._compile_one} if self._compile_one else {}
        rows = compile_items(items, jobs=self.jobs, supported=supported,
                             progress=lambda r, i, n: self.log(
                                 f"    {r['status']:<5} {CompileItem(r).label:<34} {r['arch']:<7}"
                                 f" {r['seconds']:6.2f} s {r['cubin_bytes']:>9,} B"
                                 + (f"  {str(r['error']).splitlines()[0][:160]}"
                                    if r.get("error") else "")), **kw)
        self.evidence.setdefault(step.id, {})["compile"] = rows
        all_ok = True
        for a in archs:
            ra = [r for r in rows if r["arch"] == a]
            ok = all(r["ok"] for r in ra)
            uns = any(r["status"] == "unsupported" for r in ra)
            secs = sum(r["seconds"] for r in ra)
            size = sum(r["cubin_bytes"] for r in ra)
            measured = (f"{sum(r['ok'] for r in ra)}/{len(ra)} ok, {secs:.1f} s, "
                        f"{size / 1024:.0f} KiB of cubin" if not uns else
                        "arch not supported by this tileiras")
            row = self.gate(step, "cpu", "Compiles (tileiras)", goal, how, measured,
                            PASS if ok else FAIL, arch=a)
            if not ok and all_ok:
                bad = next(r for r in ra if not r["ok"])
                self._fail(step, row, f"{CompileItem(bad).label} for {a}: {bad['error']}")
                all_ok = False
        return all_ok

    # ---------------------------------------------------------------- GPU loop
    def run_gpu(self) -> None:
        if self.recorded is not None and self.gpu_info is None:
            self.gpu_info = recorded_gpu_info(self.recorded, self.recorded_files)
        info = self.gpu_info if self.gpu_info is not None else (
            detect_gpu() if self.do_gpu else {"present": False, "reason": "--no-gpu"})
        self.gpu_info = info
        arch = info.get("arch")
        reason = None
        if not info.get("present"):
            reason = info.get("reason") or "no GPU"
        elif arch not in self.plan.targets:
            reason = f"GPU {info['name']} ({arch}) is not a target of this plan"
        if self.stopped is not None:
            reason = "stopped: a CPU gate failed"
        gpu_steps = [s for s in self.plan.steps if s.gpu]
        if reason:
            self.log(f"GPU loop: not run here ({reason})")
            for s in gpu_steps:
                self._gpu_placeholders(s, STOPPED if self.stopped else NOT_RUN, reason,
                                       self.plan.archs)
            return
        self.log(f"GPU loop on {info['name']} ({arch})"
                 + (f", judged from recorded results: {', '.join(self.recorded_files)}"
                    if self.recorded is not None else ""))
        others = [a for a in self.plan.archs if a != arch]
        for s in gpu_steps:
            t0 = time.perf_counter()
            self.log(f"[{s.index + 1}/{len(self.plan.steps)} {s.id}] {s.title} (GPU)")
            if s.kind == "kernel":
                self.gpu_kernel(s, arch)
            elif s.kind == "sweep":
                self.gpu_sweep(s, arch)
            self.step_seconds[f"{s.id}/gpu"] = time.perf_counter() - t0
            self._gpu_placeholders(s, NOT_RUN, "no results recorded for this arch"
                                   if self.recorded is not None else
                                   "no such GPU on this machine", others)

    def _gpu_goals(self, step):
        g = step.gpu
        goals = []
        if g.get("rel_l2"):
            goals.append(("Numerical error (GPU vs float64)",
                          ", ".join(f"{k} <= {v:g}" for k, v in g["rel_l2"].items())
                          + f"; NaN/Inf <= {g.get('nonfinite', 0)}",
                          "spak run: relative L2 vs a float64 reference"))
        if "sim_agreement" in g:
            sa = g["sim_agreement"]
            goal = (", ".join(f"{a}: >= {x:g}" for a, x in sa.items()) + "; other archs 0"
                    if isinstance(sa, dict) else f">= {sa:g}")
            goals.append(("Correctness (simulator agrees with GPU)",
                          f"fraction bit-identical {goal}"
                          + (" (measured and recorded)" if sa == 0 else ""),
                          "spak run: simulator on the same inputs, the arch's numeric model"))
        if "tuned_vs_default" in g:
            goals.append(("Tuned >= default tiles",
                          f"best config >= {g['tuned_vs_default']:g} x default, every shape",
                          "spak sweep: CUDA events, same run"))
        return goals

    def _floor_goal(self, f) -> str:
        return (f">= {f.floor:g} TFLOPS ({f.label})"
                + ("" if f.verified else " [unverified goal]"))

    def _gpu_placeholders(self, step, status, reason, archs):
        for metric, goal, how in self._gpu_goals(step):
            for a in archs:
                t = self.plan.targets.get(a)
                if "simulator agrees" in metric and t is not None and t.sim_model is None:
                    goal_a = goal + f"; the simulator has no {a} numeric model yet"
                else:
                    goal_a = goal
                self.gate(step, "gpu", metric, goal_a, how, reason, status, arch=a)
        for f in step.gpu.get("tflops") or ():
            if f.arch in archs:
                self.gate(step, "gpu", "Throughput", self._floor_goal(f),
                          "spak run / spak sweep: TFLOPS = 4*B*Hq*Sq*Sk*D (causal halved) "
                          "over the CUDA-event median", reason, status, arch=f.arch,
                          source=f.source, verified=f.verified)
        if not step.gpu.get("tflops") and step.gpu.get("timed_shapes"):
            for a in archs:
                self.gate(step, "gpu", "Throughput", "measured, no floor",
                          "spak run", reason, status, arch=a)

    def _spak_cli(self, argv: list, jsonl: Path) -> tuple[list, int]:
        """Run `python -m spak ...` writing JSON lines to `jsonl`; (rows, exit status)."""
        argv = [sys.executable, "-m", "spak", *argv, "--out", str(jsonl)]
        self.log("  $ spak " + " ".join(argv[3:]))
        if jsonl.exists():
            jsonl.unlink()
        jsonl.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(argv, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        for line in proc.stdout:
            self.log("    | " + line.rstrip("\n"))
        rc = proc.wait()
        rows = []
        if jsonl.exists():
            for line in jsonl.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
        self.gpu_runs.append({"argv": argv[3:], "rc": rc, "rows": len(rows),
                              "file": str(jsonl)})
        return rows, rc

    def _gpu_module_available(self, module, what, step, arch) -> bool:
        """False (with "not available" placeholders) when another issue's module is absent."""
        ok, why = _importable(module)
        if not ok:
            self.log(f"  {what}: not available ({why})")
            self._gpu_placeholders(step, NOT_AVAILABLE, why, [arch])
        return ok

    @staticmethod
    def _gpu_cases(step) -> tuple[list, str]:
        """The step's GPU shapes and its --dtype argument (fp16, bf16 or all)."""
        shapes = list(step.gpu.get("shapes") or step.shapes)
        dtypes = list(step.gpu.get("dtypes") or step.dtypes)
        return shapes, "all" if len(set(dtypes)) > 1 else dtypes[0]

    def gpu_kernel(self, step, arch):
        if self.recorded is not None:
            rows = [r for r in self.recorded if str(r.get("schema", "")).startswith("spak.run")]
            self.judge_gpu_rows(step, arch, rows, source="recorded " + ", ".join(
                Path(f).name for f in self.recorded_files))
            return
        if not self._gpu_module_available("spak.device.gpurun", "GPU loop", step, arch):
            return
        g = step.gpu
        shapes, dtype = self._gpu_cases(step)
        tiles = (["--tiles", f"{step.tiles['TILE_M']}x{step.tiles['TILE_N']}"]
                 if step.tiles else [])
        rows, rc = self._spak_cli(
            ["run", "--kernel", step.kernel, "--shapes", *shapes, "--dtype", dtype,
             "--causal", g.get("causal", step.causal), "--no-time", *tiles],
            self.out_dir / f"gpu-{step.id}-check.jsonl")
        if g.get("timed_shapes"):
            timed, rc2 = self._spak_cli(
                ["run", "--kernel", step.kernel, "--shapes", *g["timed_shapes"],
                 "--dtype", g.get("timed_dtype", "fp16"), "--causal", "both", "--no-sim",
                 *tiles], self.out_dir / f"gpu-{step.id}-timed.jsonl")
            rows += timed
            rc = rc or rc2
        self.judge_gpu_rows(step, arch, rows, rc=rc)

    def judge_gpu_rows(self, step, arch, rows, rc=0, source=None):
        """Gate rows from `spak run` JSON lines (separate so tests can feed rows)."""
        from spak.attention.problems import parse_spec
        from spak.device.archs import PROFILES, percent_of_peak, percent_of_ceiling
        g = step.gpu
        prov = f"spak-{step.kernel}"
        ours = [r for r in rows if r.get("provider") == prov and not r.get("skipped")]
        how_run = f"spak run --kernel {step.kernel}" + (f": {source}" if source else "")
        if not ours:
            msg = (f"no {prov} rows in {source}" if source else
                   f"spak run produced no {prov} rows (exit status {rc})")
            for metric, goal, how in self._gpu_goals(step):
                self.gate(step, "gpu", metric, goal, how, msg, NOT_RUN if source else FAIL,
                          arch=arch)
            return
        planned = {c.case_id for c in step.cases(g.get("shapes") or step.shapes,
                                                 g.get("dtypes"), g.get("causal"))}
        if g.get("timed_shapes"):
            planned |= {c.case_id for c in step.cases(g["timed_shapes"],
                                                      [g.get("timed_dtype", "fp16")], "both")}
        have = {r.get("case") for r in ours}
        coverage = f"; {len(have & planned)} of {len(planned)} planned cases present"
        gates = g.get("rel_l2") or step.cpu.get("rel_l2") or {}
        nf_max = g.get("nonfinite", 0)
        bad = [r for r in ours if r.get("error") or r.get("rel_l2") is None
               or r["rel_l2"] > gates.get(r.get("dtype"), math.inf)
               or (r.get("nonfinite") or 0) > nf_max or r.get("masked_rows_zero") is False]
        worst = {}
        for r in ours:
            if r.get("rel_l2") is not None:
                dt = r.get("dtype")
                worst[dt] = max(worst.get(dt, 0.0), r["rel_l2"])
        if gates:
            self.gate(step, "gpu", "Numerical error (GPU vs float64)",
                      ", ".join(f"{k} <= {v:g}" for k, v in gates.items())
                      + f"; NaN/Inf <= {nf_max}", how_run,
                      "; ".join(f"max {k} {_fmt(v)}" for k, v in sorted(worst.items()))
                      + f"; {len(ours) - len(bad)}/{len(ours)} rows pass" + coverage
                      + (f"; first failure {bad[0].get('case')}: "
                         f"{bad[0].get('error') or _fmt(bad[0].get('rel_l2'))}" if bad else ""),
                      FAIL if bad else PASS, arch=arch)
        if "sim_agreement" in g:
            need = sim_agreement_for(g["sim_agreement"], arch)
            fr = [r["sim"]["fraction_bit_identical"] for r in ours
                  if isinstance(r.get("sim"), dict) and "fraction_bit_identical" in r["sim"]]
            errs = [r for r in ours if isinstance(r.get("sim"), dict) and r["sim"].get("error")]
            if fr:
                mn = min(fr)
                ulps = [r["sim"].get("max_ulp") for r in ours if isinstance(r.get("sim"), dict)
                        and r["sim"].get("max_ulp") is not None]
                measured = (f"bit-identical: min {mn:.4f}, median {sorted(fr)[len(fr) // 2]:.4f} "
                            f"over {len(fr)} shapes" + (f"; max ulp {max(ulps)}" if ulps else "")
                            + (f"; {len(errs)} simulator errors" if errs else ""))
                st = PASS if mn >= need and not errs else FAIL
            else:
                measured, st = "no simulator comparison in the run's rows", FAIL
            self.gate(step, "gpu", "Correctness (simulator agrees with GPU)",
                      f"fraction bit-identical >= {need:g}", how_run, measured,
                      st, arch=arch)
        prof = PROFILES.get((self.gpu_info or {}).get("profile") or "")
        floors = [f for f in (g.get("tflops") or ()) if f.arch == arch]
        for f in floors:
            match = []
            for r in ours:
                try:
                    spec = parse_spec(r["case"])
                except Exception:  # noqa: BLE001
                    continue
                if f.applies(spec) and r.get("tflops"):
                    match.append(r)
            if not match:
                self.gate(step, "gpu", "Throughput", self._floor_goal(f), how_run,
                          "no timed shape matches this floor", FAIL if f.verified else
                          ADVISORY_FAIL, arch=arch, source=f.source, verified=f.verified)
                continue
            low = min(match, key=lambda r: r["tflops"])
            t = low["tflops"]
            extra = []
            if prof is not None:
                extra.append(f"{percent_of_peak(t, prof, f.dtype):.0f}% of {prof.name} peak")
            pc = percent_of_ceiling(t, low.get("ceiling_tflops"))
            if pc is not None:
                extra.append(f"{pc:.0f}% of the run's matmul ceiling")
            measured = (f"min {t:.1f} TFLOPS ({low['case']}) over {len(match)} shapes, max "
                        f"{max(r['tflops'] for r in match):.1f}" + (f"; {', '.join(extra)}"
                                                                    if extra else ""))
            ok = t >= f.floor
            st = (PASS if ok else FAIL) if f.verified else (ADVISORY_PASS if ok else ADVISORY_FAIL)
            self.gate(step, "gpu", "Throughput", self._floor_goal(f), how_run, measured, st,
                      arch=arch, source=f.source, verified=f.verified)
        if not floors and g.get("timed_shapes"):
            timed = [r for r in ours if r.get("tflops")]
            if timed:
                best = max(timed, key=lambda r: r["tflops"])
                self.gate(step, "gpu", "Throughput", "measured, no floor", how_run,
                          f"max {best['tflops']:.1f} TFLOPS ({best['case']})", PASS, arch=arch)

    def gpu_sweep(self, step, arch):
        if self.recorded is not None:
            rows = [r for r in self.recorded if str(r.get("schema", "")).startswith("spak.tune.sweep")]
            if rows:
                self.judge_sweep_rows(step, arch, rows)
            else:
                self._gpu_placeholders(step, NOT_RUN, "no spak sweep rows among the recorded "
                                       "results", [arch])
            return
        if not self._gpu_module_available("spak.tune.sweep", "GPU sweep", step, arch):
            return
        g = step.gpu
        shapes, dtype = self._gpu_cases(step)
        rows, rc = self._spak_cli(
            ["sweep", "--kernel", step.kernel, "--shapes", *shapes, "--dtype", dtype,
             "--causal", g.get("causal", step.causal), "--plan", str(self.plan.path or "")],
            self.out_dir / f"gpu-{step.id}-sweep.jsonl")
        proc_rc = rc
        if not rows:
            msg = f"spak sweep wrote no results (exit status {proc_rc})"
            for metric, goal, how in self._gpu_goals(step):
                self.gate(step, "gpu", metric, goal, how, msg, FAIL, arch=arch)
            return
        self.judge_sweep_rows(step, arch, rows)

    def judge_sweep_rows(self, step, arch, rows):
        from spak.attention.problems import parse_spec
        g = step.gpu
        how = f"spak sweep --kernel {step.kernel}"
        tuned_p, default_p = f"spak-{step.kernel}", f"spak-{step.kernel}-default"
        best, default = {}, {}
        failed = 0
        for r in rows:
            if r.get("kind", "result") != "result" or r.get("provider") not in (tuned_p,
                                                                                default_p):
                continue
            t = r.get("tflops")
            if not t or r.get("error") or r.get("status", "ok") != "ok":
                failed += 1
                continue
            c = r["case"]
            if c not in best or t > best[c]["tflops"]:
                best[c] = r
            if r.get("provider") == default_p:
                default[c] = r
        if "tuned_vs_default" in g:
            ratios = {c: best[c]["tflops"] / default[c]["tflops"] for c in default if c in best}
            if ratios:
                worst_c = min(ratios, key=ratios.get)
                ok = ratios[worst_c] >= g["tuned_vs_default"]
                measured = (f"min best/default {ratios[worst_c]:.3f} ({worst_c}) over "
                            f"{len(ratios)} shapes; {failed} configs failed")
            else:
                ok, measured = False, "no shape has both a default and a tuned result"
            self.gate(step, "gpu", "Tuned >= default tiles",
                      f"best config >= {g['tuned_vs_default']:g} x default, every shape", how,
                      measured, PASS if ok else FAIL, arch=arch)
        for f in (x for x in (g.get("tflops") or ()) if x.arch == arch):
            match = []
            for c, r in best.items():
                try:
                    if f.applies(parse_spec(c)):
                        match.append(r)
                except Exception:  # noqa: BLE001
                    pass
            if not match:
                st = FAIL if f.verified else ADVISORY_FAIL
                self.gate(step, "gpu", "Throughput", self._floor_goal(f), how,
                          "no swept shape matches this floor", st, arch=arch, source=f.source,
                          verified=f.verified)
                continue
            low = min(match, key=lambda r: r["tflops"])
            ok = low["tflops"] >= f.floor
            st = (PASS if ok else FAIL) if f.verified else (ADVISORY_PASS if ok else ADVISORY_FAIL)
            cfg = low.get("config") or {}
            from spak.device.archs import PROFILES, percent_of_peak
            prof = PROFILES.get((self.gpu_info or {}).get("profile") or "")
            pct = (f"; {percent_of_peak(low['tflops'], prof, f.dtype):.0f}% of {prof.name} peak"
                   if prof is not None else "")
            self.gate(step, "gpu", "Throughput", self._floor_goal(f), how,
                      f"min best {low['tflops']:.1f} TFLOPS ({low['case']}, "
                      f"{cfg.get('TILE_M')}x{cfg.get('TILE_N')}) over {len(match)} shapes, max "
                      f"{max(r['tflops'] for r in match):.1f}{pct}",
                      st, arch=arch, source=f.source, verified=f.verified)

    # ---------------------------------------------------------------- all
    def run(self) -> dict:
        t0 = time.perf_counter()
        started = _dt.datetime.now(_dt.timezone.utc)
        cpu_ok = self.run_cpu()
        if not cpu_ok:
            for s in self.plan.steps:
                if s.index > self.stopped["step_index"]:
                    self.gate(s, "cpu", "CPU gates", "-", "-", "stopped at step "
                              f"{self.stopped['step_index'] + 1}", STOPPED)
        self.run_gpu()
        wall = time.perf_counter() - t0
        failed = [g for g in self.gates if g["status"] == FAIL]
        return {"schema": "spak.recipe.schema/1", "plan": _rel(self.plan.path) if self.plan.path else None,
                "name": self.plan.name, "title": self.plan.title,
                "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "wall_seconds": wall,
                "step_seconds": self.step_seconds, "machine": machine_info(),
                "gpu": self.gpu_info, "status": PASS if not failed else FAIL,
                "cpu_gates_passed": cpu_ok, "stopped": self.stopped,
                "archs": self.plan.archs,
                "warnings": list(self.plan.warnings), "gates": self.gates,
                "not_checked": not_checked(self.gates), "evidence": self.evidence,
                "gpu_runs": self.gpu_runs,
                "sweep": {a: s.as_dict() for a, s in self.plan.sweep.items()}}


CATEGORIES = ("Numerical error", "Correctness", "Throughput")


def category_of(metric: str) -> str:
    """The recipe's three evaluation metrics: which one a gate belongs to."""
    m = metric.lower()
    if "throughput" in m or "tuned" in m:
        return "Throughput"
    if "numerical error" in m:
        return "Numerical error"
    return "Correctness"          # checker, compiles, simulator agreement, stopped steps


def not_checked(gates: list[dict]) -> list[str]:
    """One line per arch: which gates this machine did not check, and why."""
    out = {}
    for g in gates:
        if g["status"] in (NOT_RUN, NOT_AVAILABLE, SKIPPED, STOPPED):
            key = (g["arch"], g["status"], g["measured"])
            out.setdefault(key, []).append(f"{g['step']}: {g['metric']}")
    lines = []
    for (arch, status, why), what in out.items():
        uniq = list(dict.fromkeys(what))
        lines.append(f"{arch}: {status} ({why}): {'; '.join(uniq)}")
    return lines


# ------------------------------------------------------------------------ reports

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


def _md_escape(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def gpu_line(gpu: dict) -> str:
    if not gpu.get("present"):
        return f"none ({gpu.get('reason')}): GPU gates not run here"
    s = f"{gpu.get('name')} ({gpu.get('arch')})"
    if gpu.get("recorded"):
        s += (" -- GPU gates judged from results recorded on that GPU by `spak run`/`spak "
              "sweep` (" + ", ".join(f"`{f}`" for f in gpu["recorded"]) + "), not run by this "
              "invocation")
    return s


def format_markdown(doc: dict) -> str:
    m = doc["machine"]
    gpu = doc.get("gpu") or {}
    lines = [f"# `spak plan` report: {doc['name']}", "",
             f"{doc['title']}", "",
             f"- plan: `{doc['plan']}`",
             f"- machine: `{m['host']}`, {m['platform']}, {m['cpu_count']} CPU cores, "
             f"Python {m['python']}",
             f"- GPU: {gpu_line(gpu)}",
             f"- software: numpy {m['numpy']}, numba {m['numba']}, cuda-tile {m['cuda_tile']}, "
             f"tileiras {m['tileiras']}, torch {m['torch']}",
             f"- commit: {m['commit']}{' (with uncommitted changes)' if m['dirty'] else ''}",
             f"- started {doc['started']}, {doc['wall_seconds']:.1f} s in all "
             f"({', '.join(f'{k} {v:.1f} s' for k, v in doc['step_seconds'].items())})",
             f"- result: **{doc['status']}**"
             + ("" if not doc.get("stopped") else
                f", stopped at step {doc['stopped']['step_index'] + 1} "
                f"({doc['stopped']['step']}), gate '{doc['stopped']['metric']}': "
                f"{doc['stopped']['reason']}"), "",
             "## Evaluation metrics", "",
             "The recipe's table (seeds/001, section 3), one row per goal and target arch "
             "(\"all\": checked once for every target). Details per gate below.", "",
             "| metric | gate | arch | goal | how verified | result |",
             "|---|---|---|---|---|---|"]
    for r in summary_rows(doc):
        lines.append("| " + " | ".join(_md_escape(x) for x in (
            r["category"], r["metric"], r["arch"], r["goal"], r["how"], r["result"])) + " |")
    lines += ["", "## Every gate", "",
              "| step | metric | arch | goal | how verified | measured | result |",
              "|---|---|---|---|---|---|---|"]
    for g in merged_gates(doc["gates"]):
        lines.append("| " + " | ".join(_md_escape(x) for x in (
            f"{g['step_index'] + 1} {g['step']}", g["metric"], g["arch"], g["goal"], g["how"],
            g["measured"], g["status"])) + " |")
    lines += ["", "## Targets not checked on this machine", ""]
    lines += [f"- {x}" for x in doc["not_checked"]] or ["- none"]
    srcs = [g for g in doc["gates"] if g.get("source")]
    if srcs:
        lines += ["", "## Sources of the TFLOPS goals", ""]
        seen = set()
        for g in srcs:
            key = (g["step"], g["arch"], g["goal"])
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"- {g['step']}, {g['arch']}, {g['goal']}: {g['source']}"
                         + ("" if g.get("verified") else " (unverified: reported, does not "
                            "decide the exit status)"))
    if doc.get("warnings"):
        lines += ["", "## Plan warnings", ""] + [f"- {w}" for w in doc["warnings"]]
    comp = [(sid, r) for sid, ev in doc["evidence"].items() for r in ev.get("compile", [])]
    if comp:
        lines += ["", "## Compile checks (tileiras, CPU)", "",
                  "| step | variant | arch | tiles | result | seconds | cubin bytes |",
                  "|---|---|---|---|---|---|---|"]
        for sid, r in comp:
            t = r.get("tiles") or {}
            from spak.device.compile_report import CompileItem
            lines.append(f"| {sid} | {CompileItem(r).label} | {r['arch']} | "
                         f"{t.get('TILE_M')}x{t.get('TILE_N')} | {r['status']} | "
                         f"{r['seconds']:.2f} | {r['cubin_bytes']:,} |")
    sims = [(sid, ev["cases"]) for sid, ev in doc["evidence"].items() if ev.get("cases")]
    if sims:
        lines += ["", "## Simulator cases (summary per step, model and dtype)", "",
                  "| step | model | dtype | cases | pass | max rel L2 | simulated s |",
                  "|---|---|---|---|---|---|---|"]
        for sid, rows in sims:
            keys = sorted({(r["model"], r["dtype"]) for r in rows})
            for model, dt in keys:
                rs = [r for r in rows if r["model"] == model and r["dtype"] == dt]
                rels = [r["rel_l2"] for r in rs if r["rel_l2"] is not None]
                lines.append(f"| {sid} | {model} | {dt} | {len(rs)} | "
                             f"{sum(bool(r.get('passed')) for r in rs)} | "
                             f"{_fmt(max(rels) if rels else None)} | "
                             f"{sum(r['seconds'] or 0 for r in rs):.1f} |")
    lines += ["", "Full per-case evidence: `report.json` next to this file.", ""]
    return "\n".join(lines)


def write_report(doc: dict, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "report.json", out_dir / "report.md"
    js.write_text(json.dumps(_jsonable(doc), indent=1, allow_nan=False) + "\n")
    md.write_text(format_markdown(doc))
    return md, js


# ------------------------------------------------------------------------ command

def default_out_dir() -> Path:
    host = "".join(c if c.isalnum() or c in "-_." else "-" for c in socket.gethostname())
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    return Path("results") / f"plan-{host}-{date}"


def cmd_plan(args: argparse.Namespace) -> int:
    from spak.recipe.schema import PlanError, load_plan
    try:
        plan = load_plan(args.plan)
    except PlanError as e:
        print(f"spak plan: {e}", file=sys.stderr)
        print("spak plan: the plan was rejected before anything ran", file=sys.stderr)
        return 2
    out_dir = Path(args.out) if args.out else default_out_dir()

    def log(msg):
        print(msg, flush=True)

    log(f"spak plan {plan.path}: {plan.title}")
    targets = ", ".join(f"{a} ({', '.join(t.gpus)})" for a, t in plan.targets.items())
    log(f"  targets: {targets}; {len(plan.steps)} steps: "
        f"{', '.join(s.id for s in plan.steps)}")
    for w in plan.warnings:
        log(f"  warning: {w}")
    recorded = None
    if args.gpu_results:
        try:
            recorded = read_jsonl(args.gpu_results)
        except OSError as e:
            print(f"spak plan: error: --gpu-results: {e}", file=sys.stderr)
            return 2
    runner = PlanRunner(plan, out_dir=out_dir, log=log, compile=not args.no_compile,
                        gpu=not args.no_gpu, jobs=args.jobs, seed=args.seed,
                        verbose=args.verbose, recorded=recorded,
                        recorded_files=args.gpu_results)
    doc = runner.run()
    md, js = write_report(doc, out_dir)
    log("")
    log(f"{'PASS' if doc['status'] == PASS else 'FAIL'}: "
        f"{sum(g['status'] == PASS for g in doc['gates'])} gates passed, "
        f"{sum(g['status'] == FAIL for g in doc['gates'])} failed, "
        f"{sum(g['status'] in (NOT_RUN, NOT_AVAILABLE, STOPPED, SKIPPED) for g in doc['gates'])}"
        f" not run; {doc['wall_seconds']:.1f} s")
    for line in doc["not_checked"]:
        log(f"  not checked: {line}")
    log(f"report: {md} and {js}")
    return 0 if doc["status"] == PASS else 1


def register(subparsers) -> None:
    """Add `spak plan`."""
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser(
        "plan", help="carry out a plan: CPU gates of every step, then the GPU loop if a GPU "
                     "is present; writes a report",
        description="\n\n".join(doc[1:5]) + "\n\n" + doc[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", nargs="?", default=None, metavar="PLAN",
                   help="plan file (default: plans/fmha.toml)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="report directory (default: results/plan-<host>-<date>)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the tileiras compile gates (reported as skipped)")
    p.add_argument("--no-gpu", action="store_true",
                   help="do not run the GPU loop even if a GPU is present")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="compile in N processes (default 1)")
    p.add_argument("--seed", type=int, default=None,
                   help="input seed for every step (default: each step's own)")
    p.add_argument("--verbose", action="store_true", help="a progress line per simulated case")
    p.add_argument("--gpu-results", nargs="+", default=None, metavar="JSONL",
                   help="judge the GPU gates on these `spak run` / `spak sweep` result files "
                        "(recorded on a GPU machine) instead of running the GPU loop here")
    p.set_defaults(func=cmd_plan)
