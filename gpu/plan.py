"""Host-side launch plans for the FMHA kernels: framework-agnostic.

``plan_fmha`` validates the inputs and returns the kernel launches (kernel, grid, args)
that compute ``out = softmax(q k^T * scale + mask) v``. It never launches anything and
never imports torch: the arrays only need ``.shape`` and ``.dtype`` (numpy arrays and
sim.SimArray for the CPU simulator, torch tensors for cuTile on a GPU). The caller
(sim.launch or gpu/launch.py) runs the launches in order.

The caller passes arrays already 4D and contiguous, the mask already float32 and
expanded to [MB, MH, Sq, Sk] with MB in {1, B} and MH in {1, Hq}.
"""
from __future__ import annotations

import dataclasses
import math
import struct
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional

import cuda.tile as ct

from .kernels import fused as _fused
from .kernels import naive as _naive
from .kernels.common import FLOAT32_MAX, LOG2E

KERNELS = ("fused", "naive")
INPUT_DTYPES = ("float16", "bfloat16")
MAX_HEAD_DIM = 256
MIN_TILE, MAX_TILE = 16, 256
#: Arrays with more elements than this get int64 shape/stride/index math: a launch with
#: int32 indexing refuses a shape or stride past INT32_MAX ("stride is too big").
INT32_MAX = 2**31 - 1

#: Launch names, in launch order, per kernel.
LAUNCH_NAMES = {
    "fused": ("fused",),
    "naive": ("naive.scores", "naive.softmax", "naive.pv"),
}


@dataclass(frozen=True)
class Launch:
    kernel: object                 # a @ct.kernel
    grid: tuple[int, int, int]
    args: tuple                    # arrays, python float scale, python int/bool Constants
    name: str


# --------------------------------------------------------------------------------------
# Tiles
# --------------------------------------------------------------------------------------
def default_tiles(head_dim: int, arch: str = "sm_90", causal: bool = False) -> dict[str, int]:
    """Default {"TILE_M", "TILE_N"} for a head dim, a target ("sm_90", "sm_120", ...) and
    the causal flag. The tuned-config store (spak.tune.store), when it has an entry, wins.

    sm_90 (H100/H200), from ci/perf_probe.py@f3e1eb2 on an H200 with occupancy 2 (results/
    perf-probe-h200-2026-11-22.md): D<=64: 128x128 non-causal, 128x64 causal (the
    diagonal wastes less of a narrower key tile); D=128: 64x128 (128x128 spills: half
    the speed). D=256 keeps the float32 accumulator small: 64x64.
    Other archs (sm_80/86/89/120: smaller shared memory, no wgmma): 64x64 up to D=128,
    64x32 for D=256. Untuned guesses until the sweeper measures them.
    """
    d = _tile_width(_check_int("head_dim", head_dim, 1, MAX_HEAD_DIM))
    if arch == "sm_90" or arch.startswith("sm_10"):
        if d <= 64:
            return {"TILE_M": 128, "TILE_N": 64 if causal else 128}
        return {"TILE_M": 64, "TILE_N": 128 if d == 128 else 64}
    return {"TILE_M": 64, "TILE_N": 32 if d > 128 else 64}


def _tile_width(n: int) -> int:
    """Power-of-two tile extent covering n (at least 16: the tensor-core K minimum)."""
    return max(16, 1 << (n - 1).bit_length())


