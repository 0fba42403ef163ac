"""Gate rows: what `spak plan` records for every gate it judges, and their statuses.

A gate row says which step and loop (cpu/gpu) it belongs to, the metric, the goal, how it
was verified, what was measured, the status and the arch it holds for ("all": every
target). `GateBook` collects them in order and remembers where the plan stopped.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

__all__ = ["PASS", "FAIL", "NOT_RUN", "NOT_AVAILABLE", "SKIPPED", "STOPPED", "ADVISORY_PASS",
           "ADVISORY_FAIL", "JUDGED", "NOT_JUDGED", "CATEGORIES", "GateBook", "category_of",
           "floor_status", "not_checked", "sci"]

PASS, FAIL = "PASS", "FAIL"
NOT_RUN, NOT_AVAILABLE, SKIPPED = "not run here", "not available", "skipped"
STOPPED = "not run (stopped earlier)"
ADVISORY_PASS, ADVISORY_FAIL = "PASS (advisory)", "FAIL (advisory)"
#: statuses of gates that were judged here (advisory ones never decide the exit status)
JUDGED = (PASS, FAIL, ADVISORY_FAIL, ADVISORY_PASS)
#: statuses of gates this machine did not check
NOT_JUDGED = (NOT_RUN, NOT_AVAILABLE, SKIPPED, STOPPED)
#: the recipe's three evaluation metrics, in the order reports list them
CATEGORIES = ("Numerical error", "Correctness", "Throughput")


def sci(x, spec=".2e") -> str:
    """A measured number for a gate row: "-" for none, "nan"/"inf" as such."""
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec)


def category_of(metric: str) -> str:
    """The recipe's three evaluation metrics: which one a gate belongs to."""
    m = metric.lower()
    if "throughput" in m or "tuned" in m:
        return "Throughput"
    if "numerical error" in m:
        return "Numerical error"
    return "Correctness"          # checker, compiles, simulator agreement, stopped steps


def floor_status(ok: bool, verified: bool) -> str:
    """A throughput floor's status: an unverified floor is advisory."""
    if verified:
        return PASS if ok else FAIL
    return ADVISORY_PASS if ok else ADVISORY_FAIL


class GateBook:
    """The gate rows of one plan run, in order, and the gate that stopped it (if any)."""

    def __init__(self, log: Callable[[str], None] = print):
        self.rows: list[dict] = []
        self.stopped: Optional[dict] = None
        self.log = log

    def add(self, step, loop, metric, goal, how, measured, status, arch="all", **extra) -> dict:
        row = {"step": step.id, "step_index": step.index, "loop": loop, "metric": metric,
               "category": category_of(metric), "arch": arch, "goal": goal, "how": how,
               "measured": measured, "status": status, **extra}
        self.rows.append(row)
        if status in JUDGED:
            self.log(f"    {status:<16} {metric}: {measured}")
        return row

    def stop(self, step, row, reason) -> None:
        self.stopped = {"step": step.id, "step_index": step.index, "metric": row["metric"],
                        "reason": reason}
        self.log(f"  STOPPED at step {step.index + 1} ({step.id}), gate '{row['metric']}': "
                 f"{reason}")


def not_checked(gates: list[dict]) -> list[str]:
    """One line per arch: which gates this machine did not check, and why."""
    out: dict = {}
    for g in gates:
        if g["status"] in NOT_JUDGED:
            key = (g["arch"], g["status"], g["measured"])
            out.setdefault(key, []).append(f"{g['step']}: {g['metric']}")
    lines = []
    for (arch, status, why), what in out.items():
        uniq = list(dict.fromkeys(what))
        lines.append(f"{arch}: {status} ({why}): {'; '.join(uniq)}")
    return lines
