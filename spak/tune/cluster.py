"""`spak sweep --ray [ADDRESS]`: the sweep's jobs as Ray tasks on a Ray cluster.

Ray is an optional extra (``pip install -e ".[cluster]"``), imported only here and only
for ``--ray``. The jobs are grouped into tasks of one GPU each (``num_gpus=1``): the
shapes that share every compile unit (same dtype, head dim, causal and JIT
specialisation) go together with their peer and default jobs, so a task compiles each
config once, times it on all of its shapes, and times the peers on the same GPU as the
configs they are compared with. Inside a task the local single-GPU sweep runs
(spak.tune.runner.Sweep with its worker subprocess, timeouts, and one retry of a job
whose worker faulted); its rows stream back to the driver as they are measured, and the
driver writes the file (and the store) exactly as the local mode does. Ray retries a task
whose node or worker process died once; a task that fails again has its unrecorded jobs
recorded as "crash". ``--budget-s`` cancels the tasks at the deadline (resume to finish).

ADDRESS: "auto" (default: the cluster this machine belongs to, or $RAY_ADDRESS), "local"
(start a Ray instance on this machine), or a cluster address ("ray://head:10001").
"""
from __future__ import annotations

import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

from spak.tune.jobs import Job, job_seconds
from spak.tune.runner import Sweep, SweepOptions

__all__ = ["RaySweep", "job_groups", "INSTALL_HINT"]

INSTALL_HINT = 'spak sweep --ray needs Ray: pip install -e ".[cluster]" (or: pip install ray)'


def job_groups(jobs: list[Job], done=frozenset()) -> list[list[Job]]:
    """The Ray tasks' jobs (see the module doc), the most modelled work first. A group with
    nothing left to run is dropped; one with configs left keeps its peer and default jobs
    even when done, so they are timed again beside the rest on the task's GPU."""
    units: dict = {}
    for j in jobs:
        units.setdefault(j.case, set())
        if j.unit is not None:
            units[j.case].add(j.unit["unit_id"])
    key = {c: frozenset(u) if u else ("case", c) for c, u in units.items()}
    groups: dict = {}
    for j in jobs:
        groups.setdefault(key[j.case], []).append(j)
    out = []
    for g in groups.values():
        if all(j.key in done for j in g):
            continue
        if any(j.key not in done for j in g if j.config is not None and
               j.config_id != "default"):
            out.append([j for j in g if j.key not in done or j.config is None
                        or j.config_id == "default"])
        else:
            out.append([j for j in g if j.key not in done])
    return sorted(out, key=lambda g: -sum(job_seconds(j) for j in g))


def _task_options(opts: SweepOptions) -> dict:
    return {"timeout": opts.timeout, "compile_jobs": opts.compile_jobs,
            "compile_on": opts.compile_on,
            "runner": opts.runner, "timing": dict(opts.timing), "retry_faults": True,
            "startup_timeout": opts.startup_timeout, "quiet": True}


def _node_sweep(opts: dict, sweep_id: str) -> Sweep:
    """The local sweep a task runs on its node (logs in the node's temp folder)."""
    folder = Path(tempfile.gettempdir()) / "spak-ray"
    folder.mkdir(parents=True, exist_ok=True)
    s = Sweep(folder / f"{sweep_id}-{uuid.uuid4().hex[:8]}.jsonl", SweepOptions(**opts),
              echo=lambda m: None)
    s.sweep_id = sweep_id
    return s


def _probe(opts: dict, sweep_id: str) -> dict:
    """A Ray task: the hello of a worker on the task's GPU (name, arch, versions)."""
    s = _node_sweep(opts, sweep_id)
    try:
        return s.start_worker()
    finally:
        s.shutdown()


def _time_group(jobs: list[Job], opts: dict, env: dict, sweep_id: str):
    """A Ray task (a generator: its rows stream to the driver): the jobs on this task's
    GPU through the local sweep; last, {"kind": "task_end", counts, worker_starts}."""
    import queue
    import threading
    import ray
    rows: queue.Queue = queue.Queue()

    class _ToDriver:                      # the sweep's results writer
        def write(self, row):
            rows.put(row)

    s = _node_sweep(opts, sweep_id)
    gpu = (ray.get_gpu_ids() or [None])[0]
    hello = s.start_worker()
    task_env = {**env, "gpu": hello["gpu"], "host": socket.gethostname(), "gpu_index": gpu}
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(s.run(jobs, _ToDriver(), task_env)),
                         daemon=True)
    t.start()
    while t.is_alive() or not rows.empty():
        try:
            yield rows.get(timeout=0.2)
        except queue.Empty:
            pass
    yield {"kind": "task_end", "counts": out.get("counts", {}),
           "worker_starts": s.worker_starts, "stopped": out.get("stopped")}


