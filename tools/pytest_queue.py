"""pytest plugin: many pytest processes share one ordered list of node ids as a work queue.

    PYTEST_QUEUE_IDS=ids.txt PYTEST_QUEUE_CLAIMS=dir/ PYTEST_QUEUE_OUT=shard3.tsv \
    PYTEST_QUEUE_DEADLINE=<epoch s> python -m pytest -p pytest_queue tests/ops

(with this directory on PYTHONPATH). Used by tools/tilegym_suite.sh (issue 37): TileGym's
tests take 0.1 s to 70 s each (GPU: mostly cuTile's JIT compile; CPU: the simulator), so a
fixed interleaved split leaves shards idle while one runs the slow tail. Here every process
collects the listed ids (others deselected), and runs them in the list's order, each id
claimed first by creating CLAIMS/<index> with O_EXCL: an id runs exactly once, in whichever
process is free, and the ids that finished form (nearly) a prefix of the list, so two runs
ordered alike (a GPU run and a CPU run) finish the same ids first. No new id is claimed after
PYTEST_QUEUE_DEADLINE, so each process ends (and writes its junit xml) in time.

Each finished test is appended to PYTEST_QUEUE_OUT at once (outcome, seconds, node id, reason;
tab-separated: TileGym ids hold spaces), so a process killed later loses only its running test.
A test that started and did not finish leaves a "STARTED" row (its process was killed).
pytest-xdist is not needed (and may be missing where this runs).
"""
from __future__ import annotations

import os
import time

import pytest

_OUTCOME_ORDER = {"PASSED": 0, "SKIPPED": 1, "XFAIL": 1, "FAILED": 2, "ERROR": 3}


def _env(name, default=None):
    v = os.environ.get(name)
    return v if v not in (None, "") else default


def _clean(text: str) -> str:
    return " ".join(str(text).split())[:400]


class Queue:
    def __init__(self, ids_path, claims, out, deadline):
        with open(ids_path) as f:
            self.ids = [line.rstrip("\n").strip() for line in f if "::" in line]
        self.index = {nid: i for i, nid in enumerate(self.ids)}
        self.claims = claims
        self.deadline = deadline
        self.out = open(out, "a", buffering=1) if out else None
        self.reports: dict = {}
        self.started: dict = {}
        os.makedirs(claims, exist_ok=True)

    def claim(self, i: int) -> bool:
        try:
            fd = os.open(os.path.join(self.claims, str(i)), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        return True

    def write(self, outcome, seconds, nid, reason=""):
        if self.out:
            self.out.write(f"{outcome}\t{seconds:.3f}\t{nid}\t{_clean(reason)}\n")

    # -- pytest hooks -------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        keep = [it for it in items if it.nodeid in self.index]
        drop = [it for it in items if it.nodeid not in self.index]
        keep.sort(key=lambda it: self.index[it.nodeid])
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

    def _next(self, items, pos):
        """The first item at or after pos this process claims (None: none left / past the
        deadline); returns (item, position after it)."""
        while pos < len(items):
            if time.time() >= self.deadline:
                return None, len(items)
            it = items[pos]
            pos += 1
            if self.claim(self.index[it.nodeid]):
                return it, pos
        return None, pos

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session):
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
        if session.config.option.collectonly:
            return True
        items = session.items
        cur, pos = self._next(items, 0)
        while cur is not None and time.time() < self.deadline:
            # claim the next one before running this one: pytest tears fixtures down by it
            # (one claimed id may stay unrun at the deadline: no row, NOT-RUN in the join)
            nxt, pos = self._next(items, pos)
            cur.config.hook.pytest_runtest_protocol(item=cur, nextitem=nxt)
            if session.shouldfail or session.shouldstop:
                break
            cur = nxt
        return True

    def pytest_runtest_logstart(self, nodeid, location):
        self.started[nodeid] = time.time()
        self.reports[nodeid] = []
        if self.out:
            self.write("STARTED", 0.0, nodeid)

    def pytest_runtest_logreport(self, report):
        self.reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid, location):
        reps = self.reports.pop(nodeid, [])
        outcome, reason = "PASSED", ""
        for r in reps:
            if r.skipped:
                o = "XFAIL" if hasattr(r, "wasxfail") else "SKIPPED"
                why = r.longrepr[2] if isinstance(r.longrepr, tuple) else getattr(r, "wasxfail", "")
            elif r.failed:
                o = "FAILED" if r.when == "call" else "ERROR"
                why = _reason(r)
            else:
                continue
            if _OUTCOME_ORDER.get(o, 0) >= _OUTCOME_ORDER.get(outcome, 0):
                outcome, reason = o, why
        t = time.time() - self.started.pop(nodeid, time.time())
        self.write(outcome, t, nodeid, reason)


def _reason(report) -> str:
    """The failure's last 'E ...' line or exception line: what the reason column shows."""
    text = getattr(report, "longreprtext", "") or ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    if errs:
        return errs[0] if len(errs) == 1 else errs[0] + " | " + errs[-1]
    return lines[-1] if lines else ""


def pytest_configure(config):
    ids = _env("PYTEST_QUEUE_IDS")
    if not ids:
        return
    q = Queue(ids, _env("PYTEST_QUEUE_CLAIMS", ids + ".claims"), _env("PYTEST_QUEUE_OUT"),
              float(_env("PYTEST_QUEUE_DEADLINE", "inf")))
    config.pluginmanager.register(q, "pytest_queue_instance")
