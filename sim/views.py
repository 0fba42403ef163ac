"""Array views a kernel can make: `Array.tiled_view(...)` (TiledView) and
`Array.get_raw_memory()` (RawArrayMemory). Semantics: cuda/tile/_stub.py."""
from __future__ import annotations

import numpy as np
import cuda.tile as ct

from . import atomics, dtypes, memory
from .context import current
from .errors import SimNotSupported, SimTypeError, SimulationError
from .indexing import _mask, implicit_value, read_elements, write_elements
from .tile import Tile, as_tile

_MO, _MS = ct.MemoryOrder, ct.MemoryScope


def _shape(s, ndim, what):
    s = (int(s),) if isinstance(s, int) else tuple(int(v) for v in s)
    if len(s) == 0:
        s = (1,) * ndim
    if len(s) != ndim:
        raise SimTypeError(f"Array.tiled_view: {what} {s} needs {ndim} entries")
    return s


class TiledView:
    """A partition of an array into tiles of `tile_shape`, tile i at i * traversal_steps."""

    def __init__(self, array, tile_shape, padding_mode, traversal_steps):
        self.array = array
        self.tile_shape = _shape(tile_shape, array.ndim, "tile_shape")
        for t in self.tile_shape:
            if t <= 0 or t & (t - 1):
                raise SimTypeError(f"Array.tiled_view: tile_shape {self.tile_shape} must be powers of two")
        self.padding_mode = padding_mode
        self.traversal_steps = (self.tile_shape if traversal_steps is None
                                else _shape(traversal_steps, array.ndim, "traversal_steps"))

    @property
    def dtype(self):
        return self.array.dtype

    def _steps(self):
        return None if self.traversal_steps == self.tile_shape else self.traversal_steps

    def num_tiles(self, axis):
        axis = int(axis) % self.array.ndim
        if self._steps() is not None:
            raise SimNotSupported("TiledView.num_tiles with traversal_steps != tile_shape: "
                                  "the tile-space size of a strided view is not documented")
        return -(-self.array.shape[axis] // self.tile_shape[axis])

    def load(self, index, *, check_bounds=True, latency=None, allow_tma=None):
        return memory.load_box(self.array, index, self.tile_shape,
                               padding_mode=self.padding_mode, check_bounds=check_bounds,
                               steps=self._steps())

    def store(self, index, tile, *, check_bounds=True, latency=None, allow_tma=None):
        memory.store_box(self.array, index, tile, check_bounds=check_bounds,
                         steps=self._steps(), tile_shape=self.tile_shape)

    def _atomic(self, op, index, update):
        """Relaxed, device scope (fixed by cuTile); elements outside the array are skipped."""
        a = self.array
        steps = self.traversal_steps
        starts, shape4, strides4, tshape4, _ = memory._box(a, index, self.tile_shape, "C",
                                                           f"atomic_store_{op}", steps)
        off, ok = _box_elements(starts, shape4, strides4, tshape4, self.tile_shape)
        if not ok.reshape(ok.shape[0], -1).any(axis=1).all():
            raise SimulationError(f"TiledView.atomic_store_{op}: the tile lies entirely "
                                  f"outside '{a.name}' {a.shape}")
        atomics.offsets_op(op, a, off, ok, update, None, None, _MO.RELAXED, _MS.DEVICE)

    def atomic_store_add(self, index, update, /):
        self._atomic("add", index, update)

    def atomic_store_max(self, index, update, /):
        self._atomic("max", index, update)

    def atomic_store_min(self, index, update, /):
        self._atomic("min", index, update)

    def atomic_store_and(self, index, update, /):
        self._atomic("and", index, update)

    def atomic_store_or(self, index, update, /):
        self._atomic("or", index, update)

    def atomic_store_xor(self, index, update, /):
        self._atomic("xor", index, update)


def _box_elements(starts, shape4, strides4, tshape4, tile_shape):
    """(offsets (L, *tile_shape) with -1 outside, in-bounds mask) of each lane's box."""
    L = starts.shape[0]
    idx = [starts[:, d, None] + np.arange(int(tshape4[d]))[None, :] for d in range(4)]
    ok = [(i >= 0) & (i < shape4[d]) for d, i in enumerate(idx)]
    grid = lambda v, d: v.reshape((L,) + tuple(-1 if e == d else 1 for e in range(4)))  # noqa: E731
    inb = grid(ok[0], 0) & grid(ok[1], 1) & grid(ok[2], 2) & grid(ok[3], 3)
    off = sum(grid(np.where(ok[d], idx[d], 0) * strides4[d], d) for d in range(4))
    off = np.where(inb, off, -1).reshape((L,) + tuple(tile_shape))
    return off, inb.reshape((L,) + tuple(tile_shape))


class RawArrayMemory:
    """Element-offset access to an array's memory (offsets from its first element). An
    offset outside the array is undefined behaviour on the GPU: the simulator raises."""

    def __init__(self, array):
        self.array = array

    @property
    def dtype(self):
        return self.array.dtype

    def _offsets(self, offset, op):
        ctx = current()
        t = as_tile(offset)
        if not dtypes.is_int(t.dtype):
            raise SimTypeError(f"RawArrayMemory.{op}: offsets must be integers, got {t.dtype.name}")
        off = np.broadcast_to(t.v.astype(np.int64), (max(t.v.shape[0], ctx.lanes),) + t.shape)
        return ctx, np.ascontiguousarray(off), t.shape

    def _inside(self, ctx, off, eff, op):
        a = self.array
        size = a._root.data.size - a._offset
        bad = eff & ((off < 0) | (off >= size))
        if bad.any():
            lane = int(np.argwhere(bad)[0][0])
            raise SimulationError(f"RawArrayMemory.{op} in block {ctx.block_of(lane)} at "
                                  f"{ctx.kernel_line()}: offset outside '{a.name}' "
                                  f"({size} elements from its start)")

    def load_offset(self, offset, /, *, mask=None, padding_value=0, latency=None):
        ctx, off, shape = self._offsets(offset, "load_offset")
        m = _mask(mask, shape, off.shape[0], "load_offset")
        eff = np.ones(off.shape, bool) if m is None else m
        self._inside(ctx, off, eff, "load_offset")
        pad = implicit_value(padding_value, self.dtype, shape, off.shape[0], "load_offset padding_value")
        ctx.loads += ctx.lanes
        vals = read_elements(ctx, self.array, off, eff)
        return Tile(np.where(eff, vals, pad), self.dtype)

    def store_offset(self, offset, value, /, *, mask=None, latency=None):
        ctx, off, shape = self._offsets(offset, "store_offset")
        m = _mask(mask, shape, off.shape[0], "store_offset")
        eff = np.ones(off.shape, bool) if m is None else m
        self._inside(ctx, off, eff, "store_offset")
        vals = implicit_value(value, self.dtype, shape, off.shape[0], "store_offset value")
        write_elements(ctx, self.array, np.where(eff, off, -1), vals)

    def _rmw(self, op, offset, update, expected, mask, order, scope):
        ctx, off, shape = self._offsets(offset, f"atomic_{op}_offset")
        eff = np.ones(off.shape, bool)
        if mask is not None:
            eff = eff & _mask(mask, shape, off.shape[0], f"atomic_{op}_offset")
        self._inside(ctx, off, eff, f"atomic_{op}_offset")
        old = atomics.offsets_op(op, self.array, off, eff, update, expected, None, order, scope)
        return Tile(old, self.dtype)

    def atomic_cas_offset(self, offset, expected, desired, /, *, mask=None,
                          memory_order=_MO.ACQ_REL, memory_scope=_MS.DEVICE):
        return self._rmw("cas", offset, desired, expected, mask, memory_order, memory_scope)


def _raw_rmw(op):
    def f(self, offset, update, /, *, mask=None, memory_order=_MO.ACQ_REL,
          memory_scope=_MS.DEVICE):
        return self._rmw(op, offset, update, None, mask, memory_order, memory_scope)
    f.__name__ = f"atomic_{op}_offset"
    return f


for _op in ("xchg", "add", "max", "min", "and", "or", "xor"):
    setattr(RawArrayMemory, f"atomic_{_op}_offset", _raw_rmw(_op))


def _count_uses(cls):
    """Their methods are ops the kernel calls: count tile arguments' uses (sim.tile.counted)."""
    from .tile import counted
    for name, fn in list(vars(cls).items()):
        if callable(fn) and not name.startswith("_"):
            setattr(cls, name, counted(fn))


_count_uses(TiledView)
_count_uses(RawArrayMemory)
