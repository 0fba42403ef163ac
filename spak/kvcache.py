"""`spak.fmha_kvcache`: decode attention over a KV cache for PyTorch CUDA tensors.

    out = spak.fmha_kvcache(q, k_cache, v_cache, cache_seqlens)                  # contiguous
    out = spak.fmha_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=bt)  # paged

The layouts of FlashAttention's ``flash_attn_with_kvcache`` (and vLLM's paged cache):

* q [B, Sq, Hq, D]: the new queries (Sq = 1 in plain decode, a few with speculative
  decoding or chunked prefill); fp16 or bf16.
* k_cache, v_cache: [B, Sk_max, Hkv, D] (contiguous), or with ``block_table``
  [num_pages, page_size, Hkv, D] (paged; page_size a power of two >= 16). Same dtype as
  q; Hq a multiple of Hkv (GQA/MQA); D, Dv in [1, 256]. Must be contiguous (a cache is
  never copied).
* cache_seqlens: int32 (or int64, converted) [B], or an int for every sequence: sequence b
  attends to its first cache_seqlens[b] keys. Values are device data and not checked (a
  check would cost a device sync and break CUDA graph capture): the kernels clamp them to
  [0, capacity]; a sequence of length 0 gives zeros.
* block_table: int32 (or int64) [B, max_pages]: the page ids of sequence b in order;
  entries past a sequence's last page are never read.
* is_causal: bottom-right: query i of a sequence of length L sees keys j <= i + L - Sq
  (the queries are the last Sq tokens); rows with no key give zeros. No effect at Sq = 1.
* scale: default 1/sqrt(D); any finite real number.
* num_splits: key splits (None: chosen from the shape and the GPU's SM count); tiles:
  {"TILE_N", "MAX_ROWS", "PAGE_MODE", "OCCUPANCY", "KT_FORM", "NUM_CTAS", "LAT",
  "PAGE_AHEAD"} (gpu.plan_decode: keys per step, most query rows per block, how a tile of
  several pages is read, the split kernel's occupancy hint, rows or keys in the tensor
  cores' M: -1 auto, 0 rows, 1 keys, 2 keys_vt; the split kernel's CTAs a block: 0 no
  hint, 1, 2, 4; the K/V loads' DRAM latency hint, 1..10, 0 none; a paged cache's page
  ids looked up in the key step, 0, or one tile ahead, 1: -1 auto). TILE_N and MAX_ROWS not given come
  from the tuned-config store's fmha_decode entry for this GPU and (dtype, D, Hq // Hkv,
  Sq, paged) when it has one (`spak sweep --family fmha_decode --update-store`), else
  from gpu.plan_decode.default_decode_tiles.

Returns [B, Sq, Hq, Dv] in q's dtype. Forward only. Registered as the custom op
``torch.ops.spak.fmha_kvcache`` (with a fake implementation) for torch.compile; it
allocates its workspaces with torch on the current stream and launches there, so it can
be captured in a CUDA graph. Every bad input raises ValueError/TypeError naming the
argument before anything runs (docs/errors.md).
"""
from __future__ import annotations

import functools
import math
import numbers
import os
from typing import Optional

import torch

from spak import api as _api
from spak.api import _plain_eager as _api_plain_eager
from spak.torch_checks import check_devices, check_dtypes, check_tiles
from spak.torch_checks import check_scale as _check_scale

__all__ = ["fmha_kvcache", "validate"]

INDEX_DTYPES = (torch.int32, torch.int64)
MAX_HEAD_DIM = 256
MAX_SPLITS = 256
TILE_KEYS = ("TILE_N", "MAX_ROWS", "PAGE_MODE", "OCCUPANCY", "KT_FORM", "NUM_CTAS", "LAT",
             "PAGE_AHEAD")
PAGE_MODES = (0, 1)                  # = gpu.plan_decode.PAGE_MODES
KT_FORMS = (-1, 0, 1, 2)             # = gpu.plan_decode.KT_AUTO and KT_FORMS
OCCUPANCIES = (0, 1, 2, 3, 4)        # = gpu.plan_decode.OCCUPANCIES
NUM_CTAS_VALUES = (0, 1, 2, 4)       # = gpu.plan_decode.NUM_CTAS_VALUES
LATENCIES = tuple(range(11))         # the K/V loads' latency hint; 0: none


