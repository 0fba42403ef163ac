"""Data races between blocks, found on the CPU.

Two parts:

* `HappensBefore`: the checker of a cooperative launch (sim.coop). Every block carries a
  vector clock; atomics and acquire/release loads and stores move clocks between blocks
  as the memory model says (a release publishes the block's clock on the element, an
  acquire that reads it joins it). Each array element remembers its last plain write, its
  last plain read and its last atomic write as (block, clock, line). A plain access that
  conflicts with another block's access that does not happen before it is a race: two
  writes, a write and a read, or a plain access and an atomic. Scope BLOCK and order
  RELAXED synchronise nothing between blocks. Only the element's most recent plain read
  is kept (FastTrack's epoch without its read vector), so a race with an older read of the
  same element by a third block can go unreported.
* `find_races(kernel, grid, args)`: runs the launch in several seeded block orders (each
  on its own copy of the arrays), collects every run's race findings and reports the
  outputs that differ between orders.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import cuda.tile as ct

_MO, _MS = ct.MemoryOrder, ct.MemoryScope
ACQUIRING = (_MO.ACQUIRE, _MO.ACQ_REL)
RELEASING = (_MO.RELEASE, _MO.ACQ_REL)


def synchronizes(order, scope) -> bool:
    """Whether an op orders memory between blocks (block scope only orders within one)."""
    return order not in (None, _MO.WEAK, _MO.RELAXED) and scope not in (_MS.BLOCK, _MS.NONE)


class _Shadow:
    """Per element of one root array: last plain write, plain read and atomic write."""

    def __init__(self, size):
        def pair():
            return np.full(size, -1, np.int32), np.zeros(size, np.int32), np.zeros(size, np.int32)
        self.w = pair()          # (block, clock, line id)
        self.r = pair()
        self.a = pair()


class HappensBefore:
    def __init__(self, grid):
        self.grid = grid
        self.nblocks = grid[0] * grid[1] * grid[2]
        self.vc: dict[int, np.ndarray] = {}
        self._shadow: dict[int, _Shadow] = {}
        self._sync: dict[tuple[int, int], np.ndarray] = {}
        self._lines: list[str] = []
        self._line_id: dict[str, int] = {}
        self._races: dict[tuple, list] = {}

    # -- blocks ----------------------------------------------------------------------------
    def start(self, b: int):
        v = np.zeros(self.nblocks, np.int32)
        v[b] = 1
        self.vc[b] = v

    def finish(self, b: int):
        self.vc.pop(b, None)

    # -- accesses (offsets: flat element offsets from the array's first element) ------------
    def read(self, b, array, offs, line):
        o, sh = self._at(array, offs)
        self._check(b, array, o, sh.w, "write", "read", line)
        self._check(b, array, o, sh.a, "atomic write", "read", line)
        self._record(b, o, sh.r, line)

    def write(self, b, array, offs, line):
        o, sh = self._at(array, offs)
        self._check(b, array, o, sh.w, "write", "write", line)
        self._check(b, array, o, sh.r, "read", "write", line)
        self._check(b, array, o, sh.a, "atomic write", "write", line)
        self._record(b, o, sh.w, line)

    def atomic(self, b, array, offs, written, order, scope, line, rmw=True):
        """An atomic access of `offs` (written: bool mask of elements it changed or wrote)."""
        o, sh = self._at(array, offs)
        self._check(b, array, o, sh.w, "write", "atomic access", line)
        if written is not None and written.any():
            self._check(b, array, o[written], sh.r, "read", "atomic write", line)
        if synchronizes(order, scope) and order in ACQUIRING:
            self._acquire(b, array, o)
        if written is not None and written.any():
            ow = o[written]
            if synchronizes(order, scope) and order in RELEASING:
                self._release(b, array, ow, join=rmw)
            self._record(b, ow, sh.a, line)

    # -- findings ----------------------------------------------------------------------------
    def findings(self) -> list[str]:
        out = []
        for (name, k1, k2, l1, l2), (n, first, b1, b2) in self._races.items():
            out.append(f"race on '{name}': {k1} by block {_unlinear(b1, self.grid)} at {l1} and "
                       f"{k2} by block {_unlinear(b2, self.grid)} at {l2} are not ordered "
                       f"(no atomic or acquire/release between them); element {first}"
                       + (f", {n} elements in all" if n > 1 else ""))
        return out

    # -- internals ---------------------------------------------------------------------------
    def _at(self, array, offs):
        root = array._root
        sh = self._shadow.get(id(root))
        if sh is None:
            sh = self._shadow[id(root)] = _Shadow(root.data.size)
        return np.asarray(offs, np.int64).reshape(-1) + array._offset, sh

    def _lid(self, line) -> int:
        i = self._line_id.get(line)
        if i is None:
            i = self._line_id[line] = len(self._lines)
            self._lines.append(line)
        return i

    def _record(self, b, o, rec, line):
        blk, clk, lid = rec
        blk[o] = b
        clk[o] = self.vc[b][b]
        lid[o] = self._lid(line)

    def _check(self, b, array, o, rec, k1, k2, line):
        if o.size == 0:
            return
        blk, clk, lid = rec
        other = blk[o]
        cand = (other >= 0) & (other != b)
        if not cand.any():
            return
        vc = self.vc[b]
        racy = cand & (clk[o] > vc[np.where(cand, other, 0)])
        if not racy.any():
            return
        root = array._root
        for i in np.flatnonzero(racy)[:1]:
            e = int(o[i])
            key = (root.name, k1, k2, self._lines[lid[e]], line)
            idx = tuple(int(x) for x in np.unravel_index(e, root.shape))
            entry = self._races.setdefault(key, [0, idx, int(other[i]), b])
            entry[0] += int(racy.sum())

    def _acquire(self, b, array, o):
        root = id(array._root)
        vc = self.vc[b]
        for e in np.unique(o):
            s = self._sync.get((root, int(e)))
            if s is not None:
                np.maximum(vc, s, out=vc)

    def _release(self, b, array, o, join):
        root = id(array._root)
        vc = self.vc[b]
        for e in np.unique(o):
            key = (root, int(e))
            s = self._sync.get(key)
            # an RMW continues the element's release sequence (join); a release store heads
            # a new one (replace), as in the C++/PTX memory models
            self._sync[key] = np.maximum(s, vc) if (join and s is not None) else vc.copy()
        vc[b] += 1


def _unlinear(i, grid):
    i = int(i)
    return (i % grid[0], (i // grid[0]) % grid[1], i // (grid[0] * grid[1]))


# ---------------------------------------------------------------------------------------
# the race finder

@dataclass
class RaceReport:
    kernel: str
    grid: tuple
    orders: list                           # None: the default order; ints: seeds
    races: list[str] = field(default_factory=list)        # checker findings, all runs
    differences: list[str] = field(default_factory=list)  # outputs that differ by order
    reports: list = field(default_factory=list)           # each run's sim.LaunchReport

    @property
    def clean(self) -> bool:
        return not self.races and not self.differences

    def __str__(self):
        lines = [f"find_races({self.kernel}, grid={self.grid}): {len(self.orders)} orders, "
                 f"{len(self.races)} race finding(s), {len(self.differences)} differing output(s)"]
        lines += ["  " + r for r in self.races + self.differences]
        return "\n".join(lines)


def _race_key(msg: str) -> str:
    """A finding without its block ids and element: the same race seen in two orders."""
    msg = re.sub(r"block \(\d+, \d+, \d+\)", "block", msg)
    return re.split(r"; element |\(\d+ elements\)", msg)[0]


def _copy_args(args):
    from .memory import SimArray
    out = []
    for a in args:
        if isinstance(a, SimArray):
            c = SimArray(a.data.copy(), a.dtype, name=a.name)
            out.append(c)
        elif isinstance(a, np.ndarray):
            out.append(a.copy())
        else:
            out.append(a)
    return out


def _bits(a) -> np.ndarray:
    from .memory import SimArray
    d = a.data if isinstance(a, SimArray) else a
    return np.ascontiguousarray(d).reshape(-1).view(np.uint8).reshape(d.size, -1)


def _differences(names, base, other, order0, order1) -> list[str]:
    out = []
    for name, a, b in zip(names, base, other):
        if not hasattr(a, "shape") or isinstance(a, (int, float)):
            continue
        ba, bb = _bits(a), _bits(b)
        diff = np.flatnonzero((ba != bb).any(axis=1))
        if diff.size:
            data_a = a.data if hasattr(a, "data") and not isinstance(a, np.ndarray) else a
            data_b = b.data if hasattr(b, "data") and not isinstance(b, np.ndarray) else b
            i = int(diff[0])
            idx = tuple(int(x) for x in np.unravel_index(i, data_a.shape))
            out.append(f"output '{name}': {diff.size} of {data_a.size} elements differ between "
                       f"order {order0} and order {order1} (first at {idx}: "
                       f"{data_a.reshape(-1)[i].item()!r} vs {data_b.reshape(-1)[i].item()!r})")
    return out


def find_races(kernel, grid, args, *, orders: int = 4, seed: int = 0, model="sm_90",
               mode: str = "cooperative", resident: int | None = None) -> RaceReport:
    """Run `kernel` over `grid` in `orders` block orders (the default order, then orders
    seeded from `seed`), each on a copy of `args` (the caller's arrays are not touched).

    mode="cooperative" (default) runs every block as its own thread with the
    happens-before checker; "lockstep" uses the fast executor's double-write check only.
    Returns a RaceReport: races (checker findings of any run) and differences (outputs
    not bit-identical across orders). `report.clean` is True when both are empty.
    """
    from .launch import launch, _signature
    if not isinstance(orders, int) or orders < 1:
        raise ValueError(f"find_races: orders must be a positive int, got {orders!r}")
    _, names, *_rest = _signature(kernel)
    seq = [None] + [seed + i for i in range(orders - 1)]
    first = None
    rep = RaceReport(kernel=getattr(kernel, "__name__", None) or _rest[-1], grid=tuple(grid)
                     if isinstance(grid, (tuple, list)) else (grid,), orders=seq)
    seen = set()
    for o in seq:
        run_args = _copy_args(args)
        r = launch(kernel, grid, run_args, model=model, check=False, mode=mode, order=o,
                   resident=resident)
        rep.reports.append(r)
        rep.kernel = r.kernel
        for f in r.findings:
            if _race_key(f) not in seen:
                seen.add(_race_key(f))
                rep.races.append(f + ("" if o is None else f" [order {o}]"))
        if first is None:
            first = run_args
        else:
            rep.differences += _differences(names, first, run_args, None, o)
    return rep
