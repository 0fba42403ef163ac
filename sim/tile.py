"""The simulator's tile value.

A `Tile` holds one value per *lane*: the simulator runs a group of blocks in lock-step, one
lane per block, so every tile carries a leading lane axis. `v.shape == (lanes, *shape)`, or
`(1, *shape)` when the value is the same in every block (numpy broadcasting does the rest).
Python-level decisions (`if`, `range(n)`, `bool()`) on a value that differs between lanes
raise `Divergence`; the launcher then splits the group and re-runs each part, so kernels
with block-dependent control flow still run block-exactly.
"""
from __future__ import annotations

import operator
import sys

import numpy as np
import cuda.tile as ct

from . import dtypes
from .errors import ContractionConflict, Divergence, SimNotSupported, SimTypeError
from .context import current
from .numerics import GATHER_LAYOUT, HALF_BLOCKED_LAYOUT, MMA_LAYOUT


def derived_layout(shape, *operands):
    """MMA_LAYOUT when an elementwise result of `shape` comes from a same-shaped operand
    in the fragment layout (the compiler keeps elementwise work in the layout it finds);
    likewise GATHER_LAYOUT (a ct.gather result's), fragments taking precedence."""
    for x in operands:
        if isinstance(x, Tile) and x.layout == MMA_LAYOUT and x.shape == tuple(shape):
            return MMA_LAYOUT
    same = [x for x in operands if isinstance(x, Tile) and x.shape == tuple(shape)]
    # a same-shaped operand in the blocked layout (e.g. a ct.full accumulator carried by a
    # loop: TileGym's rms_norm) keeps the result blocked
    if same and all(x.layout == GATHER_LAYOUT for x in same):
        return GATHER_LAYOUT
    # likewise converted fp16/bf16 loads (all of them: a mix with fp32 loads is not read)
    if same and all(x.layout == HALF_BLOCKED_LAYOUT for x in same):
        return HALF_BLOCKED_LAYOUT
    return None


