"""ct.atomic_cas / atomic_xchg / atomic_add / atomic_max / atomic_min / atomic_and /
atomic_or / atomic_xor (semantics: cuda/tile/_stub.py; dtype rules: _ATOMIC_RMW_SPECS and
_atomic_cas_core in cuda/tile/_ir/ops.py).

Atomics run only in the cooperative executor (sim.coop), where blocks are threads that
take turns and memory is shared at once: each atomic is a hand-over point, then applies to
memory immediately, element by element in the tile's row-major order (cuTile leaves the
order of one op's elements unspecified; the simulator fixes it so a launch repeats), and
returns the old values. The happens-before checker (sim.races) sees its memory order.

Numerics: integer ops wrap like the hardware; float32 atomic_add flushes subnormal
inputs and results to zero and rounds to nearest even, as PTX documents for atom.add.f32;
float16/bfloat16/float64 adds round to nearest even without flushing (PTX .noftz).
Not verified on hardware. CAS compares bit patterns (PTX atom.cas is a b32/b64 op).
"""
from __future__ import annotations

import numpy as np
import cuda.tile as ct

from . import dtypes
from .context import current
from .errors import SimTypeError, SimulationError
from .indexing import _mask, _unbounded, element_offsets, implicit_value

_I = (ct.int32, ct.int64, ct.uint32, ct.uint64)
_IF = _I + (ct.float32, ct.float64)
SUPPORTED = {"xchg": _IF, "add": _IF + (ct.float16, ct.bfloat16), "min": _I, "max": _I,
             "and": _I, "or": _I, "xor": _I, "cas": _IF}
BITWISE = ("and", "or", "xor")
_MO, _MS = ct.MemoryOrder, ct.MemoryScope
_ORDERS = (_MO.RELAXED, _MO.ACQUIRE, _MO.RELEASE, _MO.ACQ_REL)
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _check(op, array, order, scope):
    if array.dtype not in SUPPORTED[op]:
        raise SimTypeError(f"ct.atomic_{op}: unsupported array dtype {array.dtype.name} "
                           f"(cuTile allows {[d.name for d in SUPPORTED[op]]})")
    if order not in _ORDERS:
        raise SimTypeError(f"ct.atomic_{op}: memory_order={order} must be one of "
                           f"{[o.name for o in _ORDERS]}")
    if scope not in (_MS.BLOCK, _MS.DEVICE, _MS.SYS):
        raise SimTypeError(f"ct.atomic_{op}: memory_scope={scope} must be BLOCK, DEVICE or SYS")


def _cooperative(ctx, op):
    if ctx.coop is None:
        raise SimulationError(
            f"ct.atomic_{op} at {ctx.kernel_line()} ran in the lock-step executor, whose blocks "
            "cannot see each other's memory: launch with sim.launch(..., mode='cooperative') "
            "(mode='auto' picks it for kernels whose code names an atomic)")


def _poison(dtype):
    st = dtypes.storage(dtype)
    return np.array(np.nan if st.kind == "f" else np.iinfo(st).max, st)


def _combine(op, dtype, old, upd, model):
    """New element values of an RMW `op` (storage arrays)."""
    with np.errstate(all="ignore"):
        if op == "xchg":
            return upd
        if op == "add":
            if dtype == ct.float32:
                from .rounding import ftz
                return ftz(ftz(old) + ftz(upd))
            if dtype == ct.bfloat16:
                return model.round_to(old.astype(np.float64) + upd, dtype)
            return old + upd
        return {"max": np.maximum, "min": np.minimum, "and": np.bitwise_and,
                "or": np.bitwise_or, "xor": np.bitwise_xor}[op](old, upd)


def apply(ctx, op, array, off, eff, upd, order, scope, expected=None):
    """Apply one atomic op of the running block: off (1, *shape) flat offsets, eff mask,
    upd (and expected for CAS) broadcast to the same shape. Returns the old values."""
    _cooperative(ctx, op)
    ctx.coop.sync_point(ctx)
    st = dtypes.storage(array.dtype)
    vals = array._read_bits().view(st)
    o = off[eff]
    u = np.ascontiguousarray(upd[eff]).astype(st, copy=False)
    e = None if expected is None else np.ascontiguousarray(expected[eff]).astype(st, copy=False)
    if np.unique(o).size == o.size:
        old, wrote = _apply_distinct(op, array.dtype, vals, o, u, e, ctx.model)
    else:
        old, wrote = _apply_serial(op, array.dtype, vals, o, u, e, ctx.model)
    after = vals[o]
    if (~_same_bits(after, old)).any():
        ctx.coop.progress()
    if len(o):
        owner = array._owner_flat()
        owner[o[wrote]] = int(ctx.coop_block.linear)
    hb = ctx.coop.hb
    if hb is not None:
        hb.atomic(int(ctx.coop_block.linear), array, o, wrote, order, scope, ctx.kernel_line())
    fill = expected if expected is not None else np.broadcast_to(_poison(array.dtype), off.shape)
    out = np.array(np.broadcast_to(fill, off.shape), st)
    out[eff] = old
    return out


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.view(_BITS[a.itemsize]) == b.view(_BITS[b.itemsize])


