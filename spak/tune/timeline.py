"""Where a sweep's wall time goes, per GPU: worker start-up, jobs (their first calls, which
hold the compile or its cache hit, and the timing), waiting for a compile helper, and idle
at the end (no work left for this GPU while others still run). The end line carries it
("breakdown") and `spak sweep` prints it under the summary table, so a multi-GPU run shows
whether start-up, compile or the split of the jobs kept it from scaling.
"""
from __future__ import annotations

import time

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

    def job_done(self, seconds: float, row: dict) -> None:
        self.jobs += 1
        self.busy_s += seconds
        fc = row.get("first_call_s")
        if isinstance(fc, (int, float)) and str(row.get("provider", "")).startswith("spak-"):
            self.first_call_s += min(float(fc), seconds)
        if row.get("status") in ("timeout", "crash"):
            self.fault_s += seconds

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
                "tail_s": self.tail_s}


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
                        "cpu_s": c.compile_s,
                        "done_after_s": (c.last_done - run_t0) if c.last_done and run_t0
                        else None},
            "gpus": [{"gpu_index": s.index, **s.clock.as_dict()} for s in sweep.slots]}


def _s(x) -> str:
    return "-" if x is None else f"{x:.1f} s"


def breakdown_lines(b: dict) -> list[str]:
    """The breakdown as `spak sweep` prints it."""
    c = b["compile"]
    lines = [f"time: {_s(b['wall_s'])} wall = set-up {_s(b['setup_s'])} (workers started) "
             f"+ jobs {_s(b['run_s'])}; compile helpers: {c['helpers']} started, "
             f"{c['units']} variants built in {_s(c['cpu_s'])} of helper time, the last "
             f"{_s(c['done_after_s'])} into the jobs"]
    for g in b["gpus"]:
        who = "the GPU" if g["gpu_index"] is None else f"gpu{g['gpu_index']}"
        lines.append(
            f"  {who}: {g['jobs']} jobs; start-up {_s(g['startup_s'])}, busy "
            f"{_s(g['busy_s'])} (first calls {_s(g['first_call_s'])}, timing "
            f"{_s(g['timing_s'])}, faults {_s(g['fault_s'])}), waiting for compiles "
            f"{_s(g['wait_compile_s'])}, idle at the end {_s(g['tail_s'])}")
    return lines
