"""`spak.fmha`: SPAK's cuTile attention for PyTorch CUDA tensors.

    out = spak.fmha(q, k, v, is_causal=True)           # like F.scaled_dot_product_attention

It mirrors ``torch.nn.functional.scaled_dot_product_attention`` where they overlap:

* q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] -> [B, Hq, Sq, Dv]; fp16 or bf16,
  all three the same; D, Dv in [1, 256]; one CUDA device.
* ``attn_mask``: a bool mask (True = attend) or an additive float mask, broadcastable to
  [B, Hq, Sq, Sk]. Rows with no allowed key give zeros (SDPA gives NaN there).
* ``is_causal``: bottom-right aligned, as in prefill with a KV cache: query i sees key j
  iff j <= i + Sk - Sq. For Sq == Sk this is SDPA's causal; for Sq != Sk SDPA's is_causal
  is top-left. Unlike SDPA, is_causal and attn_mask may be combined.
* ``scale``: default 1/sqrt(D); any finite real number, 0 and negative included.
* ``enable_gqa``: must be True when Hq != Hkv (Hq a multiple of Hkv), as in SDPA.
* ``kernel``: "fused" (one pass, online softmax) or "naive" (three kernels through memory).
* ``tiles``: {"TILE_M": .., "TILE_N": ..}; default: the tuned-config store
  (spak.tune.store) for this GPU, else gpu.plan.default_tiles(D, arch).

Every input is validated before anything runs (ValueError / TypeError naming the argument
and the accepted values; docs/errors.md has the table). Non-contiguous inputs are copied.
Values inside q/k/v are not checked: NaN/inf in q, k, v or the mask propagate as in SDPA
(both kernels; docs/errors.md, "NaN and inf").

Autograd: gradients flow to q, k and v (kernel "fused"; the forward then also writes the
row log-sum-exp, and autograd keeps q, k, v, out and that float32 [B, Hq, Sq] LSE: O(S)
extra state, never S x S). No gradient flows to ``attn_mask``: a mask that requires grad
is refused (ValueError). ``kernel="naive"`` has no backward (NotImplementedError when
backward is called). Works under ``torch.compile(fullgraph=True)`` and
``torch.utils.checkpoint``.

``spak.fmha`` is registered as the torch custom op ``torch.ops.spak.fmha`` (fake
implementations included), so ``torch.compile`` graphs can hold it; under torch.compile
the tile lookup happens in the op's body at run time. Plain eager calls (plain tensors,
no autograd, no torch.compile/jit.trace, no torch function/dispatch mode, functorch
transform or profiler) call the op's body directly (training ones one autograd.Function
over the same bodies, _Train), and a call whose signature was already validated skips
validation and the tile lookup: both cost more host time than a short kernel takes (see
fmha(); docs/host-path.md).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from typing import Optional

import torch

from spak import bwd_ready as _bwd_ready
from spak.torch_checks import DTYPES, check_devices, check_dtypes, check_tiles
from spak.torch_checks import MAX_SCALE  # noqa: F401 (spak.api.MAX_SCALE)
from spak.torch_checks import check_scale as _check_scale
from spak.tune import store as tuned

__all__ = ["fmha", "validate", "resolve_tiles", "KERNELS", "DTYPES", "MAX_HEAD_DIM"]

KERNELS = ("fused", "naive")
MAX_HEAD_DIM = 256
_MASK_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --------------------------------------------------------------------------- validation

class _Checked:
    """What validate() found: sizes plus the normalised arguments."""
    __slots__ = ("B", "Hq", "Hkv", "Sq", "Sk", "D", "Dv", "scale", "mask", "causal",
                 "kernel", "tiles")


def validate(q, k, v, *, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
             kernel="fused", tiles=None, require_cuda: bool = True) -> _Checked:
    """Check every argument of fmha; raise ValueError/TypeError naming the culprit.

    Order: types, ndim, dtypes, sizes (batch, heads, GQA, seq, head dims, zero sizes),
    mask, flags, scale, kernel, tiles, then devices (so shape errors are reported for CPU
    or meta tensors too). Returns the sizes and the normalised scale (a float, or None).
    """
    B, Hq, Hkv, Sq, Sk, D, Dv = _check_qkv(q, k, v)
    _check_heads(Hq, Hkv, enable_gqa)
    mask = None if attn_mask is None else _check_mask(attn_mask, (B, Hq, Sq, Sk))
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    scale = _check_scale(scale)
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if tiles is not None:
        tiles = _check_tiles(tiles)
    _check_devices(q, k, v, mask, require_cuda)
    c = _Checked()
    c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, c.Dv = B, Hq, Hkv, Sq, Sk, D, Dv
    c.scale, c.mask, c.causal, c.kernel, c.tiles = scale, mask, is_causal, kernel, tiles
    return c


def _check_qkv(q, k, v) -> tuple:
    """Types, ndim, dtypes and matching sizes of q, k, v: (B, Hq, Hkv, Sq, Sk, D, Dv)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4D [batch, heads, seq, head_dim], got "
                             f"{t.dim()}D shape {tuple(t.shape)}")
    check_dtypes(q, (("k", k), ("v", v)))
    B, Hq, Sq, D = q.shape
    Bk, Hkv, Sk, Dk = k.shape
    Bv, Hv, Sv, Dv = v.shape
    if Bk != B or Bv != B:
        raise ValueError(f"batch sizes must match: q {B}, k {Bk}, v {Bv}")
    if Hv != Hkv:
        raise ValueError(f"k and v must have the same number of heads, got k {Hkv}, v {Hv}")
    if Sv != Sk:
        raise ValueError(f"k and v must have the same sequence length, got k {Sk}, v {Sv}")
    if Dk != D:
        raise ValueError(f"q and k must have the same head_dim, got q {D}, k {Dk}")
    for name, d in (("q/k head_dim", D), ("v head_dim", Dv)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name} must be in [1, {MAX_HEAD_DIM}], got {d}")
    return B, Hq, Hkv, Sq, Sk, D, Dv


