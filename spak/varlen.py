"""`spak.fmha_varlen`: attention over a packed variable-length batch (prefill), for PyTorch
CUDA tensors, in FlashAttention's varlen convention:

    out = spak.fmha_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           is_causal=True)

* q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]: the sequences' rows
  packed one after another (no padding); fp16 or bf16, all three the same; Hq a multiple
  of Hkv (GQA/MQA); D, Dv in [1, 256]. Non-contiguous inputs are copied.
* cu_seqlens_q, cu_seqlens_k: int32 (int64 converted) [B+1], ascending offsets from 0:
  sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q (and of the output) and
  cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v. Device data, not read on the host (that
  would cost a sync): the kernel clamps the offsets to the arrays (offsets past the packed
  length, decreasing, or runs longer than max_seqlen never read or write outside q, k, v
  and the output; such runs' rows are undefined); a sequence of length 0 is allowed (a
  query run with no key gives zeros). `check_cu_seqlens(...)` checks them on the host
  (a sync) where wanted.
* max_seqlen_q, max_seqlen_k: ints >= 0, the longest runs (they size the launch, as in
  FlashAttention; rows of a query run past max_seqlen_q are left unwritten). Where
  total = B x max_seqlen for q and k and max_seqlen is a multiple of the tiles, every run
  is taken to be max_seqlen long (the kernel's WHOLE form, 2-9% faster): a run longer
  than its max_seqlen then leaves other runs' rows undefined as well.
* is_causal: bottom-right per sequence: query i of a run of Lq sees keys j <= i + Lk - Lq
  (FlashAttention >= 2.1); rows that see no key give zeros.
* scale: default 1/sqrt(D); any finite real number. tiles: {"TILE_M", "TILE_N"}, as for
  spak.fmha; default: spak.fmha's config for the padded batch (the tuned-config store's
  entry for this GPU, head dim, causal flag and max_seqlen_k, else the default tiles).

Returns [total_q, Hq, Dv] in q's dtype. Forward only. The kernel is spak.fmha's forward
block (gpu/kernels/fused.py, fmha_varlen_kernel): one block per (query tile, head,
sequence), each viewing its sequence's rows as a padded batch of one, so each sequence's
output equals spak.fmha's on that sequence alone, bit for bit. Registered as the custom op
``torch.ops.spak.fmha_varlen`` (fake implementation included) for torch.compile; it
launches on the current stream, so it can be captured in a CUDA graph and replayed with
new values and new run lengths of the same shapes (both checked bit for bit against eager
calls on an H100: ci/decode_bench.py@f3e1eb2's varlen_graph check). Every bad input
raises ValueError/TypeError naming the argument before anything runs (docs/errors.md).
"""
from __future__ import annotations

import math
import numbers
import os
from typing import Optional

import torch

from spak import api as _api
from spak.kvcache import (INDEX_DTYPES, MAX_HEAD_DIM, Prepared, Templates, _Const,
                          launch_all, launch_templates)
from spak.torch_checks import check_devices, check_dtypes, check_tiles
from spak.torch_checks import check_scale as _check_scale

__all__ = ["fmha_varlen", "validate_varlen", "launch_config", "check_cu_seqlens"]

TILE_KEYS = ("TILE_M", "TILE_N")


def _check_3d(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 3:
        raise ValueError(f"{name} must be 3D [total, heads, head_dim], got {t.dim()}D shape "
                         f"{tuple(t.shape)}")


def _check_sizes(q, k, v):
    Tq, Hq, D = q.shape
    Tk, Hkv, Dk = k.shape
    if tuple(v.shape[:2]) != (Tk, Hkv):
        raise ValueError(f"k and v must agree in all but the last dim, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    if Dk != D:
        raise ValueError(f"q and k must have the same head_dim, got q {D}, k {Dk}")
    for name, d in (("q/k head_dim", D), ("v head_dim", v.shape[2])):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name} must be in [1, {MAX_HEAD_DIM}], got {d}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k's heads ({Hkv}) "
                         f"(grouped-query attention)")


def _check_offsets(cu_q, cu_k):
    for name, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in INDEX_DTYPES:
            raise TypeError(f"{name} dtype must be torch.int32 (or torch.int64, converted), "
                            f"got {t.dtype}")
        if t.dim() != 1 or t.shape[0] < 1:
            raise ValueError(f"{name} must be 1D [B+1] (B >= 0), got shape {list(t.shape)}")
    if cu_q.shape != cu_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length B+1, got "
                         f"{cu_q.shape[0]} and {cu_k.shape[0]}")


def _check_max(name, n):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {n!r}")
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return int(n)


def _check_tiles(tiles):
    return check_tiles(tiles, TILE_KEYS, "{'TILE_M': int, 'TILE_N': int}")


def validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                    is_causal=False, scale=None, tiles=None, require_cuda: bool = True):
    """Check every argument of fmha_varlen; raise ValueError/TypeError naming the culprit.
    Returns (scale or None, tiles dict). Order: types and ndim, dtypes, sizes, offsets,
    lengths, options, devices (shape errors are reported for CPU and meta tensors too)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_3d(name, t)
    check_dtypes(q, (("k", k), ("v", v)))
    _check_sizes(q, k, v)
    _check_offsets(cu_seqlens_q, cu_seqlens_k)
    _check_max("max_seqlen_q", max_seqlen_q)
    _check_max("max_seqlen_k", max_seqlen_k)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    scale = _check_scale(scale)
    tiles = _check_tiles(tiles)
    check_devices([("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                   ("cu_seqlens_k", cu_seqlens_k)], [], require_cuda, "spak.fmha_varlen",
                  "the simulator (spak.cpu.simrun_decode.simulate_varlen)")
    return scale, tiles


# -------------------------------------------------------------------------- the op

_PLANS: dict = {}


def launch_config(q, cu_seqlens_q, max_seqlen_q: int, max_seqlen_k: int, is_causal: bool,
                  tile_m: int = 0, tile_n: int = 0, lat_k: int = 0, lat_v: int = 0,
                  occupancy: int = 0, num_ctas: int = 0) -> dict:
    """The config (gpu.plan_decode.plan_varlen's tiles) spak.fmha_varlen launches: the
    given one, or (tile_m or tile_n 0: not chosen by the caller) spak.fmha's for the
    padded batch, looked up at run time as spak.fmha does (under torch.compile too: the
    op's arguments are zeros then). Pass it to the simulator to reproduce a GPU call."""
    from spak.api import launch_settings
    rows = (cu_seqlens_q.shape[0] - 1) * q.shape[1] * max_seqlen_q     # the padded batch's
    c = launch_settings("fused", q.dtype, q.shape[2], is_causal, max_seqlen_k, q.device, rows,
                        tile_m, tile_n, lat_k, lat_v, occupancy, num_ctas)
    return {"TILE_M": c["TILE_M"], "TILE_N": c["TILE_N"], "LAT_K": c["LAT_K"],
            "LAT_V": c["LAT_V"], "OCCUPANCY": c["occupancy"], "NUM_CTAS": c["num_ctas"]}


def _plan_key(q, k, v, cu_q, max_q, is_causal, scale, config) -> tuple:
    return (q.shape, k.shape, v.shape, cu_q.shape, q.dtype, q.device, max_q, is_causal,
            scale, tuple(config.items()))


def _templates(q, k, v, cu_q, cu_k, out, max_q, max_k, is_causal, scale, config):
    """gpu.plan_decode.plan_varlen's launch with the tensors' places named, per (shapes,
    flags, config): planning costs host time a short kernel would not."""
    key = _plan_key(q, k, v, cu_q, max_q, is_causal, scale, config)
    cached = _PLANS.get(key)
    if cached is not None:
        return cached
    from spak.gpu.plan_decode import plan_varlen
    major, minor = torch.cuda.get_device_capability(q.device)
    launches = plan_varlen(q, k, v, cu_q, cu_k, out, max_seqlen_q=max_q, max_seqlen_k=max_k,
                           causal=is_causal, scale=scale, tiles=config,
                           arch=f"sm_{major}{minor}")
    names = {id(q): "q", id(k): "k", id(v): "v", id(cu_q): "cq", id(cu_k): "ck", id(out): "out"}
    cached = Templates((L.kernel, L.grid, tuple(names.get(id(a), _Const(a)) for a in L.args))
                       for L in launches)
    if len(_PLANS) >= 512:
        _PLANS.clear()
    _PLANS[key] = cached
    return cached


def _impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
          cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, is_causal: bool,
          scale: float, tile_m: int = 0, tile_n: int = 0, lat_k: int = 0, lat_v: int = 0,
          occupancy: int = 0, num_ctas: int = 0) -> torch.Tensor:
    """The custom op's CUDA body; arguments validated by fmha_varlen. tile_m/tile_n 0: the
    config spak.fmha would launch for the padded batch (launch_config)."""
    q, k, v = (t.contiguous() for t in (q, k, v))
    cq, ck = (c if c.dtype == torch.int32 else c.to(torch.int32)
              for c in (cu_seqlens_q, cu_seqlens_k))
    cq, ck = cq.contiguous(), ck.contiguous()
    # every row of a run up to max_seqlen_q is written (a run without keys: zeros); rows
    # past it are the caller's broken promise and stay unwritten, as in FlashAttention
    out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    config = launch_config(q, cq, max_seqlen_q, max_seqlen_k, is_causal, tile_m, tile_n,
                           lat_k, lat_v, occupancy, num_ctas)
    templates = _templates(q, k, v, cq, ck, out, max_seqlen_q, max_seqlen_k, is_causal,
                           scale, config)
    if not templates:                     # no key anywhere (or max_seqlen_q == 0): zeros
        return out.zero_()
    tensors = {"q": q, "k": k, "v": v, "cq": cq, "ck": ck, "out": out}
    launch_templates(q.device, templates, [], tensors)
    return out


_op = torch.library.custom_op("spak::fmha_varlen", mutates_args=())(_impl)
_op.__doc__ = "torch.ops.spak.fmha_varlen: spak.fmha_varlen's kernel (inputs validated)."


@_op.register_fake
def _fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale,
          tile_m=0, tile_n=0, lat_k=0, lat_v=0, occupancy=0, num_ctas=0):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))