# --------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------
def plan_fmha(kernel_name: str, q, k, v, out, *,
              mask=None,
              causal: bool = False,
              scale: Optional[float] = None,
              tiles: Optional[dict] = None,
              alloc: Optional[Callable[[tuple, str], Any]] = None,
              lse=None) -> list[Launch]:
    """Launches computing ``out = softmax(q k^T * scale + mask) v``.

    q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], out [B, Hq, Sq, Dv],
    fp16 or bf16 (all the same); Hq a multiple of Hkv (GQA); D, Dv <= 256 (powers of two
    are the efficient case; others are padded with zeros inside the tiles).
    mask: None or a float32 [MB, MH, Sq, Sk] additive mask, MB in {1, B}, MH in {1, Hq}.
    causal: bottom-right aligned (query i sees key j iff j <= i + Sk - Sq).
    scale: default 1/sqrt(D); any finite number (0 and negative included).
    tiles: {"TILE_M": .., "TILE_N": ..}, powers of two in [16, 256]; default
    ``default_tiles(D)``.
    alloc(shape, kind), kind "float32" or "input" (q's dtype): makes the workspaces
    (naive's S and P, and the (1,1,1,1) dummy mask when mask is None). May be omitted
    when q is a numpy array.
    lse: None, or a float32 [B, Hq, Sq] contiguous array that also receives the row
    log-sum-exp for the backward (gpu.plan_bwd), "fused" only: natural log,
    lse[r] = log(sum_j exp(scale * s_rj + mask_rj)), +inf for a row that sees no key.
    The launch is then the fused kernel's LSE entry point (same output bits); None
    plans exactly the inference launch.

    Returns [] when there is nothing to compute (Sq, B or Hq is 0). When Sk is 0 the
    kernels write zeros.
    """
    if kernel_name not in KERNELS:
        raise ValueError(f"kernel_name must be one of {KERNELS}, got {kernel_name!r}")
    B, Hq, Sq, D, Hkv, Sk, Dv = _check_qkvo(q, k, v, out)
    dtype = _dtype_name(q)
    causal = _check_bool("causal", causal)
    scale = _check_scale(scale, D)
    tm, tn, lat_k, lat_v = _check_tiles(tiles, D, causal)
    has_mask = mask is not None
    if has_mask:
        _check_mask(mask, B, Hq, Sq, Sk)
    if lse is not None:
        _check_lse(kernel_name, lse, B, Hq, Sq)

    if B * Hq * Sq == 0:
        return []
    _check_grid(kernel_name, B, Hq)
    alloc = _resolve_alloc(alloc, q, dtype)
    if not has_mask:
        mask = alloc((1, 1, 1, 1), "float32")     # never read: HAS_MASK=False

    head_dim, head_dim_v = _tile_width(D), _tile_width(Dv)
    m_tiles = _cdiv(Sq, tm)
    if kernel_name == "fused":
        raw_max, c_pow2 = raw_max_args(scale, has_mask)
        if lse is not None:
            return [_launch(_fused.fmha_fwd_lse_kernel, (m_tiles, Hq, B),
                            (q, k, v, out, mask, lse, scale, c_pow2, head_dim, head_dim_v,
                             tm, tn, causal, has_mask, raw_max, Hq // Hkv, lat_k, lat_v),
                            "fused")]
        return [_launch(_fused.fmha_fwd_kernel, (m_tiles, Hq, B),
                        (q, k, v, out, mask, scale, c_pow2, head_dim, head_dim_v, tm, tn,
                         causal, has_mask, raw_max, Hq // Hkv, lat_k, lat_v),
                        "fused")]

    # naive: S (float32) and P (input dtype) workspaces through global memory, padded to
    # whole tiles (the scores kernel writes -inf past Sk, so P is 0 there). Why: with a
    # ragged extent the compiler loads S element by element into another register layout,
    # and the row sums then run in an order the simulator does not model (measured on an
    # H100: Sk = 1000 was 99.8% bit-identical, every tile-multiple shape 100%).
    s = alloc((B, Hq, m_tiles * tm, _cdiv(Sk, tn) * tn), "float32")
    p = alloc((B, Hq, m_tiles * tm, _cdiv(Sk, tn) * tn), "input")
    launches = []
    if Sk > 0:   # with no keys, S and P are empty and P V writes zeros on its own
        launches.append(_launch(_naive.naive_scores_kernel, (m_tiles, _cdiv(Sk, tn), B * Hq),
                                (q, k, mask, s, scale, head_dim, tm, tn, causal, has_mask),
                                "naive.scores"))
        launches.append(_launch(_naive.naive_softmax_kernel, (m_tiles, B * Hq, 1),
                                (s, p, tm, tn), "naive.softmax"))
    launches.append(_launch(_naive.naive_pv_kernel, (m_tiles, B * Hq, 1),
                            (p, v, out, head_dim_v, tm, tn), "naive.pv"))
    return launches


def _launch(kernel, grid, args, name) -> Launch:
    """A Launch, switched to the kernel's int64-indexed twin when an array needs it."""
    if any(_numel(a) > INT32_MAX for a in args if hasattr(a, "shape")):
        kernel = int64_variant(kernel)
    return Launch(kernel, grid, args, name)


def _numel(a) -> int:
    return math.prod(int(n) for n in a.shape)


_INT64_VARIANTS: dict = {}


def int64_variant(kernel):
    """The same kernel body with every array parameter annotated ``ct.IndexedWithInt64``.

    A launch with the default int32 indexing refuses arrays whose shape or strides pass
    INT32_MAX (naive's S and P, or a full [B, Hq, Sq, Sk] mask, get there first). The twin
    shares the kernel's code and globals (so the simulator sees the same source) and is
    built once per kernel; small problems keep the cheaper int32 kernel.
    """
    twin = _INT64_VARIANTS.get(kernel)
    if twin is None:
        fn = kernel._annotated_function.pyfunc
        ann = dict(fn.__annotations__)
        for name in list(fn.__code__.co_varnames[:fn.__code__.co_argcount]):
            if name not in ann:                 # unannotated parameters are the arrays
                ann[name] = ct.IndexedWithInt64
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_i64",
                                 fn.__defaults__, fn.__closure__)
        new.__annotations__ = ann
        new.__qualname__ = fn.__qualname__ + "_i64"
        new.__module__ = fn.__module__
        new.__doc__ = fn.__doc__
        # same compiler options (occupancy, num_ctas, ...): ct.kernel(new) alone would
        # drop the kernel's decorator options
        opts = kernel._compiler_options
        twin = _INT64_VARIANTS[kernel] = ct.kernel(new).replace_hints(
            **{f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)})
    return twin


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------
def _shape(name: str, x) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name} must be an array with a .shape, got {type(x).__name__}")
    return tuple(int(n) for n in shape)