def _check_heads(Hq: int, Hkv: int, enable_gqa) -> None:
    """Head counts and grouped-query attention (SDPA's enable_gqa convention)."""
    if Hkv == 0 and Hq != 0:
        raise ValueError(f"k/v heads must be >= 1 when q has {Hq} heads, got 0")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {enable_gqa!r}")
    if Hkv and Hq != Hkv:
        if Hq % Hkv:
            raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv}) "
                             f"for grouped-query attention")
        if not enable_gqa:
            raise ValueError(f"q has {Hq} heads but k/v have {Hkv}: pass enable_gqa=True "
                             f"for grouped-query attention (as in SDPA)")


def _check_mask(attn_mask, full_shape: tuple):
    """A bool (True = attend) or float (additive) mask broadcasting to [B, Hq, Sq, Sk]."""
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got "
                        f"{type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and attn_mask.dtype not in _MASK_FLOAT:
        raise TypeError(f"attn_mask dtype must be torch.bool (True = attend) or a float "
                        f"dtype (additive: float16, bfloat16, float32, float64), "
                        f"got {attn_mask.dtype}")
    if attn_mask.dim() > 4:
        raise ValueError(f"attn_mask must have at most 4 dims, got shape "
                         f"{tuple(attn_mask.shape)}")
    try:
        torch.broadcast_shapes(tuple(attn_mask.shape), full_shape)
    except RuntimeError:
        raise ValueError(f"attn_mask shape {tuple(attn_mask.shape)} does not broadcast "
                         f"to [B, Hq, Sq, Sk] = {list(full_shape)}") from None
    return attn_mask


def _check_devices(q, k, v, mask, require_cuda: bool) -> None:
    """One device for every tensor, and a CUDA one unless the caller allows otherwise."""
    check_devices([("q", q), ("k", k), ("v", v)], [("attn_mask", mask)], require_cuda,
                  "spak.fmha", "the simulator (`spak sim`) or torch SDPA")


def _check_tiles(tiles) -> dict:
    return check_tiles(tiles, ("TILE_M", "TILE_N"), "{'TILE_M': int, 'TILE_N': int}")


# ---------------------------------------------------------------------- tiles, masks

def device_arch(device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


#: Config keys a tuned entry or a `tiles` dict may carry: kernel constants (tiles, load
#: latency knobs) and decorator hints (occupancy, num_ctas; 0 or None = the kernel's own).
CONFIG_KEYS = ("TILE_M", "TILE_N", "LAT_K", "LAT_V", "occupancy", "num_ctas")


def resolve_tiles(kernel: str, dtype, D: int, causal: bool, Sk: int, device,
                  tiles: Optional[dict] = None, rows: Optional[int] = None) -> dict:
    """The launch config: `tiles` as given (filled up from defaults), else the tuned store's
    entry (all of its keys: tiles, knobs and hints), else the default tiles. ``rows``
    (B * Hq * Sq) lets a small-grid store entry serve the problem (spak.tune.store)."""
    from spak.gpu.plan import default_tiles
    arch, gpu_name = _device_info(device)
    base = default_tiles(D, arch, causal)
    if tiles:
        return {**base, **tiles}
    found = _lookup(gpu_name, kernel, str(dtype), D, causal, Sk, rows)
    if found:
        base = {**base, **{k: int(found[k]) for k in CONFIG_KEYS if found.get(k) is not None}}
    return off_grid_config(base, D, Sk, arch) if kernel == "fused" else base


def off_grid_config(cfg: dict, D: int, Sk: int, arch: str) -> dict:
    """The tuned or default config for a key length off the 16-grid (issue 35). ct.launch
    declares an extent divisible by 16 only when it is; for a ragged Sk, the fused
    forward's sm_90 cubin at D <= 64 with 128 x 128 tiles then spills 368 bytes a thread
    (64 when Sk is declared divisible; tileiras 13.4 on the CPU), and spak.fmha ran ~1/3
    slower (H100, 16 x 1000: 242 TFLOPS against 382 at 16 x 1024). 64 query rows with
    occupancy 2 do not spill there (0 bytes, ragged or not) and took 0.678 of the time on
    that shape, bit-identical (results/issue18-h100-2026-11-28, run 20): that config is
    used instead. Explicit tiles are never changed (resolve_tiles returns them first); nor
    are key lengths within one 128-key tile (no interior loop step: unmeasured, kept)."""
    if Sk % 16 == 0 or Sk <= 128 or arch != "sm_90" or D > 64 \
            or cfg.get("TILE_M") != 128 or cfg.get("TILE_N") != 128:
        return cfg
    return {**cfg, "TILE_M": 64, "occupancy": 2}


@functools.lru_cache(maxsize=None)
def _device_info(device) -> tuple[str, str]:
    """(arch, name) of a CUDA device, asked once: spak.fmha's per-call host time matters
    for short sequences, where the kernel itself takes ~0.1 ms."""
    return device_arch(device), torch.cuda.get_device_name(device)


_lookup_cache: dict = {}


def _lookup(gpu_name, kernel, dtype, D, causal, Sk, rows=None):
    """spak.tune.store.lookup, memoised per (problem class, rows, store file version)."""
    key = (gpu_name, kernel, dtype, D, causal, tuned.seq_bucket(Sk), rows, _store_version())
    if key not in _lookup_cache:
        _lookup_cache[key] = tuned.lookup(gpu_name, kernel, dtype, D, causal, Sk, rows=rows)
    return _lookup_cache[key]


def _store_version() -> tuple:
    """(path, mtime_ns or None) of the tuned-config store: a rewritten store (`spak sweep`,
    `spak store update`, SPAK_TUNED_CONFIGS pointed elsewhere) is a new version.

    Asked again at most every STORE_RECHECK_S seconds, or at once after this process wrote
    a store (spak.tune.store.write_store counts its writes): the environment lookup and the
    stat() cost ~3-6 us, a third of an eager spak.fmha call's host time (issue 34). Another
    process's rewrite is therefore seen within STORE_RECHECK_S."""
    now = _monotonic()
    if now - _STORE_SEEN[0] < STORE_RECHECK_S and _STORE_SEEN[1] == tuned.WRITES[0]:
        return _STORE_SEEN[2]
    writes = tuned.WRITES[0]
    path = tuned.store_path()
    try:
        version = str(path), path.stat().st_mtime_ns
    except OSError:
        version = str(path), None
    _STORE_SEEN[:] = [now, writes, version]
    return version


#: seconds between two looks at the store file (0: every call)
STORE_RECHECK_S = 1.0
_STORE_SEEN: list = [-math.inf, -1, None]      # [when, store writes then, version]
_monotonic = time.monotonic


def kernel_mask(mask: torch.Tensor, B: int, Hq: int, Sq: int, Sk: int) -> torch.Tensor:
    """float32 [MB, MH, Sq, Sk] (MB in {1, B}, MH in {1, Hq}), contiguous, bool -> 0/-inf."""
    if mask.dtype == torch.bool:
        m = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        m.masked_fill_(~mask, float("-inf"))
    else:
        m = mask.to(torch.float32)
    m = m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))
    mb = B if m.shape[0] == B else 1
    mh = Hq if m.shape[1] == Hq else 1
    return m.expand(mb, mh, Sq, Sk).contiguous()


