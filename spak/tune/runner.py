"""The sweep's scheduler: feeds jobs to the measuring worker (one per GPU with
``--gpus``), keeps the compile helpers ahead of them, records every result (or failure)
as a JSON line, restarts a worker after a hang or a crash, and stops before the
wall-clock budget runs out.

Isolation. A config that fails to compile, fails to launch or gives a wrong result is
recorded with its error by the worker; one that runs past ``timeout`` seconds, or that
kills the worker, is recorded here (the worker's process group is killed) and a fresh
worker takes the remaining configs. With ``retry_faults`` (``--gpus``), a job whose worker
faulted (timeout, crash, lost CUDA context) runs once more before its failure is recorded
("attempts": 2, "retried_after": the first failure, "retried_from": its GPU), on another
GPU when there is one (which then times the shape's peers and default too), so a config
that hangs one GPU is tried on another while that GPU's fresh worker goes on; a GPU whose
worker cannot start again leaves the sweep, its shapes going to the others.
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
from spak.tune import timeline
from spak.tune.pool import WorkerProcess, log_tail
from spak.tune.slots import ShapeQueue, Slot
from spak.tune.space import config_id, tile_keys

__all__ = ["SCHEMA", "SCHEMAS_READ", "SweepOptions", "Sweep", "format_seconds"]

#: The result lines' schema. Version 2 adds "family" (the kernel family; version-1 lines
#: are all the FMHA forward's) and takes the problem fields from the family.
SCHEMA = "spak.sweep/2"
#: Schemas whose lines --resume reads: "spak.sweep/1" (files written before kernel
#: families: every row is the FMHA forward) and this one.
SCHEMAS_READ = ("spak.sweep/1", SCHEMA)


@dataclass
class SweepOptions:
    kernel: str = "fused"
    timeout: float = 120.0              # per config, seconds (compile + check + timing)
    budget_s: Optional[float] = None    # wall clock for the whole invocation
    compile_jobs: int = 0               # compile helper processes (0: the worker compiles)
    #: "cpu": the helpers compile on the CPU (no torch, no CUDA context; spak.tune.
    #: cpu_compile), GPU helpers only for the units they hand back; "gpu": GPU helpers only
    compile_on: str = "cpu"
    runner: str = "gpu"
    timing: dict = field(default_factory=dict)
    retry_failed: bool = False
    commit: Optional[str] = None
    startup_timeout: float = 180.0
    quiet: bool = False
    #: a job whose worker faulted (timeout, crash, lost CUDA context) runs once more on a
    #: fresh worker before its failure is recorded (`spak sweep --gpus`)
    retry_faults: bool = False


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_seconds(s: float) -> str:
    """"42s", "5m14s"."""
    s = max(0, int(round(s)))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


_IN_FLIGHT = object()
_BUDGET = object()


class Sweep:
    """Runs a list of jobs on one worker per GPU (see the module doc); ``run`` returns
    the counts and the stop reason, ``worker_starts`` counts the workers started.

    ``gpus`` None: one worker on the GPUs this process sees, jobs in plan order. A list
    (``--gpus``): one worker per GPU, pinned with CUDA_VISIBLE_DEVICES, fed from one
    queue; each shape is claimed by one GPU, which times all of its jobs (the peers and
    the default config beside the swept ones), the largest shapes claimed first."""

    def __init__(self, out_path, opts: SweepOptions, *, log_path=None, echo=print, gpus=None):
        self.out_path = Path(out_path)
        self.opts = opts
        self.log_path = Path(log_path) if log_path else self.out_path.with_suffix(".log")
        self.echo = echo
        self.sel = selectors.DefaultSelector()
        self.multi = gpus is not None
        self.slots = [Slot(str(g), self.log_path.with_suffix(f".gpu{g}.log")) for g in gpus] \
            if self.multi else [Slot(None, self.log_path)]
        self._helpers = 0
        self.compiler = CompileAhead(
            opts.compile_jobs, self._helper, opts.timeout, echo,
            spawn_cpu=self._cpu_helper if opts.compile_on == "cpu" else None,
            gpu_jobs=max(1, len(self.slots)), arch=self._arch)
        self.compiler.hold = True           # helpers spawn after the workers (_start)
        self.env: dict = {}
        self.sweep_id = uuid.uuid4().hex[:12]
        self.t0 = time.monotonic()
        self.logs: dict = {}
        self.counts: dict = {}
        self.stopped_reason: Optional[str] = None
        self.walls: list[float] = []
        self.best: dict = {}                # case -> (tflops, config_id)
        self.worker_starts = 0
        self.left = 0
        self.shapes = ShapeQueue(self.compiler)
        self.retried: dict = {}             # job key -> why its first attempt failed
        self.retried_from: dict = {}        # job key -> the GPU index of that attempt

    # -- children
    def _open_log(self, path: Optional[Path] = None):
        path = path or self.log_path
        if path not in self.logs:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.logs[path] = open(path, "ab")
        return self.logs[path]

    def _child(self, role: str, slot: Optional[Slot] = None) -> WorkerProcess:
        env = {"CUDA_VISIBLE_DEVICES": slot.gpu} if slot is not None and slot.gpu else None
        return WorkerProcess(role, self.opts.runner, self.opts.timing,
                             self._open_log(slot.log_path if slot else None), self.sel, env)

    def _helper(self) -> WorkerProcess:
        """A compile helper; with --gpus the helpers are spread over the sweep's GPUs (each
        holds a CUDA context and launches its variant once on tiny arrays), so no one GPU
        carries them all beside its measuring worker. Their output goes to the main log."""
        live = [s for s in self.slots if s.gpu is not None and not s.retired]
        self._helpers += 1
        env = {"CUDA_VISIBLE_DEVICES": live[self._helpers % len(live)].gpu} if live else None
        return WorkerProcess("compile", self.opts.runner, self.opts.timing, self._open_log(),
                             self.sel, env)

    def _cpu_helper(self) -> WorkerProcess:
        """A CPU compile helper: no GPU visible (it must not open a CUDA context on a GPU
        being timed; it needs none)."""
        return WorkerProcess("compile-cpu", self.opts.runner, self.opts.timing,
                             self._open_log(), self.sel, {"CUDA_VISIBLE_DEVICES": ""})

    def _arch(self) -> Optional[str]:
        """The measuring workers' "sm_XY" (the first that said hello), for CPU helpers."""
        return next((s.hello.get("arch") for s in self.slots if s.hello), None)

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for any child's output and take it in."""
        for key, _ in self.sel.select(timeout=max(0.0, timeout)):
            key.data.on_readable()
        self.compiler.service()

    def _await_hellos(self, waiting: dict) -> dict:
        """{slot: hello or the RuntimeError saying why its worker did not start}."""
        out: dict = {}
        deadline = time.monotonic() + self.opts.startup_timeout
        while waiting and time.monotonic() < deadline:
            for slot, w in list(waiting.items()):
                msg = w.pop()
                if msg is not None or w.eof:
                    slot.clock.startup_s += time.monotonic() - w.started
                if msg is not None and "hello" in msg:
                    slot.clock.started(w.started, msg["hello"].get("startup"))
                    slot.worker, slot.hello = w, msg["hello"]
                    self.worker_starts += 1
                    out[slot] = msg["hello"]
                elif msg is not None and "fatal_setup" in msg:
                    w.kill()
                    out[slot] = RuntimeError(msg["fatal_setup"])
                elif msg is None and w.eof:
                    code = w.exit_code()
                    w.kill()
                    out[slot] = RuntimeError(
                        f"the sweep worker exited at start-up (status {code}); its log "
                        f"{slot.log_path} ends with:\n" + log_tail(slot.log_path))
                else:
                    continue
                del waiting[slot]
            if waiting:
                self._pump(0.5)
        for slot, w in waiting.items():
            slot.clock.startup_s += time.monotonic() - w.started
            w.kill()
            out[slot] = RuntimeError(f"the sweep worker did not start within "
                                     f"{self.opts.startup_timeout:.0f} s; see {slot.log_path}")
        return out

    def _start(self, slots) -> dict:
        waiting = {}
        for slot in slots:
            if slot.worker is not None:
                slot.worker.kill()
                slot.worker = None
            w = self._child("worker", slot)
            w.send({"op": "hello"})
            waiting[slot] = w
        # The compile helpers (asked for by compiler.warm() before) spawn only now: the
        # 4x H200 run started 32 helpers, then the 4 workers, and the workers were ready
        # after 12-14 s where a lone restart took ~4 s. Whatever the 36 start-ups
        # contend for, the measuring workers are first in line.
        self.compiler.release()
        return self._await_hellos(waiting)

    def start_worker(self, slot: Optional[Slot] = None) -> dict:
        """A fresh worker (on the first slot by default); returns its hello (GPU name, arch,
        versions). Raises RuntimeError when it cannot start (no GPU, no torch)."""
        slot = slot or self.slots[0]
        hello = self._start([slot])[slot]
        if isinstance(hello, Exception):
            raise hello
        return hello

    def start_workers(self) -> list:
        """A worker on every GPU, started together: their hellos, in the slots' order. A GPU
        whose worker cannot start is retired (said on echo); RuntimeError if none starts."""
        got = self._start(self.slots)
        for slot in self.slots:
            if isinstance(got[slot], Exception):
                self._retire(slot, str(got[slot]), [])
        if all(s.retired for s in self.slots):
            raise got[self.slots[0]]
        return [got[s] for s in self.slots if not s.retired]

    # -- what the sweep runs on
    def gpu_names(self) -> list[str]:
        """The names of the GPUs whose workers run, in slot order (one name per GPU)."""
        return [s.hello["gpu"] for s in self.slots if s.hello and not s.retired]

    def gpu_count(self) -> int:
        """How many GPUs time jobs at once."""
        return max(1, len(self.gpu_names()))

    def where(self) -> str:
        """"2 GPUs (gpu0 NVIDIA H100 80GB HBM3, gpu1 ...)" for a --gpus sweep, else ""."""
        if not self.multi:
            return ""
        live = [s for s in self.slots if s.hello and not s.retired]
        return f"{len(live)} GPU{'s' if len(live) > 1 else ''} (" + \
            ", ".join(f"{s.label} {s.hello['gpu']}" for s in live) + ")"

    def frame_fields(self) -> dict:
        """What the start and end lines add: {"gpus": [{gpu_index, gpu, pid, retired}]}
        for a --gpus sweep, else nothing."""
        if not self.multi:
            return {}
        return {"gpus": [{"gpu_index": s.index, "gpu": (s.hello or {}).get("gpu"),
                          "pid": (s.hello or {}).get("pid"), "retired": s.retired}
                         for s in self.slots]}

    # -- one job
    def _base_row(self, job: Job, slot: Slot) -> dict:
        s = job.spec
        fam = families.get(job.family)
        return {"schema": SCHEMA, "kind": "result", "sweep_id": self.sweep_id,
                "date": _utc_now(), **self.env, **slot.row_fields(), "family": job.family,
                "kernel": job.kernel, "case": job.case, "shape": s.display,
                **fam.row_fields(s), "dtype": s.dtype, "causal": s.causal, "flops": job.flops,
                "provider": job.provider, "config_id": job.config_id, "config": job.config}

    def _dispatch(self, slot: Slot, job: Job, deadline: Optional[float]) -> Optional[dict]:
        """Send the job to the slot's worker (started if needed; RuntimeError when it cannot
        start). Returns the result at once when the job's variant failed to compile in a
        helper, else None (in flight)."""
        st = self.compiler.failure(job.unit)
        if st:
            return {"status": st["status"], "error": "(compile helper) " + st["error"],
                    "wall_s": 0.0}
        if slot.worker is None:
            self.start_worker(slot)
        slot.job, slot.t0 = job, time.monotonic()
        self.shapes.started.add(job.case)
        if not slot.worker.send({"op": "job", "job": job.payload()}):
            slot.worker.eof = True
        slot.limit = slot.t0 + self.opts.timeout
        slot.budget_kill = deadline is not None and deadline < slot.limit
        slot.end = min(slot.limit, deadline) if deadline is not None else slot.limit
        return None

    def _drop_worker(self, slot: Slot) -> None:
        slot.worker.kill()
        slot.worker = None

    def _worker_gone(self, slot: Slot) -> tuple[dict, bool]:
        """The result of a job whose worker died: its last reply if one made it, else a
        crash with the exit status and the log's tail; and whether the GPU faulted."""
        w = slot.worker
        self._pump(0.05)                     # a last reply may still be in the pipe
        msg = w.pop()
        if msg is not None and "result" in msg:
            last = msg["result"]
            self._drop_worker(slot)
            return last, bool(last.pop("fatal", False))
        code = w.exit_code()
        self._drop_worker(slot)
        sig = f"signal {-code}" if isinstance(code, int) and code < 0 else f"status {code}"
        tail = log_tail(slot.log_path, 8)
        return {"status": "crash", "wall_s": time.monotonic() - slot.t0,
                "error": f"the worker died ({sig}) during this config"
                         + (f"; log tail:\n{tail}" if tail else "")}, True

    def _poll(self, slot: Slot, now: float):
        """The in-flight job's (result, GPU faulted), _IN_FLIGHT, or _BUDGET when the budget
        ran out while it ran (not recorded: --resume runs it again)."""
        w = slot.worker
        msg = w.pop()
        if msg is not None and "result" in msg:
            r = msg["result"]
            fatal = bool(r.pop("fatal", False))
            if fatal:
                w.exit_code(5)
                self._drop_worker(slot)
            return r, fatal
        if w.eof or w.proc.poll() is not None:
            return self._worker_gone(slot)
        if now < slot.end:
            return _IN_FLIGHT
        self._drop_worker(slot)
        if slot.budget_kill and now < slot.limit:
            return _BUDGET
        return {"status": "timeout", "wall_s": now - slot.t0,
                "error": f"no result within --timeout {self.opts.timeout:g} s "
                         f"(worker killed; a fresh one takes the next config)"}, True

    def _retire(self, slot: Slot, why: str, todo: list[Job]) -> None:
        """Take a GPU whose worker cannot start out of the sweep; its shapes go back to
        the queue with their peer and default jobs, to be timed again beside the rest."""
        slot.retired = why
        self.echo(f"spak sweep: {slot.label or 'the GPU'} is out of this sweep: "
                  f"{why.splitlines()[0]}")
        self._total = getattr(self, "_total", 0) + self.shapes.release(slot, todo)

    # -- the loop
    def _record(self, slot: Slot, job: Job, r: dict, writer: ResultsWriter,
                seconds: float = 0.0) -> dict:
        if job.key in self.retried:
            r = {**r, "attempts": 2, "retried_after": self.retried[job.key]}
            if job.key in self.retried_from:
                r["retried_from"] = self.retried_from[job.key]
        row = {**self._base_row(job, slot), **r}
        slot.clock.job_done(seconds, row)
        if row.get("status") == "ok" and row.get("ms_median"):
            row["tflops"] = job.flops / (row["ms_median"] * 1e-3) / 1e12
        writer.write(row)
        slot.finished.append(job)
        self.counts[row["status"]] = self.counts.get(row["status"], 0) + 1
        if row.get("wall_s"):
            self.walls.append(float(row["wall_s"]))
        self._done += 1
        self._eta["left"] -= self._cost.get(id(job), 0.0)
        self._eta["done"] += self._cost.get(id(job), 0.0)
        self._progress(self._done, self._total, row, time.monotonic() - self._run_t0, slot)
        return row

    def _over_budget(self, deadline: Optional[float]) -> bool:
        """Whether the next job (the median of the last 20) would end past the deadline."""
        if deadline is None:
            return False
        est = statistics.median(self.walls[-20:]) if self.walls else 2.0
        return time.monotonic() + est > deadline

    def _fill(self, slot: Slot, todo: list[Job], deadline, writer) -> bool:
        """Give an idle slot its next job; False when no more jobs are to start (budget,
        or no worker can start)."""
        while slot.job is None and not slot.retired:
            if self._over_budget(deadline):
                self.stopped_reason = "budget"
                return False
            job = self.shapes.next_job(slot, todo) if self.multi else \
                next((j for j in todo if self.compiler.ready(j.unit)), None)
            if job is None:
                return True
            todo.remove(job)
            try:
                r = self._dispatch(slot, job, deadline)
            except RuntimeError as e:           # the worker cannot (re)start
                todo.insert(0, job)
                if not self.multi:
                    self.stopped_reason = f"worker: {e}"
                    return False
                self._retire(slot, str(e), todo)
                if all(s.retired for s in self.slots):
                    self.stopped_reason = f"worker: {e}"
                    return False
                continue
            if r is not None:
                self._record(slot, job, r, writer)
        return True

    def _collect(self, slot: Slot, todo: list[Job], writer) -> bool:
        """Take the slot's finished job, if it is; False when the budget stopped it."""
        out = self._poll(slot, time.monotonic())
        if out is _IN_FLIGHT:
            return True
        job, slot.job = slot.job, None
        if out is _BUDGET:
            todo.insert(0, job)
            self.stopped_reason = "budget"
            return False
        r, fault = out
        seconds = time.monotonic() - slot.t0
        if fault and self.opts.retry_faults and job.key not in self.retried:
            self.retried_from[job.key] = slot.index
            self.retried[job.key] = f"{r['status']}: " + str(r.get("error") or "").strip() \
                .split("\n")[0][:200]
            where = self.shapes.retry_elsewhere(slot, job, todo, self.slots) if self.multi \
                else todo.insert(0, job)     # one GPU: retried on a fresh worker there
            if not self.opts.quiet:
                self.echo(f"      {slot.label}: {self.retried[job.key]}; worker restarted, "
                          f"{job.case} {job.config_id} runs once more"
                          + (f" on {where}" if where and where != slot.label else ""))
            slot.clock.job_done(seconds, r)      # the first attempt's time, not a job
            slot.clock.jobs -= 1
            return True
        self._record(slot, job, r, writer, seconds)
        return True

    def run(self, jobs: list[Job], writer: ResultsWriter, env: dict, *,
            done: set = frozenset(), claims: Optional[dict] = None,
            have_anchors=frozenset()) -> dict:
        """Run every job not in ``done``; returns the counts and the stop reason.
        ``claims``: case -> GPU (as in ``gpus``) that timed its done jobs (on --resume);
        ``have_anchors``: (case, provider, config_id, GPU) of the peer and default rows the
        file already has."""
        self.env = env
        todo = [j for j in jobs if j.key not in done]
        self._total, self._done = len(todo), 0
        self.compiler.start([j.unit for j in todo if j.unit is not None])
        self._cost = {id(j): job_seconds(j, self.opts.timing) for j in jobs}
        self._eta = {"left": sum(self._cost[id(j)] for j in todo), "done": 0.0}
        self.shapes.cost = self._cost
        self.shapes.set_jobs(jobs, have_anchors)
        self.shapes.on_added = self._added
        self.shapes.adopt(claims or {}, self.slots)
        deadline = self.t0 + self.opts.budget_s if self.opts.budget_s else None
        self._run_t0 = time.monotonic()
        starting = True
        while True:
            for slot in self.slots:
                starting = starting and self._fill(slot, todo, deadline, writer)
            busy = [s for s in self.slots if s.job is not None]
            if not busy:
                if not todo or not starting or all(s.retired for s in self.slots):
                    break
                self._timed_pump(0.5, todo)      # waiting for compile helpers
                continue
            self._timed_pump(min(0.5, min(s.end for s in busy) - time.monotonic()), todo)
            for slot in busy:
                starting = self._collect(slot, todo, writer) and starting
        self.left = len(todo)
        self.shutdown()
        return {"finished": self._done, "left": len(todo), "counts": dict(self.counts),
                "stopped": self.stopped_reason}

    def _added(self, jobs: list[Job]) -> None:
        """Jobs the queue added (anchors copied for a GPU that helps with a shape)."""
        self._total += len(jobs)
        self._eta["left"] += sum(self._cost.get(id(j), 0.0) for j in jobs)

    def _timed_pump(self, timeout: float, todo: list) -> None:
        """_pump, the wait counted as idle time of every idle GPU (the breakdown)."""
        t = time.monotonic()
        self._pump(timeout)
        dt = time.monotonic() - t
        for slot in self.slots:
            if slot.job is None and not slot.retired:
                slot.clock.idle(dt, bool(todo) and self.compiler.building())

    def breakdown(self) -> dict:
        """Where the time went (spak.tune.timeline)."""
        return timeline.breakdown(self)

    def shutdown(self) -> None:
        self.compiler.shutdown()
        for slot in self.slots:
            if slot.worker is not None:
                slot.worker.stop()
                slot.worker = None
        for f in self.logs.values():
            f.close()
        self.logs = {}

    # -- printing
    def _progress(self, done: int, total: int, row: dict, elapsed: float,
                  slot: Optional[Slot] = None) -> None:
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
        where = f"{slot.label} " if slot is not None and slot.label else ""
        line = (f"[{bar}] {done:>4}/{total} {100 * frac:3.0f}% ETA {format_seconds(eta):>6} | "
                f"{where}{row['case']:<30} {_who(row):<18} {res}{mark}")
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