def _dtype_name(x) -> str:
    """'float16', 'bfloat16', 'float32', ... from a numpy, torch or cuTile dtype."""
    dt = getattr(x, "dtype", None)
    name = getattr(dt, "name", None)            # numpy dtype, cuTile DType
    if not isinstance(name, str):
        name = str(dt)                          # torch.float16 -> 'torch.float16'
    return name.rsplit(".", 1)[-1]


def _shapes(named, ndim: int, layout: str = "") -> dict:
    """{name: shape} of (name, array) pairs, each `ndim`-D (`layout` names the dims)."""
    shapes = {}
    for name, x in named:
        shapes[name] = _shape(name, x)
        if len(shapes[name]) != ndim:
            raise ValueError(f"{name} must be {ndim}D{layout}, got shape {shapes[name]}")
    return shapes


def _check_head_dims(D: int, Dv: int) -> None:
    for name, d in (("q/k head dim", D), ("v head dim", Dv)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name} must be in [1, {MAX_HEAD_DIM}], got {d}")


def _check_inputs(named) -> None:
    """(name, array) pairs, q first: each contiguous, q fp16 or bf16, the rest q's dtype."""
    for name, x in named:
        _check_contiguous(name, x)
    names = {n: _dtype_name(x) for n, x in named}
    if names["q"] not in INPUT_DTYPES:
        raise TypeError(f"q dtype must be one of {INPUT_DTYPES}, got {names['q']}")
    for n, _ in named[1:]:
        if names[n] != names["q"]:
            raise TypeError(f"{n} dtype ({names[n]}) must match q dtype ({names['q']})")


#: CUDA's limit on a grid's y and z extents (x allows 2^31 - 1).
MAX_GRID_YZ = 65535


def _check_grid(kernel_name, B, Hq):
    """The launch grids fit the GPU: the fused kernel puts heads on y and the batch on z,
    the naive kernels B * Hq on one of y/z. A clear error instead of a launch failure."""
    if kernel_name == "fused":
        if B > MAX_GRID_YZ or Hq > MAX_GRID_YZ:
            raise ValueError(f"batch ({B}) and q heads ({Hq}) must each be <= {MAX_GRID_YZ} "
                             "for the fused kernel (the GPU's grid limit on its y and z axes)")
    elif B * Hq > MAX_GRID_YZ:
        raise ValueError(f"batch * q heads ({B * Hq}) must be <= {MAX_GRID_YZ} for the naive "
                         "kernel (the GPU's grid limit on its y and z axes)")


