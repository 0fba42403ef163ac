"""Tile-only ops added for issue 19 (semantics: cuda/tile/_stub.py and the compiler's
checks in cuda/tile/_ir/ops.py): extract/insert, atan2, divmod, pack/unpack bytes, scans
and custom reductions, and the ops that have nothing to simulate on a CPU.

Integer results are exact. Float results whose GPU evaluation order is not known (custom
reductions, scans, atan2) follow a declared order and are marked "semantics only" in
docs/sim-coverage.md.
"""
from __future__ import annotations

import builtins
import contextlib

import numpy as np
import cuda.tile as ct

from . import dtypes
from .context import current
from .errors import SimNotSupported, SimTypeError
from .tile import Tile, as_tile, binary, lane_array, result_dtype

_builtin_divmod = builtins.divmod


# ---------------------------------------------------------------------------------------
# sub-tiles

def _grid_index(index, ndim, op):
    if not isinstance(index, (tuple, list)):
        index = (index,)
    if len(index) != ndim:
        raise SimTypeError(f"ct.{op}: index {tuple(index)} needs {ndim} entries")
    return tuple(int(i) for i in index)       # a lane-dependent index splits the group


def _sub_slices(xshape, index, sub, op):
    out = []
    for n, i, s in zip(xshape, index, sub):
        if s <= 0 or n % s:
            raise SimTypeError(f"ct.{op}: sub-tile shape {tuple(sub)} must divide {tuple(xshape)}")
        if not 0 <= i < n // s:
            raise SimTypeError(f"ct.{op}: index {tuple(index)} outside the grid of "
                               f"{tuple(n // t for n, t in zip(xshape, sub))} sub-tiles")
        out.append(slice(i * s, (i + 1) * s))
    return (slice(None),) + tuple(out)


def extract(x, /, index, shape):
    x = as_tile(x)
    shape = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if len(shape) != x.ndim:
        raise SimTypeError(f"ct.extract: shape {shape} needs {x.ndim} entries")
    sl = _sub_slices(x.shape, _grid_index(index, x.ndim, "extract"), shape, "extract")
    return Tile(np.ascontiguousarray(x.v[sl]), x.dtype)


def insert(x, /, index, value):
    x = as_tile(x)
    value = as_tile(value, x.dtype) if not isinstance(value, Tile) else value
    if value.dtype != x.dtype:
        raise SimTypeError(f"ct.insert: value dtype {value.dtype.name} != tile dtype {x.dtype.name}")
    sub = value.shape if value.ndim else (1,) * x.ndim
    if len(sub) != x.ndim:
        raise SimTypeError(f"ct.insert: value of shape {value.shape} into a {x.ndim}-d tile")
    sl = _sub_slices(x.shape, _grid_index(index, x.ndim, "insert"), sub, "insert")
    lanes = builtins.max(x.v.shape[0], value.v.shape[0])
    out = np.array(np.broadcast_to(x.v, (lanes,) + x.shape))
    out[sl] = value.v.reshape((value.v.shape[0],) + sub)
    return Tile(out, x.dtype)


# ---------------------------------------------------------------------------------------
# elementwise

def atan2(x1, x2, /):
    """Correctly rounded from float64 (the GPU's atan2 is a polynomial sequence: semantics
    only, not bit-exact)."""
    dt = result_dtype(x1, x2)
    if not dtypes.is_float(dt):
        raise SimTypeError(f"ct.atan2: needs float operands, got {dt.name}")
    nd = builtins.max([t.ndim for t in (x1, x2) if isinstance(t, Tile)] or [0])
    a, b = lane_array(x1, dt, nd), lane_array(x2, dt, nd)
    r = np.arctan2(a.astype(np.float64), b.astype(np.float64))
    return Tile(dtypes.round_value(current().model, r, dt), dt)


def divmod(x, y, /):
    """(x // y, x % y) for integers, floor semantics like ct.floordiv and ct.mod."""
    if not isinstance(x, Tile) and not isinstance(y, Tile):
        return _builtin_divmod(x, y)
    dt = result_dtype(x, y)
    if not dtypes.is_int(dt):
        raise SimTypeError(f"ct.divmod: float operands are not implemented by cuTile ({dt.name})")
    return binary("floordiv", x, y), binary("mod", x, y)


# ---------------------------------------------------------------------------------------
# bytes

