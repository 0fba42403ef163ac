"""The sweep's scheduler: feeds jobs to the measuring worker, keeps the compile helpers
ahead of it, records every result (or failure) as a JSON line, restarts the worker after
a hang or a crash, and stops before the wall-clock budget runs out.

Isolation. A config that fails to compile, fails to launch or gives a wrong result is
recorded with its error by the worker; one that runs past ``timeout`` seconds, or that
kills the worker, is recorded here (the worker's process group is killed) and a fresh
worker takes the remaining configs.
"""
from __future__ import annotations

import datetime as _dt
import selectors
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from spak import families
from spak.results.jsonl import ResultsWriter
from spak.tune.compile_ahead import CompileAhead
from spak.tune.jobs import Job, job_seconds
from spak.tune.pool import WorkerProcess, log_tail
from spak.tune.space import config_id, tile_keys

__all__ = ["SCHEMA", "SCHEMAS_READ", "SweepOptions", "Sweep", "format_seconds"]

#: The result lines' schema. Version 2 adds "family" (the kernel family; version-1 lines
#: are all the FMHA forward's) and takes the problem fields from the family.
SCHEMA = "spak.tune.sweep/2"
#: Schemas whose lines --resume, `spak store update` and `spak report` read.
SCHEMAS_READ = ("spak.tune.sweep/1", SCHEMA)