def _check_qkvo(q, k, v, out):
    named = (("q", q), ("k", k), ("v", v), ("out", out))
    shapes = _shapes(named, 4, " [batch, heads, seq, head_dim]")
    B, Hq, Sq, D = shapes["q"]
    Bk, Hkv, Sk, Dk = shapes["k"]
    Bv, Hv, Sv, Dv = shapes["v"]
    if Bk != B or Bv != B:
        raise ValueError(f"batch sizes differ: q {B}, k {Bk}, v {Bv}")
    if Hv != Hkv:
        raise ValueError(f"k and v must have the same number of heads, got {Hkv} and {Hv}")
    if Hkv == 0 and Hq != 0 or Hkv != 0 and Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv}) (GQA)")
    if Sv != Sk:
        raise ValueError(f"k and v must have the same sequence length, got {Sk} and {Sv}")
    if Dk != D:
        raise ValueError(f"q and k must have the same head dim, got {D} and {Dk}")
    _check_head_dims(D, Dv)
    if shapes["out"] != (B, Hq, Sq, Dv):
        raise ValueError(f"out must have shape {(B, Hq, Sq, Dv)} [B, Hq, Sq, Dv], "
                         f"got {shapes['out']}")
    _check_inputs(named)
    return B, Hq, Sq, D, Hkv, Sk, Dv


def _check_mask(mask, B, Hq, Sq, Sk):
    shape = _shape("mask", mask)
    if (len(shape) != 4 or shape[0] not in (1, B) or shape[1] not in (1, Hq)
            or shape[2:] != (Sq, Sk)):
        raise ValueError(f"mask must have shape [MB, MH, Sq, Sk] with MB in {{1, {B}}}, "
                         f"MH in {{1, {Hq}}}, Sq={Sq}, Sk={Sk}; got {shape}")
    name = _dtype_name(mask)
    if name != "float32":
        raise TypeError(f"mask dtype must be float32, got {name}")
    _check_contiguous("mask", mask)


def _check_lse(kernel_name, lse, B, Hq, Sq):
    if kernel_name != "fused":
        raise ValueError(f"lse is computed by the 'fused' kernel only, not by {kernel_name!r}")
    check_rows("lse", lse, B, Hq, Sq)


def check_rows(name, x, B, Hq, Sq):
    """A float32 [B, Hq, Sq] contiguous per-row array (the LSE, the backward's delta)."""
    shape = _shape(name, x)
    if shape != (B, Hq, Sq):
        raise ValueError(f"{name} must have shape {(B, Hq, Sq)} [B, Hq, Sq], got {shape}")
    dt = _dtype_name(x)
    if dt != "float32":
        raise TypeError(f"{name} dtype must be float32, got {dt}")
    _check_contiguous(name, x)


def _check_contiguous(name, x):
    """Reject non-contiguous views (torch, numpy, sim.SimArray); the caller copies."""
    if callable(getattr(x, "is_contiguous", None)):          # torch
        ok = x.is_contiguous()
    else:
        flags = getattr(x, "flags", None) or getattr(getattr(x, "data", None), "flags", None)
        ok = getattr(flags, "c_contiguous", True)             # numpy, SimArray; else trust
    if not ok:
        raise ValueError(f"{name} must be contiguous (row-major); "
                         f"pass a contiguous copy")


def _check_bool(name, value) -> bool:
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def _check_int(name, value, lo, hi) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


#: The kernels take scale as a float32 and work with scale * log2(e) in float32.
FLOAT32_MIN_NORMAL = 1.1754943508222875e-38
MAX_SCALE = FLOAT32_MAX / LOG2E / 2          # |scale| above this: scale*log2(e) ~ overflow


