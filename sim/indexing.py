"""Element-indexed memory ops: ct.gather, ct.scatter, ct.load_advanced_indexing,
ct.store_advanced_indexing (semantics: cuda/tile/_stub.py; checks: the compiler's
_gather_scatter_pointer_and_mask in cuda/tile/_ir/ops.py).

Indices are integer tiles or scalars broadcast to one shape, one per array axis; an index
is in bounds when 0 <= i < shape (cuTile casts indices to uint64, so negative ones are out
of bounds). Out-of-bounds elements read the padding value and are not written; with
check_bounds=False an out-of-bounds index is undefined behaviour on the GPU, so the
simulator raises. Scattered stores are buffered per lane group like ct.store (or applied
at once in cooperative mode) and recorded per element for the checker.
"""
from __future__ import annotations

import builtins

import numpy as np
import cuda.tile as ct

from . import dtypes
from .context import current
from .errors import SimTypeError, SimulationError
from .tile import Tile, as_tile, lane_array, operand_dtype

_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class Slice:
    """ct.Slice(start, length): a dense entry of load/store_advanced_indexing (cuTile's own
    class can only be built by its compiler, so kernels get this one)."""

    def __init__(self, start, length, /):
        self.start = start
        self.length = int(length)
        if self.length <= 0 or self.length & (self.length - 1):
            raise SimTypeError(f"ct.Slice: length {self.length} must be a power of two")

    def __repr__(self):
        return f"Slice({self.start}, {self.length})"


# ---------------------------------------------------------------------------------------
# indices -> flat offsets

def _index_arrays(array, indices, op):
    if not isinstance(indices, tuple):
        if array.ndim != 1:
            raise SimTypeError(f"ct.{op}: '{array.name}' has {array.ndim} dims; pass a tuple of "
                               f"{array.ndim} index tiles")
        indices = (indices,)
    if len(indices) != array.ndim:
        raise SimTypeError(f"ct.{op}: '{array.name}' has {array.ndim} dims, got {len(indices)} indices")
    tiles = []
    for d, ix in enumerate(indices):
        t = as_tile(ix)
        if not dtypes.is_int(t.dtype):
            raise SimTypeError(f"ct.{op}: index for dimension {d} has non-integer dtype {t.dtype.name}")
        tiles.append(t)
    return tiles


def _broadcast(vs, shape, lanes):
    return [np.broadcast_to(v.reshape((v.shape[0],) + (1,) * (len(shape) - v.ndim + 1) + v.shape[1:]),
                            (lanes,) + shape) for v in vs]


def element_offsets(array, indices, op):
    """(offsets (L, *shape) int64 with -1 outside, in-bounds mask, shape) for index tiles."""
    tiles = _index_arrays(array, indices, op)
    try:
        shape = tuple(np.broadcast_shapes(*(t.shape for t in tiles)))
    except ValueError:
        raise SimTypeError(f"ct.{op}: index shapes {[t.shape for t in tiles]} do not broadcast") from None
    # every lane gets its own offsets (a store attributes each element to its block)
    lanes = builtins.max([t.v.shape[0] for t in tiles] + [current().lanes])
    idx = _broadcast([t.v.astype(np.int64) for t in tiles], shape, lanes)
    ok = np.ones((lanes,) + shape, bool)
    off = np.zeros((lanes,) + shape, np.int64)
    for d, i in enumerate(idx):
        if tiles[d].dtype in (ct.uint64,):
            i = np.where(i < 0, np.iinfo(np.int64).max, i)   # uint64 above 2^63: outside
        ok &= (i >= 0) & (i < array.shape[d])
        off += np.where(ok, i, 0) * array.strides[d]
    return np.where(ok, off, -1), ok, shape


def _mask(mask, shape, lanes, op):
    if mask is None:
        return None
    m = as_tile(mask)
    if m.dtype != ct.bool_:
        raise SimTypeError(f"ct.{op}: mask must be bool, got {m.dtype.name}")
    try:
        return _broadcast([m.v], shape, lanes)[0]
    except ValueError:
        raise SimTypeError(f"ct.{op}: mask shape {m.shape} does not broadcast to {shape}") from None