def _apply_distinct(op, dtype, vals, o, u, e, model):
    """All offsets differ: the element-by-element order cannot matter; one numpy step."""
    old = vals[o].copy()
    if op == "cas":
        wrote = _same_bits(old, e)
        vals[o[wrote]] = u[wrote]
    else:
        wrote = np.ones(o.shape, bool)
        vals[o] = _combine(op, dtype, old, u, model)
    return old, wrote


def _apply_serial(op, dtype, vals, o, u, e, model):
    """Repeated offsets: element by element, so each sees the previous one's result."""
    old = np.empty(o.shape, vals.dtype)
    wrote = np.ones(o.shape, bool)
    for i in range(len(o)):
        k = o[i]
        old[i] = vals[k]
        if op == "cas":
            wrote[i] = bool(_same_bits(old[i], e[i]))
            if wrote[i]:
                vals[k] = u[i]
        else:
            vals[k] = _combine(op, dtype, np.asarray(old[i]), np.asarray(u[i]), model)
    return old, wrote


def _indexed(op, array, indices, update, expected, check_bounds, memory_order, memory_scope):
    ctx = current()
    _check(op, array, memory_order, memory_scope)
    off, ok, shape = element_offsets(array, indices, f"atomic_{op}")
    _unbounded(ctx, array, ok, None, check_bounds, f"atomic_{op}")
    upd = _update(op, array, update, shape, off.shape[0])
    exp = None if expected is None else implicit_value(
        expected, array.dtype, shape, off.shape[0], "ct.atomic_cas expected")
    ctx.loads += ctx.lanes
    ctx.stores += ctx.lanes
    old = apply(ctx, op, array, off, ok, upd, memory_order, memory_scope, exp)
    from .tile import Tile
    return Tile(old, array.dtype)


def _update(op, array, update, shape, lanes):
    from .tile import Tile
    if op in BITWISE and isinstance(update, Tile) and update.dtype != array.dtype:
        raise SimTypeError(f"ct.atomic_{op}: bitwise atomics need the update dtype "
                           f"({update.dtype.name}) to match the array's ({array.dtype.name})")
    return implicit_value(update, array.dtype, shape, lanes, f"ct.atomic_{op} update")


def atomic_cas(array, indices, expected, desired, /, *, check_bounds=True,
               memory_order=_MO.ACQ_REL, memory_scope=_MS.DEVICE):
    return _indexed("cas", array, indices, desired, expected, check_bounds, memory_order,
                    memory_scope)


def _rmw_op(op):
    def f(array, indices, update, /, *, check_bounds=True, memory_order=_MO.ACQ_REL,
          memory_scope=_MS.DEVICE):
        return _indexed(op, array, indices, update, None, check_bounds, memory_order,
                        memory_scope)
    f.__name__ = f"atomic_{op}"
    f.__doc__ = f"ct.atomic_{op}: see the module docstring."
    return f


atomic_xchg, atomic_add = _rmw_op("xchg"), _rmw_op("add")
atomic_max, atomic_min = _rmw_op("max"), _rmw_op("min")
atomic_and, atomic_or, atomic_xor = _rmw_op("and"), _rmw_op("or"), _rmw_op("xor")

ATOMIC_NAMES = ("atomic_cas", "atomic_xchg", "atomic_add", "atomic_max", "atomic_min",
                "atomic_and", "atomic_or", "atomic_xor")


def offsets_op(op, array, off, eff, update, expected, mask, order, scope):
    """Shared by RawArrayMemory.atomic_*_offset and TiledView.atomic_store_*."""
    ctx = current()
    _check(op, array, order, scope)
    shape = off.shape[1:]
    m = _mask(mask, shape, off.shape[0], f"atomic_{op}")
    eff = eff if m is None else (eff & m)
    upd = _update(op, array, update, shape, off.shape[0])
    exp = None if expected is None else implicit_value(
        expected, array.dtype, shape, off.shape[0], "atomic_cas_offset expected")
    ctx.loads += ctx.lanes
    ctx.stores += ctx.lanes
    return apply(ctx, op, array, off, eff, upd, order, scope, exp)
