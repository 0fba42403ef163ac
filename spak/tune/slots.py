"""Where the jobs of a multi-GPU sweep run: one `Slot` per GPU (its worker and the job in
flight there) and the `ShapeQueue` policy that gives each idle GPU its next job.

The policy: a shape (a case) is claimed by one GPU, which times all of its jobs (the
peers and the default config beside the swept configs: every comparison of the shape is
made on one GPU). An idle GPU takes the next job of its own shapes in plan order (peers
first); with none ready (a compile still running) it has that compile moved to the front
and claims another shape, the unclaimed one with the most modelled work left (the
largest first: the sweep ends with small shapes, so the GPUs finish together), else one
another GPU claimed but has not started.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from spak.tune.jobs import Job
from spak.tune.pool import WorkerProcess

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
    modelled seconds."""

    def __init__(self, compiler):
        self.compiler = compiler
        self.cost: dict = {}
        self.claims: dict = {}              # case -> the Slot that times it
        self.started: set = set()           # cases with a job dispatched in this run

    def adopt(self, claims: dict, slots: list) -> None:
        """Shapes a resumed sweep measured before stay on their GPU ({case: gpu})."""
        by_gpu = {s.gpu: s for s in slots}
        for case, gpu in claims.items():
            if str(gpu) in by_gpu:
                self.claims[case] = by_gpu[str(gpu)]
                self.started.add(case)

    def _claim(self, slot: Slot, todo: list[Job]) -> Optional[str]:
        """A case for this slot: the unclaimed one with the most work left, else one
        another slot claimed but has not started (so no GPU idles while work waits)."""
        work: dict = {}
        startable = set()                    # cases with a job that can start now
        for j in todo:
            owner = self.claims.get(j.case)
            if owner is None or owner.retired or (owner is not slot and
                                                  j.case not in self.started):
                work[j.case] = work.get(j.case, 0.0) + self.cost.get(id(j), 1.0)
                if self.compiler.ready(j.unit):
                    startable.add(j.case)
        free = [c for c in startable if self.claims.get(c) is None or self.claims[c].retired]
        pick = max(free or startable, key=work.get, default=None)
        if pick is not None:
            self.claims[pick] = slot
        return pick

    def next_job(self, slot: Slot, todo: list[Job]) -> Optional[Job]:
        """The slot's next job (claiming a shape when it needs one), or None: wait."""
        ready = self.compiler.ready
        mine = [j for j in todo if self.claims.get(j.case) is slot]
        job = next((j for j in mine if ready(j.unit)), None)
        if job is not None:
            return job
        if mine:                             # waiting for a compile: have it built next
            self.compiler.prioritize(next(j.unit for j in mine if not ready(j.unit)))
        case = self._claim(slot, todo)
        return next((j for j in todo if j.case == case and ready(j.unit)), None) \
            if case is not None else None

    def release(self, slot: Slot, todo: list[Job]) -> int:
        """A retired slot's shapes go back to the queue; the peer and default jobs it had
        finished of shapes with jobs left are queued again (to be timed beside the rest
        on the next GPU). Returns how many jobs were queued again."""
        added = 0
        for case, owner in list(self.claims.items()):
            if owner is not slot:
                continue
            del self.claims[case]
            self.started.discard(case)
            if any(j.case == case for j in todo):
                redo = [j for j in slot.finished if j.case == case and j not in todo
                        and (j.config is None or j.config_id == "default")]
                todo[:0] = redo
                added += len(redo)
        return added