def implicit_value(value, dtype, shape, lanes, what):
    """A scalar or tile converted as cuTile's implicit_cast allows, broadcast to shape."""
    src = operand_dtype(value) if not isinstance(value, Tile) else value.dtype
    if src is None:                       # python constant: category rules
        if isinstance(value, float) and not dtypes.is_float(dtype):
            raise SimTypeError(f"{what}: cannot implicitly cast {value!r} to {dtype.name}")
    elif src != dtype:
        try:
            ok = dtypes.promote(src, dtype) == dtype
        except SimTypeError:
            ok = False
        if not ok:
            raise SimTypeError(f"{what}: cannot implicitly cast {src.name} to {dtype.name}")
    nd = value.ndim if isinstance(value, Tile) else 0
    v = lane_array(value, dtype, nd)
    try:
        return _broadcast([v], shape, lanes)[0]
    except ValueError:
        raise SimTypeError(f"{what}: shape {np.shape(v)[1:]} does not broadcast to {shape}") from None


def _unbounded(ctx, array, ok, eff, check_bounds, op):
    """check_bounds=False promises every index is inside; the simulator holds it to that."""
    if check_bounds:
        return eff
    bad = ~ok if eff is None else (~ok & eff)
    if bad.any():
        lane = int(np.argwhere(bad)[0][0])
        raise SimulationError(f"ct.{op} with check_bounds=False out of bounds in block "
                              f"{ctx.block_of(lane)} at {ctx.kernel_line()}: array '{array.name}' "
                              f"of shape {array.shape}")
    return eff


# ---------------------------------------------------------------------------------------
# gather / scatter

def read_elements(ctx, array, off, eff):
    """Values at `off` where eff (storage dtype array shaped like off), after the checker
    (cooperative hand-over and happens-before, or lock-step reads of others' writes)."""
    take = np.where(eff, off, 0)
    if ctx.coop is not None:
        from .memory import _coop_access
        _coop_access(ctx, array, off[eff], None, None, False)
    elif array._root._owner is not None:
        ctx.findings += _foreign(ctx, array, off, eff)
    bits = array._read_bits()[take]
    if ctx.coop is None:
        from .memory import _pending_on, overlay_own
        if _pending_on(ctx, array):
            flat = bits.reshape(bits.shape[0], -1)
            overlay_own(ctx, array, np.where(eff, off, -1).reshape(flat.shape[0], -1), flat)
    from .memory import values_of
    return values_of(bits, array.dtype)


def _foreign(ctx, array, off, eff):
    own = np.where(eff, array._owner_flat()[np.where(eff, off, 0)], -1)
    me = ctx.linear_ids.reshape((-1,) + (1,) * (own.ndim - 1))
    bad = (own >= 0) & (own != me)
    if not bad.any():
        return []
    lane = int(np.argwhere(bad)[0][0])
    return [f"read of another block's write: '{array.name}' gathered by block "
            f"{ctx.block_of(lane)} at {ctx.kernel_line()} holds values another block wrote "
            f"in this launch; without atomics the result depends on block order "
            f"({int(bad.sum())} elements)"]


def gather(array, indices, /, *, mask=None, padding_value=0, check_bounds=True, latency=None):
    ctx = current()
    off, ok, shape = element_offsets(array, indices, "gather")
    lanes = off.shape[0]
    m = _mask(mask, shape, lanes, "gather")
    _unbounded(ctx, array, ok, m, check_bounds, "gather")
    eff = ok if m is None else (ok & m)
    pad = implicit_value(padding_value, array.dtype, shape, lanes, "ct.gather padding_value")
    ctx.loads += ctx.lanes
    vals = read_elements(ctx, array, off, eff)
    from .numerics import GATHER_LAYOUT   # the sum order of a gathered tile (NumericModel.sum)
    out = Tile(np.where(eff, vals, pad), array.dtype, layout=GATHER_LAYOUT)
    out.raw = True          # summed as gathered: the blocked order on sm_90 (ops.sum)
    return out