def fmha_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                is_causal: bool = False, scale: Optional[float] = None,
                tiles: Optional[dict] = None):
    """softmax(q K^T * scale) V per packed sequence; see the module docstring."""
    # a repeated plain eager call launched before, tested inline (issue 34g): _memo_key's
    # tests and key without its calls (the tensors' types, exact argument types, no grad)
    if (PREPARED and _api.INLINE and tiles is None
            and (is_causal is True or is_causal is False)
            and type(max_seqlen_q) is int and type(max_seqlen_k) is int
            and (scale is None or type(scale) is float and scale != 0.0
                 or type(scale) is int)
            and type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor
            and type(cu_seqlens_q) is _Tensor and type(cu_seqlens_k) is _Tensor
            and _api._plain_and_fresh()
            and not (q.requires_grad or k.requires_grad or v.requires_grad)):
        try:
            ready = _READY.get((
                q.shape, k.shape, v.shape, cu_seqlens_q.shape, cu_seqlens_k.shape, q.dtype,
                k.dtype, v.dtype, cu_seqlens_q.dtype, cu_seqlens_k.dtype, q.device, k.device,
                v.device, cu_seqlens_q.device, cu_seqlens_k.device, max_seqlen_q,
                max_seqlen_k, is_causal, scale, _api._STORE_SEEN[2]))
        except RuntimeError:            # e.g. a nested tensor has no .shape
            ready = None
        if ready is not None:
            out = _launch_ready(ready, q, k, v, cu_seqlens_q, cu_seqlens_k)
            if out is not None:
                return out
    key = _memo_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    is_causal, scale, tiles)
    if key is not None:
        ready = _READY.get(key) if PREPARED else None
        if ready is not None:            # launched before: bound but for the tensors
            out = _launch_ready(ready, q, k, v, cu_seqlens_q, cu_seqlens_k)
            if out is not None:
                return out
        tail = _VALIDATED.get(key)
        if tail is not None:             # validated before: plain eager, config resolved
            out = _impl(q, k, v, cu_seqlens_q, cu_seqlens_k, *tail)
            if ready is None:
                _prepare(key, q, k, v, cu_seqlens_q, out, tail)
            return out
    s, t = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           is_causal=is_causal, scale=scale, tiles=tiles)
    tile_m = tile_n = 0                   # 0: spak.fmha's config, looked up in the op
    if t:
        from spak.gpu.plan_decode import default_varlen_tiles
        major, minor = torch.cuda.get_device_capability(q.device)
        cfg = {**default_varlen_tiles(q.shape[2], f"sm_{major}{minor}", is_causal), **t}
        tile_m, tile_n = cfg["TILE_M"], cfg["TILE_N"]
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
            is_causal, 1.0 / math.sqrt(q.shape[2]) if s is None else s, tile_m, tile_n)
    from spak.kvcache import _plain_eager
    if not _plain_eager(q, k, v, cu_seqlens_q, cu_seqlens_k) or (
            torch.is_grad_enabled() and q.requires_grad):
        return torch.ops.spak.fmha_varlen(*args)
    if key is not None:                  # the config resolved once, not per call
        c = launch_config(q, cu_seqlens_q, *args[5:8], *args[9:11])
        if len(_VALIDATED) >= 512:
            _VALIDATED.clear()
        _VALIDATED[key] = tail = args[5:9] + (c["TILE_M"], c["TILE_N"], c["LAT_K"],
                                              c["LAT_V"], c["OCCUPANCY"], c["NUM_CTAS"])
        out = _impl(*args)
        _prepare(key, q, k, v, cu_seqlens_q, out, tail)
        return out
    return _impl(*args)


_READY: dict = {}
"""Plain eager calls launched before: _memo_key(...) -> kvcache.Prepared (the launch
bound but for the tensors). PREPARED False: not used (tools/host_cost_bench.py's A/B)."""
PREPARED = os.environ.get("SPAK_PREPARED", "1") != "0"
_ORDER = ("q", "k", "v", "cq", "ck", "out")        # the tensors' order in a Prepared pool