class Tile:
    __slots__ = ("v", "dtype", "share", "f64", "layout", "product", "uses", "fused_at", "mul",
                 "raw")
    __hash__ = None  # elementwise __eq__

    def __init__(self, v: np.ndarray, dtype, share=None, layout=None):
        self.v = v
        self.dtype = dtype
        # share: (lane -> unique id, representative lane per id) when lanes hold equal
        # values (e.g. one K tile loaded by every query block of a head). Only a speed
        # hint for mma, kept by pure views (reshape/permute); any arithmetic drops it.
        self.share = share
        self.f64 = None     # cached float64 values (mma operands reused across a loop)
        # layout: MMA_LAYOUT when the values sit in the tensor core's accumulator fragments
        # (an mma result, or elementwise work on one): a row reduction then runs in the
        # fragment order (NumericModel.sum). None: the blocked layout of a load.
        self.layout = layout
        # product: (x, y) lane arrays when this float32 tile is x*y and the model contracts
        # a single-use product feeding an add/sub into one fused multiply-add (binary()).
        # uses: kernel-level ops that read this tile so far (note_use); fused_at: the
        # multiply's site once fused, so a later second use can undo the decision.
        self.product = None
        self.uses = 0
        self.fused_at = None
        # mul: a float multiply's result in a contracting model, fused or not (the sm_90
        # rule that a left multiply operand of an add blocks the right one, _contract)
        self.mul = False
        # raw: the tile is an mma result or a gather result itself, no op applied since;
        # sm_90 sums such tiles in another order than computed ones (ops.sum)
        self.raw = False

    # -- shape ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.v.shape[1:])

    @property
    def ndim(self) -> int:
        return self.v.ndim - 1

    def __repr__(self):
        lanes = self.v.shape[0]
        return f"Tile(shape={self.shape}, dtype={self.dtype.name}, lanes={lanes})"

    def __format__(self, spec):
        """f"{tile}" inside a kernel: its values, as ct.print shows them (sim.formatting)."""
        from .formatting import format_tile
        return format_tile(self, spec)

    def __str__(self):
        return self.__format__("")

    # -- python-level decisions (uniform across lanes or Divergence) ----------------------
    def _uniform_scalar(self, what: str):
        if self.shape != ():
            raise SimTypeError(f"{what} of a tile with shape {self.shape}: only scalars (0-d) "
                               "can steer python control flow")
        v = self.v
        if v.shape[0] > 1 and not (v == v[0]).all():
            raise Divergence(v, what)
        return v[0].item()

    def __bool__(self):
        return bool(self._uniform_scalar("bool()"))

    def __index__(self):
        if not dtypes.is_int(self.dtype) and self.dtype != ct.bool_:
            raise SimTypeError(f"cannot use a {self.dtype.name} tile as an integer")
        return int(self._uniform_scalar("integer use (range/index)"))

    __int__ = __index__

    def __float__(self):
        return float(self._uniform_scalar("float()"))

    def item(self):
        if self.shape != () and int(np.prod(self.shape)) != 1:
            raise SimTypeError(f"item() on a tile of shape {self.shape}")
        return Tile(self.v.reshape(self.v.shape[0]), self.dtype)

    # -- views ---------------------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if int(np.prod(shape)) != int(np.prod(self.shape)):
            raise SimTypeError(f"cannot reshape tile of shape {self.shape} to {shape}")
        return Tile(self.v.reshape((self.v.shape[0],) + shape), self.dtype, self.share)

    def permute(self, axes):
        axes = tuple(int(a) % self.ndim for a in axes)
        if sorted(axes) != list(range(self.ndim)):
            raise SimTypeError(f"permute: {axes} is not a permutation of {self.ndim} axes")
        return Tile(self.v.transpose((0,) + tuple(a + 1 for a in axes)), self.dtype, self.share)

    def transpose(self, axis0=None, axis1=None):
        if axis0 is None and axis1 is None:
            if self.ndim != 2:
                raise SimTypeError("transpose() without axes needs a 2-D tile")
            axis0, axis1 = 0, 1
        axes = list(range(self.ndim))
        a0, a1 = int(axis0) % self.ndim, int(axis1) % self.ndim
        axes[a0], axes[a1] = axes[a1], axes[a0]
        return self.permute(axes)

    def astype(self, dtype, *, rounding_mode=None):
        from .ops import astype
        return astype(self, dtype, rounding_mode=rounding_mode)

    def extract(self, index, shape):
        from .tileops import extract
        return extract(self, index, shape)

    def insert(self, index, value):
        from .tileops import insert
        return insert(self, index, value)

    def __divmod__(self, o):
        from .tileops import divmod as _divmod
        return _divmod(self, o)

    def __rdivmod__(self, o):
        from .tileops import divmod as _divmod
        return _divmod(o, self)

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        norm = []
        for ix in index:
            if ix is None or ix is Ellipsis or (isinstance(ix, slice) and ix == slice(None)):
                norm.append(ix)
            else:
                raise SimNotSupported(f"tile indexing with {ix!r}: only ':', None and ... "
                                      "are supported by the simulator")
        return Tile(self.v[(slice(None),) + tuple(norm)], self.dtype)

    # -- arithmetic ------------------------------------------------------------------------
    def __add__(self, o): return binary("add", self, o)
    def __radd__(self, o): return binary("add", o, self)
    def __sub__(self, o): return binary("sub", self, o)
    def __rsub__(self, o): return binary("sub", o, self)
    def __mul__(self, o): return binary("mul", self, o)
    def __rmul__(self, o): return binary("mul", o, self)
    def __truediv__(self, o): return binary("truediv", self, o)
    def __rtruediv__(self, o): return binary("truediv", o, self)
    def __floordiv__(self, o): return binary("floordiv", self, o)
    def __rfloordiv__(self, o): return binary("floordiv", o, self)
    def __mod__(self, o): return binary("mod", self, o)
    def __rmod__(self, o): return binary("mod", o, self)
    def __pow__(self, o): return binary("pow", self, o)
    def __rpow__(self, o): return binary("pow", o, self)
    def __and__(self, o): return binary("and", self, o)
    def __rand__(self, o): return binary("and", o, self)
    def __or__(self, o): return binary("or", self, o)
    def __ror__(self, o): return binary("or", o, self)
    def __xor__(self, o): return binary("xor", self, o)
    def __rxor__(self, o): return binary("xor", o, self)
    def __lshift__(self, o): return binary("lshift", self, o)
    def __rlshift__(self, o): return binary("lshift", o, self)
    def __rshift__(self, o): return binary("rshift", self, o)
    def __rrshift__(self, o): return binary("rshift", o, self)
    def __lt__(self, o): return binary("lt", self, o)
    def __le__(self, o): return binary("le", self, o)
    def __gt__(self, o): return binary("gt", self, o)
    def __ge__(self, o): return binary("ge", self, o)
    def __eq__(self, o): return binary("eq", self, o)
    def __ne__(self, o): return binary("ne", self, o)

    def __matmul__(self, o):
        from .ops import matmul
        return matmul(self, o)

    def __rmatmul__(self, o):
        from .ops import matmul
        return matmul(o, self)

    def __neg__(self):
        if self.dtype == ct.bool_:
            raise SimTypeError("negation of a bool tile")
        return Tile(np.negative(self.v), self.dtype, layout=self.layout)

    def __invert__(self):
        if self.dtype == ct.bool_:
            return Tile(np.logical_not(self.v), self.dtype)
        if not dtypes.is_int(self.dtype):
            raise SimTypeError(f"~ on a {self.dtype.name} tile")
        return Tile(np.invert(self.v), self.dtype)

    def __abs__(self):
        return Tile(np.abs(self.v), self.dtype)