class ElementStore:
    """Buffered scattered stores of one op: per lane, the offsets (-1: not stored) and
    values; committed with the group (sim.memory.commit)."""

    def __init__(self, array, off, vals, line):
        self.array, self.off, self.vals, self.line = array, off, vals, line

    def commit(self, linear, grid, report=True) -> list[str]:
        from .memory import _unlinear
        flat, owner = self.array._bits(), self.array._owner_flat()
        out = []
        L = self.off.shape[0]
        off = self.off.reshape(L, -1)
        bits = np.ascontiguousarray(self.vals).reshape(self.vals.shape[0], -1)
        bits = bits.view(_BITS[bits.dtype.itemsize])
        if self._commit_disjoint(flat, owner, _stamps(self.array), off, bits, linear):
            return out
        for lane in range(L):
            o = off[lane]
            v = bits[lane if bits.shape[0] > 1 else 0]
            keep = o >= 0
            o, v = o[keep], v[keep]
            me = int(linear[lane])
            prev = owner[o]
            clash = (prev >= 0) & (prev != me)
            if report and clash.any():
                i = int(np.argmax(clash))
                out.append(f"double write: element {np.unravel_index(int(o[i]), self.array.shape)} "
                           f"of '{self.array.name}' written by block {_unlinear(prev[i], grid)} and "
                           f"by block {_unlinear(me, grid)} (scatter at {self.line}); "
                           f"{int(clash.sum())} elements in all")
            if report:
                out += self._duplicates(o, v, me, grid)
            flat[o] = v
            owner[o] = me
        return out

    @staticmethod
    def _commit_disjoint(flat, owner, stamps, off, bits, linear) -> bool:
        """All lanes at once, when that is what the lane-by-lane loop below would do: every
        stored element distinct across the op's lanes (so no lane sees another's write, no
        duplicate within a lane) and none owned by another block before. Then the order of
        the writes cannot matter and there is nothing to report; False leaves it to the loop
        (which finds and words the double writes). The loop cost ~0.5 ms a lane group on
        TileGym's scatter-heavy kernels (geglu's perf test: 1.1M calls of _duplicates)."""
        L, n = off.shape
        if bits.shape[1] != n or bits.shape[0] not in (1, L):
            return False
        keep = off >= 0
        o = off[keep]
        if o.size > 1:
            # all distinct iff each entry reads back its own index (a sort costs 4x more)
            idx = np.arange(o.size, dtype=np.int64)
            stamps[o] = idx
            if not np.array_equal(stamps[o], idx):
                return False
        me = np.broadcast_to(np.asarray(linear[:L], np.int64)[:, None], off.shape)[keep]
        prev = owner[o]
        if ((prev >= 0) & (prev != me)).any():
            return False
        flat[o] = np.broadcast_to(bits, off.shape)[keep]
        owner[o] = me
        return True

    def _duplicates(self, o, v, me, grid):
        """One op writing different values to one element: which lands is unspecified."""
        from .memory import _unlinear
        order = np.argsort(o, kind="stable")
        so, sv = o[order], v[order]
        same = so[1:] == so[:-1]
        differ = same & (sv[1:] != sv[:-1])
        if not differ.any():
            return []
        e = int(so[1:][differ][0])
        return [f"scatter by block {_unlinear(me, grid)} at {self.line} writes different values "
                f"to element {np.unravel_index(e, self.array.shape)} of '{self.array.name}' "
                f"({int(differ.sum())} times): which one lands is unspecified"]


def _stamps(array) -> np.ndarray:
    """Scratch int64 per element of the array's root (contents meaningless between uses),
    from the array's first element on: ElementStore's distinctness check."""
    root = array._root
    st = getattr(root, "_stamps", None)
    if st is None or st.size != root.data.size:
        st = root._stamps = np.empty(root.data.size, np.int64)
    return st[array._offset:]


def write_elements(ctx, array, off, vals):
    """Buffer (lock-step) or apply (cooperative) a scattered store; off -1 = not stored."""
    from .memory import bits_of
    item = ElementStore(array, off, bits_of(vals, array.dtype), ctx.kernel_line())
    ctx.stores += ctx.lanes
    if ctx.coop is None:
        ctx.pending_stores.append(item)
        return
    from .memory import _coop_access, coop_commit
    live = off[off >= 0]
    _coop_access(ctx, array, live, None, None, True)
    coop_commit(ctx, [item], array, live)