# -------------------------------------------------------------------------- the ops
#
# torch.ops.spak.fmha is what spak.fmha calls whenever the eager fast path does not apply
# (autograd, torch.compile, modes, subclasses). It is a CompositeImplicitAutograd op: it
# decomposes, above autograd, into one of two custom ops, so that a call that needs no
# gradient never pays for one and a call that does gets the forward's row log-sum-exp:
#   spak::fmha_fwd    (inference)  -> out
#   spak::fmha_train  (grad needed) -> (out, lse), with an autograd formula whose backward
#                                      is spak::fmha_bwd -> (dq, dk, dv)
# Saved for the backward: q, k, v, out, lse (float32 [B, Hq, Sq]) and the caller's mask:
# O(S) state beside the inputs, never an S x S tensor.

_SAME_DEVICE = contextlib.nullcontext()     # reusable: no guard object per call

_OP_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool is_causal, float scale, "
              "str kernel, SymInt tile_m, SymInt tile_n, SymInt lat_k=0, SymInt lat_v=0, "
              "SymInt occupancy=0, SymInt num_ctas=0)")


def _launch_config(q, k, kernel, is_causal, tile_m, tile_n, lat_k, lat_v, occupancy,
                   num_ctas) -> tuple[dict, dict]:
    """(tiles, hints) for gpu.launch. tile_m or tile_n 0 = not chosen by the caller: the
    config is looked up here, at run time. torch.compile passes zeros because the lookup
    asks the CUDA driver for the GPU's name and reads the tuned-config store, neither of
    which a traced graph may do (issue 20); the result is the one eager resolve_tiles
    gives (explicit tiles filled from the defaults, else the tuned entry, else defaults)."""
    c = launch_settings(kernel, q.dtype, q.shape[3], is_causal, k.shape[2], q.device,
                        q.shape[0] * q.shape[1] * q.shape[2], tile_m, tile_n, lat_k, lat_v,
                        occupancy, num_ctas)
    tiles = {"TILE_M": c["TILE_M"], "TILE_N": c["TILE_N"]}
    if kernel == "fused":
        tiles.update(LAT_K=c["LAT_K"], LAT_V=c["LAT_V"])
    return tiles, {"occupancy": c["occupancy"] or None, "num_ctas": c["num_ctas"] or None}


def launch_settings(kernel: str, dtype, D: int, causal: bool, Sk: int, device, rows: int,
                    tile_m: int = 0, tile_n: int = 0, lat_k: int = 0, lat_v: int = 0,
                    occupancy: int = 0, num_ctas: int = 0) -> dict:
    """{"TILE_M", "TILE_N", "LAT_K", "LAT_V", "occupancy", "num_ctas"} (ints, 0: none) of
    a forward launch: the given ones, or (tile_m or tile_n 0: not chosen by the caller)
    resolve_tiles' (explicit tiles filled from the defaults, else the tuned entry for
    ``rows`` = B * Hq * Sq, else the defaults). Shared by spak.fmha and spak.fmha_varlen,
    which launches spak.fmha's config for its padded batch."""
    if not (tile_m and tile_n):
        given = {key: val for key, val in (("TILE_M", tile_m), ("TILE_N", tile_n)) if val}
        t = resolve_tiles(kernel, dtype, D, causal, Sk, device, given or None, rows=rows)
        tile_m, tile_n = int(t["TILE_M"]), int(t["TILE_N"])
        if not given:
            lat_k, lat_v, occupancy, num_ctas = (int(t.get(key) or 0) for key in
                                                 ("LAT_K", "LAT_V", "occupancy", "num_ctas"))
    return {"TILE_M": tile_m, "TILE_N": tile_n, "LAT_K": lat_k, "LAT_V": lat_v,
            "occupancy": occupancy, "num_ctas": num_ctas}


def _on_device(device, call):
    """Run call(stream) on `device`'s current stream, with cuTile compile errors explained.
    When `device` is the current GPU (the common case) skip the guard's device switch."""
    dev = device.index
    import spak.gpu.launch as gl
    # gl.current_device: torch.cuda.current_device() without its Python wrapper
    guard = _SAME_DEVICE if dev == gl.current_device() else torch.cuda.device(dev)
    try:
        with guard:
            return call(gl.current_raw_stream(dev))
    except Exception as exc:
        from spak.device import env as gpu_env
        if gpu_env.is_compile_error(exc):
            raise gpu_env.explain(exc, arch=device_arch(device)) from exc
        raise


