"""Numeric models: how a target GPU rounds the inexact operations a tile kernel uses.

A model is a named, swappable object. The simulator's tile ops call it for every operation
whose result can differ between an IEEE reference and the GPU: tensor-core products
(`ct.mma`), `exp2`, approximate division, float reductions and narrowing conversions.
Plain fp32/fp16 add, sub, mul and max are IEEE round-to-nearest-even on the GPU and in
numpy alike, so they need no model.

`Sm90` ("sm_90") is the model measured on an H200 (docs/numerics-sm90.md): the tensor
core's truncating k16 fused sums and the row-sum tree bit for bit, exp2 and approximate
division declared approximate until tools/numerics_tables.py records the MUFU tables.

`Sm120` ("sm_120", RTX 5070) and `Sm89` ("sm_89", L4) are not measured: their tensor-core
arithmetic is MMA-Sim's for those GPUs (checked bit for bit by tests/test_mmasim_oracle.py;
sm_89 differs: 8-term steps, 24 bits), their compiler facts are read from the cubins'
SASS (tools/sass_trace_mma.py; sm_120 sums a loaded row's lane chunks in another order), and
the MUFU tables are sm_90's, assumed (docs/numerics-sm120.md, docs/numerics-sm89.md).

`Sm90v0` ("sm_90-v0") is the first declared model. What it assumes, and what is not yet calibrated
against the hardware (the bit-exact issue replaces these with measured behaviour):
  * mma: products of fp16/bf16 operands are exact; the whole K sum plus the accumulator
    is formed in float64 and rounded once to the accumulator dtype (RNE). The H100 tensor
    core instead aligns and truncates per k-step; not modelled yet.
  * exp2 (ex2.approx.ftz.f32 on the GPU): modelled as the correctly rounded exp2 of the
    float32 input, with subnormal inputs and results flushed to zero when asked.
  * approximate division: x * fl32(1/y), each step rounded to float32, flush-to-zero.
  * float sums: formed in float64 and rounded once (the GPU's reduction tree is not
    modelled yet).
  * fp32 -> fp16 and fp32 -> bf16: round to nearest even (exact model).
"""
from __future__ import annotations

import os
import types
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import types as nbtypes
from numba.extending import intrinsic, overload
import cuda.tile as ct

from . import dtypes, libdevice

#: sim.tile.Tile.layout of values held in tensor-core accumulator fragments (an mma result
#: or elementwise work on one); a model may reduce those in a different order.
MMA_LAYOUT = "mma"
#: sim.tile.Tile.layout of a ct.gather result (and elementwise work on it): on sm_90 one
#: element per thread and repeat, lanes fastest (read from TileGym's softmax on an H100)
GATHER_LAYOUT = "gather"
#: sim.tile.Tile.layout of a loaded fp16/bf16 tile converted to float32 (and elementwise
#: work on such tiles): the values stay in the 2-byte load's blocked layout (8 neighbours a
#: thread), read from TileGym's FMHA backward preprocess row sums on an H100
HALF_BLOCKED_LAYOUT = "blocked16"
#: the layout ops.sum passes for an mma or gather result summed as it is (Tile.raw: no op
#: applied since): sm_90 reduces those in another order than values computed from them
#: (tools/sim_ops_gpu.py --shapes on an H100, docs/numerics-sm90.md 16); models that do not
#: tell them apart map them back (Sm90.sum)
MMA_RAW_LAYOUT, GATHER_RAW_LAYOUT = "mma-raw", "gather-raw"
RAW_LAYOUTS = {MMA_LAYOUT: MMA_RAW_LAYOUT, "gather": GATHER_RAW_LAYOUT}

_CACHE = os.environ.get("SPAK_NUMBA_CACHE", "1") != "0"


# ---------------------------------------------------------------------------------------
# numba primitives (the hot elementwise work; prange spreads it over the cores)

def _bf16_round_f32_py(xb, ob):
    """fp32 -> bf16 round-to-nearest-even on the uint32 bit patterns (the caller passes
    `x.view(np.uint32)`, `out.view(np.uint32)`; a `.view` taken inside a prange loop lost
    every write in numba's parallel build, see docs/numerics-sm90.md). NaN stays NaN."""
    for i in numba.prange(xb.size):
        b = xb[i]
        if (b & 0x7F800000) == 0x7F800000 and (b & 0x007FFFFF) != 0:
            ob[i] = b | 0x00400000          # quiet NaN, payload truncated below
            ob[i] &= 0xFFFF0000
        else:
            lsb = (b >> 16) & 1
            ob[i] = ((b + 0x7FFF + lsb) >> 16) << 16


def _exp2_f32_py(x, out, ftz):
    tiny = np.float32(1.1754943508222875e-38)  # smallest normal float32
    for i in numba.prange(x.size):
        v = x[i]
        if ftz and abs(v) < tiny:
            v = np.float32(0.0)
        r = np.float32(2.0 ** np.float64(v))
        if ftz and abs(r) < tiny:
            r = np.float32(0.0)
        out[i] = r


def _div_approx_f32_py(x, y, out, ftz):
    tiny = np.float32(1.1754943508222875e-38)
    for i in numba.prange(x.size):
        a = x[i]
        b = y[i]
        if ftz:
            if abs(a) < tiny:
                a = np.float32(0.0)
            if abs(b) < tiny:
                b = np.float32(0.0)
        r = np.float32(np.float32(1.0) / b)
        q = np.float32(a * r)
        if ftz and abs(q) < tiny:
            q = np.float32(0.0)
        out[i] = q


PARALLEL_MIN = 1 << 18   # elements; below this numba's thread wake-up costs more than it saves


def threaded() -> bool:
    """Whether numba may use more than one thread. With NUMBA_NUM_THREADS=1 (many simulator
    processes side by side, e.g. a test suite sharded over the cores) the parallel builds only
    add their compile time (seconds each, per process on a cold cache) and the threading
    layer: the serial build runs instead. Both builds are the same loop over independent
    elements, so the bits do not depend on the choice."""
    return numba.config.NUMBA_NUM_THREADS > 1


def _renamed(pyfunc, suffix):
    """A copy of `pyfunc` under another qualified name. numba's on-disk cache is keyed by
    the function's name and bytecode, not by `parallel=`: without distinct names the serial
    and the parallel build of one loop load each other's machine code from the cache."""
    f = types.FunctionType(pyfunc.__code__, pyfunc.__globals__, pyfunc.__name__ + suffix,
                           pyfunc.__defaults__, pyfunc.__closure__)
    f.__qualname__ = pyfunc.__qualname__ + suffix
    f.__doc__ = pyfunc.__doc__
    return f


def _dual(pyfunc, **opts):
    """A serial and a parallel numba build of one loop; calls pick by problem size."""
    serial = numba.njit(cache=_CACHE, **opts)(_renamed(pyfunc, "_serial"))
    parallel = numba.njit(parallel=True, cache=_CACHE, **opts)(_renamed(pyfunc, "_parallel"))

    def call(*args):
        big = args[0].size >= PARALLEL_MIN and threaded()
        return (parallel if big else serial)(*args)
    call.__name__ = pyfunc.__name__
    return call


_bf16_round_f32 = _dual(_bf16_round_f32_py)
_exp2_f32 = _dual(_exp2_f32_py)
_div_approx_f32 = _dual(_div_approx_f32_py, error_model="numpy")   # y = 0 -> inf, not an exception


def _single_threaded_blas() -> bool:
    """Pin numpy's OpenBLAS to one thread. The simulator parallelises over lanes itself;
    OpenBLAS threads spinning beside numba's and ours made batched mma 50x slower here."""
    return set_blas_threads(1)