# ---------------------------------------------------------------------------------------
# operands and promotion

def _count_method_uses():
    """Tile's arithmetic and conversion methods are ops the kernel calls: count them."""
    skip = {"__init__", "__repr__", "__format__", "__str__", "_uniform_scalar", "shape", "ndim"}
    for name, fn in list(vars(Tile).items()):
        if callable(fn) and name not in skip and not isinstance(fn, (staticmethod, classmethod)):
            setattr(Tile, name, counted(fn))


def note_use(*xs) -> None:
    """Count one kernel-level use of each tile among xs (called once per op the kernel
    calls, not by the simulator's internal helpers)."""
    for x in xs:
        if isinstance(x, Tile):
            x.uses += 1
            if x.fused_at is not None and x.uses > 1:
                raise ContractionConflict(x.fused_at)
        elif isinstance(x, (list, tuple)):
            note_use(*x)


def counted(fn):
    """Wrap a kernel-facing op so each tile argument's use is counted (note_use)."""
    def op(*args, **kwargs):
        note_use(*args, *kwargs.values())
        return fn(*args, **kwargs)
    op.__name__, op.__qualname__, op.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    op.__wrapped__ = fn
    return op


def is_scalar(x) -> bool:
    return isinstance(x, (bool, int, float, np.generic))


def operand_dtype(x):
    """dtype of a typed operand, or None for a python constant (loosely typed)."""
    if isinstance(x, Tile):
        return x.dtype
    if isinstance(x, np.generic):
        return dtypes.from_numpy(x.dtype)
    if isinstance(x, (bool, int, float)):
        return None
    raise SimTypeError(f"unsupported operand {x!r} of type {type(x).__name__}")


def result_dtype(a, b, force_float=False):
    da, db = operand_dtype(a), operand_dtype(b)
    if da is None and db is None:
        dt = dtypes.promote(dtypes.loose_default(a), dtypes.loose_default(b))
    elif da is None:
        dt = dtypes.loose_dtype(a, db)
    elif db is None:
        dt = dtypes.loose_dtype(b, da)
    else:
        dt = dtypes.promote(da, db)
    if force_float and not dtypes.is_float(dt):
        dt = ct.float32
    return dt