def _forward(q, k, v, attn_mask, is_causal, scale, kernel, tile_m, tile_n, lat_k, lat_v,
             occupancy, num_ctas, lse=None) -> torch.Tensor:
    """The forward's CUDA body (spak::fmha_fwd, spak::fmha_train); `lse`, when given,
    receives the row log-sum-exp (fused kernel only; +inf for a row that sees no key)."""
    key = None
    if attn_mask is None and tile_m and tile_n and scale:      # scale 0.0 == -0.0: not keyed
        key = (q.shape, k.shape, v.shape, q.dtype, q.device, is_causal, scale, kernel, tile_m,
               tile_n, lat_k, lat_v, occupancy, num_ctas, lse is None)
        ready = _READY.get(key)
        if ready is not None:
            return _launch_ready(ready, q, k, v, lse)
    # imported here so that importing spak.api needs no cuTile; per call, `import a.b as c`
    # costs a third of `from a.b import x, y`
    import spak.gpu.launch as gl
    B, Hq, Sq, D = q.shape
    Sk, Dv = k.shape[2], v.shape[3]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty((B, Hq, Sq, Dv), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    if Sk == 0 or k.shape[1] == 0:
        if lse is not None:
            lse.fill_(math.inf)                # a row that sees no key (gpu.plan's rule)
        return out.zero_()                     # no keys: every row is fully masked
    # Any finite scale goes to the kernels as is: gpu.plan.raw_max_args sends 0, negative
    # and masked problems to the fused kernel's general path (scores scaled before the max).
    mask = kernel_mask(attn_mask, B, Hq, Sq, Sk) if attn_mask is not None else None
    tiles, hints = _launch_config(q, k, kernel, is_causal, tile_m, tile_n, lat_k, lat_v,
                                  occupancy, num_ctas)
    extra = {} if lse is None else {"lse": lse}     # the inference call stays as it was
    _on_device(q.device, lambda stream: gl.fmha_into(
        kernel, q, k, v, out, mask=mask, causal=is_causal, scale=scale, tiles=tiles,
        hints=hints, stream=stream, **extra))
    if key is not None and kernel == "fused":
        ready = gl.fused_ready(q, k, v, out, lse, is_causal, scale, tiles, hints)
        if ready is not None:               # None under CUDA-graph capture (gpu.launch)
            if len(_READY) >= 512:
                _READY.clear()
            _READY[key] = (q.device.index, tuple(out.shape), gl) + ready
    return out


_READY: dict = {}
"""_forward's launches made before: op arguments -> (device index, out shape, gpu.launch,
grid, kernel, dummy mask, constant arguments). A call found here skips the config, the
device guard and gpu.launch's plan key: ~5 us of a ~15 us call (issue 34)."""


def _launch_ready(ready, q, k, v, lse):
    """_forward's body for a launch made before: allocate out, launch on the current
    stream. Another current device than q's takes _on_device's guard (the slow path)."""
    dev, shape, gl, grid, kernel, dummy, tail = ready
    out = torch.empty(shape, dtype=q.dtype, device=q.device)
    args = (q.contiguous(), k.contiguous(), v.contiguous(), out, dummy)
    if lse is not None:
        args += (lse,)
    if dev == gl.current_device():
        try:            # a new specialisation (another alignment) may compile here
            gl.ct.launch(gl.current_raw_stream(dev), grid, kernel, args + tail)
        except Exception as exc:
            from spak.device import env as gpu_env
            if not gpu_env.is_compile_error(exc):
                raise
            raise gpu_env.explain(exc, arch=device_arch(q.device)) from exc
    else:
        _on_device(q.device, lambda stream: gl.ct.launch(stream, grid, kernel, args + tail))
    return out


def _impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          attn_mask: Optional[torch.Tensor], is_causal: bool, scale: float, kernel: str,
          tile_m: int, tile_n: int, lat_k: int = 0, lat_v: int = 0, occupancy: int = 0,
          num_ctas: int = 0) -> torch.Tensor:
    """spak::fmha_fwd's body (the inference forward); arguments already validated by fmha()."""
    return _forward(q, k, v, attn_mask, is_causal, scale, kernel, tile_m, tile_n, lat_k,
                    lat_v, occupancy, num_ctas)


_fwd_op = torch.library.custom_op("spak::fmha_fwd", mutates_args=())(_impl)


@_fwd_op.register_fake
def _fake(q, k, v, attn_mask, is_causal, scale, kernel, tile_m, tile_n, lat_k=0, lat_v=0,
          occupancy=0, num_ctas=0):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


def _train_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: Optional[torch.Tensor], is_causal: bool, scale: float, kernel: str,
                tile_m: int, tile_n: int, lat_k: int = 0, lat_v: int = 0, occupancy: int = 0,
                num_ctas: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """spak::fmha_train's body: the forward plus its row log-sum-exp for the backward."""
    B, Hq, Sq = q.shape[:3]
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    if kernel != "fused" or not backward_available():
        # no LSE from this kernel: the backward refuses with SPAK's message (_bwd)
        out = _forward(q, k, v, attn_mask, is_causal, scale, kernel, tile_m, tile_n, lat_k,
                       lat_v, occupancy, num_ctas)
        return out, lse.fill_(math.nan)
    out = _forward(q, k, v, attn_mask, is_causal, scale, kernel, tile_m, tile_n, lat_k,
                   lat_v, occupancy, num_ctas, lse=lse)
    return out, lse


_train_op = torch.library.custom_op("spak::fmha_train", mutates_args=())(_train_impl)


@_train_op.register_fake
def _train_fake(q, k, v, attn_mask, is_causal, scale, kernel, tile_m, tile_n, lat_k=0,
                lat_v=0, occupancy=0, num_ctas=0):
    B, Hq, Sq = q.shape[0], q.shape[1], q.shape[2]
    return (q.new_empty((B, Hq, Sq, v.shape[3])),
            q.new_empty((B, Hq, Sq), dtype=torch.float32))


