"""Global memory: arrays passed to a kernel, and ct.load / ct.store with the checker.

Loads gather a box per lane (numba); stores are buffered per lane group and committed when
the group finishes (so a group that diverges and re-runs leaves no trace), recording which
block wrote each element. That record gives the checker its three findings: accesses
outside the array beyond what padding allows, elements written by two different blocks,
and elements of an output that no block wrote.
"""
from __future__ import annotations

import numba
import numpy as np
import cuda.tile as ct

from . import dtypes
from .context import current
from . import oob
from .errors import SimulationError, SimTypeError
from .numerics import _CACHE, PARALLEL_MIN, _renamed, threaded
from .tile import Tile

_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class SimArray:
    """A numpy array seen by a simulated kernel as a cuTile Array (data shared, not copied).

    bf16 arrays: pass float32 `data` and dtype=ct.bfloat16; values are rounded to bf16
    (RNE) in place on construction so the array holds only representable values
    (rounded=True: the caller vouches that they already are, e.g. a bf16 torch tensor's
    .float(): the pass is skipped; interpreter mode wraps every bf16 argument at every
    launch, memo hits included).
    A view made inside a kernel (`Array.slice`) shares its root's memory and write record.
    """

    def __init__(self, data: np.ndarray, dtype=None, name: str | None = None, *,
                 rounded: bool = False):
        if not isinstance(data, np.ndarray):
            raise TypeError(f"SimArray needs a numpy array, got {type(data).__name__}")
        if not data.flags.c_contiguous:
            raise ValueError(f"array {name or ''} must be C-contiguous for the simulator "
                             "(use np.ascontiguousarray; a copy would not receive stores)")
        dt = dtypes.as_ct_dtype(dtype) if dtype is not None else dtypes.from_numpy(data.dtype)
        if data.dtype != dtypes.array_storage(dt):
            raise TypeError(f"array {name or ''}: dtype {dt.name} is held in numpy "
                            f"{dtypes.array_storage(dt)}, got {data.dtype}")
        if dt == ct.bfloat16 and not rounded:
            from .numerics import get_model
            data[...] = get_model("ieee").round_to(data, ct.bfloat16)
        self.data = data
        self.dtype = dt
        self.name = name or "array"
        self._parent = None         # the root this array views (None: it is a root)
        self._offset = 0
        self._shape = tuple(int(n) for n in data.shape)
        self._strides = tuple(st // data.itemsize for st in data.strides)
        self._owner: np.ndarray | None = None   # block (linear id) that wrote each element
        self._was_read = False      # a load, gather or atomic touched it (sim.launch_memo)

    @property
    def _root(self) -> "SimArray":
        """The array whose memory and write record this one views (itself for a root). A
        link to the parent only: `self._root = self` made every root a reference cycle, freed
        only by Python's cyclic GC, and interpreter mode's per-launch copies (a bf16
        argument's float32 values, a written array's int64 write record) piled up between
        collections: TileGym's chunk_gated_delta_rule perf test, T2048, grew to 7.6 GB
        resident over its memo hits (1.2 GB after its own gc.collect); T8192 hit 24 GB."""
        return self._parent if self._parent is not None else self

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def strides(self) -> tuple[int, ...]:
        return self._strides

    @property
    def owner(self):
        root = self._root
        if root._owner is None or root is self:
            return root._owner
        return root._owner[self._offset:]

    @owner.setter
    def owner(self, value):
        self._root._owner = value

    def _owner_flat(self) -> np.ndarray:
        """The write record from this array's first element on (created on first use)."""
        root = self._root
        if root._owner is None:
            root._owner = np.full(root.data.size, -1, np.int64)
        return root._owner[self._offset:]

    @classmethod
    def strided(cls, arr: np.ndarray, dtype=None, name: str | None = None) -> "SimArray":
        """A non-contiguous numpy array (positive strides) as a view sharing its memory, as
        cuTile takes strided tensors (interpreter mode passes torch views this way)."""
        if any(st < 0 or st % arr.itemsize for st in arr.strides):
            raise ValueError(f"array {name or ''}: negative or unaligned strides {arr.strides} "
                             "are not supported by the simulator")
        span = 1 + sum((n - 1) * st // arr.itemsize for n, st in zip(arr.shape, arr.strides))
        flat = np.lib.stride_tricks.as_strided(arr, shape=(max(span, 1),), strides=(arr.itemsize,))
        root = cls(flat, dtype, name)
        return root._view(0, arr.shape, tuple(st // arr.itemsize for st in arr.strides),
                          name or "array")

    def owner_view(self):
        """The write record at this array's own elements (its shape), or None."""
        root = self._root
        if root._owner is None:
            return None
        return np.lib.stride_tricks.as_strided(root._owner[self._offset:], self._shape,
                                               tuple(st * 8 for st in self._strides))

    def __repr__(self):
        return f"SimArray({self.name}, shape={self.shape}, dtype={self.dtype.name})"

    def _bits(self) -> np.ndarray:
        root = self._root.data
        return root.reshape(-1).view(_BITS[root.itemsize])[self._offset:]

    def _read_bits(self) -> np.ndarray:
        """_bits() for a read: marks the array as read (the launch memo keys a launch on the
        contents of the arrays it read, sim.launch_memo)."""
        self._root._was_read = True
        return self._bits()

    # -- cuTile Array methods (kernel side) -----------------------------------------------
    def slice(self, axis, start, stop):
        """A view along one axis, [start, stop) (cuTile's Array.slice: no data copied)."""
        axis = int(axis)
        if not -self.ndim <= axis < self.ndim:
            raise SimTypeError(f"Array.slice: axis {axis} out of range for {self.ndim}-d '{self.name}'")
        axis %= self.ndim
        start, stop, n = int(start), int(stop), self._shape[axis]
        if not (0 <= start < n and start <= stop <= n):
            raise SimulationError(f"Array.slice of '{self.name}': need 0 <= start < {n} and "
                                  f"start <= stop <= {n}, got start={start} stop={stop}")
        shape = self._shape[:axis] + (stop - start,) + self._shape[axis + 1:]
        return self._view(self._offset + start * self._strides[axis], shape, self._strides,
                          f"{self.name}[{axis}:{start}:{stop}]")

    def _view(self, offset, shape, strides, name):
        v = object.__new__(SimArray)
        root = self._root
        v.dtype, v.name, v._parent, v._offset = self.dtype, name, root, offset
        v._shape, v._strides, v._owner = tuple(shape), tuple(strides), None
        item = root.data.itemsize
        v.data = np.lib.stride_tricks.as_strided(root.data.reshape(-1)[offset:], v._shape,
                                                 tuple(st * item for st in v._strides))
        return v

    def tiled_view(self, tile_shape, *, padding_mode=ct.PaddingMode.UNDETERMINED,
                   traversal_steps=None):
        from .views import TiledView
        return TiledView(self, tile_shape, padding_mode, traversal_steps)

    def get_raw_memory(self):
        from .views import RawArrayMemory
        return RawArrayMemory(self)

    @property
    def foreign_pointer(self):
        """This array's first element as a ForeignPointer (cuTile's Array.foreign_pointer)."""
        return ForeignPointer(self)

    @staticmethod
    def from_foreign(pointer, shape, strides):
        """cuTile's Array.from_foreign: an array of `shape` and element `strides` whose first
        element is `pointer`'s. A view of the pointer's memory (shared write record); an
        element past that memory raises, where the GPU would read or write whatever is there."""
        if not isinstance(pointer, ForeignPointer):
            raise SimTypeError(f"Array.from_foreign needs a foreign pointer "
                               f"(Array.foreign_pointer), got {type(pointer).__name__}")
        if len(shape) != len(strides):
            raise SimTypeError(f"Array.from_foreign: shape {tuple(shape)} and strides "
                               f"{tuple(strides)} differ in length")
        shape = tuple(int(n) for n in shape)
        strides = tuple(int(st) for st in strides)
        base = pointer.array
        if any(n < 0 for n in shape) or any(st < 0 for st in strides):
            raise SimulationError(f"Array.from_foreign over '{base.name}': negative shape "
                                  f"{shape} or strides {strides}")
        size = base._root.data.size
        if all(shape):
            last = base._offset + sum((n - 1) * st for n, st in zip(shape, strides))
            if last >= size:
                raise SimulationError(
                    f"Array.from_foreign over '{base.name}': shape {shape} with strides "
                    f"{strides} reaches element {last} of {size} from its pointer's memory")
        return base._view(base._offset, shape, strides, f"foreign({base.name})")


class ForeignPointer:
    """Array.foreign_pointer in the simulator: the array it came from (its memory and first
    element). As on the GPU it takes no arithmetic; Array.from_foreign is its one use."""
    __slots__ = ("array",)

    def __init__(self, array: SimArray):
        self.array = array

    def __repr__(self):
        return f"ForeignPointer({self.array.name})"


# ---------------------------------------------------------------------------------------
# numba movers: boxes of up to 4 dims, on the raw bits (so every dtype shares one kernel);
# a box of more dims reaches them folded to 4 (_fold)

def _gather_py(flat, shape, strides, starts, tshape, pad, out):
    L = starts.shape[0]
    t0, t1, t2, t3 = tshape[0], tshape[1], tshape[2], tshape[3]
    for l in numba.prange(L):
        k = 0
        for i0 in range(t0):
            c0 = starts[l, 0] + i0
            ok0 = 0 <= c0 < shape[0]
            for i1 in range(t1):
                c1 = starts[l, 1] + i1
                ok1 = ok0 and 0 <= c1 < shape[1]
                for i2 in range(t2):
                    c2 = starts[l, 2] + i2
                    ok2 = ok1 and 0 <= c2 < shape[2]
                    base = c0 * strides[0] + c1 * strides[1] + c2 * strides[2]
                    for i3 in range(t3):
                        c3 = starts[l, 3] + i3
                        if ok2 and 0 <= c3 < shape[3]:
                            out[l, k] = flat[base + c3 * strides[3]]
                        else:
                            out[l, k] = pad
                        k += 1


def _scatter_py(flat, shape, strides, starts, tshape, vals, vlanes, owner, lane_block, conflicts):
    """Write each lane's box; owner[] records the writer; returns #conflicting elements."""
    L = starts.shape[0]
    t0, t1, t2, t3 = tshape[0], tshape[1], tshape[2], tshape[3]
    n = 0
    for l in range(L):
        vl = l if vlanes > 1 else 0
        me = lane_block[l]
        k = 0
        for i0 in range(t0):
            c0 = starts[l, 0] + i0
            ok0 = 0 <= c0 < shape[0]
            for i1 in range(t1):
                c1 = starts[l, 1] + i1
                ok1 = ok0 and 0 <= c1 < shape[1]
                for i2 in range(t2):
                    c2 = starts[l, 2] + i2
                    ok2 = ok1 and 0 <= c2 < shape[2]
                    base = c0 * strides[0] + c1 * strides[1] + c2 * strides[2]
                    for i3 in range(t3):
                        c3 = starts[l, 3] + i3
                        if ok2 and 0 <= c3 < shape[3]:
                            off = base + c3 * strides[3]
                            prev = owner[off]
                            if prev != -1 and prev != me:
                                if n < conflicts.shape[0]:
                                    conflicts[n, 0] = off
                                    conflicts[n, 1] = prev
                                    conflicts[n, 2] = me
                                n += 1
                            owner[off] = me
                            flat[off] = vals[vl, k]
                        k += 1
    return n


# distinct names: numba's disk cache keys by name and bytecode, not by parallel= (numerics._renamed)
_gather_serial = numba.njit(cache=_CACHE)(_renamed(_gather_py, "_serial"))
_gather_parallel = numba.njit(parallel=True, cache=_CACHE)(_renamed(_gather_py, "_parallel"))
_scatter = numba.njit(cache=_CACHE)(_scatter_py)


def _gather(flat, shape, strides, starts, tshape, pad, out):
    fn = _gather_parallel if out.size >= PARALLEL_MIN and threaded() else _gather_serial
    fn(flat, shape, strides, starts, tshape, pad, out)


# ---------------------------------------------------------------------------------------

def _order(order, ndim):
    if order == "C":
        return tuple(range(ndim))
    if order == "F":
        return tuple(reversed(range(ndim)))
    order = tuple(int(o) for o in order)
    if sorted(order) != list(range(ndim)):
        raise SimTypeError(f"order={order} is not a permutation of {ndim} array axes")
    return order


def _pad4(seq, fill):
    seq = list(seq)
    return np.array([fill] * (4 - len(seq)) + seq, dtype=np.int64)


def _box(array: SimArray, index, shape, order, op: str, steps=None):
    """Per-lane start coordinates of the box, in the order-permuted array space (a tiled
    view's traversal `steps` put box i at i * step instead of i * shape)."""
    if not isinstance(array, SimArray):
        raise SimTypeError(f"ct.{op}: first argument must be an array, got {type(array).__name__}")
    if not isinstance(index, (tuple, list)):
        index = (index,)
    nd = array.ndim
    if len(index) != nd or len(shape) != nd:
        raise SimTypeError(f"ct.{op} on {array.name} (ndim {nd}): index {tuple(index)} and "
                           f"shape {tuple(shape)} must both have {nd} entries")
    perm = _order(order, nd)
    ashape = [array.shape[p] for p in perm]
    astrides = [array.strides[p] for p in perm]
    ctx = current()
    L = ctx.lanes
    starts = np.zeros((L, max(nd, 4)), np.int64)
    for a, (ix, ts) in enumerate(zip(index, steps if steps is not None else shape)):
        col = max(4 - nd, 0) + a
        if isinstance(ix, Tile):
            if ix.shape != ():
                raise SimTypeError(f"ct.{op}: index entries must be scalars, got a tile {ix.shape}")
            starts[:, col] = ix.v.astype(np.int64) * int(ts)
        else:
            starts[:, col] = int(ix) * int(ts)
    if nd > 4:
        return _fold(starts, ashape, astrides, [int(s) for s in shape], op) + (ashape,)
    shape4 = _pad4(ashape, 1)
    strides4 = _pad4(astrides, 0)
    tshape4 = _pad4([int(s) for s in shape], 1)
    return starts, shape4, strides4, tshape4, ashape


def _fold(starts, ashape, astrides, tshape, op):
    """An N-D box (N > 4; cuTile allows rank 5 and more) as the movers' exact 4-D box, so
    the 4-D path stays as it is. Dims of tile extent 1 fold into one leading dim whose
    coordinate is their flat offset (stride 1); a lane outside one of them gets offset -1,
    which keeps its box wholly outside, as it is. Then a dim the tile covers whole, from 0,
    merges into the dim before it when the two are contiguous."""
    shp, std, tsh = list(ashape), list(astrides), list(tshape)
    cols = [starts[:, a] for a in range(len(shp))]
    unit = [a for a in range(len(shp)) if tsh[a] == 1]
    if len(unit) > 1:
        base = sum(cols[a] * std[a] for a in unit)
        inside = np.logical_and.reduce([(cols[a] >= 0) & (cols[a] < shp[a]) for a in unit])
        keep = [a for a in range(len(shp)) if tsh[a] != 1]
        cols = [np.where(inside, base, -1)] + [cols[a] for a in keep]
        shp = [1 << 62] + [shp[a] for a in keep]
        std = [1] + [std[a] for a in keep]
        tsh = [1] + [tsh[a] for a in keep]
    a = len(shp) - 2
    while len(shp) > 4 and a >= 0:
        if (tsh[a + 1] == shp[a + 1] and std[a] == shp[a + 1] * std[a + 1]
                and shp[a] < 1 << 62 and not cols[a + 1].any()):
            cols[a] = cols[a] * shp[a + 1]
            shp[a], std[a], tsh[a] = shp[a] * shp[a + 1], std[a + 1], tsh[a] * tsh[a + 1]
            for v in (cols, shp, std, tsh):
                del v[a + 1]
            a = min(a, len(shp) - 2)
        else:
            a -= 1
    if len(shp) > 4:
        from .errors import SimNotSupported
        raise SimNotSupported(f"ct.{op}: a {len(ashape)}-D box of tile shape {tuple(tshape)} "
                              "that does not fold to 4 dims (more than 3 dims of extent > 1 "
                              "that are not contiguous)")
    starts4 = np.zeros((starts.shape[0], 4), np.int64)
    starts4[:, 4 - len(shp):] = np.stack(cols, axis=1)
    return starts4, _pad4(shp, 1), _pad4(std, 0), _pad4(tsh, 1)


def _check_box(array, starts, shape4, tshape4, op, index, shape, check_bounds):
    """Lanes whose box lies entirely outside the array (or partly, if unchecked): undefined
    in cuTile. Strict mode (sim.oob) raises; by default the access runs as on the GPU (the
    movers pad loads and drop stores element by element) and is recorded as a finding."""
    lo = starts
    hi = starts + tshape4[None, :]
    inside_any = ((hi > 0) & (lo < shape4[None, :])).all(axis=1)
    inside_all = ((lo >= 0) & (hi <= shape4[None, :])).all(axis=1)
    bad = ~inside_any if check_bounds else ~inside_all
    if bad.any():
        ctx = current()
        lane = int(np.argmax(bad))
        where = "entirely outside" if check_bounds else "partly outside (check_bounds=False)"
        line = ctx.kernel_line()
        msg = (f"ct.{op} out of bounds in block {ctx.block_of(lane)} at {line}: "
               f"tile index {tuple(_lane_value(i, lane) for i in index)} with shape "
               f"{tuple(shape)} lies {where} array '{array.name}' of shape {array.shape}")
        if oob.strict():
            raise SimulationError(msg)
        oob.record(f"{op}|{line}|{array.name}|{where}", msg, int(bad.sum()))
    return not inside_all.all()


def _lane_value(ix, lane):
    if isinstance(ix, Tile):
        return int(ix.v[min(lane, ix.v.shape[0] - 1)])
    return int(ix)


# what a load with UNDETERMINED padding reads outside the array: "poison" (NaN / int max,
# the default: a kernel must not depend on it) or "zero" (what the H100 gave TileGym's
# attention_sink kernel, which masks such columns by adding -1e6: interpreter mode's
# undetermined_padding="zero" runs such programs as the GPU does; issue 19)
_UNDETERMINED = {"fill": "poison"}


def set_undetermined_padding(fill: str) -> str:
    """Set the UNDETERMINED padding fill ("poison" or "zero"); returns the previous one."""
    if fill not in ("poison", "zero"):
        raise ValueError(f"undetermined_padding must be 'poison' or 'zero', got {fill!r}")
    old, _UNDETERMINED["fill"] = _UNDETERMINED["fill"], fill
    return old


def _pad_bits(dtype, padding_mode) -> int:
    PM = ct.PaddingMode
    # the "zero" choice holds for every dtype, fp8 included: checked before fp8's own table
    # (which gives UNDETERMINED its NaN poison code), else TileGym's fp8 e5m2 attention
    # (K/V loads without padding_mode on a ragged tail) read NaN where the GPU reads zeros
    if padding_mode in (None, PM.UNDETERMINED) and _UNDETERMINED["fill"] == "zero":
        return 0
    if dtype in dtypes.FP8:
        from .fp8 import pad_code
        return pad_code(dtype, padding_mode)
    st = dtypes.storage(dtype)
    if padding_mode in (None, PM.UNDETERMINED):
        # poison: a kernel must not depend on undetermined padding
        val = np.array(np.nan if st.kind == "f" else np.iinfo(st).max if st.kind in "iu" else True, st)
    else:
        fill = {PM.ZERO: 0.0, PM.NEG_ZERO: -0.0, PM.NAN: np.nan,
                PM.POS_INF: np.inf, PM.NEG_INF: -np.inf}[padding_mode]
        if st.kind != "f" and padding_mode is not PM.ZERO:
            raise SimTypeError(f"padding_mode={padding_mode} needs a float array, got {dtype.name}")
        val = np.array(fill, st)
    return int(val.reshape(1).view(_BITS[st.itemsize])[0])


_MO, _MS = ct.MemoryOrder, ct.MemoryScope


def check_order(op, order, scope, valid):
    """cuTile's rules (validate_memory_order_and_scope): an allowed order; a scope iff the
    order is not WEAK."""
    order = _MO.WEAK if order is None else order
    scope = _MS.NONE if scope is None else scope
    if order not in valid:
        raise SimTypeError(f"ct.{op}: memory_order={order} is not one of {[o.name for o in valid]}")
    if (order == _MO.WEAK) != (scope == _MS.NONE):
        raise SimTypeError(f"ct.{op}: memory_order={order.name} needs "
                           + ("no memory_scope" if order == _MO.WEAK else "a memory_scope"))
    return order, scope


def load(array, /, index, shape, *, order="C", padding_mode=ct.PaddingMode.UNDETERMINED,
         check_bounds=True, latency=None, allow_tma=None, memory_order=None, memory_scope=None):
    return load_box(array, index, shape, order=order, padding_mode=padding_mode,
                    check_bounds=check_bounds, memory_order=memory_order,
                    memory_scope=memory_scope)


def load_box(array, index, shape, *, order="C", padding_mode=ct.PaddingMode.UNDETERMINED,
             check_bounds=True, memory_order=None, memory_scope=None, steps=None):
    mo, ms = check_order("load", memory_order, memory_scope, (_MO.WEAK, _MO.RELAXED, _MO.ACQUIRE))
    scalar = tuple(shape) == () if isinstance(shape, (tuple, list)) else False
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    if scalar:
        shape = (1,) * array.ndim
    for s in shape:
        if s <= 0 or s & (s - 1):
            raise SimTypeError(f"ct.load: tile shape {shape} must be powers of two")
    starts, shape4, strides4, tshape4, _ = _box(array, index, shape, order, "load", steps)
    _check_box(array, starts, shape4, tshape4, "load", index if isinstance(index, (tuple, list)) else (index,),
               shape, check_bounds)
    ctx = current()
    ctx.loads += ctx.lanes
    if ctx.coop is not None:
        if mo == _MO.ACQUIRE:
            _note_acquire_poll(ctx, array, starts)
        _coop_access(ctx, array, box_offsets(starts, shape4, strides4, tshape4), mo, ms, False)
    elif array._root._owner is not None:
        ctx.findings += foreign_reads(ctx, array, starts, shape4, strides4, tshape4)
    flat = array._read_bits()
    share = None
    own = ctx.coop is None and _pending_on(ctx, array)
    if ctx.lanes > 1 and not own:
        # lanes loading the same box (e.g. every query block of a head loads one K tile):
        # gather each box once, and tell mma so it can batch those lanes into one GEMM
        uniq, reps, inverse = np.unique(starts, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        if len(uniq) < ctx.lanes:
            share = (inverse, reps)
            starts = uniq
    out = np.empty((len(starts), int(np.prod(shape))), flat.dtype)
    _gather(flat, shape4, strides4, starts, tshape4,
            flat.dtype.type(_pad_bits(array.dtype, padding_mode)), out)
    if share is not None:
        out = out[share[0]]
        share = (share[0], _first_lane(share[0], len(share[1])))
    if own:
        overlay_own(ctx, array, lane_box_offsets(starts, shape4, strides4, tshape4), out)
    v = values_of(out, array.dtype).reshape((ctx.lanes,) + shape)
    if scalar:
        v = v.reshape((ctx.lanes,))
    return Tile(v, array.dtype, share)


def values_of(bits: np.ndarray, dtype) -> np.ndarray:
    """Tile values of raw array bits (fp8 codes are decoded, others reinterpreted)."""
    if dtype in dtypes.FP8:
        from .fp8 import decode
        return decode(bits.view(np.uint8), dtype)
    return bits.view(dtypes.storage(dtype))


def bits_of(values: np.ndarray, dtype) -> np.ndarray:
    """Array bits of tile values (fp8 values are encoded, others as stored)."""
    if dtype in dtypes.FP8:
        from .fp8 import encode
        return encode(values, dtype)
    return values


def _first_lane(inverse, n):
    """For each unique id, the first lane holding it."""
    first = np.full(n, len(inverse), np.int64)
    np.minimum.at(first, inverse, np.arange(len(inverse)))
    return first


def store(array, /, index, tile, *, order="C", check_bounds=True, latency=None,
          allow_tma=None, memory_order=None, memory_scope=None):
    store_box(array, index, tile, order=order, check_bounds=check_bounds,
              memory_order=memory_order, memory_scope=memory_scope)


def store_box(array, index, tile, *, order="C", check_bounds=True, memory_order=None,
              memory_scope=None, steps=None, tile_shape=None):
    mo, ms = check_order("store", memory_order, memory_scope, (_MO.WEAK, _MO.RELAXED, _MO.RELEASE))
    ctx = current()
    if not isinstance(tile, Tile):
        from .tile import as_tile
        tile = as_tile(tile, array.dtype)
        tile = Tile(tile.v.reshape((tile.v.shape[0],) + (1,) * array.ndim), tile.dtype)
    elif tile.ndim == 0:
        tile = Tile(tile.v.reshape((tile.v.shape[0],) + (1,) * array.ndim), tile.dtype)
    if tile.dtype != array.dtype:
        if not _widening(tile.dtype, array.dtype):
            raise SimTypeError(
                f"ct.store at {ctx.kernel_line()}: stored tile is incompatible with array "
                f"'{array.name}': cannot implicitly cast {tile.dtype.name} to {array.dtype.name}")
        tile = Tile(dtypes.round_value(ctx.model, tile.v, array.dtype), array.dtype)
    if tile_shape is not None:
        tile = Tile(np.broadcast_to(tile.v, (tile.v.shape[0],) + tuple(tile_shape)), tile.dtype)
    shape = tile.shape
    starts, shape4, strides4, tshape4, _ = _box(array, index, shape, order, "store", steps)
    idx = index if isinstance(index, (tuple, list)) else (index,)
    _check_box(array, starts, shape4, tshape4, "store", idx, shape, check_bounds)
    vals = bits_of(np.ascontiguousarray(tile.v).reshape(tile.v.shape[0], -1), array.dtype)
    item = (array, starts, shape4, strides4, tshape4, vals, ctx.kernel_line())
    ctx.stores += ctx.lanes
    if ctx.coop is not None:
        offs = box_offsets(starts, shape4, strides4, tshape4)
        _coop_access(ctx, array, offs, mo, ms, True)
        coop_commit(ctx, [item], array, offs)
    else:
        ctx.pending_stores.append(item)


# ---------------------------------------------------------------------------------------
# cooperative mode and the checker's view of single elements

def box_offsets(starts, shape4, strides4, tshape4) -> np.ndarray:
    """Flat offsets of the in-bounds elements of lane 0's box (cooperative mode: 1 lane)."""
    axes = []
    for d in range(4):
        i = starts[0, d] + np.arange(int(tshape4[d]))
        axes.append(i[(i >= 0) & (i < shape4[d])] * strides4[d])
    return (axes[0][:, None, None, None] + axes[1][None, :, None, None]
            + axes[2][None, None, :, None] + axes[3][None, None, None, :]).reshape(-1)


def lane_box_offsets(starts, shape4, strides4, tshape4) -> np.ndarray:
    """(lanes, n) flat offsets of each lane's box in gather order; -1 outside the array."""
    L = starts.shape[0]
    off = np.zeros((L,) + tuple(int(t) for t in tshape4), np.int64)
    ok = np.ones(off.shape, bool)
    for d in range(4):
        i = starts[:, d, None] + np.arange(int(tshape4[d]))[None, :]
        shp = (L,) + tuple(-1 if e == d else 1 for e in range(4))
        ok &= ((i >= 0) & (i < shape4[d])).reshape(shp)
        off += (i * strides4[d]).reshape(shp)
    return np.where(ok, off, -1).reshape(L, -1)


def _pending_on(ctx, array) -> bool:
    root = array._root
    return any((item[0] if isinstance(item, tuple) else item.array)._root is root
               for item in ctx.pending_stores)


def _pending_items(ctx, array):
    """(root offsets (L, n) with -1 = not stored, value bits (L or 1, n)) of this group's
    buffered stores to `array`'s memory, in program order."""
    root = array._root
    for item in ctx.pending_stores:
        if isinstance(item, tuple):
            a, starts, shape4, strides4, tshape4, vals, _ = item
            if a._root is root:
                off = lane_box_offsets(starts, shape4, strides4, tshape4)
                yield np.where(off >= 0, off + a._offset, -1), vals
        elif item.array._root is root:
            off = item.off.reshape(item.off.shape[0], -1)
            yield (np.where(off >= 0, off + item.array._offset, -1),
                   np.ascontiguousarray(item.vals).reshape(item.vals.shape[0], -1))


def overlay_own(ctx, array, load_off, out):
    """A block sees its own earlier stores (cuTile orders a block's memory ops on one
    array): replace loaded elements by this lane's buffered store values, in place."""
    lo = np.where(load_off >= 0, load_off + array._offset, -1)
    width = out.dtype.itemsize
    for st_off, vals in _pending_items(ctx, array):
        bits = vals.view(_BITS[vals.dtype.itemsize]) if vals.dtype.itemsize == width else None
        if bits is None:
            continue
        for lane in range(out.shape[0]):
            so = st_off[min(lane, st_off.shape[0] - 1)]
            sv = bits[min(lane, bits.shape[0] - 1)]
            keep = so >= 0
            so, sv = so[keep], sv[keep]
            if so.size == 0:
                continue
            order = np.argsort(so, kind="stable")
            so, sv = so[order], sv[order]
            last = np.r_[so[1:] != so[:-1], True]          # a later duplicate wins
            so, sv = so[last], sv[last]
            pos = np.clip(np.searchsorted(so, lo[lane]), 0, so.size - 1)
            hit = (so[pos] == lo[lane]) & (lo[lane] >= 0)
            out[lane, hit] = sv[pos[hit]]


def _note_acquire_poll(ctx, array, starts):
    """An acquire ct.load that reads again what this block read there before is a spin-wait.
    The simulator runs it as declared, but tileiras 13.4 compiled one (SPAK's fused-dQ
    backward, warp-specialised) to LDGSTS.E, a weak copy through L1, and the kernel hung on
    an H200: recorded as a finding (sim.oob's log), with the read that compiles safely."""
    line = ctx.kernel_line()
    key = (line, array.name, starts.tobytes())
    seen = ctx.__dict__.setdefault("_acquire_reads", set())
    if key not in seen:
        seen.add(key)
        return
    oob.record(f"spin|{line}|{array.name}",
               f"spin-wait on an acquire ct.load of '{array.name}' at {line}: tileiras 13.4 "
               "can compile it to a weak L1 load (LDGSTS.E) that never sees the other block's "
               "store (a hang on an H200); poll with an atomic instead, e.g. "
               "ct.atomic_add(flag, index, 0, memory_order=ACQUIRE)")


def _coop_access(ctx, array, offs, order, scope, write):
    """Hand over at the access (sync ops always, plain ones every quantum), then let the
    happens-before checker see it."""
    coop = ctx.coop
    sync = order not in (None, _MO.WEAK)
    if sync:
        coop.sync_point(ctx)
    else:
        coop.plain_point(ctx)
    hb = coop.hb
    if hb is None:
        return
    b, line = int(ctx.coop_block.linear), ctx.kernel_line()
    if sync:
        hb.atomic(b, array, offs, np.ones(len(offs), bool) if write else None, order, scope,
                  line, rmw=False)
    elif write:
        hb.write(b, array, offs, line)
    else:
        hb.read(b, array, offs, line)


def coop_commit(ctx, items, array, offs):
    """Apply stores at once (cooperative mode); memory that changed counts as progress."""
    bits = array._bits()
    before = bits[offs].copy()
    pending, ctx.pending_stores = ctx.pending_stores, list(items)
    try:
        commit(ctx, ctx.grid, report=False)
    finally:
        ctx.pending_stores = pending
    if (bits[offs] != before).any():
        ctx.coop.progress()


def foreign_reads(ctx, array, starts, shape4, strides4, tshape4) -> list[str]:
    """Lock-step mode: a load of elements another block wrote earlier in this launch. Blocks
    cannot synchronise without atomics, so the value read depends on the block order."""
    n = int(np.prod(tshape4))
    own = np.empty((len(starts), n), np.int64)
    _gather(array._owner_flat(), shape4, strides4, starts, tshape4, np.int64(-1), own)
    me = ctx.linear_ids[:, None]
    bad = (own >= 0) & (own != me)
    if not bad.any():
        return []
    lane, k = np.unravel_index(int(np.argmax(bad)), bad.shape)
    writer = _unlinear(own[lane, k], ctx.grid)
    return [f"read of another block's write: '{array.name}' read by block "
            f"{ctx.block_of(int(lane))} at {ctx.kernel_line()} holds values written by block "
            f"{writer} in this launch; without atomics the result depends on block order "
            f"({int(bad.sum())} elements)"]


def _widening(src, dst) -> bool:
    """Implicit store conversions cuTile accepts (measured: f16 -> f32 ok, f32 -> f16 refused)."""
    if src == dst:
        return True
    try:
        return dtypes.promote(src, dst) == dst
    except SimTypeError:
        return False


def commit(ctx, grid, report=True) -> list[str]:
    """Apply a finished group's stores; return double-write findings (report=False: the
    cooperative mode, whose happens-before checker judges writes instead)."""
    findings = []
    linear = (ctx.block_ids[:, 0] + grid[0] * (ctx.block_ids[:, 1] + grid[1] * ctx.block_ids[:, 2]))
    for item in ctx.pending_stores:
        if not isinstance(item, tuple):       # an element store (sim.indexing.ElementStore)
            findings += item.commit(linear.astype(np.int64), grid, report)
            continue
        array, starts, shape4, strides4, tshape4, vals, line = item
        conflicts = np.zeros((4, 3), np.int64)
        bits = vals.view(_BITS[vals.dtype.itemsize])
        n = _scatter(array._bits(), shape4, strides4, starts, tshape4, bits, bits.shape[0],
                     array._owner_flat(), linear.astype(np.int64), conflicts)
        for off, prev, me in conflicts[:min(n, 4) if report else 0]:
            findings.append(
                f"double write: element {np.unravel_index(int(off), array.shape)} of "
                f"'{array.name}' written by block {_unlinear(prev, grid)} and by block "
                f"{_unlinear(me, grid)} (store at {line})" + (f"; {n} elements in all" if n > 1 else ""))
    ctx.pending_stores.clear()
    return findings


def _unlinear(i, grid):
    i = int(i)
    return (i % grid[0], (i // grid[0]) % grid[1], i // (grid[0] * grid[1]))


def unwritten_findings(arrays) -> list[str]:
    out = []
    for a in arrays:
        own = a.owner_view()
        if own is None:
            continue
        missing = np.flatnonzero(own == -1)
        if missing.size:
            first = np.unravel_index(int(missing[0]), a.shape)
            out.append(f"unwritten: {missing.size} of {own.size} elements of output "
                       f"'{a.name}' were written by no block (first at index {tuple(int(x) for x in first)})")
    return out