def set_blas_threads(n: int) -> bool:
    """Set numpy's OpenBLAS thread count; False when no way to was found. (The speed
    benchmark gives numpy every core for numpy's own figure, then pins it back to 1.)"""
    import ctypes
    import glob
    libdir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in glob.glob(os.path.join(libdir, "*openblas*.so*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                    "openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn(ctypes.c_int(int(n)))
                return True
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(int(n), user_api="blas")
        return True
    except ImportError:
        return False


BLAS_PINNED = _single_threaded_blas()


def _flat(x):
    return np.ascontiguousarray(x).reshape(-1)


class NumericModel:
    """Base: IEEE-correct choices everywhere. Subclasses name a target and its quirks."""

    name = "ieee"
    description = "IEEE round-to-nearest-even everywhere; float64 accumulation."
    #: contract a float32 multiply feeding an add/sub into one fused multiply-add, as the
    #: GPU compiler does (sim.tile.binary). Off: every op rounds on its own.
    contract_fma = False
    #: with contract_fma: an add whose left operand is an unfusable multiply is not
    #: contracted with its right one (the sm_90 SASS, sim.tile._contract)
    fma_left_mul_first = False
    fma_no_broadcast = False

    def __init__(self, threads: int | None = None):
        self.threads = threads or max(1, min(4, os.cpu_count() or 1))
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None

    # -- conversions -------------------------------------------------------------------
    def round_to(self, x: np.ndarray, dtype) -> np.ndarray:
        """Round a float array to `dtype`, returning its storage array (RNE)."""
        st = dtypes.storage(dtype)
        if dtype == ct.bfloat16:
            x32 = np.asarray(x, dtype=np.float32)  # float64 inputs: double rounding, see doc
            out = np.empty(x32.shape, np.float32)
            if x32.size:
                _bf16_round_f32(_flat(x32).view(np.uint32), out.reshape(-1).view(np.uint32))
            return out
        if dtypes.is_int(dtype) and np.asarray(x).dtype.kind == "f":
            # cuTile float->int conversion truncates toward zero (C semantics)
            return np.trunc(x).astype(st)
        return np.asarray(x).astype(st, copy=False)

    # -- tensor cores ------------------------------------------------------------------
    def mma(self, a: np.ndarray, b: np.ndarray, acc: np.ndarray, acc_dtype,
            y_share=None, in_dtype=None) -> np.ndarray:
        """(a @ b) + acc per lane: exact products, the K sum and acc added in float64,
        one rounding to acc_dtype. Arrays carry a leading lane axis (size L or 1)."""
        lanes = max(a.shape[0], b.shape[0], acc.shape[0])
        if y_share is not None and a.ndim == 3 and a.shape[0] == lanes:
            r = self._mma_shared(a, b, acc, y_share, lanes)
        else:
            r = self._mma_lanes(a, b, acc, lanes)
        return self.round_to(r, acc_dtype)

    def _map(self, fn, items):
        if self._pool is not None and len(items) > 1:
            return list(self._pool.map(fn, items))
        return [fn(i) for i in items]

    def _mma_lanes(self, a, b, acc, lanes):
        def part(sl):
            bb = b[sl] if b.shape[0] > 1 else b
            cc = acc[sl] if acc.shape[0] > 1 else acc
            r = np.matmul(a[sl].astype(np.float64), bb.astype(np.float64))
            r += cc
            return r
        if a.shape[0] != lanes:
            a = np.broadcast_to(a, (lanes,) + a.shape[1:])
        n = self.threads if lanes >= 2 * self.threads else 1
        step = -(-lanes // n)
        parts = self._map(part, [slice(i, i + step) for i in range(0, lanes, step)])
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def _mma_shared(self, a, b, acc, share, lanes):
        """Lanes whose b is the same tile become one taller GEMM (same sums, fewer calls)."""
        inverse, reps = share
        m, k = a.shape[1], a.shape[2]
        out = np.empty((lanes, m, b.shape[-1]), np.float64)

        def part(g):
            idx = np.flatnonzero(inverse == g)
            if idx[-1] - idx[0] + 1 == len(idx):        # the usual case: a run of lanes
                idx = slice(int(idx[0]), int(idx[-1]) + 1)
            x = a[idx].reshape(-1, k)
            if x.dtype != np.float64:
                x = x.astype(np.float64)
            r = (x @ b[reps[g]].astype(np.float64)).reshape(-1, m, out.shape[-1])
            r += acc[idx] if acc.shape[0] > 1 else acc
            out[idx] = r
        self._map(part, list(range(len(reps))))
        return out

    # -- special functions ---------------------------------------------------------------
    def exp2(self, x: np.ndarray, dtype, flush_to_zero: bool) -> np.ndarray:
        if dtype == ct.float32:
            x = np.ascontiguousarray(x, np.float32)
            out = np.empty_like(x)
            if x.size:
                _exp2_f32(x.reshape(-1), out.reshape(-1), bool(flush_to_zero))
            return out
        return self.round_to(np.exp2(x.astype(np.float64)), dtype)

    def unary(self, fn: str, x: np.ndarray, dtype) -> np.ndarray:
        """exp, log, log2, sqrt, rsqrt, sin, ...: correctly rounded from float64."""
        x64 = x.astype(np.float64)
        fn = "tanh" if fn == "tanh_approx" else fn      # tanh.approx: correctly rounded here
        with np.errstate(all="ignore"):
            if fn == "rsqrt":
                r = 1.0 / np.sqrt(x64)
            else:
                r = getattr(np, fn)(x64)
        return self.round_to(r, dtype)

    def truediv(self, x, y, dtype, rounding_mode, flush_to_zero) -> np.ndarray:
        if rounding_mode is ct.RoundingMode.APPROX and dtype == ct.float32:
            x, y = np.broadcast_arrays(np.asarray(x, np.float32), np.asarray(y, np.float32))
            out = np.empty(x.shape, np.float32)
            if out.size:
                _div_approx_f32(_flat(x), _flat(y), out.reshape(-1), bool(flush_to_zero))
            return out
        if rounding_mode not in (None, ct.RoundingMode.RN, ct.RoundingMode.FULL,
                                 ct.RoundingMode.APPROX):
            from .errors import SimNotSupported
            raise SimNotSupported(f"ct.truediv: rounding_mode={rounding_mode} is not modelled")
        with np.errstate(all="ignore"):
            r = np.asarray(x, np.float64) / np.asarray(y, np.float64)
        r = self.round_to(r, dtype)
        if flush_to_zero:
            r = _ftz(r)
        return r

    # -- reductions --------------------------------------------------------------------
    def sum(self, x: np.ndarray, axis, dtype, layout=None) -> np.ndarray:
        """Sum along `axis` (lane axis included in the numbering). layout: the tile's
        sim.tile layout, for models whose order depends on where the values live."""
        if dtypes.is_float(dtype):
            return self.round_to(np.sum(x, axis=axis, dtype=np.float64), dtype)
        return np.sum(x, axis=axis, dtype=dtypes.storage(dtype))

    def scan(self, x: np.ndarray, axis: int, op, reverse: bool, dtype):
        """A float cumsum/cumprod (op np.add/np.multiply) along `axis` (lane axis 0) in the
        GPU's order, or None: the caller then scans element by element."""
        return None

    def describe(self) -> dict:
        return {"name": self.name, "description": self.description.strip()}


def _ftz(r: np.ndarray) -> np.ndarray:
    if r.dtype.kind != "f":
        return r
    tiny = np.finfo(r.dtype).tiny if r.dtype != np.float16 else np.float16(6.104e-05)
    return np.where(np.abs(r) < tiny, np.zeros((), r.dtype), r)


class Sm90v0(NumericModel):
    name = "sm_90-v0"
    description = ("The first declared model" + __doc__.split("is the first declared model", 1)[1]
                   if __doc__ else "")


# ---------------------------------------------------------------------------------------
# sm_90 v1: measured on an H200 (docs/numerics-sm90.md has the data and the rejected fits)

@intrinsic
def _f64_bits(typingctx, x):
    """The IEEE bit pattern of a float64 as int64 (a register bitcast, vectorisable)."""
    sig = nbtypes.int64(nbtypes.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(nbtypes.int64))
    return sig, codegen


@intrinsic
def _bits_f64(typingctx, x):
    sig = nbtypes.float64(nbtypes.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(nbtypes.float64))
    return sig, codegen


@numba.njit(inline="always", cache=_CACHE)
def _half_to_f64(h):
    """fp16 bit pattern (uint16) -> float64, exactly (numba has no float16 arithmetic)."""
    h = np.int64(h)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = np.float64(m) * 2.0 ** -24
    elif e == 31:
        v = np.inf if m == 0 else np.nan
    else:
        v = _bits_f64(((e - 15 + 1023) << 52) | (m << 42))
    return -v if (h >> 15) & 1 else v


def _to_f64(x):
    pass


@overload(_to_f64, inline="always")
def _ov_to_f64(x):
    if isinstance(x, nbtypes.Integer):
        return lambda x: _half_to_f64(x)
    return lambda x: np.float64(x)


_NOEXP = -100000     # exponent of a zero term: never the largest


@numba.njit(inline="always", cache=_CACHE)
def _expo(v, emin):
    """floor(log2|v|) of a finite float64, clamped below at emin (subnormals of the
    input format sit at its minimum exponent); _NOEXP for zero."""
    e = np.int32(((_f64_bits(v) >> 52) & 0x7FF) - 1023)
    e = max(e, np.int32(emin))
    return e if v != 0.0 else np.int32(_NOEXP)


@numba.njit(inline="always", cache=_CACHE)
def _rz_f32(v):
    """float64 -> the float32 value nearest v toward zero (fp32 subnormals included);
    returned as float64. Magnitudes >= 2^128 give inf on the float32 conversion (MMA-Sim)."""
    bits = _f64_bits(v)
    if ((bits >> 52) & 0x7FF) >= 1023 - 126:
        return _bits_f64(bits & ~np.int64((1 << 29) - 1))
    return np.trunc(v * 2.0 ** 149) * 2.0 ** -149


@numba.njit(inline="always", cache=_CACHE)
def _f32_register(v):
    """A k-step's RZ result as the fp32 accumulator register holds it for the next step:
    >= 2^128 is inf (MMA-Sim), and a zero result is +0 (MMA-Sim: the fused sum has no
    sign of zero)."""
    return np.float64(np.float32(v)) + 0.0


@numba.njit(cache=_CACHE)
def _hopper_step_scalar(arow, bcol, k0, k1, c, emin, fbits, ezero):
    """One k-step for one output element, with MMA-Sim's special values: a NaN anywhere
    gives the canonical NaN, an infinite sum gives that infinity; a zero term (product or
    accumulator) counts with exponent `ezero` in the largest exponent (it matters only when
    every non-zero term is below 2^ezero: bf16 products of tiny values)."""
    s = c
    for k in range(k0, k1):
        s += arow[k] * bcol[k]
    if s != s:
        return _bits_f64(0x7FFFFFFFE0000000)       # -> float32 0x7FFFFFFF
    if s == np.inf or s == -np.inf:
        return s
    E = _expo(c, -126) if c != 0.0 else np.int32(ezero)
    for k in range(k0, k1):
        if arow[k] != 0.0 and bcol[k] != 0.0:
            E = max(E, _expo(arow[k], emin) + _expo(bcol[k], emin))
        else:
            E = max(E, np.int32(ezero))
    sc = _bits_f64(np.int64(1023 + fbits - E) << 52)
    acc = np.trunc(c * sc)
    for k in range(k0, k1):
        acc += np.trunc(arow[k] * bcol[k] * sc)
    return _f32_register(_rz_f32(acc / sc))


# long: the numba-compiled hot loop of every simulated mma; one body keeps its scratch
# arrays and loop state in registers (helpers would be extra compiled calls per k-step)
@numba.njit(cache=_CACHE, error_model="numpy")
def _hopper_lane(a, b, c, out, emin, kstep, slow, bf, eb, cur, acc, E, sc, fbits, ezero):
    """out[M,N] = the tensor core's a[M,K] @ b[K,N] + c[M,N], fp32 accumulator.

    Per k-step of `kstep` (16: one wgmma k16 on sm_90): E = the largest of the unnormalised
    product exponents e(a)+e(b) and e(c); every product and c truncated toward zero to a
    multiple of 2^(E-fbits) (fbits 25 on sm_90); exact sum; result rounded toward zero to
    fp32, the next step's c. Zero terms count as exponent `ezero` (-133 on sm_90), which
    only decides E when every non-zero term is below it: such elements take the scalar
    path."""
    M, K = a.shape
    N = b.shape[1]
    for k in range(K):
        for j in range(N):
            v = _to_f64(b[k, j])
            bf[k, j] = v
            eb[k, j] = _expo(v, emin)
    for i in range(M):
        for j in range(N):
            cur[j] = c[i, j]
        for k0 in range(0, K, kstep):
            k1 = min(k0 + kstep, K)
            if slow:
                for j in range(N):
                    cur[j] = _hopper_step_scalar(a[i], bf[:, j], k0, k1, cur[j], emin,
                                                 fbits, ezero)
                continue
            for j in range(N):
                E[j] = _expo(cur[j], -126)
            k = k0
            while k + 8 <= k1:            # 8 k at a time: fewer passes over E (speed)
                e0 = _expo(a[i, k], emin)
                e1 = _expo(a[i, k + 1], emin)
                e2 = _expo(a[i, k + 2], emin)
                e3 = _expo(a[i, k + 3], emin)
                e4 = _expo(a[i, k + 4], emin)
                e5 = _expo(a[i, k + 5], emin)
                e6 = _expo(a[i, k + 6], emin)
                e7 = _expo(a[i, k + 7], emin)
                for j in range(N):
                    E[j] = max(max(max(E[j], max(e0 + eb[k, j], e1 + eb[k + 1, j])),
                                   max(e2 + eb[k + 2, j], e3 + eb[k + 3, j])),
                               max(max(e4 + eb[k + 4, j], e5 + eb[k + 5, j]),
                                   max(e6 + eb[k + 6, j], e7 + eb[k + 7, j])))
                k += 8
            while k < k1:
                ea = _expo(a[i, k], emin)
                for j in range(N):
                    E[j] = max(E[j], ea + eb[k, j])
                k += 1
            tiny = False
            for j in range(N):
                e = E[j]
                # all terms zero: any scale gives +0; every non-zero term below 2^ezero
                # (bf16 only; c is then 0): redone by the scalar rule below
                s = _bits_f64(np.int64(1023 + fbits - e) << 52) if e >= ezero else 1.0
                tiny |= _NOEXP // 2 < e < ezero
                sc[j] = s
                acc[j] = np.trunc(cur[j] * s)
            k = k0
            while k + 8 <= k1:
                a0 = a[i, k]
                a1 = a[i, k + 1]
                a2 = a[i, k + 2]
                a3 = a[i, k + 3]
                a4 = a[i, k + 4]
                a5 = a[i, k + 5]
                a6 = a[i, k + 6]
                a7 = a[i, k + 7]
                for j in range(N):
                    s = sc[j]
                    # the truncated terms are integers below 2^28 and at most 17 of them are
                    # summed: float64 holds every partial sum exactly, and unlike int64
                    # conversions trunc() vectorises
                    acc[j] += (((np.trunc(a0 * bf[k, j] * s) + np.trunc(a1 * bf[k + 1, j] * s))
                                + (np.trunc(a2 * bf[k + 2, j] * s) + np.trunc(a3 * bf[k + 3, j] * s)))
                               + ((np.trunc(a4 * bf[k + 4, j] * s) + np.trunc(a5 * bf[k + 5, j] * s))
                                  + (np.trunc(a6 * bf[k + 6, j] * s) + np.trunc(a7 * bf[k + 7, j] * s))))
                k += 8
            while k < k1:
                av = a[i, k]
                for j in range(N):
                    acc[j] += np.trunc(av * bf[k, j] * sc[j])
                k += 1
            for j in range(N):
                cur[j] = _f32_register(_rz_f32(acc[j] / sc[j]))
            if tiny:
                for j in range(N):
                    if _NOEXP // 2 < E[j] < ezero:
                        cur[j] = _hopper_step_scalar(a[i], bf[:, j], k0, k1, 0.0, emin,
                                                     fbits, ezero)
        for j in range(N):
            out[i, j] = np.float32(cur[j])


@numba.njit(cache=_CACHE)
def _hopper_one(a, b, c, out, t, emin, kstep, slow, fbits, ezero):
    K = b.shape[1]
    N = b.shape[2]
    _hopper_lane(a[min(t, a.shape[0] - 1)], b[min(t, b.shape[0] - 1)],
                 c[min(t, c.shape[0] - 1)], out[t], emin, kstep, slow[t],
                 np.empty((K, N)), np.empty((K, N), np.int32), np.empty(N),
                 np.empty(N), np.empty(N, np.int32), np.empty(N), fbits, ezero)


def _hopper_mma_py(a, b, c, out, emin, kstep, slow, fbits, ezero):
    for t in numba.prange(out.shape[0]):
        _hopper_one(a, b, c, out, np.int64(t), emin, kstep, slow, fbits, ezero)


_hopper_mma_serial = numba.njit(cache=_CACHE)(_renamed(_hopper_mma_py, "_serial"))
_hopper_mma_parallel = numba.njit(parallel=True, cache=_CACHE)(_renamed(_hopper_mma_py, "_parallel"))


# ---------------------------------------------------------------------------------------
# fp16 operands: the same arithmetic on narrower numbers (twice the lanes per vector
# register). An fp16 x fp16 product has at most 22 significant bits and lies well inside
# float32's range, so float32 holds it exactly; times the step's power of two it stays
# exact, or falls below 1 where truncation gives 0 either way. A truncated term is an
# integer of magnitude below 2^(fbits+2), so a step's kstep terms sum exactly in int32
# when kstep * 2^(fbits+2) <= 2^31 (sm_90: 16 * 2^27). Every sum is exact in both paths,
# so the bits are _hopper_lane's (tests/test_sim_mma_fp16_path.py compares the two).

@intrinsic
def _f32_bits(typingctx, x):
    sig = nbtypes.int32(nbtypes.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(nbtypes.int32))
    return sig, codegen


@intrinsic
def _bits_f32(typingctx, x):
    sig = nbtypes.float32(nbtypes.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(nbtypes.float32))
    return sig, codegen


@numba.njit(inline="always", cache=_CACHE)
def _expo32(v, emin):
    """_expo of a float32, branch-free (selects) so loops over it vectorise."""
    e = max(np.int32(((_f32_bits(v) >> 23) & 0xFF) - 127), np.int32(emin))
    return e if v != 0 else np.int32(_NOEXP)


@numba.njit(inline="always", cache=_CACHE)
def _half_f32(h):
    """fp16 bit pattern -> float32 value, branch-free; finite inputs (callers check)."""
    h = np.int32(h)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    normal = ((e + 112) << 23) | (m << 13)
    sub = _f32_bits(np.float32(m) * np.float32(2.0 ** -24))
    return _bits_f32((sub if e == 0 else normal) | ((h & 0x8000) << 16))


@numba.njit(inline="always", cache=_CACHE)
def _rz_f32_select(v):
    """_rz_f32 computing both cases and selecting one (no branch: vectorises)."""
    bits = _f64_bits(v)
    hi = _bits_f64(bits & ~np.int64((1 << 29) - 1))
    lo = np.trunc(v * 2.0 ** 149) * 2.0 ** -149
    return hi if ((bits >> 52) & 0x7FF) >= 1023 - 126 else lo


@numba.njit(cache=_CACHE)
def _prep16_b(b, bf, eb):
    """b's fp16 bits -> float32 values and exponents; False when b holds inf or NaN."""
    bad = 0
    for k in range(b.shape[0]):
        for j in range(b.shape[1]):
            h = b[k, j]
            bad |= np.int32((h & 0x7C00) == 0x7C00)
            v = _half_f32(h)
            bf[k, j] = v
            eb[k, j] = _expo32(v, -14)
    return bad == 0


def _a16(x):
    pass


@overload(_a16, inline="always")
def _ov_a16(x):
    """(float32 value, 1 if not a finite fp16 value else 0) of one element of a."""
    if isinstance(x, nbtypes.Integer):          # fp16 bits
        return lambda x: (_half_f32(x), np.int32((x & 0x7C00) == 0x7C00))

    def from_float(x):                          # a float64 that should hold an fp16 value
        v = np.float32(x)
        y = x * 2.0 ** 24                       # fp16 subnormals: multiples of 2^-24
        low = (_f32_bits(v) & 0x1FFF) != 0 if abs(x) >= 2.0 ** -14 else y != np.trunc(y)
        return v, np.int32(low or np.float64(v) != x or not abs(x) <= 65504.0)
    return from_float


@numba.njit(cache=_CACHE)
def _prep16_a(a, af, ea):
    """a (fp16 bits, or float64 values) -> float32 values and exponents; False unless every
    value is a finite fp16 (then the float32 products are exact)."""
    bad = 0
    for i in range(a.shape[0]):
        for k in range(a.shape[1]):
            v, b = _a16(a[i, k])
            bad |= b
            af[i, k] = v
            ea[i, k] = _expo32(v, -14)
    return bad == 0


@numba.njit(cache=_CACHE)
def _finite32(c):
    bad = 0
    for i in range(c.shape[0]):
        for j in range(c.shape[1]):
            bad |= np.int32(not abs(c[i, j]) < np.inf)
    return bad == 0


# one body: the loop state stays in registers (helpers would be compiled calls per k-step)
@numba.njit(cache=_CACHE, error_model="numpy")
def _hopper16_lane(af, ea, bf, eb, c, out, kstep, fbits, ezero, elow, E, s32, inv, cur, it):
    """_hopper_lane's arithmetic for operands whose products are exact float32 numbers (af,
    bf: float32 values, ea, eb: their exponents; fp16, or _hopperg_one's checked range) and
    a finite float32 c. elow: the least exponent of a non-zero product (it clamps the
    float32 scale of a step whose products are all zero)."""
    M, K = af.shape
    N = bf.shape[1]
    for i in range(M):
        for j in range(N):
            cur[j] = c[i, j]
            E[j] = _expo32(c[i, j], -126)
        for k0 in range(0, K, kstep):
            k1 = min(k0 + kstep, K)
            k = k0
            while k + 8 <= k1:              # the largest exponent, 8 k at a time
                e0, e1, e2, e3 = ea[i, k], ea[i, k + 1], ea[i, k + 2], ea[i, k + 3]
                e4, e5, e6, e7 = ea[i, k + 4], ea[i, k + 5], ea[i, k + 6], ea[i, k + 7]
                for j in range(N):
                    # np.int32(): numba widens int32 sums to int64, half the lanes per vector
                    m0 = max(np.int32(e0 + eb[k, j]), np.int32(e1 + eb[k + 1, j]))
                    m1 = max(np.int32(e2 + eb[k + 2, j]), np.int32(e3 + eb[k + 3, j]))
                    m2 = max(np.int32(e4 + eb[k + 4, j]), np.int32(e5 + eb[k + 5, j]))
                    m3 = max(np.int32(e6 + eb[k + 6, j]), np.int32(e7 + eb[k + 7, j]))
                    E[j] = max(max(E[j], max(m0, m1)), max(m2, m3))
                k += 8
            while k < k1:
                e0 = ea[i, k]
                for j in range(N):
                    E[j] = max(E[j], np.int32(e0 + eb[k, j]))
                k += 1
            for j in range(N):
                e = E[j]
                ok = e >= ezero             # else every term is zero: any scale gives +0
                s = _bits_f64(np.int64(1023 + fbits - e) << 52) if ok else 1.0
                inv[j] = _bits_f64(np.int64(1023 - fbits + e) << 52) if ok else 1.0
                # a non-zero product has e >= elow: the clamp keeps float32's scale
                # finite for steps whose products are all zero
                s32[j] = np.float32(_bits_f64(np.int64(1023 + fbits - max(e, elow)) << 52))
                cur[j] = np.trunc(cur[j] * s)
                it[j] = 0
            k = k0
            while k + 8 <= k1:              # the truncated terms, summed exactly in int32
                a0, a1, a2, a3 = af[i, k], af[i, k + 1], af[i, k + 2], af[i, k + 3]
                a4, a5, a6, a7 = af[i, k + 4], af[i, k + 5], af[i, k + 6], af[i, k + 7]
                for j in range(N):
                    s = s32[j]
                    t0 = np.int32(a0 * bf[k, j] * s) + np.int32(a1 * bf[k + 1, j] * s)
                    t1 = np.int32(a2 * bf[k + 2, j] * s) + np.int32(a3 * bf[k + 3, j] * s)
                    t2 = np.int32(a4 * bf[k + 4, j] * s) + np.int32(a5 * bf[k + 5, j] * s)
                    t3 = np.int32(a6 * bf[k + 6, j] * s) + np.int32(a7 * bf[k + 7, j] * s)
                    it[j] += (t0 + t1) + (t2 + t3)
                k += 8
            while k < k1:
                a0 = af[i, k]
                for j in range(N):
                    it[j] += np.int32(a0 * bf[k, j] * s32[j])
                k += 1
            for j in range(N):              # RZ to fp32: the next step's accumulator
                v = _f32_register(_rz_f32_select((cur[j] + np.float64(it[j])) * inv[j]))
                cur[j] = v
                E[j] = _expo32(np.float32(v), -126)
        for j in range(N):
            out[i, j] = np.float32(cur[j])


@numba.njit(cache=_CACHE)
def _hopper16_one(a, b, c, out, t, kstep, fbits, ezero):
    """Lane t: the fp16 path when its operands allow it, else _hopper_lane (non-finite
    values: its scalar path)."""
    at, bt, ct_ = a[min(t, a.shape[0] - 1)], b[min(t, b.shape[0] - 1)], c[min(t, c.shape[0] - 1)]
    M, K = at.shape
    N = bt.shape[1]
    bf, eb = np.empty((K, N), np.float32), np.empty((K, N), np.int32)
    af, ea = np.empty((M, K), np.float32), np.empty((M, K), np.int32)
    ok_b = _prep16_b(bt, bf, eb)
    ok_c = _finite32(ct_)
    if _prep16_a(at, af, ea) and ok_b and ok_c:
        # a non-zero fp16 product has e >= -28; -60 keeps the float32 scale finite
        _hopper16_lane(af, ea, bf, eb, ct_, out[t], kstep, fbits, ezero, -60, np.empty(N, np.int32),
                       np.empty(N, np.float32), np.empty(N), np.empty(N), np.empty(N, np.int32))
        return
    a64 = np.empty((M, K))
    for i in range(M):
        for k in range(K):
            a64[i, k] = _to_f64(at[i, k])
    slow = not (ok_b and ok_c and np.isfinite(a64).all())
    _hopper_lane(a64, bt, ct_, out[t], -14, kstep, slow, np.empty((K, N)),
                 np.empty((K, N), np.int32), np.empty(N), np.empty(N), np.empty(N, np.int32),
                 np.empty(N), fbits, ezero)


def _hopper16_py(a, b, c, out, kstep, fbits, ezero):
    for t in numba.prange(out.shape[0]):
        _hopper16_one(a, b, c, out, np.int64(t), kstep, fbits, ezero)


_hopper16_serial = numba.njit(cache=_CACHE)(_renamed(_hopper16_py, "_serial"))
_hopper16_parallel = numba.njit(parallel=True, cache=_CACHE)(_renamed(_hopper16_py, "_parallel"))


#: take the fp16 path (set False to run every lane through _hopper_lane: the tests compare)
FP16_PATH = True


# ---------------------------------------------------------------------------------------
# bf16, tf32 and fp8 operands: the fp16 path's arithmetic for lanes whose values allow it.
# Their significands have at most 11 bits, so a product has at most 22 and float32 holds
# it exactly when it is a normal float32 number: every non-zero operand in
# [2^G_EMIN, 2^(G_EMAX+1)) keeps products in [2^(2*G_EMIN), 2^(2*G_EMAX+2)), inside
# float32's normal range, and elow = 2*G_EMIN keeps the step scale finite. Values outside
# (or not finite, or not float32 numbers) send their lane to _hopper_lane, as before.
G_EMIN, G_EMAX = -50, 62


@numba.njit(cache=_CACHE)
def _prepg(x, xf, ex):
    """x (float values) -> float32 values and exponents; False unless every value is a
    float32 number, finite, and zero or of exponent in [G_EMIN, G_EMAX]."""
    bad = 0
    for i in range(x.shape[0]):
        for k in range(x.shape[1]):
            v = x[i, k]
            f = np.float32(v)
            e = _expo32(f, -126)
            bad |= np.int32(np.float64(f) != v or (v != 0 and (e < G_EMIN or e > G_EMAX)))
            xf[i, k] = f
            ex[i, k] = e
    return bad == 0


@numba.njit(cache=_CACHE)
def _hopperg_one(a, b, c, out, t, emin, kstep, slow, fbits, ezero):
    """Lane t: _hopper16_lane when its values allow it (emin is -126 for these formats:
    in-range values are never clamped), else _hopper_lane."""
    at, bt, ct_ = a[min(t, a.shape[0] - 1)], b[min(t, b.shape[0] - 1)], c[min(t, c.shape[0] - 1)]
    M, K = at.shape
    N = bt.shape[1]
    if not slow[t] and emin == -126:
        bf, eb = np.empty((K, N), np.float32), np.empty((K, N), np.int32)
        af, ea = np.empty((M, K), np.float32), np.empty((M, K), np.int32)
        if _prepg(bt, bf, eb) and _prepg(at, af, ea) and _finite32(ct_):
            _hopper16_lane(af, ea, bf, eb, ct_, out[t], kstep, fbits, ezero, 2 * G_EMIN,
                           np.empty(N, np.int32), np.empty(N, np.float32), np.empty(N),
                           np.empty(N), np.empty(N, np.int32))
            return
    _hopper_lane(at, bt, ct_, out[t], emin, kstep, slow[t], np.empty((K, N)),
                 np.empty((K, N), np.int32), np.empty(N), np.empty(N), np.empty(N, np.int32),
                 np.empty(N), fbits, ezero)


def _hopperg_py(a, b, c, out, emin, kstep, slow, fbits, ezero):
    for t in numba.prange(out.shape[0]):
        _hopperg_one(a, b, c, out, np.int64(t), emin, kstep, slow, fbits, ezero)


_hopperg_serial = numba.njit(cache=_CACHE)(_renamed(_hopperg_py, "_serial"))
_hopperg_parallel = numba.njit(parallel=True, cache=_CACHE)(_renamed(_hopperg_py, "_parallel"))

#: take the float32 path for bf16/tf32/fp8 lanes (False: _hopper_lane for all; tests compare)
GENERAL_F32_PATH = True


def hopper_mma_f32(a, b, c, in_dtype, kstep=16, fbits=25, ezero=-133):
    """The sm_90 HGMMA model on lane-leading arrays: a [La,M,K] (float values; float16
    storage for fp16 also), b [Lb,K,N] (float16 storage for fp16, float32 holding bf16
    values), c [Lc,M,N] float32 -> float32 [L,M,N]. Lane axes of size 1 broadcast.
    kstep, fbits, ezero: the fused dot-add's length, kept fraction bits and zero-term
    exponent (MMA-Sim's L_max, F, e_zero; sm_90: 16, 25, -133; sm_120 the same; sm_89: 8,
    24, -132)."""
    emin = -14 if in_dtype == ct.float16 else -126
    b = np.ascontiguousarray(b)
    if b.dtype == np.float16:
        b = b.view(np.uint16)
    elif b.dtype != np.float32:
        b = b.astype(np.float64)
    c = np.ascontiguousarray(c, np.float32)
    lanes = max(a.shape[0], b.shape[0], c.shape[0])
    out = np.empty((lanes, a.shape[1], b.shape[2]), np.float32)
    big = lanes * a.shape[1] * b.shape[2] >= (1 << 14) and threaded()
    if (FP16_PATH and in_dtype == ct.float16 and b.dtype == np.uint16
            and int(kstep) << (int(fbits) + 2) <= 1 << 31):
        # the fp16 path (same bits); it checks each lane's values itself. An fp16 `a`
        # goes in as its bits (no float64 copy)
        a = np.ascontiguousarray(a)
        a = a.view(np.uint16) if a.dtype == np.float16 else a.astype(np.float64, copy=False)
        (_hopper16_parallel if big else _hopper16_serial)(a, b, c, out, int(kstep), int(fbits),
                                                          int(ezero))
        return out
    a = np.ascontiguousarray(a, np.float64)
    slow = _nonfinite_lanes(a, lanes) | _nonfinite_lanes(c, lanes)
    if b.dtype == np.uint16:
        slow |= _nonfinite_lanes_f16(b, lanes)
    else:
        slow |= _nonfinite_lanes(b, lanes)
    if GENERAL_F32_PATH and int(kstep) << (int(fbits) + 2) <= 1 << 31:
        fn = _hopperg_parallel if big else _hopperg_serial
    else:
        fn = _hopper_mma_parallel if big else _hopper_mma_serial
    fn(a, b, c, out, emin, int(kstep), slow, int(fbits), int(ezero))
    return out


def _nonfinite_lanes(x, lanes):
    bad = ~np.isfinite(x.reshape(x.shape[0], -1)).all(axis=1)
    return np.broadcast_to(bad, (lanes,)).copy() if bad.shape[0] != lanes else bad


def _nonfinite_lanes_f16(xb, lanes):
    bad = ((xb.reshape(xb.shape[0], -1) & 0x7C00) == 0x7C00).any(axis=1)
    return np.broadcast_to(bad, (lanes,)).copy() if bad.shape[0] != lanes else bad


# exp2 (ex2.approx.ftz.f32): the GPU's result is a function of x's integer part and of its
# fraction truncated to 23 bits, with a negative x taken as the one's complement of |x|
# (fraction F = 2^23-1-trunc(frac|x| * 2^23), integer part -floor|x|-1). 2^(F/2^23) itself is
# approximated by the hardware's interpolator (not a single rounding of any polynomial);
# RN(2^((F + 0.35)/2^23)) is the closest simple rule found (86% bit-identical, within 1 ulp).
_EXP2_BIAS = 0.35


def _exp2_sm90_py(x, out, tab, packed):
    """tab: int8[2^23] measured offsets of G(F) from the formula, in units of 2^-23, or empty.
    packed: the same offsets at 2 bits each (uint8[2^21], offset+1), when all are in
    {-1, 0, 1} (the H200's are): 2 MB instead of 8 stay in cache, which made the difference
    between 0.9 s and ~0.3 s of exp2 per simulated 1x8x2048x64 kernel."""
    for i in numba.prange(x.size):                    # branch-free: vectorises
        v = np.float64(x[i])
        v = 0.0 if abs(v) < 1.1754943508222875e-38 else v          # ftz input (NaN kept)
        vc = min(max(v, -130.0), 130.0)
        va = abs(vc)
        m = np.floor(va)
        rt = np.floor((va - m) * 8388608.0)
        neg = vc < 0.0
        f = 8388607.0 - rt if neg else rt
        n = -m - 1.0 if neg else m
        g = np.float64(np.float32(2.0 ** ((f + _EXP2_BIAS) * (1.0 / 8388608.0))))
        # clamp the index: f is NaN for a NaN input (handled below), and numba does
        # not bounds-check
        fi = min(max(np.int64(f) if f == f else 0, 0), 8388607)
        if packed.size:
            off = np.int64((packed[fi >> 2] >> ((fi & 3) * 2)) & 3) - 1
            g += np.float64(off) * 2.0 ** -23
        elif tab.size:
            g += np.float64(tab[fi]) * 2.0 ** -23
        g = 2.0 if f == 8388607.0 else g     # measured: negative integers give exact powers of 2
        ni = np.int64(n)
        r = g * _bits_f64((1023 + ni) << 52)
        r = r if r >= 1.1754943508222875e-38 else 0.0                # ftz result
        r = np.inf if v >= 128.0 else r
        out[i] = np.float32(r if v == v else v)


_exp2_sm90 = _dual(_exp2_sm90_py, error_model="numpy")


def _div_sm90_py(x, y, out, tab):
    """q = RN(x * R(y)), R(y) = the reciprocal of y's significand (from `tab`: int8[2^23]
    offsets from RN(1/1.M) in units of 2^-24, or RN(1/y) when empty), scaled by y's
    exponent; subnormal inputs and results flushed to zero."""
    tiny = 1.1754943508222875e-38
    for i in numba.prange(x.size):
        a = np.float64(x[i])
        b = np.float64(y[i])
        a = 0.0 * a if abs(a) < tiny else a                        # ftz (NaN kept)
        b = 0.0 * b if abs(b) < tiny else b
        r = np.float64(np.float32(1.0 / b))
        if tab.size and b == b and b != 0.0 and abs(b) != np.inf:
            bits = _f64_bits(b)
            mant = bits & 0xFFFFFFFFFFFFF
            e = ((bits >> 52) & 0x7FF) - 1023
            y1 = _bits_f64((np.int64(1023) << 52) | mant)
            r1 = np.float64(np.float32(1.0 / y1)) + np.float64(tab[mant >> 29]) * 2.0 ** -24
            r = r1 * _bits_f64((1023 - e) << 52)
            r = -r if b < 0.0 else r
        q = np.float64(np.float32(a * r))
        out[i] = np.float32(0.0 * q if abs(q) < tiny else q)


_div_sm90 = _dual(_div_sm90_py, error_model="numpy")
_NO_TABLE = np.zeros(0, np.int8)
MUFU_TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sm90_mufu.npz")


def load_mufu_tables(path=MUFU_TABLES):
    """The measured MUFU.EX2 / MUFU.RCP tables (tools/numerics_tables.py writes them on a GPU),
    or empty arrays when there are none yet."""
    if path and os.path.exists(path):
        with np.load(path) as f:
            return (np.ascontiguousarray(f["exp2_off"], np.int8),
                    np.ascontiguousarray(f["rcp_off"], np.int8))
    return _NO_TABLE, _NO_TABLE


def _pack2(table: np.ndarray) -> np.ndarray:
    """int8 offsets in {-1, 0, 1} -> 4 per byte (offset + 1 in 2 bits); empty if not packable."""
    if table.size == 0 or table.size % 4 or table.min() < -1 or table.max() > 1:
        return np.zeros(0, np.uint8)
    t = (table.astype(np.int16) + 1).astype(np.uint8).reshape(-1, 4)
    return (t[:, 0] | (t[:, 1] << 2) | (t[:, 2] << 4) | (t[:, 3] << 6)).astype(np.uint8)


# row sums: a [.., 128] fp32 row is 32 chunks of 4 neighbours (one per lane of a warp);
# each chunk adds (x0+x1)+(x2+x3), then the chunks meet in a halving (shuffle) tree.
_SUM_CHUNK = 4


def tree_sum_f32(x: np.ndarray, axis: int, chunk: str = "adjacent") -> np.ndarray:
    """float32 sum along one axis in the sm_90 order (docs/numerics-sm90.md).

    chunk: how a lane adds its 4 neighbours. "adjacent" (sm_90, sm_89):
    (x0 + x1) + (x2 + x3); "halving" (sm_120, read from its SASS): (x0 + x2) + (x1 + x3)."""
    x = np.moveaxis(np.asarray(x, np.float32), axis, -1)
    n = x.shape[-1]
    c = min(_SUM_CHUNK, n)
    x = x.reshape(x.shape[:-1] + (n // c, c))
    while x.shape[-1] > 1:                      # inside a chunk
        if chunk == "halving":
            h = x.shape[-1] // 2
            x = x[..., :h] + x[..., h:]
        else:                                   # adjacent pairs
            x = x[..., 0::2] + x[..., 1::2]
    x = x[..., 0]
    while x.shape[-1] > 1:                      # across chunks: halving tree
        h = x.shape[-1] // 2
        x = x[..., :h] + x[..., h:]
    return x[..., 0]


def fragment_row_sum_f32(x: np.ndarray) -> np.ndarray:
    """float32 sum of each row of an mma accumulator tile, in the order the sm_90 compiler
    emits (read from the fused kernel's SASS, docs/numerics-sm90.md).

    In the accumulator fragment, lane t (0..3) of a quad holds columns 8k + 2t and
    8k + 2t + 1 of a row, k = 0..N/8-1. Each lane runs two sequential chains from +0 (even
    and odd columns, k ascending) and adds them; the quad then meets by butterfly shuffles,
    xor 2 first, then xor 1: ((T0 + T2) + (T1 + T3))."""
    x = np.asarray(x, np.float32)
    k = x.shape[-1] // 8
    frag = x.reshape(x.shape[:-1] + (k, 4, 2))           # [.., k, lane t, even/odd]
    chains = np.zeros(x.shape[:-1] + (4, 2), np.float32)
    for i in range(k):
        chains += frag[..., i, :, :]
    t = chains[..., 1] + chains[..., 0]
    return (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])


def fragment_row_chain_f32(x: np.ndarray) -> np.ndarray:
    """float32 row sums of an mma accumulator tile of 256 rows, as the sm_90 compiler emits
    them for TileGym's FMHA forward (TILE_M 256, TILE_N 128, read from its SASS): lane t of
    a quad runs ONE sequential chain over its values in fragment order (columns 8k + 2t,
    8k + 2t + 1, k ascending), starting from the first value (no +0), then the quad meets
    by butterflies xor 2, xor 1. With 4 m64 accumulator blocks a thread the compiler keeps
    one chain where, with fewer rows (fragment_row_sum_f32), it runs two from +0."""
    x = np.asarray(x, np.float32)
    k = x.shape[-1] // 8
    frag = np.moveaxis(x.reshape(x.shape[:-1] + (k, 4, 2)), -2, -3)   # [.., lane t, k, e/o]
    frag = frag.reshape(frag.shape[:-2] + (2 * k,))
    t = frag[..., 0]
    for i in range(1, 2 * k):
        t = t + frag[..., i]
    return (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])


def fragment_row_tree_f32(x: np.ndarray) -> np.ndarray:
    """float32 row sums of an mma accumulator tile summed as it is (no op since the mma):
    lane t of a quad reduces its values in fragment order (columns 8k + 2t, 8k + 2t + 1, k
    ascending) as a pairwise tree of neighbours ((v0 + v1) + (v2 + v3)) + ..., then the
    quad meets by butterflies xor 2, xor 1. Measured on an H100 (tools/sim_ops_gpu.py
    --shapes): 100% on 64x128, 128x64, 128x128, 256x64 and 256x128 tiles, where a computed
    tile (exp2 of the same) keeps the two chains of fragment_row_sum_f32."""
    x = np.asarray(x, np.float32)
    k = x.shape[-1] // 8
    v = np.moveaxis(x.reshape(x.shape[:-1] + (k, 4, 2)), -2, -3)     # [.., lane t, k, e/o]
    v = v.reshape(v.shape[:-2] + (2 * k,))
    while v.shape[-1] > 1:
        v = v[..., 0::2] + v[..., 1::2]
    t = v[..., 0]
    return (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])


def fragment_row_sum_m16_f32(x: np.ndarray) -> np.ndarray:
    """float32 row sums of a 16-row mma tile [.., 16, N] (N a multiple of 32), as the sm_90
    compiler emits them: M = 16 is below wgmma's 64, so the tile is HMMA.16816 (mma.sync)
    over the 4 consumer warps splitting N, warp w holding the n8 blocks w, w + 4, w + 8, ..
    Each lane runs two chains from +0 over its blocks (even and odd columns 8k + 2t,
    8k + 2t + 1), adds them, the quad meets by butterflies xor 2, xor 1, and the 4 warps'
    partial sums meet through shared memory, read back by the lanes of one warp and
    butterflied xor 2, xor 1: (w0 + w2) + (w1 + w3). Read from the SASS of the decode split
    kernel (tileiras 13.4, sm_90, 16 x 128 and 16 x 64: padded group 7 and 12 and
    power-of-two forms alike); the interleaved block order fitted to an H200's split
    workspaces (results/issue33-h200-2026-11-28b/ws-probe: 4 of 24 l values 1-2 ulp -> 24 of
    24, the other 20 unchanged; tests/test_sim_row_sum_m16.py)."""
    x = np.asarray(x, np.float32)
    k = x.shape[-1] // 32                                          # blocks a warp
    v = x.reshape(x.shape[:-1] + (k, _WARPS, 4, 2))                # [.., j, w, t, e/o]
    chains = np.zeros(x.shape[:-1] + (_WARPS, 4, 2), np.float32)
    for j in range(k):
        chains += v[..., j, :, :, :]
    t = chains[..., 1] + chains[..., 0]                            # [.., w, t]
    w = (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])          # the quad: [.., w]
    return (w[..., 0] + w[..., 2]) + (w[..., 1] + w[..., 3])


def _lane_chain(v):
    t = v[..., 0]
    for j in range(1, v.shape[-1]):
        t = t + v[..., j]
    return t


def _lane_tree(v):
    while v.shape[-1] > 1:
        v = v[..., 0::2] + v[..., 1::2]
    return v[..., 0]


def fragment_row_sum_m32_f32(x: np.ndarray) -> np.ndarray:
    """Float32 row sums of a 32-row mma tile [.., 32, N] (N a multiple of 32) on sm_90
    (checked on an H200: Sm90.row_warps_m32's comment): what the decode
    split kernel's SASS shows (tileiras 13.4, GT 32, TILE_N 128; docs/numerics-sm90.md
    section 17) is HMMA with the 4 warps splitting the keys as for 16 rows, but no chains
    from +0: a lane adds its values in fragment order (b0.even, b0.odd, b1.even, ..) as
    ONE chain from the first value for rows 0-15 (the first m16 tile) and as a pairwise
    tree of neighbours for rows 16-31; then the quad xor 2, xor 1 and the warps
    (w0 + w2) + (w1 + w3). Which n8 blocks a warp holds (w, w + 4, ..) is assumed from the
    16-row fit."""
    x = np.asarray(x, np.float32)
    k = x.shape[-1] // 32
    v = x.reshape(x.shape[:-1] + (k, _WARPS, 4, 2))                # [.., j, w, t, e/o]
    v = np.moveaxis(v, -4, -2).reshape(x.shape[:-1] + (_WARPS, 4, 2 * k))
    t = np.concatenate([_lane_chain(v[..., :16, :, :, :]), _lane_tree(v[..., 16:, :, :, :])],
                       axis=-3)                                    # [.., 32, w, t]
    w = (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])
    return (w[..., 0] + w[..., 2]) + (w[..., 1] + w[..., 3])


