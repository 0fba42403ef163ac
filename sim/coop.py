"""Cooperative execution: the simulator's execution model for kernels whose blocks talk to
each other through memory (atomics, acquire/release loads and stores, spin locks).

The lock-step executor (sim.launch's default) runs many blocks as lanes of one numpy
computation and buffers their stores until the group ends, so no block can see another's
writes while it runs. Here instead:

* every block is a thread running the kernel's body with one lane; at most `resident`
  blocks are live at once (like the GPU's resident blocks), a new one starts when one ends;
* exactly one block runs at a time; it hands over at *yield points*: every atomic and
  every acquire/release load or store (the synchronisation operations), and every
  `quantum`-th plain load or store (so a block spinning on a plain load cannot starve
  the others; its read is still a race the checker reports);
* memory is sequentially consistent: stores and atomics take effect at once, in the
  order the blocks run. For a data-race-free kernel every order of the synchronisation
  operations is a legal execution, and the happens-before checker (sim.races) reports
  the accesses that make a kernel racy;
* order: seed None runs blocks in linear block order and hands over round-robin, so a
  launch is reproducible; an int seed shuffles the start order and picks the next block
  at random at every yield point (and yields at every plain access), which is what
  sim.find_races varies;
* progress: a lock holder always gets to run again, because a spinning block yields at
  every atomic. When no block has changed memory, started or finished over `idle_limit`
  yields, every live block is waiting on something that will not happen (for instance a
  block that is not resident): the launch stops with a SimulationError naming the blocks
  and the lines they spin at.
"""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

from .errors import SimulationError

IDLE_LIMIT = 20000


class _Abort(BaseException):
    """Unwinds a block's thread when the launch stops (not an Exception: a kernel's own
    try/except cannot swallow it)."""


class _Block:
    __slots__ = ("xyz", "linear", "thread", "plain", "where", "ctx")

    def __init__(self, xyz, linear):
        self.xyz = tuple(int(v) for v in xyz)
        self.linear = int(linear)
        self.thread = None
        self.plain = 0          # plain memory ops since the last yield
        self.where = ""         # kernel line of the last yield (deadlock reports)
        self.ctx = None


class Cooperative:
    def __init__(self, grid, blocks: np.ndarray, *, resident=None, seed=None, hb=None,
                 quantum=64, idle_limit=None):
        self.grid = grid
        self.rng = None if seed is None else np.random.default_rng(seed)
        if self.rng is not None:
            blocks = blocks[self.rng.permutation(len(blocks))]
        self.pending = deque(blocks.tolist())
        self.resident = max(1, int(resident or 64))
        self.hb = hb
        self.quantum = 1 if self.rng is not None else max(1, int(quantum))
        self.idle_limit = IDLE_LIMIT if idle_limit is None else idle_limit
        self.live: list[_Block] = []
        self.started: list[_Block] = []
        self.turn = None
        self.cv = threading.Condition()
        self.error: BaseException | None = None
        self.idle = 0
        self.body = None

    # -- the launch --------------------------------------------------------------------------
    def run(self, body):
        """body(block) runs the kernel for one block in the calling (block) thread."""
        self.body = body
        with self.cv:
            self._fill()
            self._hand_over(None)
            self.cv.notify_all()
            while (self.live or self.pending) and self.error is None:
                self.cv.wait()
            self.turn = None
            self.cv.notify_all()
        for blk in self.started:
            blk.thread.join()
        if self.error is not None:
            raise self.error

    def _linear(self, xyz):
        gx, gy, _ = self.grid
        return xyz[0] + gx * (xyz[1] + gy * xyz[2])

    def _fill(self):
        while len(self.live) < self.resident and self.pending:
            xyz = self.pending.popleft()
            blk = _Block(xyz, self._linear(xyz))
            blk.thread = threading.Thread(target=self._main, args=(blk,), daemon=True,
                                          name=f"spak-sim-block-{blk.xyz}")
            self.live.append(blk)
            self.started.append(blk)
            if self.hb is not None:
                self.hb.start(blk.linear)
            self.idle = 0
            blk.thread.start()

    def _main(self, blk):
        with self.cv:
            if not self._wait_turn(blk):
                return
        try:
            self.body(blk)
        except _Abort:
            return
        except BaseException as e:  # noqa: BLE001 -- handed to the launching thread
            with self.cv:
                if self.error is None:
                    if hasattr(e, "add_note"):
                        e.add_note(f"spak sim: raised in block {blk.xyz} (cooperative mode)")
                    self.error = e
                self.cv.notify_all()
            return
        with self.cv:
            self.live.remove(blk)
            if self.hb is not None:
                self.hb.finish(blk.linear)
            self.idle = 0
            self._fill()
            self._hand_over(None)
            self.cv.notify_all()

    def _wait_turn(self, blk) -> bool:
        while self.turn is not blk:
            if self.error is not None:
                return False
            self.cv.wait()
        return self.error is None

    def _hand_over(self, cur):
        if not self.live:
            self.turn = None
        elif self.rng is not None:
            self.turn = self.live[int(self.rng.integers(len(self.live)))]
        else:
            i = self.live.index(cur) + 1 if cur in self.live else 0
            self.turn = self.live[i % len(self.live)]

    # -- called by the running block ----------------------------------------------------------
    def sync_point(self, ctx):
        """Before an atomic or an acquire/release access: let another block run."""
        self._yield(ctx.coop_block, ctx, 1.0)

    def plain_point(self, ctx):
        blk = ctx.coop_block
        blk.plain += 1
        if blk.plain >= self.quantum:
            # plain accesses count 1/64 each toward the deadlock limit: a long loop of loads
            # is work, not a spin (a spin on a plain load is still caught, 64x later)
            self._yield(blk, ctx, self.quantum / 64)

    def progress(self):
        """Memory changed: spinning blocks may now get further."""
        self.idle = 0

    def _yield(self, blk, ctx, weight):
        blk.plain = 0
        blk.where = ctx.kernel_line()
        with self.cv:
            self.idle += weight
            if self.idle > self.idle_limit:
                self._deadlock()
            self._hand_over(blk)
            if self.turn is not blk:
                self.cv.notify_all()
                if not self._wait_turn(blk):
                    raise _Abort()

    def _deadlock(self):
        waits = "; ".join(f"block {b.xyz} at {b.where or 'start'}" for b in self.live)
        self.error = SimulationError(
            f"deadlock: no block changed memory, started or finished over {self.idle_limit} "
            f"hand-overs at atomics (plain accesses count 1/64); live blocks: {waits}. "
            f"{len(self.pending)} block(s) not yet started "
            f"(resident={self.resident}); a block may be waiting for one that is not resident, "
            "or spinning on a value no block will write")
        self.cv.notify_all()
        raise _Abort()