# --------------------------------------------------------------------------- validation

def _check_tensor(name, t, ndim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}D, got {t.dim()}D shape {tuple(t.shape)}")


def _check_sizes(q, k_cache, v_cache):
    B, Sq, Hq, D = q.shape
    if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
        raise ValueError(f"k_cache and v_cache must agree in all but the last dim, got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.shape[3] != D:
        raise ValueError(f"q and k_cache must have the same head_dim, got q {D}, "
                         f"k_cache {k_cache.shape[3]}")
    for name, d in (("q/k head_dim", D), ("v head_dim", v_cache.shape[3])):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name} must be in [1, {MAX_HEAD_DIM}], got {d}")
    Hkv = k_cache.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of the cache's kv heads "
                         f"({Hkv}) (grouped-query attention)")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (a KV cache is never copied); "
                             f"got strides {t.stride()}")


def _check_index(name, t, shape):
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} dtype must be torch.int32 (or torch.int64, converted), "
                        f"got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")


def _check_cache_layout(q, k_cache, block_table):
    B = q.shape[0]
    if block_table is None:
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache batch ({k_cache.shape[0]}) must match q batch ({B}) "
                             f"for a contiguous cache [B, Sk_max, Hkv, D] (pass block_table "
                             f"for a paged cache)")
        return
    _check_tensor("block_table", block_table, 2)
    _check_index("block_table", block_table, (B, block_table.shape[1]))
    page = k_cache.shape[1]
    if page < 16 or page & (page - 1):
        raise ValueError(f"page_size (k_cache.shape[1]) must be a power of two >= 16 with "
                         f"block_table, got {page}")


def _check_options(is_causal, num_splits, tiles):
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
            raise TypeError(f"num_splits must be an int or None, got {num_splits!r}")
        if not 1 <= num_splits <= MAX_SPLITS:
            raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    return check_tiles(tiles, TILE_KEYS, "{'TILE_N': int, 'MAX_ROWS': int}",
                       {"PAGE_MODE": (PAGE_MODES, "boxes, gather"),
                        "OCCUPANCY": (OCCUPANCIES, "0: the compiler's choice"),
                        "KT_FORM": (KT_FORMS, "-1 auto, 0 rows, 1 keys, 2 keys_vt"),
                        "NUM_CTAS": (NUM_CTAS_VALUES, "0 no hint, else CTAs a block"),
                        "LAT": (LATENCIES, "0: the compiler's choice"),
                        "PAGE_AHEAD": ((-1, 0, 1), "-1 auto, 0 in the step, 1 one key "
                                                   "tile ahead")})


