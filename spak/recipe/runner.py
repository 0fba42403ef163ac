"""Carrying out a plan: the CPU gates of every step in order (spak.recipe.cpu_gates), then,
on a machine whose GPU's arch is a plan target, the GPU gates (spak.recipe.gpu_gates) on
what `spak run` (kernel steps) and `spak sweep` (sweep steps) measure, or on result files
recorded earlier on a GPU machine. `PlanRunner.run` returns the report document that
spak.recipe.render writes.

Call boundaries with the GPU side (kept small on purpose):

* GPU run: the `spak run` command line, in a subprocess:
  ``python -m spak run --kernel K --shapes ... --dtype D --causal C [--no-time]
  [--family F] --out FILE.jsonl``; its JSON lines (schema "spak.run/1": provider, case,
  rel_l2, nonfinite, passed, sim.fraction_bit_identical, tflops, ceiling_tflops, error,
  skipped) are what the gates read.
* Sweep: the `spak sweep` command line, in a subprocess:
  ``python -m spak sweep --kernel K --shapes ... --dtype D --causal C --plan PLAN
  [--family F] --out FILE.jsonl``; it reads its search space from this plan's
  [sweep.<arch>]. Its result lines (kind "result", provider "spak-K" for a swept config or
  "spak-K-default" for the default config, case, config, status, tflops) give the best
  config per shape, compared with the floors and with the default config.

``--family F`` is passed for steps of a family other than the FMHA forward. Either command
may be missing (not installed, or another family's not written yet): its gates then say
"not available", which is not a failure.
"""
from __future__ import annotations

import datetime as _dt
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from spak import families
from spak.recipe import gpu_gates
from spak.recipe.cpu_gates import CpuGates
from spak.recipe.gates import (FAIL, NOT_AVAILABLE, NOT_RUN, PASS, STOPPED, GateBook,
                               not_checked)
from spak.recipe.machine import detect_gpu, machine_info, recorded_gpu_info, rel_path
from spak.results.rows import tiles_label
from spak.results.rows import ResultRow

__all__ = ["PlanRunner", "REPORT_SCHEMA"]

#: the report document's schema (results/plan-*/report.json)
REPORT_SCHEMA = "spak.plan/1"


def _importable(mod: str) -> tuple[bool, Optional[str]]:
    try:
        importlib.import_module(mod)
        return True, None
    except Exception as e:  # noqa: BLE001 -- absent or broken: both "not available"
        return False, f"{mod} cannot be imported ({type(e).__name__}: {e})"