class RaySweep(Sweep):
    """A Sweep whose jobs run as Ray tasks (see the module doc); the same surface for
    `spak sweep`: start_worker (connects, and asks one GPU task for its hello), run,
    shutdown, gpu_names, where, frame_fields."""

    def __init__(self, out_path, opts: SweepOptions, *, address: str = "auto",
                 log_path=None, echo=print):
        super().__init__(out_path, opts, log_path=log_path, echo=echo)
        self.address = address
        self.ray = None
        self.started_ray = False
        self.names: dict = {}             # GPU names seen, in order
        self.pending: dict = {}           # task generator -> its jobs

    def _connect(self) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeError(INSTALL_HINT) from None
        if not ray.is_initialized():
            kw = {"include_dashboard": False} if self.address == "local" else \
                {"address": self.address}
            ray.init(log_to_driver=False, **kw)
            self.started_ray = True
        self.ray = ray

    def gpu_count(self) -> int:
        return int(self.ray.cluster_resources().get("GPU", 0)) if self.ray else 0

    def start_worker(self, slot=None) -> dict:
        self._connect()
        if not self.gpu_count():
            raise RuntimeError(f"the Ray cluster ({self.address}) has no GPU resources")
        probe = self.ray.remote(num_gpus=1)(_probe)
        try:
            hello = self.ray.get(probe.remote(_task_options(self.opts), self.sweep_id),
                                 timeout=self.opts.startup_timeout)
        except Exception as e:  # noqa: BLE001 -- RayTaskError, GetTimeoutError, ...
            raise RuntimeError(f"no sweep worker started in a Ray task: "
                               f"{type(e).__name__}: {str(e).strip().splitlines()[-1]}") from None
        self.slots[0].hello = hello
        self.worker_starts += 1
        return hello

    def gpu_names(self) -> list[str]:
        return list(self.names) or super().gpu_names()

    def where(self) -> str:
        return f"Ray cluster {self.address} ({self.gpu_count()} GPUs; first task's " \
               f"{self.slots[0].hello['gpu']})"

    def frame_fields(self) -> dict:
        return {"ray": {"address": self.address, "gpus": self.gpu_count()}}

    def _take(self, row: dict, writer, group_left: dict, gen) -> None:
        """Write one streamed row and count it."""
        if row.get("kind") == "task_end":
            self.worker_starts += row.get("worker_starts", 0)
            return
        writer.write(row)
        self.names.setdefault(row.get("gpu"), None)
        group_left[gen].discard((row["case"], row["provider"], row["config_id"]))
        self.counts[row["status"]] = self.counts.get(row["status"], 0) + 1
        self._done += 1
        self._progress(self._done, self._total, row, time.monotonic() - self._run_t0)

    def _failed(self, gen, err: Exception, writer, group_left: dict) -> None:
        """A task Ray could not finish (after its retry): its unrecorded jobs are crashes."""
        why = f"the Ray task failed: {type(err).__name__}: " + \
            (str(err).strip().splitlines() or [""])[-1][:300]
        for job in self.pending[gen]:
            if job.key in group_left[gen]:
                row = {**self._base_row(job, self.slots[0]), "status": "crash", "error": why}
                self._take(row, writer, group_left, gen)

    def run(self, jobs: list[Job], writer, env: dict, *, done: set = frozenset(),
            claims: Optional[dict] = None) -> dict:
        """Every job not in ``done``, as Ray tasks; returns the counts and the stop reason."""
        self.env = env
        groups = job_groups(jobs, done)
        self._total, self._done, self._run_t0 = sum(map(len, groups)), 0, time.monotonic()
        self._eta = None
        task = self.ray.remote(num_gpus=1, max_retries=1)(_time_group)
        opts = _task_options(self.opts)
        self.pending = {task.remote(g, opts, env, self.sweep_id): g for g in groups}
        group_left = {gen: {j.key for j in g} for gen, g in self.pending.items()}
        deadline = self.t0 + self.opts.budget_s if self.opts.budget_s else None
        while self.pending:
            if deadline is not None and time.monotonic() >= deadline:
                self.stopped_reason = "budget"
                break
            ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=0.5)
            for gen in ready:
                try:
                    row = self.ray.get(next(gen))
                except StopIteration:
                    del self.pending[gen]
                    continue
                except Exception as e:  # noqa: BLE001 -- the task died twice
                    self._failed(gen, e, writer, group_left)
                    del self.pending[gen]
                    continue
                self._take(row, writer, group_left, gen)
        self.left = sum(len(v) for v in group_left.values())
        self.shutdown()
        return {"finished": self._done, "left": self.left, "counts": dict(self.counts),
                "stopped": self.stopped_reason}

    def shutdown(self) -> None:
        for gen in list(self.pending):
            try:
                self.ray.cancel(gen, force=True)
            except Exception:  # noqa: BLE001 -- already finished
                pass
        self.pending = {}
        if self.started_ray and self.ray is not None:
            self.ray.shutdown()
            self.started_ray = False
        super().shutdown()