def validate(q, k_cache, v_cache, cache_seqlens, *, block_table=None, is_causal=False,
             scale=None, num_splits=None, tiles=None, require_cuda: bool = True):
    """Check every argument; raise ValueError/TypeError naming the culprit. Returns
    (scale or None, tiles dict). Order: types and ndim, dtypes, sizes, layout, options,
    devices (so shape errors are reported for CPU and meta tensors too)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t, 4)
    check_dtypes(q, (("k_cache", k_cache), ("v_cache", v_cache)))
    _check_sizes(q, k_cache, v_cache)
    if not isinstance(cache_seqlens, int) or isinstance(cache_seqlens, bool):
        _check_tensor("cache_seqlens", cache_seqlens, 1)
        _check_index("cache_seqlens", cache_seqlens, (q.shape[0],))
    elif cache_seqlens < 0:
        raise ValueError(f"cache_seqlens must be >= 0, got {cache_seqlens}")
    _check_cache_layout(q, k_cache, block_table)
    scale = _check_scale(scale)
    tiles = _check_options(is_causal, num_splits, tiles)
    _check_devices(q, k_cache, v_cache, cache_seqlens, block_table, require_cuda)
    return scale, tiles


def _check_devices(q, k_cache, v_cache, cache_seqlens, block_table, require_cuda):
    check_devices([("q", q), ("k_cache", k_cache), ("v_cache", v_cache)],
                  [("cache_seqlens", cache_seqlens), ("block_table", block_table)],
                  require_cuda, "spak.fmha_kvcache",
                  "the simulator (`spak sim --family fmha_decode`)")


# -------------------------------------------------------------------------- the op

@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_PLANS: dict = {}


def _plan_key(q, k_cache, v_cache, block_table, *config) -> tuple:
    """_PLANS's key: the shapes, dtype, device and (is_causal, scale, num_splits, the
    tiles) as _impl passes them to _plan."""
    return (q.shape, k_cache.shape, v_cache.shape, q.dtype, q.device,
            None if block_table is None else block_table.shape, *config)


def _plan(q, k_cache, v_cache, lens, block_table, out, is_causal, scale, num_splits,
          tile_n, max_rows, page_mode, occupancy, kt_form, num_ctas, lat, ahead):
    """gpu.plan_decode's launches as templates: per (shapes, flags, config) the kernels,
    grids and constants, with the tensors' places named; planning costs more host time
    than a short decode kernel takes."""
    key = _plan_key(q, k_cache, v_cache, block_table, is_causal, scale, num_splits, tile_n,
                    max_rows, page_mode, occupancy, kt_form, num_ctas, lat, ahead)
    cached = _PLANS.get(key)
    if cached is not None:
        return cached
    import spak.gpu.launch as gl
    from spak.gpu.plan_decode import plan_decode
    work = []

    def alloc(shape, kind):
        shape = tuple(int(n) for n in shape)
        if shape == (1, 1, 1, 1):             # one split's never-read dummies: kept once
            dummy, keep = gl.dummy_mask(q)
            if keep:
                return dummy
        work.append(torch.empty(shape, dtype=torch.float32, device=q.device))
        return work[-1]

    launches = plan_decode(q, k_cache, v_cache, lens, out, block_table=block_table,
                           causal=is_causal, scale=scale, num_splits=num_splits or None,
                           tiles={"TILE_N": tile_n, "MAX_ROWS": max_rows,
                                  "PAGE_MODE": page_mode, "OCCUPANCY": occupancy,
                                  "KT_FORM": kt_form, "NUM_CTAS": num_ctas, "LAT": lat,
                                  "PAGE_AHEAD": ahead},
                           num_sms=_num_sms(q.device.index), alloc=alloc)
    named = {"q": q, "k": k_cache, "v": v_cache, "lens": lens, "out": out}
    if block_table is not None:
        named["bt"] = block_table
    names = {id(t): name for name, t in named.items()}
    names.update({id(w): i for i, w in enumerate(work)})
    templates = Templates((L.kernel, L.grid, tuple(_place(a, names, work, named)
                                                   for a in L.args))
                          for L in launches)
    if len(_PLANS) >= 512:                    # many distinct shapes: start over
        _PLANS.clear()
    _PLANS[key] = cached = (templates, gl.workspace_layout([tuple(w.shape) for w in work]))
    return cached




class _Const:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _View:
    """A workspace seen with another shape (the combine's view of the split kernel's)."""
    __slots__ = ("index", "shape")

    def __init__(self, index, shape):
        self.index, self.shape = index, shape


class _Rows:
    """Sequences [start, start + n) of a named tensor (a plan over batch ranges,
    gpu.plan_decode.batch_chunks: a huge contiguous cache in 32-bit-index launches)."""
    __slots__ = ("name", "start", "n")

    def __init__(self, name, start, n):
        self.name, self.start, self.n = name, start, n


def _place(a, names, work, named=None):
    """A launch argument's template entry: a named tensor, a batch range of one
    (_Rows), a workspace index, a view of a workspace, or a constant."""
    if id(a) in names:
        return names[id(a)]
    if isinstance(a, torch.Tensor):
        for i, w in enumerate(work):
            if a.data_ptr() == w.data_ptr() and a.numel() == w.numel():
                return _View(i, tuple(a.shape))
        for name, t in (named or {}).items():
            if (a.dim() == t.dim() and a.dim() > 0 and a.shape[1:] == t.shape[1:]
                    and a.stride() == t.stride() and a.dtype == t.dtype and t.numel()
                    and 0 <= a.data_ptr() - t.data_ptr() < t.numel() * t.element_size()):
                row = t.stride(0) * t.element_size() if t.shape[0] > 1 else 1
                return _Rows(name, (a.data_ptr() - t.data_ptr()) // row, a.shape[0])
    return _Const(a)


def _impl(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor], is_causal: bool,
          scale: float, num_splits: int, tile_n: int, max_rows: int,
          page_mode: int, occupancy: int, kt_form: int, num_ctas: int,
          lat: int, ahead: int = -1) -> torch.Tensor:
    """The custom op's CUDA body; arguments validated by fmha_kvcache (num_splits 0:
    automatic)."""
    B, Sq, Hq, _ = q.shape
    out = torch.empty((B, Sq, Hq, v_cache.shape[3]), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    q = q.contiguous()
    lens = cache_seqlens.to(torch.int32) if cache_seqlens.dtype != torch.int32 else cache_seqlens
    bt = block_table
    if bt is not None and bt.dtype != torch.int32:
        bt = bt.to(torch.int32)
    if tile_n == 0 or max_rows == 0 or kt_form == -1:   # not given: the store's, else default
        tile_n, max_rows, kt_form = _tuned(q, k_cache, bt is not None, tile_n, max_rows,
                                           kt_form)
    elif kt_form == _KT_LOOKED_UP:                      # fmha_kvcache's memo: the plan's choice
        kt_form = -1
    templates, layout = _plan(q, k_cache, v_cache, lens, bt, out, is_causal, scale,
                              num_splits, tile_n, max_rows, page_mode, occupancy, kt_form,
                              num_ctas, lat, ahead)
    # at most one workspace allocation per call, through torch's caching allocator (and
    # its graph pools under CUDA graph capture); none for a one-split plan
    import spak.gpu.launch as gl
    work = gl.workspaces(layout, q.device)
    tensors = {"q": q, "k": k_cache, "v": v_cache, "lens": lens, "out": out, "bt": bt}
    launch_templates(q.device, templates, work, tensors)
    return out


def _tuned(q, k_cache, paged: bool, tile_n: int, max_rows: int,
           kt_form: int) -> tuple[int, int, int]:
    """(TILE_N, MAX_ROWS, KT_FORM) for a call that left them to SPAK (0, 0, -1): looked up
    here, in the op's body, so that torch.compile traces no store access (as spak.fmha).
    A store entry without KT_FORM leaves it -1 (the plan's choose_kt_form)."""
    from spak.api import _device_info
    name = _device_info(q.device)[1] if q.is_cuda else ""     # a CPU run (the simulator)
    t = decode_tiles(name, q.dtype, q.shape[3],
                     q.shape[2] // k_cache.shape[2], q.shape[1], paged)
    form = t.get("KT_FORM", -1) if kt_form == -1 else kt_form
    return tile_n or t["TILE_N"], max_rows or t["MAX_ROWS"], form


_tuned_cache: dict = {}


def decode_tiles(gpu_name: str, dtype, head_dim: int, group: int, seq_q: int,
                 paged: bool) -> dict:
    """{"TILE_N", "MAX_ROWS"} (and "KT_FORM" where the entry has one): the tuned store's
    entry of the fmha_decode family for this GPU and (dtype, head dim, GQA group, Sq,
    paged) -- what `spak sweep --family fmha_decode --update-store` files -- else
    gpu.plan_decode's defaults. Memoised per store file version (a rewritten store is
    read again)."""
    from spak.api import _store_version
    from spak.gpu.plan_decode import default_decode_tiles
    from spak.tune import store as tuned
    key = {"dtype": tuned.normalize_dtype(str(dtype)), "head_dim": int(head_dim),
           "group": int(group), "seq_q": int(seq_q), "paged": bool(paged)}
    memo = (gpu_name, *key.values(), _store_version())
    if memo not in _tuned_cache:
        base = default_decode_tiles(head_dim)
        found = tuned.lookup_key("fmha_decode", gpu_name, "splitkv", key) or {}
        t = {k: int(found.get(k) or base[k]) for k in ("TILE_N", "MAX_ROWS")}
        if found.get("KT_FORM") is not None:
            t["KT_FORM"] = int(found["KT_FORM"])
        _tuned_cache[memo] = t
    return dict(_tuned_cache[memo])


class Templates(list):
    """A plan's launches as templates (kernel, grid, template args); carries its _Binder
    once launched (built on the first launch, kept with the cached plan)."""
    binder = None


class _Binder:
    """Templates compiled for binding: every argument of every launch is one item of a
    pool (named tensors, workspaces, views of workspaces, constants), taken by an
    operator.itemgetter per launch. Binding 30 arguments one by one through _arg cost
    ~8 us of host time per decode call (issue 34)."""
    __slots__ = ("names", "views", "consts", "launches", "nwork")

    def __init__(self, templates):
        import operator
        names, views, consts, nwork = [], [], [], 0
        for _, _, args in templates:
            for a in args:
                if isinstance(a, str):
                    if a not in names:
                        names.append(a)
                elif isinstance(a, (_View, _Rows)):
                    views.append(a)
                elif isinstance(a, _Const):
                    consts.append(a)
                else:                                   # a workspace index
                    nwork = max(nwork, a + 1)
        # the pool: names, workspaces, views, constants
        at = {id(a): len(names) + nwork + i for i, a in enumerate(views + consts)}
        self.names, self.nwork = tuple(names), nwork
        # a workspace view (index, shape), or a named tensor's batch range (name, start, n)
        self.views = tuple((a.index, a.shape) if isinstance(a, _View) else
                           (a.name, a.start, a.n) for a in views)
        self.consts = tuple(a.value for a in consts)
        self.launches = []
        for kernel, grid, args in templates:
            idx = [names.index(a) if isinstance(a, str) else
                   at[id(a)] if isinstance(a, (_View, _Rows, _Const)) else len(names) + a
                   for a in args]
            get = (operator.itemgetter(*idx) if len(idx) > 1 else
                   (lambda pool, i=idx[0]: (pool[i],)) if idx else (lambda pool: ()))
            self.launches.append((kernel, grid, get))

    def pool(self, work, tensors) -> tuple:
        return (tuple(map(tensors.get, self.names)) + tuple(work[:self.nwork])
                + tuple(work[v[0]].view(v[1]) if len(v) == 2 else
                        tensors[v[0]].narrow(0, v[1], v[2]) for v in self.views)
                + self.consts)


def launch_templates(device, templates, work, tensors) -> None:
    """Launch (kernel, grid, template args) on `device`'s current stream, the arguments
    bound by the templates' _Binder; a cuTile compile error is re-raised with the set-up
    diagnosis. The device guard only when `device` is not the current one."""
    import spak.gpu.launch as gl
    binder = getattr(templates, "binder", None)
    if binder is None:
        binder = _Binder(templates)
        if isinstance(templates, Templates):
            templates.binder = binder
    pool = binder.pool(work, tensors)
    dev = device.index
    stream = gl.current_raw_stream(dev)
    try:
        if dev == gl.current_device():
            for kernel, grid, get in binder.launches:
                gl.ct.launch(stream, grid, kernel, get(pool))
        else:
            with torch.cuda.device(dev):
                for kernel, grid, get in binder.launches:
                    gl.ct.launch(stream, grid, kernel, get(pool))
    except Exception as exc:
        explained = _explained(exc, device)
        if explained is exc:
            raise
        raise explained from exc


class Prepared:
    """A memoised plain eager call's launches bound but for the call's tensors (issue 34):
    for a plan without workspaces (decode's one split, varlen), each launch's arguments
    are taken by one itemgetter from (the tensors in the entry point's order) + the
    constants. The call then makes one allocation (out) and its launches, no plan key, no
    binder pool, no tensor dict. Also the raw device and stream getters, bound here."""
    __slots__ = ("dev", "shape", "dtype", "device", "launches", "consts", "getdev",
                 "getstream", "gl", "like")

    def __init__(self, device, out, templates, order, like=None):
        import operator

        import spak.gpu.launch as gl
        consts, launches = [], []
        for kernel, grid, args in templates:
            idx = []
            for a in args:
                if isinstance(a, str):
                    idx.append(order.index(a))
                else:                       # _Const (the caller admits no workspaces)
                    idx.append(len(order) + len(consts))
                    consts.append(a.value)
            get = (operator.itemgetter(*idx) if len(idx) > 1
                   else (lambda pool, i=idx[0]: (pool[i],)))
            launches.append((kernel, grid, get))
        self.launches, self.consts = tuple(launches), tuple(consts)
        self.dev, self.device, self.gl = device.index, device, gl
        self.shape, self.dtype = tuple(out.shape), out.dtype
        # out has this tensor's shape, dtype and device (q's when Dv == D): the caller
        # then allocates it by torch.empty_like of the contiguous q, which parses no size,
        # dtype or device (1.1 against 2.9 us on the CPU box, issue 34g)
        self.like = like is not None and tuple(like.shape) == self.shape \
            and like.dtype == out.dtype and like.device == out.device
        if device.type == "cuda":
            c = torch._C
            self.getdev = getattr(c, "_cuda_getDevice", None) or gl.current_device
            self.getstream = (getattr(c, "_cuda_getCurrentRawStream", None)
                              or gl.current_raw_stream)
        else:       # CPU tensors (the simulator's tests, the host-cost fake patch gl's)
            self.getdev = lambda: gl.current_device()
            self.getstream = lambda dev: gl.current_raw_stream(dev)

    @staticmethod
    def admits(templates) -> bool:
        """Whether a plan's templates take no workspace and keep no tensor but the dummy
        mask kept per device (gpu.launch.dummy_mask): what Prepared binds."""
        import spak.gpu.launch as gl
        kept = tuple(gl._DUMMIES.values())
        return bool(templates) and all(
            isinstance(a, str) or isinstance(a, _Const) and (
                not isinstance(a.value, torch.Tensor) or any(a.value is d for d in kept))
            for _, _, args in templates for a in args)

    def launch(self, tensors: tuple) -> bool:
        """Launch on the current stream with `tensors` (the order given at __init__);
        False (nothing launched) when another device is current: the caller's general
        path has the device guard."""
        dev = self.dev
        if self.getdev() != dev:
            return False
        launch_all(self, self.getstream(dev), tensors + self.consts)
        return True


def launch_all(ready, stream, pool) -> None:
    """Launch a prepared call's kernels (ready.launches: (kernel, grid, args from the pool))
    on stream; a cuTile compile error (a new specialisation, e.g. another alignment, may
    compile here) re-raised with the set-up diagnosis."""
    launch = ready.gl.ct.launch
    try:
        for kernel, grid, get in ready.launches:
            launch(stream, grid, kernel, get(pool))
    except Exception as exc:
        explained = _explained(exc, ready.device)
        if explained is exc:
            raise
        raise explained from exc


def _explained(exc, device):
    """A cuTile compile error re-raised with the set-up diagnosis (spak.device.env);
    any other error as it is."""
    from spak.device import env as gpu_env
    if gpu_env.is_compile_error(exc):
        major, minor = torch.cuda.get_device_capability(device)
        return gpu_env.explain(exc, arch=f"sm_{major}{minor}")
    return exc


_op = torch.library.custom_op("spak::fmha_kvcache", mutates_args=())(_impl)
_op.__doc__ = "torch.ops.spak.fmha_kvcache: spak.fmha_kvcache's kernels (inputs validated)."


@_op.register_fake
def _fake(q, k_cache, v_cache, cache_seqlens, block_table, is_causal, scale, num_splits,
          tile_n, max_rows, page_mode, occupancy, kt_form, num_ctas, lat, ahead=-1):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3]))