def scatter(array, indices, value, /, *, mask=None, check_bounds=True, latency=None):
    ctx = current()
    off, ok, shape = element_offsets(array, indices, "scatter")
    lanes = off.shape[0]
    m = _mask(mask, shape, lanes, "scatter")
    _unbounded(ctx, array, ok, m, check_bounds, "scatter")
    eff = ok if m is None else (ok & m)
    vals = implicit_value(value, array.dtype, shape, lanes, "ct.scatter value")
    write_elements(ctx, array, np.where(eff, off, -1), vals)


# ---------------------------------------------------------------------------------------
# advanced indexing: one sparse (index tile) axis, the others ct.Slice(start, length)

def _advanced(array, indices, op):
    if not isinstance(indices, (tuple, list)) or len(indices) != array.ndim:
        raise SimTypeError(f"ct.{op}: indices must be a tuple of {array.ndim} entries")
    sparse = [d for d, ix in enumerate(indices) if not isinstance(ix, Slice)]
    if len(sparse) != 1:
        raise SimTypeError(f"ct.{op}: exactly one entry must be a 1-D index tile, the others "
                           f"ct.Slice(start, length); got {indices}")
    s = sparse[0]
    t = as_tile(indices[s])
    if t.ndim != 1 or not dtypes.is_int(t.dtype):
        raise SimTypeError(f"ct.{op}: the sparse index must be a 1-D integer tile, got "
                           f"{t.dtype.name} {t.shape}")
    nd = array.ndim
    per_axis = []
    for d, ix in enumerate(indices):
        if d == s:
            v = t.v
        else:
            start = as_tile(ix.start)
            v = start.v.reshape(-1, 1).astype(np.int64) + np.arange(ix.length)[None, :]
        shape = [1] * nd
        shape[d] = v.shape[1]
        per_axis.append(Tile(v.reshape((v.shape[0],) + tuple(shape)),
                             t.dtype if d == s else ct.int64))
    return tuple(per_axis)


def _entirely_outside(ctx, array, ok, op):
    flat = ok.reshape(ok.shape[0], -1)
    if (~flat.any(axis=1)).any():
        lane = int(np.argmax(~flat.any(axis=1)))
        raise SimulationError(f"ct.{op} in block {ctx.block_of(lane)} at {ctx.kernel_line()}: "
                              f"the tile lies entirely outside '{array.name}' {array.shape}")


def load_advanced_indexing(array, indices, /, *, padding_mode=ct.PaddingMode.UNDETERMINED,
                           latency=None, allow_tma=None):
    from .memory import _pad_bits
    ctx = current()
    off, ok, shape = element_offsets(array, _advanced(array, indices, "load_advanced_indexing"),
                                     "load_advanced_indexing")
    _entirely_outside(ctx, array, ok, "load_advanced_indexing")
    ctx.loads += ctx.lanes
    vals = read_elements(ctx, array, off, ok)
    from .memory import values_of
    width = dtypes.array_storage(array.dtype).itemsize
    pad = values_of(np.array([_pad_bits(array.dtype, padding_mode)]).astype(_BITS[width]), array.dtype)
    return Tile(np.where(ok, vals, pad[0]), array.dtype)


def store_advanced_indexing(array, indices, tile, /, *, latency=None, allow_tma=None):
    ctx = current()
    off, ok, shape = element_offsets(array, _advanced(array, indices, "store_advanced_indexing"),
                                     "store_advanced_indexing")
    if isinstance(tile, Tile) and tile.ndim and tile.shape != shape:
        raise SimTypeError(f"ct.store_advanced_indexing: tile shape {tile.shape} must equal {shape}")
    _entirely_outside(ctx, array, ok, "store_advanced_indexing")
    vals = implicit_value(tile, array.dtype, shape, off.shape[0], "ct.store_advanced_indexing")
    write_elements(ctx, array, off, vals)