def _float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def raw_max_args(scale: float, has_mask: bool) -> tuple[bool, float]:
    """(RAW_MAX, scale_log2_pow2) for the fused kernel.

    RAW_MAX (row max on raw scores, one FFMA per exponent) needs max(x * c) == max(x) * c,
    so c = scale * log2(e) > 0, and no mask (a mask is added after scaling). c must also
    be a NORMAL float32: a subnormal c is 0 on the GPU (flush to zero) and -inf * 0 = NaN
    for masked keys; so must scale_log2_pow2 >= c/2, hence c >= 2 * the smallest normal.
    scale_log2_pow2 is the power of two in (c/2, c] that the kernel uses for rows with
    huge scores (gpu/kernels/fused.py, _raw_max_step); 1.0 when unused.
    """
    c = _float32(_float32(scale) * _float32(LOG2E))   # exact product, then rounded once
    if has_mask or not c >= 2 * FLOAT32_MIN_NORMAL:
        return False, 1.0
    return True, math.ldexp(0.5, math.frexp(c)[1])


def _check_scale(scale, head_dim) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, (bool, str, bytes)):
        raise TypeError(f"scale must be a real number (float or int), got {scale!r}")
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale must be a real number (float or int), got {scale!r}") from None
    # any finite value: 0 gives uniform weights (plus mask), negative flips the scores
    if not math.isfinite(value):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    if abs(value) > MAX_SCALE:
        raise ValueError(f"scale must be within +-{MAX_SCALE:.3g} (the kernels hold "
                         f"scale*log2(e) in float32), got {scale!r}")
    return value


#: Kernel Constant knobs a tiles dict may carry besides TILE_M/TILE_N (fused kernel only):
#: DRAM latency hints for the K and V loads, 1..10, 0 = the compiler's choice.
LATENCY_KEYS = ("LAT_K", "LAT_V")


def _check_tiles(tiles, head_dim, causal=False) -> tuple[int, int, int, int]:
    t = merge_tiles(tiles, dict(default_tiles(head_dim, causal=causal), LAT_K=0, LAT_V=0),
                    ("TILE_M", "TILE_N", *LATENCY_KEYS), "TILE_M and TILE_N")
    check_pow2_tiles(t, ("TILE_M", "TILE_N"))
    for key in LATENCY_KEYS:
        _check_int(f"tiles[{key!r}]", t[key], 0, 10)
    return int(t["TILE_M"]), int(t["TILE_N"]), int(t["LAT_K"]), int(t["LAT_V"])


def merge_tiles(tiles, defaults: dict, keys, what: str, got=repr) -> dict:
    """A copy of `defaults` updated with the non-None values of `tiles` (None: none);
    TypeError "tiles must be a dict with <what>, got <got(tiles)>" for a non-dict,
    ValueError naming keys not in `keys`. The planners' tile dicts all start here."""
    t = dict(defaults)
    if tiles is not None:
        if not isinstance(tiles, dict):
            raise TypeError(f"tiles must be a dict with {what}, got {got(tiles)}")
        unknown = set(tiles) - set(keys)
        if unknown:
            raise ValueError(f"tiles: unknown keys {sorted(map(str, unknown))}; "
                             f"accepted: {', '.join(keys)}")
        t.update({k: v for k, v in tiles.items() if v is not None})
    return t


def check_pow2_tiles(t: dict, keys, lo: int = MIN_TILE, hi: int = MAX_TILE) -> dict:
    """t[key] for each of `keys` an int power of two in [lo, hi], stored back as an int."""
    for key in keys:
        n = _check_int(f"tiles[{key!r}]", t[key], lo, hi)
        if n & (n - 1):
            raise ValueError(f"tiles[{key!r}] must be a power of two, got {n}")
        t[key] = n
    return t


def _type_name(x) -> str:
    return type(x).__name__


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _resolve_alloc(alloc, q, dtype):
    if alloc is not None:
        if not callable(alloc):
            raise TypeError(f"alloc must be callable(shape, kind), got {alloc!r}")
        return alloc
    import numpy as np
    if type(q) is not np.ndarray:
        raise ValueError("alloc(shape, kind) is required unless q is a numpy array "
                         f"(q is {type(q).__name__}, dtype {dtype})")

    def numpy_alloc(shape, kind):
        return np.zeros(shape, dtype=np.float32 if kind == "float32" else q.dtype)
    return numpy_alloc