#: the error a backward through spak.fmha_kvcache raises (docs/errors.md)
INFERENCE_ONLY = ("spak.fmha_kvcache is inference only: it has no backward, and q, k_cache "
                  "or v_cache required grad. Call it under torch.no_grad() or "
                  "torch.inference_mode(), or pass detached tensors; spak.fmha computes "
                  "attention with gradients.")


def _no_backward(ctx, grad_out):
    raise RuntimeError(INFERENCE_ONLY)


# a forward with inputs that require grad runs (its output requires grad); a backward
# through it raises SPAK's own error instead of torch's "no autograd formula"
_op.register_autograd(_no_backward, setup_context=lambda ctx, inputs, output: None)


def _plain_eager(q, k, v, lens=None, bt=None) -> bool:
    """Nothing watches or transforms the call (spak.api's test, plus the other tensors,
    None or plain): then the op's dispatch (~12 us of host time) is skipped."""
    return ((lens is None or type(lens) is _Tensor) and (bt is None or type(bt) is _Tensor)
            and _api_plain_eager(q, k, v, None))


def fmha_kvcache(q, k_cache, v_cache, cache_seqlens, *, block_table=None,
                 is_causal: bool = False, scale: Optional[float] = None,
                 num_splits: Optional[int] = None, tiles: Optional[dict] = None):
    """softmax(q K^T * scale) V over each sequence's cached keys; see the module docstring."""
    # a repeated plain eager call launched before (one split), tested inline (issue 34g):
    # _memo_key's tests and key without its calls (tensors' and arguments' exact types,
    # no grad, a tensor cache_seqlens; an int one is made a tensor on the general path)
    if (PREPARED and _api.INLINE and tiles is None
            and (is_causal is True or is_causal is False)
            and (scale is None or type(scale) is float and scale != 0.0
                 or type(scale) is int)
            and (num_splits is None or type(num_splits) is int)
            and type(q) is _Tensor and type(k_cache) is _Tensor and type(v_cache) is _Tensor
            and type(cache_seqlens) is _Tensor
            and (block_table is None or type(block_table) is _Tensor)
            and _api._plain_and_fresh()
            and not (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad)):
        try:
            ready = _READY.get((
                q.shape, k_cache.shape, v_cache.shape, q.dtype, k_cache.dtype, v_cache.dtype,
                q.device, k_cache.device, v_cache.device,
                cache_seqlens.shape, cache_seqlens.dtype, cache_seqlens.device,
                None if block_table is None else
                (block_table.shape, block_table.dtype, block_table.device),
                is_causal, scale, num_splits, _api._STORE_SEEN[2]))
        except RuntimeError:            # e.g. a nested tensor has no .shape
            ready = None
        # the caches' layout is not in the key: a cache of a known shape that is not
        # contiguous takes the general path, whose validation raises
        if ready is not None and k_cache.is_contiguous() and v_cache.is_contiguous():
            out = _launch_ready(ready, q, k_cache, v_cache, cache_seqlens, block_table)
            if out is not None:
                return out
    key = _memo_key(q, k_cache, v_cache, cache_seqlens, block_table, is_causal, scale,
                    num_splits, tiles)
    tail = _VALIDATED.get(key) if key is not None else None
    if tail is not None:                 # validated before: plain eager, config resolved
        if type(cache_seqlens) is int:
            cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32,
                                       device=q.device)
        ready = _READY.get(key) if PREPARED else None
        if ready is not None:            # launched before: bound but for the tensors
            out = _launch_ready(ready, q, k_cache, v_cache, cache_seqlens, block_table)
            if out is not None:
                return out
        out = _impl(q, k_cache, v_cache, cache_seqlens, block_table, *tail)
        if PREPARED and ready is None:
            _prepare(key, q, k_cache, v_cache, cache_seqlens, block_table, out, tail)
        return out
    s, t = validate(q, k_cache, v_cache, cache_seqlens, block_table=block_table,
                    is_causal=is_causal, scale=scale, num_splits=num_splits, tiles=tiles)
    from spak.gpu.plan_decode import default_decode_tiles
    # TILE_N / MAX_ROWS not given: 0, resolved in the op body from the tuned store
    cfg = {**default_decode_tiles(q.shape[3]), "TILE_N": 0, "MAX_ROWS": 0, **t}
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32,
                                   device=q.device)
    args = (q, k_cache, v_cache, cache_seqlens, block_table, is_causal,
            1.0 / math.sqrt(q.shape[3]) if s is None else s, int(num_splits or 0),
            cfg["TILE_N"], cfg["MAX_ROWS"], cfg["PAGE_MODE"], cfg["OCCUPANCY"],
            cfg["KT_FORM"], cfg["NUM_CTAS"], cfg["LAT"], cfg["PAGE_AHEAD"])
    if not _plain_eager(q, k_cache, v_cache, cache_seqlens, block_table) or (
            torch.is_grad_enabled() and (q.requires_grad or k_cache.requires_grad
                                         or v_cache.requires_grad)):
        return torch.ops.spak.fmha_kvcache(*args)    # compile, tracing, modes, autograd
    if key is not None:
        tail = args[5:]
        if tail[3] == 0 or tail[4] == 0 or tail[7] == -1:   # resolved once, not per call
            tn, mr, kt = _tuned(q, k_cache, block_table is not None, args[8], args[9],
                                args[12])
            tail = (args[5:8] + (tn, mr) + args[10:12] + (_KT_LOOKED_UP if kt == -1 else kt,)
                    + args[13:])
        if len(_VALIDATED) >= 512:
            _VALIDATED.clear()
        _VALIDATED[key] = tail
        out = _impl(*args)
        if PREPARED:
            _prepare(key, q, k_cache, v_cache, cache_seqlens, block_table, out, tail)
        return out
    return _impl(*args)


