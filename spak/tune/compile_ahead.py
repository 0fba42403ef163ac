"""Compile helpers: child processes that build the coming variants' cubins ahead of the
measuring worker(s), in parallel, so the GPU is not idle while tileiras runs.

Two kinds. A CPU helper (role "compile-cpu", spak.tune.cpu_compile; used when the sweep
gives ``spawn_cpu``) plans a compile unit on shape stand-ins and compiles it with no GPU,
no CUDA context and no torch; a unit it cannot model comes back "unmapped" (also after a
CPU compile error or timeout: the CPU path only guesses the launch's signature) and goes
to a GPU helper (role "compile", spawned on demand, at most ``gpu_jobs``), which launches
the unit (a family's ``compile_unit``: tiny arrays with the real launch's JIT
specialisation). Either way the cubin lands in cuTile's disk cache, where the worker's own
first launch finds it. A unit's outcome is kept in ``unit_state``:
"ok", "compile_error" or "timeout" (recorded for its jobs without running them), or
"fallback" (a helper died on it: the worker compiles it itself, isolated there). After
three helper deaths, or a helper that cannot start, the helpers give up and the worker
compiles everything left.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from spak.tune.pool import WorkerProcess

__all__ = ["CompileAhead"]


class CompileAhead:
    """Keeps up to ``jobs`` compile helpers busy with the units not yet built.

    spawn: () -> a fresh GPU helper (a WorkerProcess of role "compile"); timeout: seconds
    one unit may take before its helper is killed; echo: where notices go. spawn_cpu: () ->
    a fresh CPU helper (role "compile-cpu"): then the ``jobs`` helpers are CPU ones, and up
    to ``gpu_jobs`` GPU helpers build what they hand back; arch: () -> the GPUs' "sm_XY"
    (or None while unknown), sent with each unit to a CPU helper."""

    def __init__(self, jobs: int, spawn: Callable[[], WorkerProcess], timeout: float,
                 echo=print, *, spawn_cpu: Optional[Callable[[], WorkerProcess]] = None,
                 gpu_jobs: int = 1, arch: Callable[[], Optional[str]] = lambda: None):
        self.jobs = jobs
        self.spawn = spawn
        self.spawn_cpu = spawn_cpu
        self.mode = "cpu" if spawn_cpu is not None else "gpu"
        self.gpu_jobs = gpu_jobs
        self.arch = arch
        self.kind: dict = {}                # helper -> "cpu" | "gpu"
        self.gpu_todo: list[dict] = []      # units handed back by CPU helpers
        self.unmapped = 0                   # ... how many (the breakdown)
        self.cpu_failures = 0
        self.told_exit: set = set()
        self.started_by_kind = {"cpu": 0, "gpu": 0}
        self.timeout = timeout
        self.echo = echo
        self.helpers: list[WorkerProcess] = []
        self.queue: dict = {}               # helper -> list of units (first = in flight)
        self.since: dict = {}               # helper -> monotonic time of its last progress
        self.unit_state: dict = {}          # unit_id -> reply dict
        self.units_todo: list[dict] = []
        self.failures = 0
        self.helpers_started = 0            # for the sweep's time breakdown
        self.units_done = 0
        self.compile_s = 0.0                # the helpers' own seconds per unit, summed
        self.last_done = None               # monotonic time of the last unit built
        self.ready_s: list = []             # each helper's spawn -> hello seconds
        self.phases: list = []              # each helper's start-up phases (its hello)
        # warm() while ``hold``: remembered, done by release() (the sweep spawns its
        # measuring workers first, then the helpers: see spak.tune.runner.Sweep._start)
        self.hold = False
        self.warm_wanted = False

    def warm(self) -> None:
        """Start the helpers now, before the units are known (a helper's start-up, torch
        and a CUDA context, takes seconds: it overlaps the measuring workers' own)."""
        if self.hold:
            self.warm_wanted = True
            return
        for _ in range(self.jobs - len(self.helpers)):
            self._new_helper()

    def release(self) -> None:
        """End ``hold``; a warm() asked for meanwhile happens now."""
        self.hold = False
        if self.warm_wanted:
            self.warm_wanted = False
            self.warm()

    def _new_helper(self, kind: Optional[str] = None) -> WorkerProcess:
        kind = kind or self.mode
        h = self.spawn_cpu() if kind == "cpu" else self.spawn()
        self.kind[h] = kind
        self.started_by_kind[kind] += 1
        self.helpers_started += 1
        self.helpers.append(h)
        self.queue[h] = []
        h.send({"op": "hello"})             # its start-up time, for the breakdown
        return h

    def start(self, units: list[dict]) -> None:
        seen, todo = set(), []
        for u in units:
            if u and u["unit_id"] not in seen and u["unit_id"] not in self.unit_state:
                seen.add(u["unit_id"])
                todo.append(u)
        self.units_todo = todo
        for h in list(self.helpers):         # warm helpers: their first unit, or exit
            if not self.queue.get(h):
                self._feed(h)
        for _ in range(min(self.jobs, len(todo)) - len(self.helpers)):
            self._spawn_helper()

    def ready(self, unit) -> bool:
        """Whether a job of this unit may start (built, failed, or nobody builds it)."""
        if unit is None or self.jobs <= 0 and not self.helpers:
            return True
        return unit["unit_id"] in self.unit_state

    def building(self) -> bool:
        """Whether units are still queued or being built."""
        return bool(self.units_todo or self.gpu_todo) or any(self.queue.get(h)
                                                              for h in self.helpers)

    def prioritize(self, unit) -> None:
        """Build this unit next (a worker is waiting for it)."""
        if unit is None:
            return
        for todo in (self.units_todo, self.gpu_todo):
            for i, u in enumerate(todo):
                if u["unit_id"] == unit["unit_id"]:
                    if i:
                        todo.insert(0, todo.pop(i))
                    return

    def failure(self, unit):
        """The recorded outcome of a unit that failed to build, or None."""
        if unit is None:
            return None
        st = self.unit_state.get(unit["unit_id"])
        return st if st and st.get("status") in ("compile_error", "timeout") else None

    def _spawn_helper(self) -> None:
        if not self.units_todo:
            return
        self._feed(self._new_helper())

    def _todo_of(self, h: WorkerProcess) -> list:
        """The queue a helper takes from: its kind's (GPU helpers of a CPU-mode sweep build
        the handed-back units)."""
        if self.kind.get(h) == "gpu" and (self.mode == "cpu" or self.gpu_todo):
            return self.gpu_todo
        return self.units_todo

    def _feed(self, h: WorkerProcess) -> None:
        todo = self._todo_of(h)
        if todo:
            u = todo.pop(0)
            self.queue[h] = [u]
            self.since[h] = time.monotonic()
            msg = {**u, "arch": self.arch()} if self.kind.get(h) == "cpu" else u
            if not h.send({"op": "compile", "unit": msg}):
                h.eof = True
        else:
            self.queue[h] = []
            if self.kind.get(h) == "gpu" and self.mode == "cpu" and (
                    self.units_todo or any(self.queue.get(x) for x in self.helpers
                                           if self.kind.get(x) == "cpu")):
                return      # stays (a CUDA context takes seconds): more may come back
            h.send({"op": "exit"})

    def _drop(self, h: WorkerProcess) -> None:
        h.kill()
        self.helpers.remove(h)
        self.queue.pop(h, None)
        self.since.pop(h, None)
        self.kind.pop(h, None)

    def _hand_to_gpu(self, u: dict) -> None:
        """A unit a CPU helper could not build: a GPU helper builds it (spawned now unless
        ``gpu_jobs`` of them run); with no GPU helpers allowed the worker compiles it."""
        self.unmapped += 1
        if self.gpu_jobs <= 0 or self.jobs <= 0:
            self.unit_state[u["unit_id"]] = {"status": "fallback"}
            return
        if self.mode == "gpu":
            self.units_todo.insert(0, u)
            return
        self.gpu_todo.append(u)
        gpu = [h for h in self.helpers if self.kind.get(h) == "gpu"]
        idle = [h for h in gpu if not self.queue.get(h)]
        if idle:
            self._feed(idle[0])
        elif len(gpu) < self.gpu_jobs:
            self._feed(self._new_helper("gpu"))

    def _retire(self, h: WorkerProcess, reason: str) -> None:
        pending = self.queue.get(h, [])
        was_cpu = self.kind.get(h) == "cpu"
        self._drop(h)
        if was_cpu:         # a CPU helper's trouble is no verdict on the unit
            self.cpu_failures += 1
            if self.cpu_failures >= 3 and self.mode == "cpu":
                self._to_gpu_mode(f"CPU compile helpers keep failing ({reason})")
            for u in pending:
                self._hand_to_gpu(u)
        else:
            for u in pending:
                if reason == "timeout":
                    self.unit_state[u["unit_id"]] = {
                        "status": "timeout",
                        "error": f"compiling this variant took over {self.timeout:.0f} s "
                                 f"(--timeout; compile helper killed)"}
                else:   # a helper crash: let the worker try the unit itself (isolated there)
                    self.unit_state[u["unit_id"]] = {"status": "fallback", "error": reason}
            if reason != "timeout":
                self.failures += 1
                if self.failures >= 3 and self.jobs > 0:
                    self.echo(f"compile helpers keep failing ({reason}); the worker compiles "
                              f"the remaining variants itself")
                    self.jobs = 0
        if self.units_todo and self.jobs > 0:
            self._spawn_helper()
        if self.gpu_todo and self.jobs > 0 and not any(
                self.kind.get(x) == "gpu" for x in self.helpers):
            self._feed(self._new_helper("gpu"))

    def _to_gpu_mode(self, why: str) -> None:
        """No more CPU helpers: GPU helpers build everything left (today's way)."""
        self.echo(f"{why}; GPU compile helpers build the remaining variants")
        self.mode = "gpu"
        self.units_todo = self.gpu_todo + self.units_todo
        self.gpu_todo = []

    def _take_replies(self, h: WorkerProcess) -> None:
        while (msg := h.pop()) is not None:
            if "compiled" in msg:
                r = msg["compiled"]
                if r.get("status") == "unmapped":
                    for u in self.queue[h]:
                        if u["unit_id"] == r["unit_id"]:
                            self._hand_to_gpu(u)
                    self.queue[h] = [u for u in self.queue[h] if u["unit_id"] != r["unit_id"]]
                    self._feed(h)
                    continue
                self.unit_state[r["unit_id"]] = r
                self.units_done += 1
                self.last_done = time.monotonic()       # the helper's unit, driver's clock
                self.compile_s += self.last_done - self.since.get(h, self.last_done)
                self.queue[h] = [u for u in self.queue[h] if u["unit_id"] != r["unit_id"]]
                if r.get("fatal"):
                    h.eof = True
                else:
                    self._feed(h)
            elif "hello" in msg:
                self.ready_s.append(time.monotonic() - h.started)
                self.phases.append((msg["hello"].get("startup") or {}).get("phases") or {})
            elif "fatal_setup" in msg and self.kind.get(h) == "cpu":
                if self.mode == "cpu":
                    self._to_gpu_mode(f"CPU compile helper could not start: "
                                      f"{msg['fatal_setup']}")
                h.eof = True
            elif "fatal_setup" in msg:
                self.echo(f"compile helper could not start: {msg['fatal_setup']}; the "
                          f"worker compiles instead")
                self.jobs = 0
                h.eof = True

    def service(self) -> None:
        """Take the helpers' replies, replace dead or hung helpers, hand out units."""
        now = time.monotonic()
        for h in list(self.helpers):
            self._take_replies(h)
            if h.eof or h.proc.poll() is not None:
                if self.queue.get(h, []):
                    code = h.exit_code(0.5)
                    self._retire(h, f"compile helper exited (status {code})")
                else:
                    self._drop(h)
                    if self.units_todo and self.jobs > 0:
                        self._spawn_helper()
                continue
            if self.queue.get(h) and now - self.since.get(h, now) > self.timeout:
                self._retire(h, "timeout")
        if self.mode == "cpu" and not (self.units_todo or self.gpu_todo) and not any(
                self.queue.get(x) for x in self.helpers):
            for h in self.helpers:          # idle GPU helpers kept for hand-backs: done
                if self.kind.get(h) == "gpu" and h not in self.told_exit:
                    self.told_exit.add(h)
                    h.send({"op": "exit"})
        if not self.helpers and (self.units_todo or self.gpu_todo) and self.jobs == 0:
            for u in self.units_todo + self.gpu_todo:   # helpers gave up: the worker compiles
                self.unit_state.setdefault(u["unit_id"], {"status": "fallback"})
            self.units_todo, self.gpu_todo = [], []

    def shutdown(self) -> None:
        for h in list(self.helpers):
            h.kill()
        self.helpers = []