def _bwd_impl(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, attn_mask: Optional[torch.Tensor],
              is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """spak::fmha_bwd's body: (dq, dk, dv) of the fused forward, from its out and lse.
    GQA: dk, dv are summed over the query heads of a group inside the kernels."""
    import spak.gpu.launch as gl
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    q, k, v, out, dout = (t.contiguous() for t in (q, k, v, out, dout))
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if B * Hq * Sq == 0 or Sk == 0 or Hkv == 0:
        # no query rows: k and v had no effect; no keys: out was 0 whatever q was
        return dq.zero_(), dk.zero_(), dv.zero_()
    mask = kernel_mask(attn_mask, B, Hq, Sq, Sk) if attn_mask is not None else None
    tiles, hints = _bwd_config(q.device, q.dtype, D, is_causal, Sk)
    _on_device(q.device, lambda stream: gl.fmha_bwd_into(
        "fused", q, k, v, out, dout, lse.contiguous(), dq, dk, dv, mask=mask,
        causal=is_causal, scale=scale, stream=stream, tiles=tiles, hints=hints))
    return dq, dk, dv


_bwd_cache: dict = {}


def _bwd_config(device, dtype, D: int, causal: bool, Sk: int) -> tuple:
    """(tiles, hints) of the tuned store's fmha_bwd entry for the device's GPU (`spak
    sweep --family fmha_bwd`; its store key: dtype, head dim, causal, key-length bucket),
    or (None, None): the backward's default tiles and the kernels' own hints.

    Memoised per (device, dtype, D, causal, Sk, store version): a repeated step reads one
    dict (issue 34's host path). The version is the one the step's forward saw
    (_STORE_SEEN, which the forward's lookup refreshes), so this adds no stat()."""
    if device.type != "cuda":
        return None, None
    key = (device.type, device.index, dtype, D, causal, Sk, _STORE_SEEN[2])
    hit = _bwd_cache.get(key)
    if hit is not None:
        return hit
    _, gpu_name = _device_info(device)
    dt = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, str(dtype))
    found = tuned.lookup_key("fmha_bwd", gpu_name, "fused",
                             {"dtype": dt, "head_dim": D, "causal": causal,
                              "seq_bucket": tuned.seq_bucket(Sk)})
    config = (None, None)
    if found:
        from spak.gpu.plan_bwd import BWD_TILE_KEYS, EXTRA_KEYS
        t = {k: int(found[k]) for k in (*BWD_TILE_KEYS, *EXTRA_KEYS) if found.get(k) is not None}
        h = {k: int(found[k]) for k in ("occupancy", "num_ctas") if found.get(k) is not None}
        config = (t or None, h or None)
    if len(_bwd_cache) >= 512:
        _bwd_cache.clear()
    _bwd_cache[key] = config
    return config


_bwd_op = torch.library.custom_op("spak::fmha_bwd", mutates_args=())(_bwd_impl)


@_bwd_op.register_fake
def _bwd_fake(dout, q, k, v, out, lse, attn_mask, is_causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, is_causal, scale, kernel = inputs[:7]
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, attn_mask)
    ctx.is_causal, ctx.scale, ctx.kernel = is_causal, scale, kernel


def _backward(ctx, dout, _dlse):
    if ctx.kernel != "fused":
        raise NotImplementedError(
            f"spak.fmha: kernel={ctx.kernel!r} has no backward (autograd): use "
            f"kernel='fused' (the default) for training, or call the naive kernel under "
            f"torch.no_grad()")
    if not backward_available():
        raise NotImplementedError(
            "spak.fmha has no backward yet (autograd): the FMHA backward kernels are not "
            "in this SPAK build (issue 16). Call spak.fmha under torch.no_grad() / "
            "torch.inference_mode(), or use torch.nn.functional.scaled_dot_product_attention "
            "for training")
    q, k, v, out, lse, attn_mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.spak.fmha_bwd(dout, q, k, v, out, lse, attn_mask, ctx.is_causal,
                                         ctx.scale)
    # grads for (q, k, v, attn_mask, is_causal, scale, kernel, tile_m, tile_n, lat_k, lat_v,
    # occupancy, num_ctas): no gradient flows to the mask (a mask that requires grad is
    # refused in the forward)
    return (dq, dk, dv) + (None,) * 10


_train_op.register_autograd(_backward, setup_context=_setup_context)


def backward_available() -> bool:
    """True when this build has the FMHA backward kernels (gpu/plan_bwd.py) and the fused
    forward's LSE output. Until then a gradient through spak.fmha raises SPAK's
    NotImplementedError, not torch's generic one."""
    global _BWD_AVAILABLE
    if _BWD_AVAILABLE is None:
        import importlib.util
        import inspect
        try:
            from spak.gpu.plan import plan_fmha
            _BWD_AVAILABLE = (importlib.util.find_spec("spak.gpu.plan_bwd") is not None
                              and "lse" in inspect.signature(plan_fmha).parameters)
        except ImportError:
            _BWD_AVAILABLE = False
    return _BWD_AVAILABLE


_BWD_AVAILABLE: Optional[bool] = None


def _needs_grad(q, k, v, attn_mask) -> bool:
    """Whether this call records a backward; a mask that asks for a gradient is refused."""
    if not torch.is_grad_enabled():
        return False
    if attn_mask is not None and attn_mask.requires_grad:
        raise ValueError(
            "attn_mask requires grad, but spak.fmha gives no gradient to the mask (it is "
            "treated as a constant): pass attn_mask.detach(), or use "
            "torch.nn.functional.scaled_dot_product_attention for a learned bias")
    return q.requires_grad or k.requires_grad or v.requires_grad


def _composite(q, k, v, attn_mask, is_causal, scale, kernel, tile_m, tile_n, lat_k=0,
               lat_v=0, occupancy=0, num_ctas=0):
    """torch.ops.spak.fmha: above autograd, pick the inference or the training forward."""
    args = (attn_mask, is_causal, scale, kernel, tile_m, tile_n, lat_k, lat_v, occupancy,
            num_ctas)
    if _needs_grad(q, k, v, attn_mask):
        return torch.ops.spak.fmha_train(q, k, v, *args)[0]
    return torch.ops.spak.fmha_fwd(q, k, v, *args)


_lib = torch.library.Library("spak", "FRAGMENT")     # kept alive: it owns the registration
_lib.define("fmha" + _OP_SCHEMA + " -> Tensor")
_lib.impl("fmha", _composite, "CompositeImplicitAutograd")


# ------------------------------------------------------------------- the eager fast path
#
# Host time per eager call matters: for short sequences the kernel takes 70-150 us, and
# spak.fmha took 80-150 us of host time on an H100 where cuDNN SDPA takes 16-24 us
# (results/host-profile-h100-2026-11-22; tools/host_profile.py). Two layers are skipped when
# that changes nothing: validate() + resolve_tiles() (~24 us) for a call signature already
# validated, and the custom op's dispatch (~12 us; on a CPU box 11.9 us per call against
# 1.0 us for a plain Python call) in plain eager mode.