_READY: dict = {}
"""Plain eager calls launched before whose plan has no workspace (one split): _memo_key
(...) -> Prepared. PREPARED False (SPAK_PREPARED=0): not used (the A/B of
tools/host_cost_bench.py)."""
PREPARED = os.environ.get("SPAK_PREPARED", "1") != "0"
_ORDER = ("q", "k", "v", "lens", "out", "bt")     # the tensors' order in a Prepared pool
_INT32 = torch.int32
_Tensor = torch.Tensor
_empty_like = torch.empty_like


def _prepare(key, q, k_cache, v_cache, lens, block_table, out, tail) -> None:
    """After a memoised call's launch: keep its plan as a Prepared when it has none of
    the split plan's workspaces (a cache of at most SHORT_CACHE_TILES key tiles)."""
    if out.numel() == 0:
        return
    bt = block_table
    if bt is not None and bt.dtype != _INT32:
        bt = bt.to(_INT32)
    config = list(tail)
    if config[7] == _KT_LOOKED_UP:          # as _impl passes it to _plan
        config[7] = -1
    found = _PLANS.get(_plan_key(q, k_cache, v_cache, bt, *config))
    if found is None or not Prepared.admits(found[0]):
        return
    if len(_READY) >= 512:
        _READY.clear()
    _READY[key] = Prepared(q.device, out, found[0], _ORDER, like=q)


