"""Where a sweep's wall time goes, per GPU: worker start-up, jobs (their first calls, which
hold the compile or its cache hit, and the timing), waiting for a compile helper, and idle
at the end (no work left for this GPU while others still run). The end line carries it
("breakdown") and `spak sweep` prints it under the summary table, so a multi-GPU run shows
whether start-up, compile or the split of the jobs kept it from scaling.
"""
from __future__ import annotations

import time
from typing import Optional

__all__ = ["GpuClock", "breakdown", "breakdown_lines"]


class GpuClock:
    """One GPU's (one slot's) seconds, by what its worker was doing."""

    def __init__(self):
        self.jobs = 0
        self.startup_s = 0.0        # spawn -> hello, every (re)start
        self.busy_s = 0.0           # a job in flight (driver's clock)
        self.first_call_s = 0.0     # the jobs' first calls: compile or cache hit, JIT front end
        self.fault_s = 0.0          # jobs that timed out or crashed their worker
        self.wait_compile_s = 0.0   # idle while jobs were left (their variant still compiling)
        self.tail_s = 0.0           # idle with no job left to start
        self.startup_phases: dict = {}   # the first start's: interpreter, torch import, ...
        # first calls' cubins: found in cuTile's disk cache (a helper's) or built by tileiras
        # in the worker (a helper's cubin missed, or nobody built it); None: not reported
        self.cubin_hits: Optional[int] = None
        self.cubin_compiles: Optional[int] = None

    def started(self, spawned: float, startup) -> None:
        """A worker said hello; ``startup``: its hello's "startup" (main_at, ready_at on
        this host's monotonic clock, phases). The first start's phases are kept."""
        if self.startup_phases or not isinstance(startup, dict):
            return
        now = time.monotonic()
        ph = {"interpreter": max(0.0, startup.get("main_at", spawned) - spawned)}
        ph.update({k: float(v) for k, v in (startup.get("phases") or {}).items()})
        ph["other"] = max(0.0, now - spawned - sum(ph.values()))
        self.startup_phases = ph

    def job_done(self, seconds: float, row: dict) -> None:
        self.jobs += 1
        self.busy_s += seconds
        fc = row.get("first_call_s")
        if isinstance(fc, (int, float)) and str(row.get("provider", "")).startswith("spak-"):
            self.first_call_s += min(float(fc), seconds)
        if row.get("status") in ("timeout", "crash"):
            self.fault_s += seconds
        if isinstance(row.get("cubin_disk_hits"), int):
            self.cubin_hits = (self.cubin_hits or 0) + row["cubin_disk_hits"]
            self.cubin_compiles = (self.cubin_compiles or 0) + int(row.get("cubin_compiles") or 0)

    def idle(self, seconds: float, work_left: bool) -> None:
        if work_left:
            self.wait_compile_s += seconds
        else:
            self.tail_s += seconds

    def as_dict(self) -> dict:
        return {"jobs": self.jobs, "startup_s": self.startup_s, "busy_s": self.busy_s,
                "first_call_s": self.first_call_s,
                "timing_s": max(0.0, self.busy_s - self.first_call_s - self.fault_s),
                "fault_s": self.fault_s, "wait_compile_s": self.wait_compile_s,
                "tail_s": self.tail_s, "startup_phases": dict(self.startup_phases),
                "cubin_hits": self.cubin_hits, "cubin_compiles": self.cubin_compiles}