def _prepare(key, q, k, v, cu_q, out, tail) -> None:
    """After a memoised call's first launch: keep it as a Prepared, when its plan has no
    workspace (and the call launched: a plan of no launch gives zeros)."""
    if not PREPARED or out.numel() == 0:
        return
    max_q, max_k, is_causal, scale = tail[:4]
    config = launch_config(q, cu_q, max_q, max_k, is_causal, *tail[4:])
    templates = _PLANS.get(_plan_key(q, k, v, cu_q, max_q, is_causal, scale, config))
    if templates is None or not Prepared.admits(templates):
        return
    if len(_READY) >= 512:
        _READY.clear()
    _READY[key] = Prepared(q.device, out, templates, _ORDER, like=q)


def _launch_ready(ready, q, k, v, cu_q, cu_k):
    """_impl's work for a Prepared call: out, or None (another device is current: the
    general path has the device guard). Prepared.launch's checks inline, its launches through
    launch_all (one shared body); nothing allocated before the device test."""
    dev = ready.dev
    if ready.getdev() != dev:
        return None
    if cu_q.dtype != _INT32:
        cu_q, cu_k = cu_q.to(_INT32), cu_k.to(_INT32)
    q = q.contiguous()
    out = _empty_like(q) if ready.like else torch.empty(ready.shape, dtype=ready.dtype,
                                                         device=ready.device)
    launch_all(ready, ready.getstream(dev), (q, k.contiguous(), v.contiguous(),
               cu_q.contiguous(), cu_k.contiguous(), out) + ready.consts)
    return out


_INT32 = torch.int32
_Tensor = torch.Tensor
_empty_like = torch.empty_like


_VALIDATED: dict = {}
"""Validated plain eager calls: _memo_key(...) -> the op's arguments after the tensors,
the config resolved (no tensors): validation and the config lookup cost more host time
than a short varlen kernel takes (issue 34)."""


def _memo_key(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, tiles):
    """The key of a plain eager call in _VALIDATED, or None (validate it in full): what
    validate_varlen() and the config lookup read, with exact argument types (True is not
    1, a float zero scale is not keyed: -0.0 == 0.0) and the store's version; no tiles."""
    if tiles is not None or type(is_causal) is not bool:
        return None
    if type(max_q) is not int or type(max_k) is not int or max_q < 0 or max_k < 0:
        return None
    if not (scale is None or type(scale) is int or type(scale) is float and scale != 0.0):
        return None
    from spak.api import _plain_eager
    try:
        if q.requires_grad or k.requires_grad or v.requires_grad:
            return None                  # validated in full, whatever the grad mode
        if not (type(cu_q) is _Tensor and type(cu_k) is _Tensor
                and _plain_eager(q, k, v, None)):
            return None
        from spak.api import _store_version
        return (q.shape, k.shape, v.shape, cu_q.shape, cu_k.shape, q.dtype, k.dtype, v.dtype,
                cu_q.dtype, cu_k.dtype, q.device, k.device, v.device, cu_q.device,
                cu_k.device, max_q, max_k, is_causal, scale, _store_version())
    except (AttributeError, RuntimeError):     # not tensors: validate_varlen() says why
        return None


def check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int,
                     max_seqlen_q: int, max_seqlen_k: int) -> None:
    """The optional host check of fmha_varlen's offsets (it reads them on the host: a
    device sync, so fmha_varlen never calls it): each starts at 0, never decreases, ends
    at its packed length (total_q = q.shape[0], total_k = k.shape[0]), and no run is
    longer than its max_seqlen. Raises ValueError naming the offsets; returns None.
    Without it the kernel clamps every offset into [0, total] (no access leaves the
    tensors), and a bad run gives rows of no defined value, as in FlashAttention."""
    for name, cu, total, longest in (("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q),
                                     ("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k)):
        off = [int(x) for x in (cu.tolist() if hasattr(cu, "tolist") else cu)]
        if not off or off[0] != 0:
            raise ValueError(f"{name} must start at 0, got {off[:1]}")
        runs = [b - a for a, b in zip(off, off[1:])]
        bad = next((i for i, n in enumerate(runs) if n < 0), None)
        if bad is not None:
            raise ValueError(f"{name} must not decrease, got {off[bad]} then {off[bad + 1]} "
                             f"at sequence {bad}")
        if off[-1] != total:
            raise ValueError(f"{name} must end at the packed length {total}, got {off[-1]}")
        if runs and max(runs) > longest:
            i = runs.index(max(runs))
            raise ValueError(f"{name}: sequence {i} has {runs[i]} rows, more than "
                             f"max_seqlen ({longest})")
