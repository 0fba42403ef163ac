"""The simulator's implementation of cuTile's tile operations (semantics: cuda/tile/_stub.py).

Each function mirrors the cuTile op of the same name. Rounding-sensitive work goes through
the active numeric model (`current().model`); everything else is exact numpy.
"""
from __future__ import annotations

import builtins
import math

import numpy as np
import cuda.tile as ct

from . import dtypes
from .context import current
from .errors import SimNotSupported, SimTypeError
from .numerics import HALF_BLOCKED_LAYOUT, RAW_LAYOUTS
from .tile import (MMA_LAYOUT, Tile, as_tile, binary, derived_layout, lane_array, operand_dtype,
                   result_dtype)


# ---------------------------------------------------------------------------------------
# grid

def bid(axis):
    ctx = current()
    col = ctx.block_ids[:, int(axis)]
    if col.shape[0] == 1 or (col == col[0]).all():
        return int(col[0])
    return Tile(col.astype(np.int32), ct.int32)


def num_blocks(axis):
    return int(current().grid[int(axis)])


def num_tiles(array, /, axis, shape, order="C"):
    from .memory import _order
    perm = _order(order, array.ndim)
    return -(-array.shape[perm[int(axis)]] // int(shape[int(axis)]))


def cdiv(x, y, /):
    if isinstance(x, Tile) or isinstance(y, Tile):
        return binary("floordiv", binary("sub", binary("add", x, y), 1), y)
    return -(-x // y)


def assume_divisible_by(x, divisor):
    return x


def static_eval(expr, /):
    return expr


def static_assert(condition, message=None, /):
    if not condition:
        raise SimTypeError(f"static_assert failed: {message or ''}")


def static_iter(iterable):
    return iterable


def ensure_constant(value, /):
    return value


# ---------------------------------------------------------------------------------------
# factories

def _shape(shape):
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(s) for s in shape)


def full(shape, fill_value, dtype):
    dtype = dtypes.as_ct_dtype(dtype)
    shape = _shape(shape)
    if isinstance(fill_value, Tile):
        v = lane_array(fill_value, dtype, 0).reshape((-1,) + (1,) * len(shape))
        return Tile(np.ascontiguousarray(np.broadcast_to(v, (v.shape[0],) + shape)), dtype)
    val = lane_array(fill_value, dtype, 0).reshape(())
    return Tile(np.full((1,) + shape, val, dtypes.storage(dtype)), dtype)


def zeros(shape, dtype):
    return full(shape, 0, dtype)


def ones(shape, dtype):
    return full(shape, 1, dtype)


def arange(size, /, *, dtype, start=0, step=1):
    dtype = dtypes.as_ct_dtype(dtype)
    size = int(size)
    if size <= 0 or size & (size - 1):
        raise SimTypeError(f"ct.arange: size {size} must be a power of two")
    st = dtypes.storage(dtype)
    base = np.arange(size, dtype=np.float64 if dtypes.is_float(dtype) else np.int64)
    s = lane_array(start, dtype, 0).reshape(-1, 1).astype(base.dtype)
    p = lane_array(step, dtype, 0).reshape(-1, 1).astype(base.dtype)
    return Tile((s + base[None, :] * p).astype(st), dtype)


def astile(value, /, *, dtype):
    dtype = dtypes.as_ct_dtype(dtype)
    arr = np.asarray(value)
    return Tile(dtypes.round_value(current().model, arr.astype(np.float64), dtype)[None]
                if dtypes.is_float(dtype) else arr.astype(dtypes.storage(dtype))[None], dtype)


# ---------------------------------------------------------------------------------------
# shape ops

def reshape(x, /, shape):
    return as_tile(x).reshape(_shape(shape))


def permute(x, /, axes):
    return as_tile(x).permute(axes)


def transpose(x, /, axis0=None, axis1=None):
    return as_tile(x).transpose(axis0, axis1)


def expand_dims(x, /, axis):
    x = as_tile(x)
    axis = int(axis)
    if axis < 0:
        axis += x.ndim + 1
    return Tile(np.expand_dims(x.v, axis + 1), x.dtype)


def broadcast_to(x, /, shape):
    x = as_tile(x)
    shape = _shape(shape)
    v = lane_array(x, x.dtype, len(shape))
    return Tile(np.broadcast_to(v, (v.shape[0],) + shape), x.dtype)


def cat(tiles, /, axis):
    tiles = [as_tile(t) for t in tiles]
    dt = tiles[0].dtype
    if any(t.dtype != dt for t in tiles):
        raise SimTypeError("ct.cat: all tiles must have one dtype")
    lanes = builtins.max(t.v.shape[0] for t in tiles)
    vs = [np.broadcast_to(t.v, (lanes,) + t.shape) for t in tiles]
    axis = int(axis) % tiles[0].ndim
    return Tile(np.concatenate(vs, axis=axis + 1), dt)


def astype(x, dtype, /, *, rounding_mode=None):
    dtype = dtypes.as_ct_dtype(dtype)
    x = as_tile(x)
    if rounding_mode not in (None, ct.RoundingMode.RN):
        return _astype_rounded(x, dtype, rounding_mode)
    if x.dtype == dtype:
        return x
    model = current().model
    if dtypes.is_float(dtype):
        layout = x.layout
        if layout is None and dtype == ct.float32 and x.dtype in (ct.float16, ct.bfloat16):
            layout = HALF_BLOCKED_LAYOUT      # the values stay where the 2-byte load put them
        return Tile(dtypes.round_value(model, x.v, dtype), dtype, x.share, layout=layout)
    if dtype == ct.bool_:
        return Tile(x.v != 0, dtype)
    return Tile(model.round_to(x.v, dtype), dtype)


def _astype_rounded(x, dtype, rounding_mode):
    """float -> float with RZ/RM/RP (exact, sim.rounding); cuTile allows rounding modes
    only for float-to-float conversions (its FTOF_ROUNDING_REGISTRY)."""
    from . import rounding
    if not (dtypes.is_float(x.dtype) and dtypes.is_float(dtype)):
        raise SimTypeError("ct.astype: rounding_mode is only valid for float to float conversions")
    if dtype == ct.tfloat32 or rounding_mode not in rounding.DIRECTED:
        raise SimNotSupported(f"ct.astype: rounding_mode={rounding_mode} to {dtype.name} "
                              "is not modelled")
    r = rounding.convert(current().model, x.v, dtype, rounding_mode)
    return Tile(np.asarray(r), dtype, layout=x.layout)


def bitcast(x, /, dtype):
    dtype = dtypes.as_ct_dtype(dtype)
    x = as_tile(x)
    if ct.bfloat16 in (dtype, x.dtype):
        raise SimNotSupported("ct.bitcast to/from bfloat16")
    if x.dtype in dtypes.FP8 or dtype in dtypes.FP8:
        from .memory import bits_of, values_of
        raw = np.ascontiguousarray(bits_of(x.v, x.dtype))
        if raw.dtype.itemsize != dtypes.array_storage(dtype).itemsize:
            raise SimTypeError(f"ct.bitcast: {x.dtype.name} and {dtype.name} differ in width")
        return Tile(values_of(raw.view(dtypes.array_storage(dtype)), dtype), dtype)
    return Tile(x.v.view(dtypes.storage(dtype)), dtype)


# ---------------------------------------------------------------------------------------
# elementwise

def _binop(name):
    def f(x, y, /, *, rounding_mode=None, flush_to_zero=False):
        if rounding_mode in (None, ct.RoundingMode.RN) and not flush_to_zero:
            return binary(name, x, y)
        return _rounded_binop(name, x, y, rounding_mode, flush_to_zero)
    f.__name__ = name
    return f


def _check_rd_ftz(op, dt, rounding_mode, flush_to_zero, modes):
    """cuTile's compile-time rules (cuda.tile._ir.ops_utils.check_rd_and_ftz)."""
    if rounding_mode is not None and rounding_mode not in modes:
        raise SimTypeError(f"ct.{op}: rounding_mode={rounding_mode} is not supported for {op}")
    if rounding_mode is not None and not dtypes.is_float(dt):
        raise SimTypeError(f"ct.{op}: a rounding mode needs float operands, got {dt.name}")
    if flush_to_zero and dt != ct.float32:
        raise SimTypeError(f"ct.{op}: flush_to_zero is only valid for float32, got {dt.name}")


_ARITH_MODES = (ct.RoundingMode.RN, ct.RoundingMode.RZ, ct.RoundingMode.RM, ct.RoundingMode.RP)


def _rounded_binop(name, x, y, rounding_mode, flush_to_zero):
    """add/sub/mul with an IEEE rounding mode and/or flush-to-zero (sim.rounding): one
    rounding of the exact result, never contracted into an FMA."""
    from . import rounding
    dt = result_dtype(x, y)
    _check_rd_ftz(name, dt, rounding_mode, flush_to_zero, _ARITH_MODES)
    nd = builtins.max([t.ndim for t in (x, y) if isinstance(t, Tile)] or [0])
    xv, yv = lane_array(x, dt, nd), lane_array(y, dt, nd)
    if flush_to_zero:
        xv, yv = rounding.ftz(xv), rounding.ftz(yv)
    model = current().model
    if name == "mul":
        r = rounding.mul(model, xv, yv, dt, rounding_mode)
    else:
        r = rounding.add(model, xv, -yv if name == "sub" else yv, dt, rounding_mode)
    if flush_to_zero:
        r = rounding.ftz(r)
    return Tile(np.asarray(r), dt, layout=derived_layout(np.shape(r)[1:], x, y))


add, sub, mul = _binop("add"), _binop("sub"), _binop("mul")


def truediv(x, y, /, *, rounding_mode=None, flush_to_zero=False):
    dt = result_dtype(x, y, force_float=True)
    nd = builtins.max([t.ndim for t in (x, y) if isinstance(t, Tile)] or [0])
    xv, yv = lane_array(x, dt, nd), lane_array(y, dt, nd)
    model = current().model
    if dt == ct.float32 and rounding_mode in (None, ct.RoundingMode.RN) and not flush_to_zero:
        with np.errstate(all="ignore"):
            r = np.divide(xv, yv)                 # IEEE float32 division, correctly rounded
        return Tile(r, dt, layout=derived_layout(r.shape[1:], x, y))
    _check_rd_ftz("truediv", dt, rounding_mode, flush_to_zero,
                  _ARITH_MODES + (ct.RoundingMode.FULL, ct.RoundingMode.APPROX))
    if rounding_mode in (ct.RoundingMode.RZ, ct.RoundingMode.RM, ct.RoundingMode.RP):
        from . import rounding
        if flush_to_zero:
            xv, yv = rounding.ftz(xv), rounding.ftz(yv)
        r = rounding.div(model, xv, yv, dt, rounding_mode)
        r = rounding.ftz(r) if flush_to_zero else r
    else:
        r = model.truediv(xv, yv, dt, rounding_mode, flush_to_zero)
    if not isinstance(x, Tile) and not isinstance(y, Tile):
        return r.reshape(()).item()
    return Tile(r, dt, layout=derived_layout(r.shape[1:], x, y))


def floordiv(x, y, /):
    return binary("floordiv", x, y)


def mod(x, y, /):
    return binary("mod", x, y)


def pow(x, y, /):
    return binary("pow", x, y)


def _cmp(name):
    def f(x, y, /):
        return binary(name, x, y)
    f.__name__ = name
    return f


greater, greater_equal = _cmp("gt"), _cmp("ge")
less, less_equal = _cmp("lt"), _cmp("le")
equal, not_equal = _cmp("eq"), _cmp("ne")
bitwise_and, bitwise_or, bitwise_xor = _cmp("and"), _cmp("or"), _cmp("xor")
bitwise_lshift, bitwise_rshift = _cmp("lshift"), _cmp("rshift")


def bitwise_not(x, /):
    return ~as_tile(x)


def negative(x, /):
    return -as_tile(x)


def abs(x, /):
    return builtins.abs(as_tile(x))


def _minmax(x, y, is_max, flush_to_zero, propagate_nan):
    if not isinstance(x, Tile) and not isinstance(y, Tile) and not flush_to_zero:
        return builtins.max(x, y) if is_max else builtins.min(x, y)
    dt = result_dtype(x, y)
    _check_rd_ftz("maximum" if is_max else "minimum", dt, None, flush_to_zero, ())
    nd = builtins.max([t.ndim for t in (x, y) if isinstance(t, Tile)] or [0])
    xv, yv = lane_array(x, dt, nd), lane_array(y, dt, nd)
    if flush_to_zero:
        # max.ftz.f32: subnormal inputs are zeros, so the result is one too
        from .rounding import ftz
        xv, yv = ftz(xv), ftz(yv)
    if propagate_nan:
        fn = np.maximum if is_max else np.minimum
    else:
        fn = np.fmax if is_max else np.fmin       # NaN operands are ignored (cuTile default)
    r = fn(xv, yv)
    return Tile(r, dt, layout=derived_layout(r.shape[1:], x, y))


def maximum(x, y, /, *, flush_to_zero=False, propagate_nan=False):
    return _minmax(x, y, True, flush_to_zero, propagate_nan)


def minimum(x, y, /, *, flush_to_zero=False, propagate_nan=False):
    return _minmax(x, y, False, flush_to_zero, propagate_nan)


def where(cond, x, y, /):
    cond_t = as_tile(cond)
    if cond_t.dtype != ct.bool_:
        raise SimTypeError(f"ct.where: condition must be bool, got {cond_t.dtype.name}")
    dt = result_dtype(x, y)
    nd = builtins.max([t.ndim for t in (cond_t, x, y) if isinstance(t, Tile)])
    c = lane_array(cond_t, ct.bool_, nd)
    r = np.where(c, lane_array(x, dt, nd), lane_array(y, dt, nd))
    return Tile(r, dt, layout=derived_layout(r.shape[1:], x, y))


def isnan(x, /):
    x = as_tile(x)
    return Tile(np.isnan(x.v) if x.v.dtype.kind == "f" else np.zeros_like(x.v, bool), ct.bool_)


def _float_in(x):
    x = as_tile(x)
    if not dtypes.is_float(x.dtype):
        raise SimTypeError(f"expected a float tile, got {x.dtype.name}")
    return x


def exp2(x, /, *, flush_to_zero=False):
    x = _float_in(x)
    return Tile(current().model.exp2(x.v, x.dtype, flush_to_zero), x.dtype, layout=x.layout)


def _unary(fn):
    def f(x, /, *, rounding_mode=None, flush_to_zero=False):
        if rounding_mode not in (None, ct.RoundingMode.RN, ct.RoundingMode.FULL) or flush_to_zero:
            return _unary_options(fn, x, rounding_mode, flush_to_zero)
        x = _float_in(x)
        return Tile(current().model.unary(fn, x.v, x.dtype), x.dtype, layout=x.layout)
    f.__name__ = fn
    return f


_UNARY_MODES = {"exp": (ct.RoundingMode.FULL, ct.RoundingMode.APPROX),
                "tanh": (ct.RoundingMode.FULL, ct.RoundingMode.APPROX),
                "sqrt": _ARITH_MODES + (ct.RoundingMode.APPROX,), "rsqrt": ()}
_LOG2E = np.float32(1.4426950408889634)


def _unary_options(fn, x, rounding_mode, flush_to_zero):
    """sqrt with RZ/RM/RP (exact, sim.rounding); flush_to_zero on sqrt/rsqrt (inputs and
    results flushed around the model's value); APPROX (semantics only): exp as the model's
    exp2 of fl32(x * log2 e), the ex2.approx formulation; tanh and sqrt correctly rounded,
    more accurate than the GPU's tanh.approx / sqrt.approx (docs/sim-coverage.md)."""
    from . import rounding
    x = _float_in(x)
    if fn not in _UNARY_MODES:
        raise SimNotSupported(f"ct.{fn}: rounding_mode={rounding_mode} "
                              f"flush_to_zero={flush_to_zero} is not modelled")
    _check_rd_ftz(fn, x.dtype, rounding_mode, flush_to_zero, _UNARY_MODES[fn])
    if rounding_mode is ct.RoundingMode.APPROX and x.dtype != ct.float32:
        raise SimTypeError(f"ct.{fn}: rounding_mode=APPROX is only valid for float32")
    model = current().model
    if rounding_mode is ct.RoundingMode.APPROX and fn == "exp":
        t = np.multiply(x.v, _LOG2E, dtype=np.float32)
        return Tile(model.exp2(t, x.dtype, False), x.dtype, layout=x.layout)
    if fn == "tanh" and rounding_mode is ct.RoundingMode.APPROX:
        # tanh.approx.f32 (MUFU.TANH): its own entry, so a model can tell it from tanhf
        return Tile(model.unary("tanh_approx", x.v, x.dtype), x.dtype, layout=x.layout)
    if fn in ("exp", "tanh") or rounding_mode is ct.RoundingMode.APPROX:
        return Tile(model.unary(fn, x.v, x.dtype), x.dtype, layout=x.layout)
    v = rounding.ftz(x.v) if flush_to_zero else x.v
    if rounding_mode in (None, ct.RoundingMode.RN):
        r = model.unary(fn, v, x.dtype)
    else:
        r = rounding.sqrt(model, v, x.dtype, rounding_mode)
    return Tile(rounding.ftz(r) if flush_to_zero else r, x.dtype, layout=x.layout)


exp, log, log2, sqrt, rsqrt = _unary("exp"), _unary("log"), _unary("log2"), _unary("sqrt"), _unary("rsqrt")
sin, cos, tan, sinh, cosh, tanh = (_unary(n) for n in ("sin", "cos", "tan", "sinh", "cosh", "tanh"))


def floor(x, /):
    x = _float_in(x)
    return Tile(np.floor(x.v), x.dtype)


def ceil(x, /):
    x = _float_in(x)
    return Tile(np.ceil(x.v), x.dtype)


# ---------------------------------------------------------------------------------------
# reductions

def _axes(x: Tile, axis):
    if axis is None:
        return tuple(range(1, x.ndim + 1))
    if isinstance(axis, (tuple, list)):
        return tuple(int(a) % x.ndim + 1 for a in axis)
    return (int(axis) % x.ndim + 1,)


def _reduce(x, axis, keepdims, fn):
    x = as_tile(x)
    ax = _axes(x, axis)
    r = fn(x, ax)
    if keepdims:
        r = np.expand_dims(r, ax)
    return r


def sum(x, /, axis=None, *, keepdims=False, rounding_mode=None, flush_to_zero=False):
    if rounding_mode not in (None, ct.RoundingMode.RN) or flush_to_zero:
        raise SimNotSupported("ct.sum: rounding_mode/flush_to_zero options are not modelled")
    x = as_tile(x)
    dt = ct.int32 if x.dtype == ct.bool_ else x.dtype
    model = current().model
    layout = RAW_LAYOUTS.get(x.layout, x.layout) if x.raw else x.layout
    return Tile(_reduce(x, axis, keepdims, lambda t, ax: model.sum(t.v, ax, dt, layout)), dt)


def max(x, /, axis=None, *, keepdims=False, flush_to_zero=False, propagate_nan=False):
    fn = np.maximum if propagate_nan else np.fmax
    x = _ftz_in("max", as_tile(x), flush_to_zero)
    return Tile(_reduce(x, axis, keepdims, lambda t, ax: fn.reduce(t.v, axis=ax)), x.dtype)


def min(x, /, axis=None, *, keepdims=False, flush_to_zero=False, propagate_nan=False):
    fn = np.minimum if propagate_nan else np.fmin
    x = _ftz_in("min", as_tile(x), flush_to_zero)
    return Tile(_reduce(x, axis, keepdims, lambda t, ax: fn.reduce(t.v, axis=ax)), x.dtype)


def _ftz_in(op, x: Tile, flush_to_zero) -> Tile:
    """x with subnormals flushed when flush_to_zero (float32 only, as cuTile checks)."""
    if not flush_to_zero:
        return x
    _check_rd_ftz(op, x.dtype, None, True, ())
    from .rounding import ftz
    return Tile(ftz(x.v), x.dtype, layout=x.layout)


def prod(x, /, axis=None, *, keepdims=False, rounding_mode=None, flush_to_zero=False):
    if rounding_mode not in (None, ct.RoundingMode.RN) or flush_to_zero:
        raise SimNotSupported("ct.prod: rounding_mode/flush_to_zero options are not modelled")
    x = as_tile(x)
    model = current().model
    return Tile(_reduce(x, axis, keepdims,
                        lambda t, ax: model.round_to(np.prod(t.v.astype(np.float64), axis=ax), x.dtype)
                        if dtypes.is_float(x.dtype) else np.prod(t.v, axis=ax)), x.dtype)


def argmax(x, /, axis=None, *, keepdims=False, propagate_nan=False):
    return _arg(_nan_ignored(x, -np.inf, propagate_nan), axis, keepdims, np.argmax)


def argmin(x, /, axis=None, *, keepdims=False, propagate_nan=False):
    return _arg(_nan_ignored(x, np.inf, propagate_nan), axis, keepdims, np.argmin)


def _nan_ignored(x, fill, propagate_nan):
    """numpy's argmax/argmin return the first NaN (cuTile's propagate_nan=True); by
    default cuTile ignores NaN, so NaN becomes the value that never wins."""
    x = as_tile(x)
    if propagate_nan or x.v.dtype.kind != "f":
        return x
    return Tile(np.where(np.isnan(x.v), x.v.dtype.type(fill), x.v), x.dtype)


def _arg(x, axis, keepdims, fn):
    x = as_tile(x)
    if axis is None:
        flat = x.v.reshape(x.v.shape[0], -1)
        r = fn(flat, axis=1).astype(np.int32)
        return Tile(r.reshape((-1,) + ((1,) * x.ndim if keepdims else ())), ct.int32)
    ax = int(axis) % x.ndim + 1
    r = fn(x.v, axis=ax).astype(np.int32)
    if keepdims:
        r = np.expand_dims(r, ax)
    return Tile(r, ct.int32)


# ---------------------------------------------------------------------------------------
# matrix multiply

_MMA_OK = {ct.float16: (ct.float16, ct.float32), ct.bfloat16: (ct.float32,),
           ct.float32: (ct.float32,), ct.float64: (ct.float64,), ct.tfloat32: (ct.float32,),
           ct.int8: (ct.int32,), ct.uint8: (ct.int32,),
           ct.float8_e4m3fn: (ct.float16, ct.float32), ct.float8_e5m2: (ct.float16, ct.float32)}


def mma(x, y, /, acc, *, use_fast_acc=False):
    x, y, acc = as_tile(x), as_tile(y), as_tile(acc)
    if x.dtype != y.dtype:
        raise SimTypeError(f"ct.mma: operands must share a dtype, got {x.dtype.name} and {y.dtype.name}")
    if acc.dtype not in _MMA_OK.get(x.dtype, ()):
        raise SimTypeError(f"ct.mma: {x.dtype.name} inputs cannot accumulate in {acc.dtype.name}")
    if x.ndim not in (2, 3) or y.ndim not in (2, 3):
        raise SimTypeError("ct.mma: operands must be 2-D or 3-D")
    if x.shape[-1] != y.shape[-2]:
        raise SimTypeError(f"ct.mma: inner dims differ: {x.shape} @ {y.shape}")
    out_shape = np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (x.shape[-2], y.shape[-1])
    if acc.shape != out_shape:
        raise SimTypeError(f"ct.mma: accumulator shape {acc.shape} != result shape {out_shape}")
    if dtypes.is_int(x.dtype):
        # integer tensor-core mma: exact products and sums, int32 accumulator wraps
        r = np.matmul(x.v.astype(np.int64), y.v.astype(np.int64)) + acc.v
        return Tile(r.astype(np.int32), acc.dtype, layout=MMA_LAYOUT)
    if x.dtype in dtypes.FP8:
        # no fp8 tensor-core model: exact products, one rounding (the base model's rule;
        # a model's own mma would take these float32-held values for bf16)
        from .numerics import NumericModel
        model = current().model
        return Tile(NumericModel.mma(model, _f64(x), y.v, acc.v, acc.dtype), acc.dtype,
                    layout=MMA_LAYOUT)
    model = current().model
    # a model with an fp16 path reads float16 storage itself (no float64 copy per k-step)
    a = x.v if x.v.dtype == np.float16 and getattr(model, "mma_reads_fp16", False) else _f64(x)
    out = Tile(model.mma(a, y.v, acc.v, acc.dtype, y_share=y.share, in_dtype=x.dtype),
               acc.dtype, layout=MMA_LAYOUT)
    out.raw = True          # the accumulator itself: its sums take the raw order (ops.sum)
    return out


def _f64(t: Tile) -> np.ndarray:
    """float64 copy of an mma operand, kept on the tile: a Q tile feeds every key step."""
    if t.f64 is None:
        t.f64 = t.v.astype(np.float64)
    return t.f64


def matmul(x, y, /):
    """x @ y in the promoted dtype, accumulated by mma in cuTile's accumulator for it (fp16
    for fp16 and fp8, fp32 for bf16 and tf32, int32 for 8-bit ints); 1-D operands are a
    row / column vector, then squeezed."""
    x, y = as_tile(x), as_tile(y)
    if x.ndim == 1 or y.ndim == 1:
        r = matmul(x.reshape((1,) + x.shape) if x.ndim == 1 else x,
                   y.reshape(y.shape + (1,)) if y.ndim == 1 else y)
        shape = r.shape[:-2] + (() if x.ndim == 1 else r.shape[-2:-1]) \
            + (() if y.ndim == 1 else r.shape[-1:])
        return r.reshape(shape)
    dt = dtypes.promote(x.dtype, y.dtype)
    # cuTile's rule (matmul_impl): the first accumulator its mma allows for the dtype, so
    # fp16 (and fp8) accumulate in fp16 (measured on an H100: k16 steps rounded to fp16)
    acc_dt = _MMA_OK.get(dt, (dt,))[0]
    out_shape = np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (x.shape[-2], y.shape[-1])
    acc = full(out_shape, 0, acc_dt)
    r = mma(astype(x, dt), astype(y, dt), acc)
    return astype(r, dt)


# ---------------------------------------------------------------------------------------
# debugging

# kernel prints so far (sim.launch_memo does not memoise a launch that printed)
PRINTS = [0]


def printf(format, *args):
    ctx = current()
    PRINTS[0] += 1
    for lane in range(ctx.lanes):
        vals = tuple(_lane_py(a, lane) for a in args)
        builtins.print(f"[block {ctx.block_of(lane)}] " + (format % vals), end="")


def print(*args, sep=" ", end="\n", **kw):
    """Per block, prefixed with its id; tiles and f-strings show that block's values
    (sim.formatting). The builtin print inside a kernel lands here, as in cuTile."""
    from .formatting import expand, lane_text
    if kw.get("file") is not None:
        return builtins.print(*args, sep=sep, end=end, **kw)
    ctx = current()
    PRINTS[0] += 1
    for lane in range(ctx.lanes):
        parts = [lane_text(a, lane) if isinstance(a, Tile) else
                 expand(a, lane, ctx.formats) if isinstance(a, str) else str(a) for a in args]
        builtins.print(f"[block {ctx.block_of(lane)}] " + sep.join(parts), end=end)


def _lane_py(a, lane):
    if isinstance(a, Tile):
        v = a.v[builtins.min(lane, a.v.shape[0] - 1)]
        return v.item() if v.ndim == 0 else v.tolist()
    return a


def assert_(cond, /, message=None):
    c = as_tile(cond)
    bad = ~np.asarray(c.v, bool).reshape(c.v.shape[0], -1).all(axis=1)
    if bad.any():
        from .errors import SimulationError
        ctx = current()
        lane = int(np.argmax(bad))
        raise SimulationError(f"ct.assert_ failed in block {ctx.block_of(lane)} at "
                              f"{ctx.kernel_line()}: {message or ''}")


# python builtins the cuTile compiler treats specially inside kernels
def builtin_max(*args, **kw):
    if len(args) >= 2 and builtins.any(isinstance(a, Tile) for a in args):
        r = args[0]
        for a in args[1:]:
            r = maximum(r, a)
        return r
    return builtins.max(*args, **kw)


def builtin_min(*args, **kw):
    if len(args) >= 2 and builtins.any(isinstance(a, Tile) for a in args):
        r = args[0]
        for a in args[1:]:
            r = minimum(r, a)
        return r
    return builtins.min(*args, **kw)
