"""Where the jobs of a multi-GPU sweep run: one `Slot` per GPU (its worker and the job in
flight there) and the `ShapeQueue` policy that gives each idle GPU its next job.

The policy: a shape (a case) is claimed by one GPU, which times all of its jobs (the
peers and the default config beside the swept configs: every comparison of the shape is
made on one GPU). An idle GPU takes the next job of its own shapes in plan order (peers
first); with none ready (a compile still running) it has that compile moved to the front
and claims another shape, the unclaimed one with the most modelled work left (the
largest first: the sweep ends with small shapes, so the GPUs finish together), else one
another GPU claimed but has not started. Among those, a GPU first takes the shapes that
share compile units (variants) with its own and avoids those of the other GPUs' shapes:
each variant's first launch in a worker costs ~0.13 s even from the disk cache, so
spreading the variants of one (head dim, causal) over every GPU doubled the sweep's first
calls on 4 GPUs (results/issue36-h200x4-2026-11-28).

Work stealing at the end. With no shape left to claim, an idle GPU helps with the shape
that has the most configs left (more than twice its peer and default jobs): it times that
shape's peers and default config itself first (copies pinned to it, so each config it
times is compared with anchors from the same GPU), then takes the shape's configs from the
same queue as its owner. Without this, 3 shapes on 2 GPUs split 2:1 (the 26/13 of the
first 2-GPU run). A job whose worker faulted is retried the same way on another GPU.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from spak.tune.jobs import Job
from spak.tune.pool import WorkerProcess
from spak.tune.timeline import GpuClock

__all__ = ["Slot", "ShapeQueue"]


class Slot:
    """One measuring worker's place: a GPU (``gpu``: its CUDA_VISIBLE_DEVICES entry, e.g.
    "0" or a UUID) or None (the single-GPU mode: the GPUs the driver sees), the job in
    flight there and its deadlines."""

    def __init__(self, gpu: Optional[str], log_path: Path):
        self.gpu = gpu
        self.log_path = log_path
        self.worker: Optional[WorkerProcess] = None
        self.hello: Optional[dict] = None
        self.job: Optional[Job] = None
        self.t0 = self.limit = self.end = 0.0
        self.budget_kill = False
        self.retired: Optional[str] = None   # why this GPU takes no more jobs
        self.finished: list[Job] = []
        self.clock = GpuClock()              # where this GPU's time went

    @property
    def index(self):
        """The GPU index as rows carry it: an int for "0", the text for a UUID."""
        return int(self.gpu) if self.gpu is not None and self.gpu.isdigit() else self.gpu

    @property
    def label(self) -> str:
        return "" if self.gpu is None else f"gpu{self.gpu}"

    def row_fields(self) -> dict:
        if self.gpu is None or self.hello is None:
            return {}
        return {"gpu": self.hello["gpu"], "gpu_index": self.index}


class ShapeQueue:
    """Which GPU times which shape (see the module doc). ``compiler``: the CompileAhead
    whose ``ready`` and ``prioritize`` say which jobs can start; ``cost``: id(job) ->
    modelled seconds; ``anchors``: case -> its peer and default jobs; ``on_added``:
    called with the jobs added (copies for a helping GPU)."""

    def __init__(self, compiler):
        self.compiler = compiler
        self.cost: dict = {}
        self.claims: dict = {}              # case -> the Slot that times it
        self.helpers: dict = {}             # case -> Slots helping with its configs
        self.started: set = set()           # cases with a job dispatched in this run
        self.anchors: dict = {}             # case -> [peer and default jobs]
        self.have_anchors: set = set()      # (case, provider, config_id, gpu) timed already
        self.units: dict = {}               # case -> the compile unit ids of its jobs
        self.on_added = lambda jobs: None
        self.steal = True

    def set_jobs(self, jobs: list[Job], have_anchors=frozenset()) -> None:
        """Every job of the run (their anchors), and the anchors a resumed sweep has already
        timed, as (case, provider, config_id, gpu)."""
        self.anchors, self.units = {}, {}
        for j in jobs:
            if j.anchor and j.pin is None:
                self.anchors.setdefault(j.case, []).append(j)
            if j.unit is not None:
                self.units.setdefault(j.case, set()).add(j.unit["unit_id"])
        self.have_anchors = set(have_anchors)

    def adopt(self, claims: dict, slots: list) -> None:
        """Shapes a resumed sweep measured before stay on their GPU ({case: gpu})."""
        by_gpu = {s.gpu: s for s in slots}
        for case, gpu in claims.items():
            if str(gpu) in by_gpu:
                self.claims[case] = by_gpu[str(gpu)]
                self.started.add(case)

    def _mine(self, slot: Slot, j: Job) -> bool:
        if j.pin is not None:
            return j.pin == slot.gpu
        if self.claims.get(j.case) is slot:
            return True
        return not j.anchor and slot in self.helpers.get(j.case, ())

    def _claim(self, slot: Slot, todo: list[Job]) -> Optional[str]:
        """A case for this slot: the unclaimed one with the most work left, else one
        another slot claimed but has not started (so no GPU idles while work waits)."""
        work: dict = {}
        startable = set()                    # cases with a job that can start now
        for j in todo:
            if j.pin is not None:
                continue
            owner = self.claims.get(j.case)
            if owner is None or owner.retired or (owner is not slot and
                                                  j.case not in self.started):
                work[j.case] = work.get(j.case, 0.0) + self.cost.get(id(j), 1.0)
                if self.compiler.ready(j.unit):
                    startable.add(j.case)
        free = [c for c in startable if self.claims.get(c) is None or self.claims[c].retired]
        mine, theirs = self._units_of(slot)
        pick = max(free or startable, default=None, key=lambda c: (
            len(self.units.get(c, set()) & mine), -len(self.units.get(c, set()) & theirs),
            work[c]))
        if pick is not None:
            self.claims[pick] = slot
            self.helpers.pop(pick, None)
        return pick

    def _units_of(self, slot: Slot) -> tuple[set, set]:
        """(compile units of the shapes ``slot`` times, those of the other GPUs' shapes).

        A worker's first launch of a variant costs ~0.1-0.2 s even when a helper built its
        cubin (cuTile's front end, the disk-cache lookup, the module load: 130 ms median on
        an H200, results/issue36-h200x4-2026-11-28), once per process. Shapes that share
        variants (same head dim, causal, dtype and extents' divisibility) are kept on one
        GPU, so each variant's first launch is paid once per sweep, not once per GPU."""
        mine, theirs = set(), set()
        for case, owner in self.claims.items():
            (mine if owner is slot else theirs).update(self.units.get(case, ()))
        for case, helpers in self.helpers.items():
            if slot in helpers:
                mine.update(self.units.get(case, ()))
        return mine, theirs

    def _pin_anchors(self, slot: Slot, case: str, todo: list[Job]) -> None:
        """Make ``slot`` a helper of ``case``: copies of the case's anchors pinned to it go
        to the front of the queue (unless it timed them already)."""
        self.helpers.setdefault(case, set()).add(slot)
        copies = []
        for j in self.anchors.get(case, ()):
            if (*j.key, slot.gpu) not in self.have_anchors:
                self.have_anchors.add((*j.key, slot.gpu))
                copies.append(replace(j, pin=slot.gpu))
                self.cost[id(copies[-1])] = self.cost.get(id(j), 1.0)
        todo[:0] = copies
        self.on_added(copies)

    def _help(self, slot: Slot, todo: list[Job]) -> Optional[str]:
        """A started shape of another GPU whose configs this slot may share (see the
        module doc), made so; None when no shape has enough left."""
        left: dict = {}
        for j in todo:
            if j.pin is None and not j.anchor and self.compiler.ready(j.unit):
                owner = self.claims.get(j.case)
                if owner is not None and owner is not slot and not owner.retired \
                        and slot not in self.helpers.get(j.case, ()):
                    left[j.case] = left.get(j.case, 0) + 1
        worth = [c for c, n in left.items() if n > 2 * len(self.anchors.get(c, ()))]
        if not worth or not self.steal:
            return None
        mine, _ = self._units_of(slot)
        case = max(worth, key=lambda c: (len(self.units.get(c, set()) & mine), left[c]))
        self._pin_anchors(slot, case, todo)
        return case

    def next_job(self, slot: Slot, todo: list[Job]) -> Optional[Job]:
        """The slot's next job (claiming or helping with a shape when it needs one), or
        None: wait."""
        ready = self.compiler.ready
        mine = [j for j in todo if self._mine(slot, j)]
        job = next((j for j in mine if ready(j.unit)), None)
        if job is not None:
            return job
        if mine:                             # waiting for a compile: have it built next
            self.compiler.prioritize(next(j.unit for j in mine if not ready(j.unit)))
        case = self._claim(slot, todo) or self._help(slot, todo)
        return next((j for j in todo if j.case == case and self._mine(slot, j)
                     and ready(j.unit)), None) if case is not None else None

    def retry_elsewhere(self, slot: Slot, job: Job, todo: list[Job], slots: list) -> str:
        """Queue a job whose worker faulted on ``slot`` once more, on the least-loaded other
        live GPU (it helps with the shape: its anchors first), else on ``slot``; returns
        the label of the GPU that retries it. A peer or the default config is retried on
        ``slot``: it is what that GPU's configs of the shape are compared with."""
        others = [s for s in slots if s is not slot and not s.retired]
        if not others or not self.steal or job.anchor:
            todo.insert(0, job)
            return slot.label
        to = min(others, key=lambda s: sum(1 for j in todo if self._mine(s, j)))
        todo.insert(0, replace(job, pin=to.gpu))
        self.cost[id(todo[0])] = self.cost.get(id(job), 1.0)
        if self.claims.get(job.case) is not to:
            self._pin_anchors(to, job.case, todo)
        return to.label

    def release(self, slot: Slot, todo: list[Job]) -> int:
        """A retired slot's shapes go back to the queue (to a GPU helping with them if
        one is); its pinned copies are dropped; the peer and default jobs it had finished
        of shapes with jobs left and no helper are queued again (to be timed beside the
        rest on the next GPU). Returns how many jobs were queued (less those dropped)."""
        dropped = [j for j in todo if j.pin is not None and j.pin == slot.gpu]
        for j in dropped:
            todo.remove(j)
            if not j.anchor:                 # a retried config: any GPU may take it
                todo.insert(0, replace(j, pin=None))
        added = -sum(1 for j in dropped if j.anchor)
        for helpers in self.helpers.values():
            helpers.discard(slot)
        for case, owner in list(self.claims.items()):
            if owner is not slot:
                continue
            del self.claims[case]
            if self.helpers.get(case):
                self.claims[case] = self.helpers[case].pop()
                continue
            self.started.discard(case)
            if any(j.case == case for j in todo):
                redo = [j for j in slot.finished if j.case == case and j not in todo
                        and j.anchor]
                todo[:0] = [replace(j, pin=None) for j in redo]
                added += len(redo)
        return added