_Tensor = torch.Tensor
_torch_function_mode = getattr(torch._C, "_is_torch_function_mode_enabled", None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_tracing_state = getattr(torch._C, "_get_tracing_state", None)
_functorch_level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level", None)
_profiler_enabled = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
#: A torch without one of these private probes always takes the op path.
_CAN_SKIP_OP = None not in (_torch_function_mode, _dispatch_modes, _tracing_state,
                            _functorch_level, _profiler_enabled)


def _plain_eager(q, k, v, attn_mask) -> bool:
    """True when nothing may watch or transform the call: plain torch.Tensor inputs (no
    FakeTensor or other subclass), not under torch.compile or jit.trace, no torch function
    mode (`with torch.device(...)` is one) or dispatch mode (FakeTensorMode, FlopCounterMode,
    make_fx), no functorch transform (vmap's batched tensors are plain torch.Tensor), no
    torch.profiler (its trace shows the spak::fmha op). Autograd is checked after validation.
    """
    return (_CAN_SKIP_OP
            and type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor
            and (attn_mask is None or type(attn_mask) is _Tensor)
            and not (torch.compiler.is_compiling() or _torch_function_mode()
                     or _dispatch_modes() or _tracing_state() is not None
                     or _functorch_level() is not None or _profiler_enabled()))


_VALIDATED: dict = {}
"""Validated calls: _memo_key(...) -> _op_args(...) (no tensors in either)."""


def _memo_key(q, k, v, attn_mask, is_causal, scale, enable_gqa, kernel, tiles):
    """The key of a plain eager call in _VALIDATED, or None: validate it in full.

    It holds everything validate() and resolve_tiles() read: shapes, dtypes and devices of
    q, k, v, the flags, the scale and the tuned store's version (a rewritten store is picked
    up). Only calls with exact argument types are keyed, so that key equality means the same
    result: is_causal=1 (an error) never meets True, a bool scale (an error) never meets 1,
    and float zero scales are left out (-0.0 == 0.0, but the kernel gets the sign). No
    attn_mask (a tensor's values and shape) and no tiles dict (mutable) either.
    """
    if attn_mask is not None or tiles is not None:
        return None
    if type(is_causal) is not bool or type(enable_gqa) is not bool or type(kernel) is not str:
        return None
    if not (scale is None or type(scale) is int or type(scale) is float and scale != 0.0):
        return None
    try:
        return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device,
                v.device, is_causal, scale, enable_gqa, kernel, _store_version())
    except RuntimeError:            # e.g. a nested tensor has no .shape: validate() says why
        return None


def _op_args(q, k, v, attn_mask, is_causal, scale, enable_gqa, kernel, tiles) -> tuple:
    """validate() and resolve_tiles(): torch.ops.spak.fmha's arguments after q, k, v.

    Under torch.compile the config is left to the op's body (tile 0 = look it up at run
    time, see _launch_config): the lookup asks the CUDA driver for the GPU's name and
    reads the tuned-config store, which Dynamo cannot trace in a full graph (issue 20)."""
    c = validate(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                 enable_gqa=enable_gqa, kernel=kernel, tiles=tiles)
    s = 1.0 / math.sqrt(c.D) if c.scale is None else c.scale
    if torch.compiler.is_compiling():
        given = c.tiles or {}
        return (c.mask, is_causal, s, kernel, given.get("TILE_M", 0), given.get("TILE_N", 0),
                0, 0, 0, 0)
    t = resolve_tiles(kernel, q.dtype, c.D, is_causal, c.Sk, q.device, c.tiles,
                      rows=c.B * c.Hq * c.Sq)
    return (c.mask, is_causal, s, kernel, int(t["TILE_M"]), int(t["TILE_N"]),
            int(t.get("LAT_K") or 0), int(t.get("LAT_V") or 0), int(t.get("occupancy") or 0),
            int(t.get("num_ctas") or 0))


def fmha(q, k, v, *, is_causal: bool = False, scale: Optional[float] = None,
         attn_mask=None, enable_gqa: bool = False, kernel: str = "fused",
         tiles: Optional[dict] = None):
    """softmax(q k^T * scale + attn_mask) v on CUDA tensors with SPAK's cuTile kernels.

    See the module docstring for the arguments; returns [B, Hq, Sq, Dv] in q's dtype.
    """
    # long: the repeated plain eager call is inlined here (issue 34): _plain_eager's and
    # _memo_key's tests and the launch made before, with no Python call between them
    # (each costs ~0.5-1 us of host time, the GPU work of a tiny call is ~5 us).
    # torch.compiler.is_compiling() first: Dynamo folds it to True and traces nothing else
    # of this block; the key's types exactly as _memo_key asks them (True is not 1, a
    # float zero scale is not keyed); the store version as _store_version() would answer
    # it (looked at again when STORE_RECHECK_S has passed or this process wrote a store)
    if (not _is_compiling() and INLINE and attn_mask is None and tiles is None
            and type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor
            and (is_causal is True or is_causal is False)
            and (enable_gqa is True or enable_gqa is False) and type(kernel) is str
            and (scale is None or type(scale) is float and scale != 0.0
                 or type(scale) is int)
            and _monotonic() - _STORE_SEEN[0] < STORE_RECHECK_S
            and _STORE_SEEN[1] == tuned.WRITES[0]
            and _CAN_SKIP_OP and not (_torch_function_mode() or _dispatch_modes()
                                      or _tracing_state() is not None
                                      or _functorch_level() is not None
                                      or _profiler_enabled())):
        try:
            key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device,
                   v.device, is_causal, scale, enable_gqa, kernel, _STORE_SEEN[2])
        except RuntimeError:        # e.g. a nested tensor has no .shape: validate() says why
            key = None
        args = _VALIDATED.get(key) if key is not None else None
        if args is not None:
            if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                            or v.requires_grad):
                if args.train is not None:       # the training forward launched before
                    return _train_apply(q, k, v, args)
            else:
                r = args.fwd if args.fwd is not None else _attach(args, q, k, v, False)
                if r is not None and r.getdev() == r.dev:
                    q = q.contiguous()
                    # empty_like parses no size, dtype or device: half torch.empty's cost
                    out = _empty_like(q) if r.like else _empty(r.shape, dtype=r.dtype,
                                                                 device=r.device)
                    try:    # a new specialisation (another alignment) may compile here
                        r.gl.ct.launch(r.getstream(r.dev), r.grid, r.kernel,
                                       (q, k.contiguous(), v.contiguous(), out,
                                        r.dummy) + r.tail)
                    except Exception as exc:
                        explained = _explained(exc, q.device)
                        if explained is exc:
                            raise
                        raise explained from exc
                    return out
    return _general(q, k, v, attn_mask, is_causal, scale, enable_gqa, kernel, tiles)