def lane_array(x, dtype, ndim: int) -> np.ndarray:
    """x as a storage array of `dtype` with a lane axis and `ndim` tile axes."""
    st = dtypes.storage(dtype)
    if isinstance(x, Tile):
        v = x.v
        if x.dtype != dtype:
            v = dtypes.round_value(current().model, v, dtype) if dtypes.is_float(dtype) else v.astype(st)
        return _lift(v, ndim)
    arr = np.asarray(x)
    if arr.dtype.kind == "f" and dtypes.is_float(dtype):
        arr = dtypes.round_value(current().model, arr.astype(np.float64), dtype)
    else:
        arr = arr.astype(st)
    return arr.reshape((1,) * (ndim + 1))


def as_tile(x, dtype=None) -> Tile:
    if isinstance(x, Tile) and (dtype is None or x.dtype == dtype):
        return x
    if dtype is None:
        dtype = operand_dtype(x) or dtypes.loose_default(x)
    nd = x.ndim if isinstance(x, Tile) else 0
    return Tile(lane_array(x, dtype, nd), dtype)


_ARITH = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "floordiv": np.floor_divide, "mod": np.mod,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "lshift": np.left_shift, "rshift": np.right_shift,
}
_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}


def binary(op: str, a, b, **kw):
    """Elementwise binary op with cuTile promotion and broadcasting."""
    if not isinstance(a, Tile) and not isinstance(b, Tile):
        # two scalars: python/numpy semantics are what cuTile's constant folding does
        return _SCALAR_OPS[op](a, b)
    ndim = max(x.ndim for x in (a, b) if isinstance(x, Tile))
    if op in _CMP:
        dt = result_dtype(a, b)
        av, bv = lane_array(a, dt, ndim), lane_array(b, dt, ndim)
        _check_broadcast(av, bv)
        return Tile(_CMP[op](av, bv), ct.bool_)
    if op == "truediv":
        from .ops import truediv
        return truediv(a, b, **kw)
    dt = result_dtype(a, b)
    if op in ("and", "or", "xor", "lshift", "rshift") and dtypes.is_float(dt):
        raise SimTypeError(f"bitwise '{op}' on {dt.name} operands")
    av, bv = lane_array(a, dt, ndim), lane_array(b, dt, ndim)
    _check_broadcast(av, bv)
    if op == "pow":
        model = current().model
        with np.errstate(all="ignore"):
            if dtypes.is_float(dt):
                return Tile(model.round_to(np.power(av.astype(np.float64), bv), dt), dt)
            return Tile(np.power(av, bv), dt)
    model = current().model
    fused = None
    if dt in _CONTRACTED and model.contract_fma and op in ("add", "sub"):
        fused = _contract(op, a, b, av, bv, ndim, dt)
    if fused is not None:
        r = fused
    elif dt == ct.float16 and op in _F16_TORCH:
        r = _f16_arith(op, av, bv)
    else:
        with np.errstate(all="ignore"):
            r = _ARITH[op](av, bv)
    if dt == ct.bfloat16:
        # float32 arithmetic on bf16 values then one RNE rounding: exact for + - * (p >= 2q+2)
        r = model.round_to(r, dt)
    out = Tile(r, dt, layout=derived_layout(r.shape[1:], a, b))
    if op == "mul" and dt in _CONTRACTED and model.contract_fma:
        site = current().kernel_line()
        out.mul = True
        if site not in current().unfused_sites:
            out.product = (av, bv, site)
    return out


_F16_TORCH = ("add", "sub", "mul")