def _bits_of(t: Tile) -> np.ndarray:
    """(lanes, n) raw little-endian element bits of a tile, in its cuTile width."""
    v = np.ascontiguousarray(t.v).reshape(t.v.shape[0], -1)
    if t.dtype == ct.bfloat16:
        return (v.view(np.uint32) >> 16).astype(np.uint16)
    if t.dtype == ct.tfloat32:
        raise SimNotSupported("ct.pack_to_bytes of a tfloat32 tile")
    if t.dtype in dtypes.FP8:
        from .memory import bits_of
        return bits_of(v, t.dtype)
    return v


def pack_to_bytes(x, /):
    x = as_tile(x)
    if x.dtype == ct.bool_:
        raise SimTypeError("ct.pack_to_bytes from a bool tile is not supported")
    b = _bits_of(x)
    return Tile(np.ascontiguousarray(b).view(np.uint8).reshape(b.shape[0], -1), ct.uint8)


def unpack_from_bytes(x, /, dtype):
    x = as_tile(x)
    dtype = dtypes.as_ct_dtype(dtype)
    if x.ndim != 1 or x.dtype != ct.uint8:
        raise SimTypeError(f"ct.unpack_from_bytes needs a 1-D uint8 tile, got {x.dtype.name} {x.shape}")
    if dtype in (ct.bool_, ct.tfloat32):
        raise SimTypeError(f"ct.unpack_from_bytes to {dtype.name} is not supported")
    width = 2 if dtype == ct.bfloat16 else dtypes.array_storage(dtype).itemsize
    if x.shape[0] % width:
        raise SimTypeError(f"ct.unpack_from_bytes: {x.shape[0]} bytes do not divide into {dtype.name}")
    raw = np.ascontiguousarray(x.v)
    if dtype == ct.bfloat16:
        v = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif dtype in dtypes.FP8:
        from .memory import values_of
        v = values_of(raw, dtype)
    else:
        v = raw.view(dtypes.storage(dtype))
    return Tile(v.reshape(raw.shape[0], -1), dtype)


# ---------------------------------------------------------------------------------------
# scans and custom reductions

def _scan_input(x, op):
    x = as_tile(x)
    if x.dtype == ct.bool_:
        x = Tile(x.v.astype(np.int32), ct.int32)   # cuTile scans bools as int32
    return x


def _axis(axis, ndim, op):
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise SimTypeError(f"ct.{op}: axis {axis} out of range for a {ndim}-d tile")
    return axis % ndim


def _scan_builtin(name, x, axis, reverse, rounding_mode, flush_to_zero):
    if rounding_mode not in (None, ct.RoundingMode.RN) or flush_to_zero:
        raise SimNotSupported(f"ct.{name}: rounding_mode/flush_to_zero options are not modelled")
    x = _scan_input(x, name)
    op = "add" if name == "cumsum" else "mul"
    ax = _axis(axis, x.v.ndim - 1, name)
    r = current().model.scan(x.v, ax + 1, np.add if op == "add" else np.multiply, reverse,
                             x.dtype)
    if r is not None:               # the model knows the GPU's order for this tile
        return Tile(r, x.dtype)
    return _scan_tiles((x,), axis, lambda a, b: (binary(op, a, b),), reverse, name)[0]


def cumsum(x, /, axis=0, *, reverse=False, rounding_mode=None, flush_to_zero=False):
    """Inclusive prefix sum in the tile's dtype: float32 in the model's order where it has
    one (sm_90: numerics.blocked_scan, read from the SASS), else element by element."""
    return _scan_builtin("cumsum", x, axis, reverse, rounding_mode, flush_to_zero)


def cumprod(x, /, axis=0, *, reverse=False, rounding_mode=None, flush_to_zero=False):
    return _scan_builtin("cumprod", x, axis, reverse, rounding_mode, flush_to_zero)


def _as_tuple(x):
    return (tuple(x), True) if isinstance(x, (tuple, list)) else ((x,), False)


def _common(xs, op):
    xs = [as_tile(t) for t in xs]
    try:
        shape = np.broadcast_shapes(*(t.shape for t in xs))
    except ValueError:
        raise SimTypeError(f"ct.{op}: input shapes {[t.shape for t in xs]} do not broadcast") from None
    lanes = builtins.max(t.v.shape[0] for t in xs)
    return [Tile(np.broadcast_to(t.v, (lanes,) + shape), t.dtype) for t in xs], shape