def breakdown(sweep) -> dict:
    """The sweep's breakdown (see the module doc): wall, the set-up before the first job
    (workers started, plan made), the compile helpers' work, and each GPU's clock."""
    now = time.monotonic()
    run_t0 = getattr(sweep, "_run_t0", None)
    c = sweep.compiler
    return {"wall_s": now - sweep.t0,
            "setup_s": (run_t0 - sweep.t0) if run_t0 else None,
            "run_s": (now - run_t0) if run_t0 else None,
            "compile": {"helpers": c.helpers_started, "units": c.units_done,
                        "by_kind": dict(getattr(c, "started_by_kind", {}) or {}),
                        "unmapped": getattr(c, "unmapped", 0),
                        "cpu_s": c.compile_s,
                        "done_after_s": (c.last_done - run_t0) if c.last_done and run_t0
                        else None,
                        "ready_s": _spread(getattr(c, "ready_s", ())),
                        "phases": _median_phases(getattr(c, "phases", ()))},
            "gpus": [{"gpu_index": s.index, **s.clock.as_dict()} for s in sweep.slots]}


def _spread(xs) -> dict | None:
    """{min, median, max} of ``xs``, or None when empty."""
    xs = sorted(xs)
    return {"min": xs[0], "median": xs[len(xs) // 2], "max": xs[-1]} if xs else None


def _median_phases(phases) -> dict:
    """The median of each start-up phase over the processes that reported it."""
    keys = sorted({k for p in phases for k in p})
    return {k: _spread([p[k] for p in phases if k in p])["median"] for k in keys}


#: start-up phases as printed
PHASE_NAMES = {"interpreter": "python", "torch_import": "torch import",
               "cuda_context": "CUDA context", "cutile_import": "cuTile import",
               "fake_startup": "fake start-up", "other": "other"}


def _phases(ph: dict) -> str:
    return ", ".join(f"{PHASE_NAMES.get(k, k)} {v:.1f}" for k, v in ph.items())


def _s(x) -> str:
    return "-" if x is None else f"{x:.1f} s"


def _who(g: dict) -> str:
    return "the GPU" if g["gpu_index"] is None else f"gpu{g['gpu_index']}"


def breakdown_lines(b: dict) -> list[str]:
    """The breakdown as `spak sweep` prints it."""
    c = b["compile"]
    lines = [f"time: {_s(b['wall_s'])} wall = set-up {_s(b['setup_s'])} (workers started) "
             f"+ jobs {_s(b['run_s'])}; compile helpers: {c['helpers']} started, "
             f"{c['units']} variants built in {_s(c['cpu_s'])} of helper time, the last "
             f"{_s(c['done_after_s'])} into the jobs"]
    if c.get("ready_s"):
        r = c["ready_s"]
        lines.append(f"  compile helpers ready {r['min']:.1f}-{r['max']:.1f} s after their "
                     f"spawn (median {r['median']:.1f} s: {_phases(c.get('phases') or {})})")
    kinds = c.get("by_kind") or {}
    if kinds.get("cpu"):
        lines.append(f"  compile helpers: {kinds['cpu']} on the CPU, {kinds.get('gpu', 0)} "
                     f"on a GPU (for the {c.get('unmapped', 0)} units the CPU ones handed "
                     f"back)")
    hits = [g for g in b["gpus"] if g.get("cubin_hits") is not None]
    if hits:
        h = sum(g["cubin_hits"] for g in hits)
        m = sum(g["cubin_compiles"] for g in hits)
        lines.append(f"  first launches: {h} cubins found in the disk cache (the helpers'), "
                     f"{m} compiled by the workers (" + ", ".join(
                         f"{_who(g)} {g['cubin_hits']}/{g['cubin_compiles']}"
                         for g in hits) + " found/compiled)")
    for g in b["gpus"]:
        who = _who(g)
        ph = f" ({_phases(g['startup_phases'])})" if g.get("startup_phases") else ""
        lines.append(
            f"  {who}: {g['jobs']} jobs; start-up {_s(g['startup_s'])}{ph}, busy "
            f"{_s(g['busy_s'])} (first calls {_s(g['first_call_s'])}, timing "
            f"{_s(g['timing_s'])}, faults {_s(g['fault_s'])}), waiting for compiles "
            f"{_s(g['wait_compile_s'])}, idle at the end {_s(g['tail_s'])}")
    return lines