def _launch_ready(ready, q, k_cache, v_cache, lens, bt):
    """_impl's work for a Prepared call: out, or None (another device is current: the
    general path has the device guard). Prepared.launch's checks inline, its launches through
    launch_all (one shared body); nothing allocated before the device test."""
    dev = ready.dev
    if ready.getdev() != dev:
        return None
    if lens.dtype != _INT32:
        lens = lens.to(_INT32)
    if bt is not None and bt.dtype != _INT32:
        bt = bt.to(_INT32)
    q = q.contiguous()
    out = _empty_like(q) if ready.like else torch.empty(ready.shape, dtype=ready.dtype,
                                                         device=ready.device)
    launch_all(ready, ready.getstream(dev), (q, k_cache, v_cache, lens, out, bt) + ready.consts)
    return out


_KT_LOOKED_UP = -2        # KT_FORM: the store has none for this class (the plan's choice)
_VALIDATED: dict = {}
"""Validated plain eager calls: _memo_key(...) -> the op's arguments after the tensors,
the config resolved (no tensors). Validation and the config lookup cost ~40 us of host
time per decode call on the CPU box, more than the decode kernels take (issue 34)."""


def _memo_key(q, k_cache, v_cache, cache_seqlens, block_table, is_causal, scale, num_splits,
              tiles):
    """The key of a plain eager call in _VALIDATED, or None (validate it in full): what
    validate() and the config lookup read, with exact argument types (True is not 1, a
    float zero scale is not keyed: -0.0 == 0.0), the store's version; no tiles dict. A
    call with a tensor that requires grad is validated in full, in any grad mode."""
    if tiles is not None or type(is_causal) is not bool:
        return None
    if not (scale is None or type(scale) is int or type(scale) is float and scale != 0.0):
        return None
    if not (num_splits is None or type(num_splits) is int):
        return None
    try:
        if q.requires_grad or k_cache.requires_grad or v_cache.requires_grad:
            return None                  # validated in full, whatever the grad mode
        if type(cache_seqlens) is int and cache_seqlens < 0:
            return None
        if not _plain_eager(q, k_cache, v_cache, None if type(cache_seqlens) is int
                            else cache_seqlens, block_table):
            return None
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            return None                  # not keyed: validate() raises
        lens = (("int", None, None) if type(cache_seqlens) is int else
                (cache_seqlens.shape, cache_seqlens.dtype, cache_seqlens.device))
        bt = (None if block_table is None else
              (block_table.shape, block_table.dtype, block_table.device))
        from spak.api import _store_version
        # the seqlens' shape, dtype and device flat in the key (fmha_kvcache's inline
        # test builds the same tuple with one tuple less)
        return (q.shape, k_cache.shape, v_cache.shape, q.dtype, k_cache.dtype, v_cache.dtype,
                q.device, k_cache.device, v_cache.device, *lens, bt, is_causal, scale,
                num_splits, _store_version())
    except (AttributeError, RuntimeError):     # not tensors: validate() says why
        return None