def _call(func, lhs, rhs, dts, op):
    """func on element slices; results implicitly cast back to the inputs' dtypes."""
    res = func(*lhs, *rhs)
    res, _ = _as_tuple(res)
    if len(res) != len(dts):
        raise SimTypeError(f"ct.{op}: the function must return {len(dts)} value(s)")
    return tuple(as_tile(r) if as_tile(r).dtype == d else _implicit(as_tile(r), d, op)
                 for r, d in zip(res, dts))


def _implicit(t: Tile, dt, op):
    if dtypes.promote(t.dtype, dt) != dt:
        raise SimTypeError(f"ct.{op}: the function returned {t.dtype.name}, "
                           f"which does not convert implicitly to {dt.name}")
    return Tile(lane_array(t, dt, t.ndim), dt)


def _take(x: Tile, axis, i):
    return Tile(x.v[(slice(None),) * (axis + 1) + (i,)], x.dtype)


def _scan_tiles(xs, axis, func, reverse, op):
    xs, shape = _common(xs, op)
    axis = _axis(axis, len(shape), op)
    n = shape[axis]
    order = range(n - 1, -1, -1) if reverse else range(n)
    dts = [t.dtype for t in xs]
    outs = [np.empty_like(t.v) for t in xs]
    acc = None
    for i in order:
        cur = tuple(_take(t, axis, i) for t in xs)
        acc = cur if acc is None else _call(func, acc, cur, dts, op)
        for o, a in zip(outs, acc):
            o[(slice(None),) * (axis + 1) + (i,)] = a.v
    return tuple(Tile(o, d) for o, d in zip(outs, dts))


def scan(x, /, axis, func, identity, *, reverse=False):
    """Inclusive scan with a user combiner, applied element by element along the axis."""
    xs, is_tuple = _as_tuple(x)
    ids, _ = _as_tuple(identity)
    if len(ids) != len(xs):
        raise SimTypeError(f"ct.scan: {len(ids)} identity value(s) for {len(xs)} input(s)")
    res = _scan_tiles(xs, axis, func, reverse, "scan")
    return res if is_tuple else res[0]


def reduce(x, /, axis, func, identity, *, keepdims=False):
    """Custom reduction: a halving tree (x[:n/2] with x[n/2:]) along the axis; float
    results whose combiner is not associative may differ from the GPU's order."""
    xs, is_tuple = _as_tuple(x)
    ids, _ = _as_tuple(identity)
    if len(ids) != len(xs):
        raise SimTypeError(f"ct.reduce: {len(ids)} identity value(s) for {len(xs)} input(s)")
    xs, shape = _common(xs, "reduce")
    axis = _axis(axis, len(shape), "reduce")
    dts = [t.dtype for t in xs]
    n = shape[axis]
    if n & (n - 1):
        raise SimTypeError(f"ct.reduce: axis length {n} is not a power of two")
    while n > 1:
        h = n // 2
        lo = tuple(Tile(t.v[(slice(None),) * (axis + 1) + (slice(0, h),)], t.dtype) for t in xs)
        hi = tuple(Tile(t.v[(slice(None),) * (axis + 1) + (slice(h, n),)], t.dtype) for t in xs)
        xs, n = _call(func, lo, hi, dts, "reduce"), h
    out = tuple(Tile(t.v if keepdims else np.take(t.v, 0, axis=axis + 1), t.dtype) for t in xs)
    return out if is_tuple else out[0]


# ---------------------------------------------------------------------------------------
# ops with nothing to simulate, and the ones the simulator refuses

def grid_dependency_control_wait():
    """sim.launch runs launches one after another: the preceding kernel has finished."""
    return None


def grid_dependency_control_launch_dependents():
    """Only lets a dependent launch start early on the GPU; no effect on results."""
    return None


def static_exception(exc, /):
    """`raise ct.static_exception(E)`: the simulator raises E when the line runs (cuTile
    raises it at compile time, wrapped in StaticException)."""
    return exc


@contextlib.contextmanager
def compiler_timeout(timeout_sec):
    """Host-side compiler setting: nothing is compiled by the simulator."""
    yield


def mma_scaled(x, x_scale, y, y_scale, /, acc):
    raise SimNotSupported(
        "spak sim: ct.mma_scaled is not supported by the simulator: it needs float8/float4 "
        "tiles with block scales (an sm_100+ tensor-core instruction), and the simulator's "
        "numeric models are sm_90/sm_120 without a block-scaled MMA model")