class PlanRunner:
    """Runs a validated Plan; collects gate rows (``gates``) and the evidence behind them."""

    def __init__(self, plan, *, out_dir: Path, log: Callable[[str], None] = print,
                 compile: bool = True, gpu: bool = True, jobs: int = 1, seed: Optional[int] = None,
                 run_case: Optional[Callable] = None, compile_one: Optional[Callable] = None,
                 gpu_info: Optional[dict] = None, verbose: bool = False,
                 recorded: Optional[list] = None, recorded_files: Optional[list] = None):
        self.plan = plan
        self.out_dir = Path(out_dir)
        self.log = log
        self.do_gpu = gpu
        self.gpu_info = gpu_info
        self.book = GateBook(log)
        self.evidence: dict = {}       # step id -> {"cases": [...], "compile": [...], ...}
        self.cpu = CpuGates(plan, self.book, self.evidence, log=log, run_case=run_case,
                            compile=compile, jobs=jobs, compile_one=compile_one, seed=seed,
                            verbose=verbose)
        self.step_seconds: dict = {}
        self.gpu_runs: list[dict] = []     # the `spak run` / `spak sweep` subprocesses
        # --gpu-results: rows recorded by `spak run` / `spak sweep` on a GPU machine, judged
        # instead of running anything (the report says so on every GPU gate)
        self.recorded = recorded
        self.recorded_files = list(recorded_files or [])

    @property
    def gates(self) -> list[dict]:
        return self.book.rows

    @property
    def stopped(self) -> Optional[dict]:
        return self.book.stopped

    # ---------------------------------------------------------------- CPU loop
    def run_cpu(self) -> bool:
        n = len(self.plan.steps)
        for step in self.plan.steps:
            t0 = time.perf_counter()
            self.log(f"[{step.index + 1}/{n} {step.id}] {step.title} (CPU)")
            ok = self.cpu.judge(step)
            self.step_seconds[step.id] = time.perf_counter() - t0
            self.log(f"  {step.id}: CPU gates {'passed' if ok else 'FAILED'} in "
                     f"{self.step_seconds[step.id]:.1f} s")
            if not ok:
                return False
        return True

    # ---------------------------------------------------------------- GPU loop
    def _gpu_here(self) -> tuple[dict, Optional[str]]:
        """(the GPU the loop runs on or judges, why the GPU loop does not run or None)."""
        if self.recorded is not None and self.gpu_info is None:
            self.gpu_info = recorded_gpu_info(self.recorded, self.recorded_files)
        info = self.gpu_info if self.gpu_info is not None else (
            detect_gpu() if self.do_gpu else {"present": False, "reason": "--no-gpu"})
        self.gpu_info = info
        reason = None
        if not info.get("present"):
            reason = info.get("reason") or "no GPU"
        elif info.get("arch") not in self.plan.targets:
            reason = f"GPU {info['name']} ({info.get('arch')}) is not a target of this plan"
        if self.stopped is not None:
            reason = "stopped: a CPU gate failed"
        return info, reason

    def run_gpu(self) -> None:
        info, reason = self._gpu_here()
        arch = info.get("arch")
        gpu_steps = [s for s in self.plan.steps if s.gpu]
        if reason:
            self.log(f"GPU loop: not run here ({reason})")
            for s in gpu_steps:
                gpu_gates.placeholders(self.book, self.plan, s,
                                       STOPPED if self.stopped else NOT_RUN, reason,
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
            gpu_gates.placeholders(self.book, self.plan, s, NOT_RUN,
                                   "no results recorded for this arch"
                                   if self.recorded is not None else
                                   "no such GPU on this machine", others)

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
        """False (with "not available" placeholders) when a GPU-side module is absent."""
        ok, why = _importable(module)
        if not ok:
            self.log(f"  {what}: not available ({why})")
            gpu_gates.placeholders(self.book, self.plan, step, NOT_AVAILABLE, why, [arch])
        return ok

    @staticmethod
    def _gpu_args(step) -> list:
        """The arguments `spak run` and `spak sweep` share for a step: kernel, shapes,
        dtype (fp16, bf16 or all), causal, and the family unless it is the default."""
        g = step.gpu
        shapes = list(g.get("shapes") or step.shapes)
        dtypes = list(g.get("dtypes") or step.dtypes)
        family = [] if step.family == families.DEFAULT else ["--family", step.family]
        return ["--kernel", step.kernel, "--shapes", *shapes, "--dtype",
                "all" if len(set(dtypes)) > 1 else dtypes[0], "--causal",
                g.get("causal", step.causal), *family]

    def _recorded_rows(self, command: str) -> list:
        return [r for r in self.recorded if ResultRow(r).command == command]

    def gpu_kernel(self, step, arch):
        if self.recorded is not None:
            self.judge_gpu_rows(step, arch, self._recorded_rows("run"),
                                source="recorded " + ", ".join(Path(f).name
                                                               for f in self.recorded_files))
            return
        if not self._gpu_module_available("spak.device.gpurun", "GPU loop", step, arch):
            return
        g = step.gpu
        tiles = ["--tiles", tiles_label(step.tiles)] if step.tiles else []
        base = self._gpu_args(step)
        rows, rc = self._spak_cli(["run", *base, "--no-time", *tiles],
                                  self.out_dir / f"gpu-{step.id}-check.jsonl")
        if g.get("timed_shapes"):
            family = base[base.index("--family"):] if "--family" in base else []
            timed, rc2 = self._spak_cli(
                ["run", "--kernel", step.kernel, "--shapes", *g["timed_shapes"],
                 "--dtype", g.get("timed_dtype", "fp16"), "--causal", "both", *family,
                 "--no-sim", *tiles], self.out_dir / f"gpu-{step.id}-timed.jsonl")
            rows += timed
            rc = rc or rc2
        self.judge_gpu_rows(step, arch, rows, rc=rc)

    def gpu_sweep(self, step, arch):
        if self.recorded is not None:
            rows = self._recorded_rows("sweep")
            if rows:
                self.judge_sweep_rows(step, arch, rows)
            else:
                gpu_gates.placeholders(self.book, self.plan, step, NOT_RUN,
                                       "no spak sweep rows among the recorded results", [arch])
            return
        if not self._gpu_module_available("spak.tune.sweep", "GPU sweep", step, arch):
            return
        rows, rc = self._spak_cli(["sweep", *self._gpu_args(step), "--plan",
                                   str(self.plan.path or "")],
                                  self.out_dir / f"gpu-{step.id}-sweep.jsonl")
        if not rows:
            msg = f"spak sweep wrote no results (exit status {rc})"
            for metric, goal, how in gpu_gates.goals(step):
                self.book.add(step, "gpu", metric, goal, how, msg, FAIL, arch=arch)
            return
        self.judge_sweep_rows(step, arch, rows)

    def judge_gpu_rows(self, step, arch, rows, rc=0, source=None):
        """Gate rows from `spak run` JSON lines."""
        gpu_gates.judge_run_rows(self.book, step, arch, rows, gpu_info=self.gpu_info, rc=rc,
                                 source=source)

    def judge_sweep_rows(self, step, arch, rows):
        """Gate rows from `spak sweep` JSON lines."""
        gpu_gates.judge_sweep_rows(self.book, step, arch, rows, gpu_info=self.gpu_info)

    # ---------------------------------------------------------------- all
    def run(self) -> dict:
        """Both loops; the report document (gates, evidence, machine, GPU, timings)."""
        t0 = time.perf_counter()
        started = _dt.datetime.now(_dt.timezone.utc)
        cpu_ok = self.run_cpu()
        if not cpu_ok:
            for s in self.plan.steps:
                if s.index > self.stopped["step_index"]:
                    self.book.add(s, "cpu", "CPU gates", "-", "-", "stopped at step "
                                  f"{self.stopped['step_index'] + 1}", STOPPED)
        self.run_gpu()
        failed = [g for g in self.gates if g["status"] == FAIL]
        return {"schema": REPORT_SCHEMA,
                "plan": rel_path(self.plan.path) if self.plan.path else None,
                "name": self.plan.name, "title": self.plan.title,
                "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "wall_seconds": time.perf_counter() - t0,
                "step_seconds": self.step_seconds, "machine": machine_info(),
                "gpu": self.gpu_info, "status": PASS if not failed else FAIL,
                "cpu_gates_passed": cpu_ok, "stopped": self.stopped,
                "archs": self.plan.archs,
                "warnings": list(self.plan.warnings), "gates": self.gates,
                "not_checked": not_checked(self.gates), "evidence": self.evidence,
                "gpu_runs": self.gpu_runs,
                "sweep": {a: s.as_dict() for a, s in self.plan.sweep.items()}}
