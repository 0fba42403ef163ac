"""The state of the lane group being executed: which blocks, which model, pending stores."""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field

import numpy as np

_local = threading.local()


@dataclass
class GroupContext:
    model: object                    # sim.numerics.NumericModel
    grid: tuple[int, int, int]
    block_ids: np.ndarray            # (L, 3) int64: the blocks running as lanes
    kernel_files: frozenset          # source files whose frames count as "the kernel"
    pending_stores: list = field(default_factory=list)
    # multiply sites (kernel file:line) whose product has several uses: never fused
    # (filled by the launcher on ContractionConflict, shared by the launch's groups)
    unfused_sites: set = field(default_factory=set)
    loads: int = 0
    stores: int = 0
    # cooperative mode (sim.coop): the scheduler and this block's record; None in lock-step
    coop: object = None
    coop_block: object = None
    # checker findings raised while the group runs (e.g. reads of other blocks' writes)
    findings: list = field(default_factory=list)
    # tiles formatted in f-strings while lanes disagree (sim.formatting markers)
    formats: list = field(default_factory=list)

    @property
    def linear_ids(self) -> np.ndarray:
        """Linear block id of each lane (x fastest), as the checker records writers."""
        gx, gy, _ = self.grid
        b = self.block_ids
        return b[:, 0] + gx * (b[:, 1] + gy * b[:, 2])

    @property
    def lanes(self) -> int:
        return self.block_ids.shape[0]

    def block_of(self, lane: int) -> tuple[int, int, int]:
        return tuple(int(x) for x in self.block_ids[min(lane, self.lanes - 1)])

    def kernel_line(self) -> str:
        """file:line of the innermost kernel-source frame calling into the simulator."""
        f = sys._getframe(1)
        while f is not None:
            if f.f_code.co_filename in self.kernel_files:
                return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"
            f = f.f_back
        return "<unknown line>"


def current() -> GroupContext:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        raise RuntimeError("spak sim: tile operations can only run inside sim.launch()")
    return ctx


def set_current(ctx):
    _local.ctx = ctx