def fragment_col_sum_f32(x: np.ndarray) -> np.ndarray:
    """float32 sums along axis -2 (down the rows) of an mma accumulator tile of M = 64 B
    rows, as measured on an H100 through TileGym's decode kernels (`ct.sum(l_i, 0)` of a
    [TILE_N, group] tile: flash_decode 128 x 8, the two MLA decoders): row 64b + 16w + 8h + g
    sits in warp w, lane group g, register (b, h). A thread adds its two rows 8 apart, then
    its m64 blocks pairwise (halving over b); the lane groups meet by butterflies xor 16,
    8, 4 (rows 4, 2, 1 apart), the warps through shared memory as (w0 + w2) + (w1 + w3).
    Found by fitting orders to the recorded LSEs (no SASS read). The m64 blocks meet as
    neighbours ((b0 + b1) + (b2 + b3)): the same as halving for M = 128, and what a 256-row
    accumulator summed as it is showed on an H100 (tools/sim_ops_gpu.py --shapes, 256 x 16
    and 256 x 64: 100%, halving 47-69%)."""
    x = np.asarray(x, np.float32)
    m, n = x.shape[-2:]
    v = x.reshape(x.shape[:-2] + (m // 64, 4, 2, 8, n))         # [.., b, w, h, g, n]
    v = v[..., 0, :, :] + v[..., 1, :, :]                          # h: rows 8 apart
    v = np.moveaxis(v, -4, -1)                                     # [.., w, g, n, b]
    while v.shape[-1] > 1:                                         # m64 blocks, neighbours
        v = v[..., 0::2] + v[..., 1::2]
    v = v[..., 0]
    v = _halving(v, -2)                                            # lanes: [.., w, n]
    return _halving(v, -2)                                         # warps


def _pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


#: threads of the consumer warpgroup that holds a loaded tile (4 warps of 32)
_WARPS, _LANES = 4, 32


def blocked_layout(shape, itemsize):
    """The register layout tileiras gives a loaded 1-D/2-D tile on sm_90, read from the SASS
    of tools/sim_ops_gpu.py's sum kernels (docs/numerics-sm90.md, "sums of loaded tiles"):
    (spt, tpw_r, tpw_c, w_r, w_c). A thread holds spt neighbours of a row (16 bytes, fewer
    when the tile has under 128 x 16 bytes: min(16 // itemsize, numel // 128)); a warp's
    lanes run along the row first, then down rows; the 4 warps likewise. None where the
    tile does not fill the layout exactly (values would be held twice: not read)."""
    r, n = (1, shape[0]) if len(shape) == 1 else shape
    if len(shape) not in (1, 2) or not (_pow2(r) and _pow2(n)):
        return None
    spt = min(16 // itemsize, max(r * n // (_WARPS * _LANES), 1))
    if n % spt:
        return None
    tpw_c = min(_LANES, n // spt)
    w_c = min(_WARPS, n // (spt * tpw_c))
    tpw_r, w_r = _LANES // tpw_c, _WARPS // w_c
    if r % (tpw_r * w_r):
        return None
    return spt, tpw_r, tpw_c, w_r, w_c


def _halving(v: np.ndarray, ax: int, rnd=None) -> np.ndarray:
    """Butterfly shuffles xor n/2 .. 1 along `ax`: v[i] + v[i + n/2], halving. rnd: a
    rounding applied after each add (bf16 held in float32), None for the array's own."""
    v = np.moveaxis(v, ax, -1)
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = v[..., :h] + v[..., h:]
        v = v if rnd is None else rnd(v)
    return v[..., 0]


def _chain(v: np.ndarray, ax: int, rnd=None) -> np.ndarray:
    """A thread's sequential accumulation over its repeats along `ax`: from +0 when there
    is more than one (the SASS's FADD RZ, x0), else the value itself."""
    v = np.moveaxis(v, ax, 0)
    if v.shape[0] == 1:
        return v[0]
    acc = np.zeros(v.shape[1:], v.dtype)
    for part in v:
        acc = acc + part
        acc = acc if rnd is None else rnd(acc)
    return acc


def _blocked_rows(x, lay, rnd=None):
    """Reduce the last axis of [.., n] in the layout: per register a chain over the
    repeats, then the spt neighbours as adjacent pairs ((x0+x1)+(x2+x3)), then the lanes
    (xor 16 .. 1), then the warps through shared memory ((w0+w2)+(w1+w3))."""
    spt, _, tpw_c, _, w_c = lay
    n = x.shape[-1]
    v = x.reshape(x.shape[:-1] + (n // (spt * tpw_c * w_c), w_c, tpw_c, spt))
    v = _chain(v, -4, rnd)                              # [.., w_c, tpw_c, spt]
    while v.shape[-1] > 1:
        v = v[..., 0::2] + v[..., 1::2]
        v = v if rnd is None else rnd(v)
    return _halving(_halving(v[..., 0], -1, rnd), -1, rnd)


def _blocked_cols(x, lay, rnd=None):
    """Reduce axis -2 of [.., r, n]: per register a chain over the row repeats, then the
    lanes down the rows, then the warps (both halving)."""
    _, tpw_r, _, w_r, _ = lay
    r, n = x.shape[-2:]
    v = x.reshape(x.shape[:-2] + (r // (tpw_r * w_r), w_r, tpw_r, n))
    v = _chain(v, -4, rnd)                              # [.., w_r, tpw_r, n]
    return _halving(_halving(v, -2, rnd), -2, rnd)


def scan_lanes(shape, axis):
    """Lanes of a warp that run along the scan axis in the layout tileiras scans a 1-D/2-D
    tile in on sm_90 (read from the SASS: one value per lane and register, lanes along
    dim 0 first, then dim 1; SHFL.UP strides of 8x256, 16x64, 64x16, 4x512, 2x128, 32x32
    and 1-D tiles agree). None for other shapes."""
    if len(shape) not in (1, 2) or not all(_pow2(d) for d in shape):
        return None
    if len(shape) == 1:
        return min(_LANES, shape[0])
    l0 = min(_LANES, shape[0])
    return l0 if axis == 0 else min(_LANES // l0, shape[1])


def _bf16_rne(v) -> np.ndarray:
    """float32 values rounded to bf16 (nearest even), kept in float32 (NaN kept)."""
    b = np.ascontiguousarray(v, np.float32).view(np.uint32).astype(np.uint64)
    r = (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(v), np.float32(np.nan), r).reshape(np.shape(v))


def _f16_rne(v) -> np.ndarray:
    return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)


def blocked_scan(x: np.ndarray, axis: int, reverse: bool, op):
    """Inclusive scan of a float32 tile [lanes, *shape] along `axis` (1-based) in the sm_90
    order: positions in chunks of g consecutive ones (the lanes along the axis), a
    Hillis-Steele scan inside a chunk (SHFL.UP 1, 2, .. g/2: s[q] = s[q] op s[q - d]), then
    the chunk totals in one sequential chain P[i] = P[i-1] op T[i], and each chunk's values
    combined with the previous chunks' P. reverse scans the mirrored axis. op: np.add or
    np.multiply. None where the shape is not modelled."""
    g = scan_lanes(x.shape[1:], axis - 1)
    if g is None:
        return None
    v = np.moveaxis(np.asarray(x, np.float32), axis, -1)
    v = v[..., ::-1] if reverse else v
    n = v.shape[-1]
    v = v.reshape(v.shape[:-1] + (n // g, g)).copy()     # written below: not the input
    d = 1
    while d < g:
        v = np.concatenate([v[..., :d], op(v[..., d:], v[..., :-d])], axis=-1)
        d *= 2
    p = v[..., 0, -1]
    for i in range(1, v.shape[-2]):
        nxt = op(p, v[..., i, -1])
        v[..., i, :] = op(v[..., i, :], p[..., None])
        p = nxt
    v = v.reshape(v.shape[:-2] + (n,))
    v = v[..., ::-1] if reverse else v
    return np.ascontiguousarray(np.moveaxis(v, -1, axis))


def blocked_sum(x: np.ndarray, axes, dtype, rnd=None, itemsize=None):
    """Sum of a loaded (non-mma) fp32/fp16 tile [lanes, *shape] over `axes` (1-based, the
    lane axis being 0) in the sm_90 order, or None where the layout is not modelled.
    Each add rounds in the tile's dtype (fp16: HADD2). A sum over both axes reduces the
    rows first, then the row of column sums (as the SASS of ct.sum(x) does).
    bf16 (held in float32): rnd rounds each add to bf16 and itemsize is 2 (the loaded
    tile's layout); 100% on the H100 (results/samples-h100-2026-11-24)."""
    lay = blocked_layout(x.shape[1:], itemsize or x.dtype.itemsize)
    nd = x.ndim - 1
    axes = sorted(a % x.ndim for a in axes)
    if lay is None or not axes or axes[0] == 0:
        return None
    x = np.asarray(x)
    if nd == 2 and 1 in axes:
        x = _blocked_cols(x, lay, rnd)
        return _blocked_rows(x, lay, rnd) if 2 in axes else x
    return _blocked_rows(x, lay, rnd)


def f32_dot_chain(a, b, acc, order):
    """fp32 ct.mma / ct.matmul of fp32 tiles as sm_90 runs it (no tensor core: the SASS of
    the FFT sample has FMUL + FADD, no FFMA): per output a chain from +0 over the K
    products, each rounded (fl(a_k * b_k)), taken in `order` ("asc": k ascending), then
    the accumulator added. a [.., M, K], b [.., K, N], acc [.., M, N] (numpy broadcasting)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    k = a.shape[-1]
    ks = range(k) if order == "asc" else [int(i) for i in order]
    s = None
    with np.errstate(all="ignore"):
        for i in ks:
            p = a[..., :, i:i + 1] * b[..., i:i + 1, :]
            s = p + np.float32(0) if s is None else s + p
        if s is None:
            s = np.zeros(np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1])),
                         np.float32)
        return np.asarray(acc, np.float32) + s


class Sm90(Sm90v0):
    """sm_90 (H100/H200), measured on an H200 on 2026-11-22 (docs/numerics-sm90.md).

    * mma fp16/bf16 -> fp32: per wgmma k16 step, products exact, all 16 products and the
      accumulator truncated at 25 bits below the largest unnormalised exponent, exact sum,
      fp32 round-toward-zero; steps in K order. 100% bit-identical on 2.1M probe outputs.
      Where the probes did not reach, MMA-Sim's Hopper model (100% identical to it on
      147,456 outputs of every input class, tests/test_mmasim_oracle.py): NaN/inf, the
      accumulator is an fp32 register between k16 steps (a sum past 2^128 is inf there), a
      zero result is +0, and a zero term counts as exponent -133 (it decides the alignment
      only when every other term of a bf16 step is below 2^-133).
    * float32 sums along one axis of power-of-two length: chunks of 4 neighbours
      ((x0+x1)+(x2+x3)), then a halving tree across chunks. 100% on the probe rows of 128.
    * sums of loaded fp32/fp16 1-D/2-D tiles in their blocked register layout, and fp32
      cumsum/cumprod in the scan layout (blocked_sum, blocked_scan; read from the SASS,
      100% on an H100: rows of 32..4096, axis 0, 1-D, all axes, fp16 rows; 8x256 scans
      along both axes, reversed, cumprod; docs/numerics-sm90.md section 12).
    * fp32 -> fp16/bf16: RNE (100% on the probe).
    * exp2 with flush_to_zero (ex2.approx.ftz.f32): declared approximate. The input rule
      (23-bit fraction, one's complement for x < 0) is measured; the hardware's 2^f
      interpolator is approximated by RN(2^((F+0.35)/2^23)): 86% bit-identical, <= 1 ulp.
    * approximate division: x * RN(1/y), v0's formula (declared approximate, 87.7%, <= 2
      ulp); the GPU's reciprocal is a faithful (< 1 ulp) function of y's 23-bit mantissa.
    * With sim/data/sm90_mufu.npz present (tools/numerics_tables.py records it on a GPU: all
      2^23 fractions of MUFU.EX2 and mantissas of MUFU.RCP), exp2 and division read the
      measured values instead of the two formulas.
    * tf32 mma -> fp32 (measured on an H100, 2026-11-24, tools/sim_ops_gpu.py): the same
      truncating fused sum in steps of 8 products (the operands rounded to tf32, RNE).
    * log, log2, exp, exp2 (no ftz), tanh, sin, cos: the compiler's libdevice sequences
      (sim.libdevice, read from the SASS), 100% on an H100 (tools/sim_ops_gpu.py); NaN
      results are the canonical 0x7FFFFFFF.
    * fp16 x fp16 -> fp16 accumulator (cuTile's ct.matmul of fp16 tiles): the exact k16
      step sum rounded to fp16 (RNE) per step (mma_f16_acc; 100% on an H100).
    * fp64 mma, multi-axis and non-fp32 sums: v0's formulas.
    * What the compiler does to the arithmetic (read from the fused kernel's SASS): a
      float32 multiply feeding an add/sub is one FFMA (contract_fma), and a row sum of an
      mma accumulator tile runs in the fragment order (fragment_row_sum_f32)."""

    name = "sm_90"
    contract_fma = True
    fma_left_mul_first = True
    fma_no_broadcast = True     # a broadcast product is not contracted (SASS)
    #: fp32 mma/matmul: the K order of f32_dot_chain; None: v0's exact sum, one rounding
    mma_f32_chain = "asc"
    #: how a lane adds the 4 neighbours of a loaded row (tree_sum_f32's chunk)
    sum_chunk = "adjacent"
    #: 256-row mma tiles sum each row in one chain (fragment_row_chain_f32)
    row_chain_256 = True
    #: 16-row mma tiles: 4 warps split N, then shared memory (fragment_row_sum_m16_f32)
    row_warps_m16 = True
    #: 32-row mma tiles: fragment_row_sum_m32_f32, read from the SASS and checked on an H200
    #: (results/issue33-h200x4-2026-11-28c: the split workspaces of 1x32:1x4096x128 and
    #: 1x28:4x3:4096x128, 2 splits: 0 of 64 and 0 of 42 row sums differ, 15 each with the
    #: one-quad chain; the other 10 candidate orders 2-16 of 64)
    row_warps_m32 = True
    raw_sums = True             # mma/gather results summed as they are (an H100, --shapes)
    #: axis -2 sums of mma tiles in the fragment's order (fragment_col_sum_f32)
    col_sums_mma = True
    #: sums of loaded (non-mma) fp32/fp16 tiles in the blocked-layout order (blocked_sum;
    #: read from the sm_90 SASS, 100% on an H100: results/sim-ops-h100-2026-11-24)
    blocked_sums = True
    #: the tensor core's fused dot-add (MMA-Sim's L_max, F, e_zero): k-step length, fraction
    #: bits kept below the largest exponent, exponent of a zero term
    mma_kstep, mma_fbits, mma_ezero = 16, 25, -133
    #: tf32 operands: (k-step, fraction bits, zero-term exponent), the same fused dot-add
    #: in steps of 8 (100% on an H100: results/sim-ops-h100-2026-11-24); None: v0's rule
    mma_tf32 = (8, 25, -133)
    #: fp16 x fp16 -> fp16 accumulator: k-step after which the sum is rounded to fp16
    #: (100% on an H100, ct.matmul of fp16 tiles); None: v0's one rounding
    mma_f16acc_kstep = 16
    #: mma takes fp16 `a` as float16 storage (hopper_mma_f32's fp16 path; sim.ops.mma)
    mma_reads_fp16 = True

    def __init__(self, threads: int | None = None, tables=MUFU_TABLES):
        super().__init__(threads)
        self.exp2_table, self.rcp_table = load_mufu_tables(tables)
        self.exp2_packed = _pack2(self.exp2_table)

    def mma(self, a, b, acc, acc_dtype, y_share=None, in_dtype=None):
        """in_dtype: the operands' cuTile dtype when known (sim.ops.mma passes it); else
        fp16/bf16 are told from b's storage."""
        if in_dtype == ct.float32 and acc_dtype == ct.float32 and self.mma_f32_chain:
            return f32_dot_chain(a, b, acc, self.mma_f32_chain)
        if in_dtype == ct.tfloat32:
            if self.mma_tf32 and acc_dtype == ct.float32 and a.ndim == 3 and b.ndim == 3:
                return hopper_mma_f32(a, b, acc, ct.tfloat32, *self.mma_tf32)
            return super().mma(a, b, acc, acc_dtype, y_share=y_share)
        in_dt = _mma_input_dtype(b)
        if acc_dtype == ct.float32 and in_dt is not None and a.ndim == 3 and b.ndim == 3:
            return hopper_mma_f32(a, b, acc, in_dt, self.mma_kstep, self.mma_fbits,
                                  self.mma_ezero)
        if (acc_dtype == ct.float16 and in_dt == ct.float16 and self.mma_f16acc_kstep
                and a.ndim == 3 and b.ndim == 3):
            return mma_f16_acc(a, b, acc, self.mma_f16acc_kstep)
        return super().mma(a, b, acc, acc_dtype, y_share=y_share)

    def exp2(self, x, dtype, flush_to_zero):
        if dtype == ct.float32 and flush_to_zero:
            return canonical_nan(self.mufu_ex2(x))
        if dtype == ct.float32:
            return canonical_nan(libdevice.exp2f(x, self.mufu_ex2))
        return super().exp2(x, dtype, flush_to_zero)

    def mufu_ex2(self, x):
        """MUFU.EX2 (ex2.approx.ftz.f32) of a float32 array."""
        x = np.ascontiguousarray(x, np.float32)
        out = np.empty_like(x)
        if x.size:
            _exp2_sm90(x.reshape(-1), out.reshape(-1), self.exp2_table, self.exp2_packed)
        return out

    def mufu_rcp(self, y):
        """MUFU.RCP (rcp.approx.ftz.f32) of a float32 array."""
        y = np.ascontiguousarray(y, np.float32)
        out = np.empty_like(y)
        if y.size:
            _div_sm90(np.ones(y.size, np.float32), y.reshape(-1), out.reshape(-1), self.rcp_table)
        return out

    def unary(self, fn, x, dtype):
        """log, log2, exp, tanh, sin, cos of fp32/fp16: the compiler's libdevice sequences (sim.libdevice,
        fp16 through float32); the rest correctly rounded. NaN results are the GPU's
        canonical NaN (measured: 0x7FFFFFFF, fp16 0x7FFF)."""
        seq = _LIBDEVICE.get(fn)
        if fn == "tanh_approx" and dtype == ct.float32:
            table = self.tanh_table()
            if table is not None:       # MUFU.TANH from its measured table (sim.mufu)
                from .mufu import tanh_sm90
                return canonical_nan(tanh_sm90(x, table))
            return canonical_nan(tanh_approx_sm90(np.asarray(x, np.float32)))
        if fn == "tanh_approx":       # fp32 only in cuTile (APPROX); keep the rule elsewhere
            fn = "tanh"
        if fn == "rsqrt" and dtype == ct.float32 and self.rsq_table() is not None:
            from .mufu import rsqrt_sm90
            return canonical_nan(rsqrt_sm90(x, self.rsq_table()))
        if seq is not None and dtype in (ct.float32, ct.float16):
            r = seq(self, np.asarray(x, np.float32))
            r = r if dtype == ct.float32 else self.round_to(r, dtype)
        else:
            r = super().unary(fn, x, dtype)
        return canonical_nan(r)

    def rsq_table(self):
        """MUFU.RSQ's measured offsets (sim.mufu), for the sm_90 model only: other GPUs'
        tables are not recorded (sm_120/sm_89 keep the correctly rounded rsqrt)."""
        if type(self).__name__ != "Sm90":
            return None
        from .mufu import rsq_table
        return rsq_table()

    def tanh_table(self):
        """MUFU.TANH's measured results (sim.mufu, every fp32 in [2^-8, 8) on an H100), for
        the sm_90 model only, as rsq_table."""
        if type(self).__name__ != "Sm90":
            return None
        from .mufu import tanh_table
        return tanh_table()

    def truediv(self, x, y, dtype, rounding_mode, flush_to_zero):
        if rounding_mode is ct.RoundingMode.APPROX and dtype == ct.float32 and flush_to_zero:
            x, y = np.broadcast_arrays(np.asarray(x, np.float32), np.asarray(y, np.float32))
            out = np.empty(x.shape, np.float32)
            if out.size:
                _div_sm90(_flat(x), _flat(y), out.reshape(-1), self.rcp_table)
            return out
        return super().truediv(x, y, dtype, rounding_mode, flush_to_zero)

    def sum(self, x, axis, dtype, layout=None):
        axes = (axis,) if np.isscalar(axis) else tuple(axis)
        raw = self.raw_sums and layout in (MMA_RAW_LAYOUT, GATHER_RAW_LAYOUT)
        layout = {MMA_RAW_LAYOUT: MMA_LAYOUT, GATHER_RAW_LAYOUT: GATHER_LAYOUT}.get(layout, layout)
        if layout == GATHER_LAYOUT:
            r = self.gather_sum(x, axes, dtype, raw)
            if r is not None:
                return r
        if self.blocked_sums and layout == HALF_BLOCKED_LAYOUT and dtype == ct.float32:
            # fp32 sums of converted fp16/bf16 loads (TileGym's FMHA backward preprocess,
            # rows of 32x64: 41.41% -> 100% on an H100); only that shape was measured
            r = blocked_sum(np.asarray(x, np.float32), axes, dtype, itemsize=2)
            if r is not None:
                return r
        if self.blocked_sums and layout != MMA_LAYOUT and dtype in (ct.float32, ct.float16):
            r = blocked_sum(np.asarray(x, dtypes.storage(dtype)), axes, dtype)
            if r is not None:
                return r
        if self.blocked_sums and layout != MMA_LAYOUT and dtype == ct.bfloat16:
            r = blocked_sum(np.asarray(x, np.float32), axes, dtype, rnd=_bf16_rne, itemsize=2)
            if r is not None:
                return r
        if dtype == ct.float32 and len(axes) == 1:
            n, last = x.shape[axes[0]], axes[0] % x.ndim == x.ndim - 1
            if layout == MMA_LAYOUT and self.col_sums_mma and x.ndim >= 2 and \
                    axes[0] % x.ndim == x.ndim - 2 and n % 64 == 0:
                return fragment_col_sum_f32(x)
            if layout == MMA_LAYOUT and last and n % 8 == 0:
                if raw and _pow2(n):
                    # the accumulator summed as it is: a tree a lane (an H100, 5 shapes)
                    return fragment_row_tree_f32(x)
                if self.row_warps_m16 and x.ndim >= 2 and x.shape[-2] == 16 and \
                        n % 32 == 0:
                    # 16 rows: mma.sync with the 4 warps splitting the keys (the decode
                    # split kernel's tiles, results/issue33-h200-2026-11-28b/ws-probe)
                    return fragment_row_sum_m16_f32(x)
                if self.row_warps_m32 and x.ndim >= 2 and x.shape[-2] == 32 and \
                        n % 32 == 0:
                    return fragment_row_sum_m32_f32(x)     # 32 rows: the same split, chain/tree halves
                if self.row_chain_256 and x.ndim >= 2 and x.shape[-2] == 256:
                    # TileGym's FMHA forward with LSE (256x128 tiles, an H100): 26 of 512
                    # LSE values 1 ulp -> 0. Not a shape rule: computed 256-row tiles of
                    # tools/sim_ops_gpu.py --shapes kept the two chains (docs/numerics-sm90.md 16)
                    return fragment_row_chain_f32(x)
                return fragment_row_sum_f32(x)
            if _pow2(n):
                return tree_sum_f32(x, axes[0], self.sum_chunk)
        return super().sum(x, axis, dtype)

    def gather_sum(self, x, axes, dtype, raw=False):
        """ct.sum of a 1-D fp32 gather result (GATHER_LAYOUT) of 256 elements: each thread
        holds elements i and i + 128 (lanes fastest) and adds them, then the lanes (xor
        16 .. 1) and the 4 warps halve. 100% on TileGym's softmax (rows of 200 in a 256
        tile, an H100, results/samples-h100-2026-11-24); None for other sizes."""
        if not self.blocked_sums or dtype != ct.float32 or x.ndim != 2 or \
                tuple(a % 2 for a in axes) != (1,):
            return None
        n = x.shape[1]
        if raw and n >= 128:
            # a gather summed as it is keeps the blocked layout of a 1-D load (2 neighbours
            # a thread at 256, 4 from 512: an H100, tools/sim_ops_gpu.py --shapes); None
            # lets the caller's blocked_sum take it
            return None
        if _LANES < n < 128 and _pow2(n):
            # one element a lane, lanes fastest, n / 32 warps: butterflies, then the warps
            # halve (64: lanes xor 16 .. 1, then w0 + w1; an H100, --shapes)
            v = np.asarray(x, np.float32).reshape(x.shape[0], n // _LANES, _LANES)
            return _halving(_halving(v, -1), -1)
        if 2 <= n <= _LANES and _pow2(n):
            # one element a lane, lanes fastest: butterflies xor n/2 .. 1, (e0+e2)+(e1+e3)
            # for 4 (TileGym splitk_reduce's 4 split LSEs, an H100: 2 of 8192 outputs
            # 1 ulp -> 0); only n = 4 was measured
            return _halving(np.asarray(x, np.float32), -1)
        if n not in (128, 256):
            # measured: 256 lanes fastest (TileGym softmax); 4096 in the loaded tile's
            # blocked order (TileGym fused_linear_cross_entropy, 100% with blocked_sum);
            # sizes between are unverified and keep the blocked order
            return None
        v = np.asarray(x, np.float32).reshape(x.shape[0], n // 128, _WARPS, _LANES)
        v = _chain(v, 1)                                    # [lanes, warps, lanes32]
        return _halving(_halving(v, -1), -1)

    def scan(self, x, axis, op, reverse, dtype):
        if self.blocked_sums and dtype == ct.float32:
            return blocked_scan(x, axis, reverse, op)
        if self.blocked_sums and dtype in (ct.float16, ct.bfloat16):
            # the same order, each op rounded to the tile's dtype (HADD2/HMUL2 and their
            # bf16 forms): 100% on the H100 for 8x256 along both axes and cumprod
            # (results/samples-h100-2026-11-24, tools/sim_ops_gpu.py --extra)
            rnd = _bf16_rne if dtype == ct.bfloat16 else _f16_rne
            r = blocked_scan(x, axis, reverse, lambda a, b: rnd(op(a, b)))
            return None if r is None else np.asarray(r, dtypes.storage(dtype))
        return None


Sm90.description = Sm90.__doc__

_LIBDEVICE = {"log": lambda m, x: libdevice.logf(x), "log2": lambda m, x: libdevice.log2f(x),
              "exp": lambda m, x: libdevice.expf(x, m.mufu_ex2),
              "tanh": lambda m, x: libdevice.tanhf(x, m.mufu_ex2, m.mufu_rcp),
              "sin": lambda m, x: libdevice.sinf(x), "cos": lambda m, x: libdevice.cosf(x)}
_CANONICAL_NAN = {np.dtype(np.float32): (np.uint32, 0x7FFFFFFF),
                  np.dtype(np.float16): (np.uint16, 0x7FFF)}


def tanh_approx_sm90(x: np.ndarray) -> np.ndarray:
    """tanh.approx.f32 (MUFU.TANH) where the H100 probe (tools/mufu_probe.py, every fp32 of
    the binades 2^-20 .. 2^4) found it simple: x itself for |x| < 2^-8, +-1 for |x| >= 8.
    Between, MUFU.TANH is constant on runs of 2^3 .. 2^6 inputs but no formula was found
    and a table would hold ~6.3M values: correctly rounded there (not the GPU's bits)."""
    with np.errstate(all="ignore"):
        r = np.tanh(x.astype(np.float64)).astype(np.float32)
    a = np.abs(x)
    r = np.where(a < np.float32(2.0 ** -8), x, r)
    return np.where(a >= 8, np.copysign(np.float32(1), x), r).astype(np.float32)


def canonical_nan(r: np.ndarray) -> np.ndarray:
    """NaN results as the GPU writes them (measured on an H100 for every transcendental:
    0x7FFFFFFF in fp32, 0x7FFF in fp16, whatever the input NaN's bits)."""
    kind = _CANONICAL_NAN.get(np.asarray(r).dtype)
    if kind is None:
        return r
    nan = np.isnan(r)
    if nan.any():
        r = np.array(r, copy=True)
        r.reshape(-1).view(kind[0])[nan.reshape(-1)] = kind[1]
    return r


def mma_f16_acc(a, b, acc, kstep):
    """fp16 x fp16 + fp16 accumulator, lane-leading: per k-step the exact sum of the
    products and the accumulator, rounded to fp16 (RNE). Measured on an H100 (ct.matmul
    of fp16 tiles, K = 64: 100% of 8192 outputs; rounding each step toward zero first:
    99.99%). The float64 sum is exact unless a step's terms span more than ~30 binades."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    r = np.asarray(acc, np.float16)
    for k0 in range(0, a.shape[-1], kstep):
        r = (r.astype(np.float64) + a[..., k0:k0 + kstep] @ b[..., k0:k0 + kstep, :]).astype(np.float16)
    return r


def _mma_input_dtype(b):
    """fp16 or bf16 from the storage of the mma's second operand; None for anything else
    (float32 storage holding values that are not all bf16 is a tf32 mma: v0 path)."""
    if b.dtype == np.float16:
        return ct.float16
    if b.dtype == np.float32:
        bb = np.ascontiguousarray(b).view(np.uint32)
        if not (bb & 0xFFFF).any():
            return ct.bfloat16
    return None


def arch_tables(arch: str) -> str:
    """sim/data/<arch>_mufu.npz when an owner of that GPU has recorded it (`spak calibrate
    --record`, then copied there), else sm_90's measured tables (the assumption)."""
    own = os.path.join(os.path.dirname(MUFU_TABLES), f"{arch.replace('_', '')}_mufu.npz")
    return own if os.path.exists(own) else MUFU_TABLES


class Sm120(Sm90):
    """sm_120 (RTX 5070 and the other RTX Blackwell GPUs): not measured on hardware; built
    from MMA-Sim and from the SASS tileiras emits (docs/numerics-sm120.md).

    * mma fp16/bf16 -> fp32: `ct.mma` becomes HMMA.16816.F32 (mma.sync m16n8k16), chained
      in ascending K (read from the fused kernel's cubin, tools/sass_trace_mma.py). One k16
      instruction is MMA-Sim's RTX Blackwell fused dot-add: 16 products, F = 25, e_zero =
      -133, RZ to fp32: the sm_90 arithmetic. 100% bit-identical to MMA-Sim 2.1.1 on every
      input class (tests/test_mmasim_oracle.py).
    * row sums of mma tiles: the same fragment order as sm_90 (per lane two chains over the
      n8 blocks in order, then butterflies xor 2, xor 1), read from the SASS; FFMA
      contraction of single-use products as on sm_90 (same SASS patterns).
    * row sums of loaded float32 tiles (the naive kernel's softmax): NOT sm_90's order. The
      SASS of the row-sum probe (rows of 16..128) adds each lane's 4 neighbours as
      (x0 + x2) + (x1 + x3) where sm_90 adds (x0 + x1) + (x2 + x3); the lanes then meet by
      the same halving butterflies (xor 16, 8, 4, 2, 1).
    * assumed, unverified: MUFU.EX2 / MUFU.RCP are sm_90's measured tables (a recorded
      sim/data/sm120_mufu.npz replaces them); fp32 -> fp16/bf16 is RNE."""

    name = "sm_120"
    sum_chunk = "halving"
    row_chain_256 = False       # measured on sm_90 only
    row_warps_m16 = False       # read from sm_90's SASS only
    col_sums_mma = False
    raw_sums = False            # measured on sm_90 only
    blocked_sums = False     # its lane order differs (above); not read there
    mma_f32_chain = None         # sm_90's fp32 chain read from its SASS only
    fma_left_mul_first = False   # read from sm_90's SASS only
    fma_no_broadcast = False     # read from sm_90's SASS only
    mma_tf32 = None          # not measured there: v0's rule
    mma_f16acc_kstep = None

    def __init__(self, threads: int | None = None, tables=None):
        super().__init__(threads, arch_tables(self.name) if tables is None else tables)


Sm120.description = Sm120.__doc__


class Sm89(Sm90):
    """sm_89 (L4, Ada Lovelace): not measured on hardware; built from MMA-Sim and from the
    SASS tileiras emits (docs/numerics-sm89.md).

    * mma fp16/bf16 -> fp32: `ct.mma` becomes HMMA.16816.F32 (mma.sync m16n8k16), chained
      in ascending K (tools/sass_trace_mma.py). MMA-Sim's Ada Lovelace model of one k16
      instruction: two fused dot-adds of 8 products each (the first's fp32 result is the
      second's accumulator), 24 fraction bits below the largest exponent kept (truncated),
      e_zero = -132, RZ to fp32. 100% bit-identical to MMA-Sim 2.1.1 on every input class
      (tests/test_mmasim_oracle.py).
    * row sums (of mma tiles and of loaded tiles) and FFMA contraction: as sm_90, read from
      the SASS (the row-sum probe: (x0 + x1) + (x2 + x3) per lane, then xor 16 ... 1).
    * assumed, unverified: MUFU.EX2 / MUFU.RCP are sm_90's measured tables (a recorded
      sim/data/sm89_mufu.npz replaces them); fp32 -> fp16/bf16 is RNE."""

    name = "sm_89"
    mma_kstep, mma_fbits, mma_ezero = 8, 24, -132
    blocked_sums = False     # sm_90's blocked order is not checked on an sm_89 GPU
    mma_f32_chain = None         # sm_90's fp32 chain read from its SASS only
    fma_left_mul_first = False   # read from sm_90's SASS only
    fma_no_broadcast = False     # read from sm_90's SASS only
    row_chain_256 = False        # read from sm_90's SASS only
    row_warps_m16 = False        # read from sm_90's SASS only
    col_sums_mma = False         # measured on sm_90 only
    raw_sums = False             # measured on sm_90 only
    mma_tf32 = None          # not measured there: v0's rule
    mma_f16acc_kstep = None

    def __init__(self, threads: int | None = None, tables=None):
        super().__init__(threads, arch_tables(self.name) if tables is None else tables)


Sm89.description = Sm89.__doc__


MODELS = {"sm_90": Sm90, "sm_90-v0": Sm90v0, "sm_120": Sm120, "sm_89": Sm89,
          "ieee": NumericModel}
_instances: dict[str, NumericModel] = {}


def get_model(model) -> NumericModel:
    """A model instance by name ('sm_90', 'sm_90-v0', 'sm_120', 'sm_89', 'ieee') or a
    NumericModel passed as is."""
    if isinstance(model, NumericModel):
        return model
    try:
        cls = MODELS[model]
    except KeyError:
        raise ValueError(f"unknown numeric model {model!r}; choose one of {sorted(MODELS)}") from None
    if model not in _instances:
        _instances[model] = cls()
    return _instances[model]