def _f16_arith(op, av, bv):
    """float16 + - * through torch's CPU kernels when torch is already loaded (interpreter
    mode: the host program's torch): numpy's float16 loops convert element by element, ~35x
    slower (TileGym's fp16 geglu: 26 of 60 s in them). Same bits: both compute in float32
    and round once to float16 (exact for *, innocuous double rounding for + -: 24 >= 2*11+2);
    checked on all 65536 x 613 operand pairs. Only NaN payloads can differ (which input's
    propagates): a result with a NaN is recomputed by numpy, as before."""
    torch = sys.modules.get("torch")
    if (torch is None or av.dtype != np.float16 or bv.dtype != np.float16
            or not (av.flags.writeable and bv.flags.writeable)):
        with np.errstate(all="ignore"):
            return _ARITH[op](av, bv)
    fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}[op]
    try:
        r = fn(torch.from_numpy(av), torch.from_numpy(bv))
    except (ValueError, RuntimeError, TypeError):      # e.g. negative strides: numpy's way
        r = None
    if r is None or bool(torch.isnan(r).any()):
        with np.errstate(all="ignore"):
            return _ARITH[op](av, bv)
    return r.numpy()


def _lift(v: np.ndarray, ndim: int) -> np.ndarray:
    """A lane array with fewer tile axes, broadcast-ready against `ndim` tile axes."""
    if v.ndim - 1 < ndim:
        v = v.reshape((v.shape[0],) + (1,) * (ndim - v.ndim + 1) + v.shape[1:])
    return v


# dtypes whose product feeding an add is contracted into one FMA (float32: FFMA, read from
# the SASS; bfloat16: HFMA2.BF16, measured on an H100 with TileGym's RoPE, sim.fma.fma_bf16)
_CONTRACTED = (ct.float32, ct.bfloat16)


def _contract(op, a, b, av, bv, ndim, dt=ct.float32):
    """a+b or a-b as one fused multiply-add when an operand is a pending float32 product,
    as the compiler contracts it; None when neither is. With two products the left one is
    fused (what LLVM's combiner picks when both have one use; seen in the masked kernel's
    SASS: (s * c) + (mask * log2e) -> fma(s, c, mask * log2e))."""
    from .fma import fma_bf16, fma_f32
    fma = fma_f32 if dt == ct.float32 else fma_bf16
    model = current().model
    shape = tuple(np.broadcast_shapes(av.shape[1:], bv.shape[1:]))

    def broadcast_product(t):
        # sm_90: a product that the add broadcasts (s + k[:, None] * c) is computed once
        # on the smaller tile, FMUL before the broadcast, and never contracted (SASS)
        return model.fma_no_broadcast and isinstance(t, Tile) and t.shape != shape
    if (model.fma_left_mul_first and isinstance(a, Tile) and a.mul
            and (a.product is None or a.uses != 1 or broadcast_product(a))):
        # sm_90: a multiply on the left that cannot be fused (another use) leaves the add
        # an FADD even when the right operand is a single-use product (SASS of x*c + y*z
        # with x*c stored too: no FFMA; y*z + x*c: FFMA; TileGym's recurrent gated delta
        # rule State*e + K*D: 51.16% -> 100% on an H100, docs/numerics-sm90.md section 14)
        return None
    for t in (a, b):
        # uses == 1: this add is the product's only use so far (a second one later raises
        # ContractionConflict from note_use and the group re-runs without this fusion)
        if isinstance(t, Tile) and t.product is not None and t.uses == 1 and \
                not broadcast_product(t):
            x, y, site = t.product
            x, y = _lift(x, ndim), _lift(y, ndim)
            t.fused_at = site
            with np.errstate(all="ignore"):
                if t is a:
                    return fma(x, y, bv if op == "add" else -bv)
                return fma(x if op == "add" else -x, y, av)
    return None


def _check_broadcast(av, bv):
    for x, y in zip(av.shape[1:], bv.shape[1:]):
        if x != y and x != 1 and y != 1:
            raise SimTypeError(f"shapes {av.shape[1:]} and {bv.shape[1:]} are not broadcastable")


_SCALAR_OPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
    "pow": operator.pow, "and": operator.and_, "or": operator.or_, "xor": operator.xor,
    "lshift": operator.lshift, "rshift": operator.rshift,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "eq": operator.eq, "ne": operator.ne,
}


_count_method_uses()