def _general(q, k, v, attn_mask, is_causal, scale, enable_gqa, kernel, tiles):
    """fmha's every other call: the ops (compile, tracing, modes, subclasses, transforms;
    every call validated), or the memo (validated once per signature) and the bodies."""
    if not _plain_eager(q, k, v, attn_mask):
        return torch.ops.spak.fmha(q, k, v, *_op_args(q, k, v, attn_mask, is_causal, scale,
                                                      enable_gqa, kernel, tiles))
    key = _memo_key(q, k, v, attn_mask, is_causal, scale, enable_gqa, kernel, tiles)
    args = _VALIDATED.get(key) if key is not None else None
    if args is None:
        args = _Args(_op_args(q, k, v, attn_mask, is_causal, scale, enable_gqa, kernel,
                              tiles))
        if key is not None:
            if len(_VALIDATED) >= 512:          # many distinct signatures: start over
                _VALIDATED.clear()
            _VALIDATED[key] = args
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or (
            attn_mask is not None and attn_mask.requires_grad)):
        if args[3] == "fused" and (attn_mask is None or not attn_mask.requires_grad) and (
                _BWD_AVAILABLE or backward_available()):
            out = _train_apply(q, k, v, args)          # the custom ops' work, one layer
            if key is not None and args.train is None:
                _attach(args, q, k, v, True)
            return out
        return torch.ops.spak.fmha(q, k, v, *args)     # autograd: the op records the backward
    return _impl(q, k, v, *args)


_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def _plain_and_fresh() -> bool:
    """For spak.fmha_kvcache's and spak.fmha_varlen's inline paths (issue 34g): not under
    torch.compile (first: Dynamo folds it), no mode, trace, transform or profiler
    (_plain_eager's tests but the tensors' types, which the caller makes), and the store
    version _STORE_SEEN[2] is what _store_version() would answer now."""
    return (not _is_compiling() and _CAN_SKIP_OP
            and _monotonic() - _STORE_SEEN[0] < STORE_RECHECK_S
            and _STORE_SEEN[1] == tuned.WRITES[0]
            and not (_torch_function_mode() or _dispatch_modes()
                     or _tracing_state() is not None or _functorch_level() is not None
                     or _profiler_enabled()))
#: SPAK_FMHA_INLINE=0: spak.fmha's every call through _general, and spak.fmha_kvcache's
#: and spak.fmha_varlen's through their memo (the A/B of tools/host_cost_i34g.py)
INLINE = os.environ.get("SPAK_FMHA_INLINE", "1") != "0"
_empty = torch.empty
_empty_like = torch.empty_like


class _Args(tuple):
    """A _VALIDATED entry: torch.ops.spak.fmha's arguments after q, k, v (the tuple), and
    the launches later calls of this signature make without the general path: ``fwd``
    (inference) and ``train`` (with the LSE), each an api._Ready or None (not made yet)."""
    fwd = None
    train = None
    bwd = None          # the prepared backward (spak.bwd_ready.BwdReady), found by _Train
    bwd_gen = -1        # bwd_ready.GEN when it was found


class _Ready:
    """A forward launch made before (_forward's _READY entry), with what fmha needs to
    make it again: out's shape and dtype (and whether it is q's), the LSE's shape, the raw device and stream
    getters (C functions on a GPU, bound here: no lookup per call)."""
    __slots__ = ("dev", "device", "shape", "dtype", "lse_shape", "gl", "grid", "kernel",
                 "dummy", "tail", "getdev", "getstream", "like", "lse_like")

    def __init__(self, q, entry):
        dev, self.shape, gl, self.grid, self.kernel, self.dummy, self.tail = entry
        self.dev, self.device, self.dtype, self.gl = dev, q.device, q.dtype, gl
        self.lse_shape = tuple(q.shape[:3])
        # the LSE's template: the kept float32 dummy seen with the LSE's shape (stride 0,
        # no memory of its own). torch.empty_like of it allocates a contiguous float32
        # [B, Hq, Sq] (not dense, so not its strides) without parsing a size, dtype or
        # device: torch.empty(shape, dtype=, device=) costs twice that (issue 34h: 2.1
        # against 1.0 us on the CPU box; 6.4 against 3.8 on an H200 host)
        self.lse_like = self.dummy.reshape(()).expand(self.lse_shape)
        # out is q's shape (Dv == D): torch.empty_like of the contiguous q allocates it
        self.like = self.shape == tuple(q.shape)
        getdev = getattr(torch._C, "_cuda_getDevice", None)
        getstream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if q.device.type == "cuda" and getdev is not None and getstream is not None:
            self.getdev, self.getstream = getdev, getstream
        else:       # CPU tensors (the simulator's tests, the host-cost fake patch gl's)
            self.getdev = lambda: gl.current_device()
            self.getstream = lambda dev: gl.current_raw_stream(dev)


def _attach(args, q, k, v, lse: bool):
    """The _Ready for a memoised signature whose forward _forward launched before (its
    _READY entry), kept on args (``train`` with the LSE, else ``fwd``); None if none."""
    entry = _READY.get((q.shape, k.shape, v.shape, q.dtype, q.device) + tuple(args[1:])
                       + (not lse,)) if (args[0] is None and args[3] == "fused" and args[2]
                                         and args[4] and args[5]) else None
    if entry is None:
        return None
    r = _Ready(q, entry)
    if lse:
        args.train = r
    else:
        args.fwd = r
    return r


def _explained(exc, device):
    """A cuTile compile error with the set-up diagnosis (spak.device.env); any other
    error as it is."""
    from spak.device import env as gpu_env
    if gpu_env.is_compile_error(exc):
        return gpu_env.explain(exc, arch=device_arch(device))
    return exc