@dataclass
class SweepOptions:
    kernel: str = "fused"
    timeout: float = 120.0              # per config, seconds (compile + check + timing)
    budget_s: Optional[float] = None    # wall clock for the whole invocation
    compile_jobs: int = 0               # compile helper processes (0: the worker compiles)
    runner: str = "gpu"
    timing: dict = field(default_factory=dict)
    retry_failed: bool = False
    commit: Optional[str] = None
    startup_timeout: float = 180.0
    quiet: bool = False


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_seconds(s: float) -> str:
    """"42s", "5m14s"."""
    s = max(0, int(round(s)))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Sweep:
    """Runs a list of jobs on one worker (see the module doc); ``run`` returns the counts
    and the stop reason, ``worker_starts`` counts the workers started."""

    def __init__(self, out_path, opts: SweepOptions, *, log_path=None, echo=print):
        self.out_path = Path(out_path)
        self.opts = opts
        self.log_path = Path(log_path) if log_path else self.out_path.with_suffix(".log")
        self.echo = echo
        self.sel = selectors.DefaultSelector()
        self.worker: Optional[WorkerProcess] = None
        self.compiler = CompileAhead(opts.compile_jobs, lambda: self._child("compile"),
                                     opts.timeout, echo)
        self.env: dict = {}
        self.sweep_id = uuid.uuid4().hex[:12]
        self.t0 = time.monotonic()
        self.log = None
        self.counts: dict = {}
        self.stopped_reason: Optional[str] = None
        self.walls: list[float] = []
        self.best: dict = {}                # case -> (tflops, config_id)
        self.worker_starts = 0
        self.left = 0

    # -- children
    def _open_log(self):
        if self.log is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log = open(self.log_path, "ab")
        return self.log

    def _child(self, role: str) -> WorkerProcess:
        return WorkerProcess(role, self.opts.runner, self.opts.timing, self._open_log(),
                             self.sel)

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for any child's output and take it in."""
        for key, _ in self.sel.select(timeout=max(0.0, timeout)):
            key.data.on_readable()
        self.compiler.service()

    def start_worker(self) -> dict:
        """A fresh worker; returns its hello (GPU name, arch, versions). Raises RuntimeError
        when it cannot start (no GPU, no torch): the sweep cannot go on."""
        if self.worker is not None:
            self.worker.kill()
        w = self._child("worker")
        w.send({"op": "hello"})
        deadline = time.monotonic() + self.opts.startup_timeout
        while time.monotonic() < deadline:
            msg = w.pop()
            if msg is not None:
                if "hello" in msg:
                    self.worker = w
                    self.worker_starts += 1
                    return msg["hello"]
                if "fatal_setup" in msg:
                    w.kill()
                    raise RuntimeError(msg["fatal_setup"])
                continue
            if w.eof:
                code = w.exit_code()
                w.kill()
                raise RuntimeError(f"the sweep worker exited at start-up (status {code}); "
                                   f"its log {self.log_path} ends with:\n"
                                   + log_tail(self.log_path))
            self._pump(0.5)
        w.kill()
        raise RuntimeError(f"the sweep worker did not start within "
                           f"{self.opts.startup_timeout:.0f} s; see {self.log_path}")

    # -- one job
    def _base_row(self, job: Job) -> dict:
        s = job.spec
        fam = families.get(job.family)
        return {"schema": SCHEMA, "kind": "result", "sweep_id": self.sweep_id,
                "date": _utc_now(), **self.env, "family": job.family, "kernel": job.kernel,
                "case": job.case, "shape": s.display, **fam.row_fields(s),
                "dtype": s.dtype, "causal": s.causal, "flops": job.flops,
                "provider": job.provider, "config_id": job.config_id, "config": job.config}

    def _worker_gone(self, w: WorkerProcess, t0: float) -> dict:
        """The result of a job whose worker died: its last reply if one made it, else a
        crash with the exit status and the log's tail."""
        self._pump(0.05)                     # a last reply may still be in the pipe
        msg = w.pop()
        if msg is not None and "result" in msg:
            last = msg["result"]
            w.kill()
            self.worker = None
            last.pop("fatal", None)
            return last
        code = w.exit_code()
        w.kill()
        self.worker = None
        sig = f"signal {-code}" if isinstance(code, int) and code < 0 else f"status {code}"
        tail = log_tail(self.log_path, 8)
        return {"status": "crash", "wall_s": time.monotonic() - t0,
                "error": f"the worker died ({sig}) during this config"
                         + (f"; log tail:\n{tail}" if tail else "")}

    def _run_job(self, job: Job, deadline: Optional[float]) -> Optional[dict]:
        """The job's result fields, or None when the budget ran out while it was in flight
        (not recorded: --resume runs it again)."""
        st = self.compiler.failure(job.unit)
        if st:
            return {"status": st["status"], "error": "(compile helper) " + st["error"],
                    "wall_s": 0.0}
        if self.worker is None:
            self.start_worker()
        w = self.worker
        t0 = time.monotonic()
        if not w.send({"op": "job", "job": job.payload()}):
            w.eof = True
        limit = t0 + self.opts.timeout
        budget_kill = deadline is not None and deadline < limit
        end = min(limit, deadline) if deadline is not None else limit
        while True:
            msg = w.pop()
            if msg is not None and "result" in msg:
                r = msg["result"]
                if r.pop("fatal", False):
                    w.exit_code(5)
                    w.kill()
                    self.worker = None
                return r
            if w.eof or w.proc.poll() is not None:
                return self._worker_gone(w, t0)
            now = time.monotonic()
            if now >= end:
                w.kill()
                self.worker = None
                if budget_kill and now < limit:
                    return None
                return {"status": "timeout", "wall_s": now - t0,
                        "error": f"no result within --timeout {self.opts.timeout:g} s "
                                 f"(worker killed; a fresh one takes the next config)"}
            self._pump(min(0.5, end - now))

    # -- the loop
    def _record(self, job: Job, r: dict, writer: ResultsWriter) -> dict:
        row = {**self._base_row(job), **r}
        if row.get("status") == "ok" and row.get("ms_median"):
            row["tflops"] = job.flops / (row["ms_median"] * 1e-3) / 1e12
        writer.write(row)
        self.counts[row["status"]] = self.counts.get(row["status"], 0) + 1
        if row.get("wall_s"):
            self.walls.append(float(row["wall_s"]))
        return row

    def _over_budget(self, deadline: Optional[float]) -> bool:
        """Whether the next job (the median of the last 20) would end past the deadline."""
        if deadline is None:
            return False
        est = statistics.median(self.walls[-20:]) if self.walls else 2.0
        return time.monotonic() + est > deadline

    def run(self, jobs: list[Job], writer: ResultsWriter, env: dict, *,
            done: set = frozenset()) -> dict:
        """Run every job not in ``done``; returns the counts and the stop reason."""
        self.env = env
        todo = [j for j in jobs if j.key not in done]
        total = len(todo)
        self.compiler.start([j.unit for j in todo if j.unit is not None])
        cost = {id(j): job_seconds(j, self.opts.timing) for j in todo}
        self._eta = {"left": sum(cost.values()), "done": 0.0}
        deadline = self.t0 + self.opts.budget_s if self.opts.budget_s else None
        finished = 0
        run_t0 = time.monotonic()
        while todo:
            if self._over_budget(deadline):
                self.stopped_reason = "budget"
                break
            job = next((j for j in todo if self.compiler.ready(j.unit)), None)
            if job is None:
                self._pump(0.5)
                continue
            todo.remove(job)
            try:
                r = self._run_job(job, deadline)
            except RuntimeError as e:           # the worker cannot (re)start
                self.stopped_reason = f"worker: {e}"
                break
            if r is None:
                self.stopped_reason = "budget"
                todo.insert(0, job)
                break
            row = self._record(job, r, writer)
            finished += 1
            self._eta["left"] -= cost[id(job)]
            self._eta["done"] += cost[id(job)]
            self._progress(finished, total, row, time.monotonic() - run_t0)
        self.left = len(todo)
        self.shutdown()
        return {"finished": finished, "left": len(todo), "counts": dict(self.counts),
                "stopped": self.stopped_reason}

    def shutdown(self) -> None:
        self.compiler.shutdown()
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        if self.log is not None:
            self.log.close()
            self.log = None

    # -- printing
    def _progress(self, done: int, total: int, row: dict, elapsed: float) -> None:
        if self.opts.quiet:
            return
        frac = done / total if total else 1.0
        bar = "#" * int(20 * frac) + "-" * (20 - int(20 * frac))
        # the modelled cost of what is left, scaled by how the model fared so far
        e = getattr(self, "_eta", None)
        eta = (elapsed / e["done"] * max(e["left"], 0.0)) if e and e["done"] > 0 else \
            (elapsed / done * (total - done) if done else 0.0)
        tf = row.get("tflops")
        mark = ""
        if tf and row["provider"].startswith("spak-"):
            best = self.best.get(row["case"])
            if best is None or tf > best[0]:
                self.best[row["case"]] = (tf, row["config_id"])
                mark = "  * best so far"
        res = f"{tf:7.1f} TFLOPS" if tf else f"{row['status'].upper():>14}"
        line = (f"[{bar}] {done:>4}/{total} {100 * frac:3.0f}% ETA {format_seconds(eta):>6} | "
                f"{row['case']:<30} {_who(row):<18} {res}{mark}")
        if row.get("status") != "ok" and row.get("error"):
            line += "\n      " + str(row["error"]).strip().splitlines()[0][:200]
        self.echo(line)


def _who(row: dict) -> str:
    """A progress line's provider column: the config id, "default 64x64", or the peer."""
    prov = row["provider"]
    if prov.startswith("spak-") and not prov.endswith("-default"):
        return row["config_id"]
    if prov.endswith("-default"):
        tiles = tile_keys(row.get("config") or {})
        return "default " + (config_id({k: row["config"][k] for k in tiles}, tiles)
                             if tiles else "")
    return prov