class _Train(torch.autograd.Function):
    """Plain eager training calls: spak::fmha_train's forward and spak::fmha_bwd's backward
    bodies under one autograd.Function. The custom ops' layers (the composite op, the
    autograd kernel, argument defaults, alias checks, two redispatches each way) cost
    ~100-200 us of host time per training step on tiny problems (issue 34); what they buy
    (torch.compile, modes, tracing) is not in play on this path. The same saved state and
    the same kernels as the ops; a backward run under a mode or a trace (compiled
    autograd), or with create_graph=True, goes through torch.ops.spak.fmha_bwd."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, args):
        # args: the op arguments after q, k, v (an _Args; attn_mask is args[0], passed
        # apart so that autograd and functorch see it as an input, as Function.apply did)
        is_causal, scale, kernel = args[1], args[2], args[3]
        r = args.train
        if r is not None and attn_mask is None and r.getdev() == r.dev:
            # launched before: the LSE and out allocated, one launch (_forward's work)
            lse = _empty_like(r.lse_like)      # float32 [B, Hq, Sq], contiguous
            qc = q.contiguous()
            out = _empty_like(qc) if r.like else _empty(r.shape, dtype=r.dtype,
                                                         device=r.device)
            try:
                r.gl.ct.launch(r.getstream(r.dev), r.grid, r.kernel,
                               (qc, k.contiguous(), v.contiguous(), out, r.dummy, lse)
                               + r.tail)
            except Exception as exc:
                explained = _explained(exc, q.device)
                if explained is exc:
                    raise
                raise explained from exc
        else:
            out, lse = _train_impl(q, k, v, attn_mask, *args[1:])
        ctx.save_for_backward(q, k, v, out, lse, attn_mask)
        ctx.is_causal, ctx.scale, ctx.kernel = is_causal, scale, kernel
        # the backward's launcher found here, on the calling thread: the engine's device
        # thread, which runs the backward, pays more for each Python step (spak.bwd_ready)
        ctx.rkey = ctx.ready = ctx.grads = None
        # not under saved-tensor hooks (save_on_cpu, checkpoint offloading): what they
        # unpack need not be the contiguous tensors the launcher binds
        if (_CAN_SKIP_OP and attn_mask is None and kernel == "fused" and scale
                and _bwd_ready.ENABLED and _saved_hooks is not None
                and _saved_hooks(False) is None
                and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
            # kept on args once found (args.bwd_gen: none forgotten since, bwd_ready.clear)
            ready = args.bwd if args.bwd_gen == _bwd_ready.GEN[0] else None
            if ready is None:
                ctx.rkey = (q.shape, k.shape, v.shape, q.dtype, q.device, is_causal, scale,
                            _STORE_SEEN[2])
                ready = _bwd_ready.remembered(ctx.rkey)
                if ready is not None:
                    args.bwd, args.bwd_gen = ready, _bwd_ready.GEN[0]
            if ready is not None:
                ctx.ready = ready
                # the gradients allocated here, on the calling thread (small problems)
                ctx.grads = ready.grads(q, k, v)
        return out

    @staticmethod
    def backward(ctx, dout):
        ready = ctx.ready
        # _plain_eager's tests (dout's type, no compile, mode, trace, transform or
        # profiler) and grad mode off, inline: each Python call here costs more on the
        # engine's thread than on the caller's
        if ready is not None and type(dout) is _Tensor and not (
                _grad_enabled() or _is_compiling()
                or _torch_function_mode() or _dispatch_modes()
                or _tracing_state() is not None or _functorch_level() is not None
                or _profiler_enabled()):
            q, k, v, out, lse, _ = ctx.saved_tensors
            grads = ctx.grads
            ctx.grads = None     # given once (retain_graph); the context keeps no reference
            grads = ready.run(dout, q, k, v, out, lse, grads)
            if grads is not None:
                return grads + _NO_GRADS
        q, k, v, out, lse, attn_mask = ctx.saved_tensors
        # create_graph=True (grad mode on here) takes the op: a backward through it then
        # raises the op's "no autograd formula" error instead of dropping a derivative
        if not torch.is_grad_enabled() and _plain_eager(dout, q, k, attn_mask):
            dq, dk, dv = _bwd_impl(dout, q, k, v, out, lse, attn_mask, ctx.is_causal,
                                   ctx.scale)
            if ctx.rkey is not None and ready is None:
                _remember_bwd(ctx.rkey, q, k, v, ctx.is_causal, ctx.scale)
        else:
            dq, dk, dv = torch.ops.spak.fmha_bwd(dout, q, k, v, out, lse, attn_mask,
                                                 ctx.is_causal, ctx.scale)
        return (dq, dk, dv) + _NO_GRADS


_NO_GRADS = (None, None)     # attn_mask, args
_saved_hooks = getattr(getattr(torch._C, "_autograd", None),
                       "_top_saved_tensors_default_hooks", None)


def _remember_bwd(rkey, q, k, v, is_causal, scale) -> None:
    """After a general backward: keep its recipe as the prepared launcher for rkey."""
    import spak.gpu.launch as gl
    tiles, hints = _bwd_config(q.device, q.dtype, q.shape[3], is_causal, k.shape[2])
    _bwd_ready.remember(rkey, q.device, gl.bwd_recipe(
        "fused", q, k, v, causal=is_causal, scale=scale, tiles=tiles, hints=hints),
        grad_bytes=(q.numel() + k.numel() + v.numel()) * q.element_size())


_fn_apply = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)
#: autograd.Function's C apply bound to _Train (what Function.apply calls last), or None
_TRAIN_C_APPLY = (_fn_apply.__get__(None, _Train)
                  if None not in (_fn_apply, _unwrap_if_dead, _transforms_active)
                  and type(_fn_apply).__name__ == "classmethod_descriptor" else None)


def _train_apply(q, k, v, args):
    """_Train.apply(q, k, v, args[0], args) without Function.apply's Python layer (issue
    34): _Train defines no setup_context, so that layer only unwraps dead functorch
    wrappers, over all its arguments in a generator, before the C apply; only q, k, v and
    the mask can be tensors that need it (the mask None on this path or a plain tensor
    passed on, as Function.apply would after unwrapping it too). Under a functorch
    transform, or on a torch without these entry points, Function.apply itself."""
    if _TRAIN_C_APPLY is None or _transforms_active():
        return _Train.apply(q, k, v, args[0], args)
    mask = args[0]
    if mask is not None:
        mask = _unwrap_if_dead(mask)
    return _TRAIN_C_APPLY(_unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v), mask,
                          args)
