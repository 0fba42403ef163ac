"""Run the FMHA launch plans on a GPU through cuTile, on torch CUDA tensors.

    plan = plan_torch("fused", q, k, v, out, mask=None, causal=True, scale=None, tiles=None)
    run(plan)                                    # enqueued on torch's current stream

The caller (spak.api.fmha, spak.device.gpurun) passes tensors already validated, 4D, contiguous,
on one CUDA device, and the mask already float32 [MB, MH, Sq, Sk] (see gpu.plan). Workspaces
(naive's S and P, the dummy mask) are allocated with torch on q's device, so they follow
torch's caching allocator and stream semantics.

torch is imported inside the functions (cuTile comes with gpu.plan).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import cuda.tile as ct

from .plan import Launch, plan_fmha
from .variants import apply_hints

__all__ = ["torch_alloc", "plan_torch", "run", "current_raw_stream", "current_device",
           "fmha_into", "fused_ready", "fmha_bwd_into", "bwd_recipe", "capturing"]


def torch_alloc(like):
    """``alloc(shape, kind)`` for plan_fmha: torch.empty on ``like``'s device.

    kind "float32" -> float32, "input" -> like's dtype. Uninitialised on purpose: the
    kernels write every element they later read (the dummy mask is never read).
    """
    import torch

    def alloc(shape, kind):
        dtype = torch.float32 if kind == "float32" else like.dtype
        return torch.empty(tuple(int(n) for n in shape), dtype=dtype, device=like.device)
    return alloc


def plan_torch(kernel_name: str, q, k, v, out, *, mask=None, causal: bool = False,
               scale: Optional[float] = None, tiles: Optional[dict] = None,
               lse=None) -> list[Launch]:
    """gpu.plan.plan_fmha with torch workspaces on q's device."""
    return plan_fmha(kernel_name, q, k, v, out, mask=mask, causal=causal, scale=scale,
                     tiles=tiles, alloc=torch_alloc(q), lse=lse)


def run(launches: Sequence[Launch], stream=None) -> None:
    """Enqueue the launches in order on ``stream`` (default: torch's current stream).

    cuTile compiles each kernel variant on its first launch (and caches the cubin);
    compile errors surface here as cuTile exceptions (spak.device.env explains them).
    """
    if stream is None:
        stream = current_raw_stream()
    for L in launches:
        ct.launch(stream, L.grid, L.kernel, L.args)


def current_device():
    """torch.cuda.current_device() without its Python wrapper (lazy init and checks: a
    tensor on the GPU exists already when SPAK launches)."""
    import torch
    getter = getattr(torch._C, "_cuda_getDevice", None)
    return torch.cuda.current_device() if getter is None else getter()


def current_raw_stream(device: Optional[int] = None):
    """Torch's current stream on ``device`` (an index; default the current device), as the
    raw pointer ct.launch accepts.

    torch.cuda.current_stream() builds a Stream object through Python device-index lookups
    on every call; the private getter torch's own generated code uses returns the int
    directly (a small part of an eager call's ~80-150 us of host time: within the noise of
    results/host-profile-h100-2026-11-22). Falls back to the public call if a torch version
    lacks it.
    """
    import torch
    if device is None:
        device = torch.cuda.current_device()
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is None:
        return torch.cuda.current_stream(device)
    return getter(device)


def fmha_into(kernel_name: str, q, k, v, out, *, mask=None, causal: bool = False,
              scale: Optional[float] = None, tiles: Optional[dict] = None, hints=None,
              stream=None, lse=None):
    """Plan and run: ``out`` (preallocated, [B, Hq, Sq, Dv]) receives the attention.

    hints: {"occupancy", "num_ctas"} decorator options (gpu.variants); None = the kernel's.
    lse: None, or float32 [B, Hq, Sq] that also receives the row log-sum-exp (the fused
    kernel's LSE entry point, for the backward; see gpu.plan.plan_fmha).
    The fused kernel's plan is one launch whose first five (six with lse) arguments are
    the tensors and whose rest depends only on shapes, dtype, flags and config, so it is
    planned once per such key and reused: planning costs more host time than a short
    kernel takes.
    """
    if kernel_name == "fused" and mask is None:
        return _fused_cached(q, k, v, out, lse, causal, scale, tiles, hints, stream)
    run(apply_hints(plan_torch(kernel_name, q, k, v, out, mask=mask, causal=causal,
                               scale=scale, tiles=tiles, lse=lse), hints), stream)
    return out


def _fused_cached(q, k, v, out, lse, causal, scale, tiles, hints, stream):
    """fmha_into's fused, maskless path: the plan is made once per key and launched with
    each call's tensors. The cache keeps no call's tensors alive (its Launch holds None in
    their places) and only a dummy mask allocated outside any CUDA-graph memory pool
    (dummy_mask): a cached tensor from such a pool is a leak there, and an error for
    torch.compile's CUDA graphs ("tensor(s) in the cudagraph pool not tracked")."""
    n = 5 if lse is None else 6               # args[4]: the dummy mask; args[5]: the LSE
    # torch.Size hashes as a tuple; the config dicts are keyed in their own order (an
    # equal dict in another order only adds an entry): cheaper than sorting per call
    key = (q.shape, k.shape, v.shape, q.dtype, q.device, causal, scale or repr(scale),
           tuple(tiles.items()) if tiles else (), tuple(hints.items()) if hints else (), n)
    cached = _FUSED_PLANS.get(key)
    if cached is None:
        dummy, keep = dummy_mask(q)
        (L,) = apply_hints(plan_torch("fused", q, k, v, out, causal=causal, scale=scale,
                                      tiles=tiles, lse=lse), hints)
        L = dataclasses.replace(L, args=(None,) * 4 + (dummy,) + (None,) * (n - 5)
                                + L.args[n:])
        cached = (L, dummy)
        if keep:
            if len(_FUSED_PLANS) >= 512:          # many distinct shapes: start over
                _FUSED_PLANS.clear()
            _FUSED_PLANS[key] = cached
    L, dummy = cached
    # run() of the plan with this call's tensors, without building a new Launch
    args = (q, k, v, out, dummy) if lse is None else (q, k, v, out, dummy, lse)
    ct.launch(current_raw_stream() if stream is None else stream, L.grid, L.kernel,
              args + L.args[n:])
    return out


def fused_ready(q, k, v, out, lse, causal, scale, tiles, hints):
    """(grid, kernel, dummy mask, constant tail arguments) of the fused, maskless launch
    fmha_into made for these shapes and this config, or None when it keeps none (first
    call, or made under CUDA-graph capture): what a caller that keys its own calls more
    cheaply (spak.api) launches with ct.launch(stream, grid, kernel, (q, k, v, out, dummy
    [, lse]) + tail) without planning or building a key here."""
    n = 5 if lse is None else 6
    key = (q.shape, k.shape, v.shape, q.dtype, q.device, causal, scale or repr(scale),
           tuple(tiles.items()) if tiles else (), tuple(hints.items()) if hints else (), n)
    cached = _FUSED_PLANS.get(key)
    if cached is None:
        return None
    L, dummy = cached
    return L.grid, L.kernel, dummy, tuple(L.args[n:])


def dummy_mask(like):
    """(a float32 (1, 1, 1, 1) tensor on like's device, cacheable): the mask argument of a
    launch without a mask (HAS_MASK=False: never read). One per device, allocated on a side
    stream, so that it never lands in the private memory pool a CUDA graph capture or a
    torch.compile CUDA-graph warm-up routes the current stream's allocations to. During a
    capture a fresh one, not to be cached (the graph keeps its address; nothing reads it).
    """
    import torch
    dev = like.device
    t = _DUMMIES.get(dev)
    if t is not None:
        return t, True
    if dev.type != "cuda":
        t = _DUMMIES[dev] = torch.empty((1, 1, 1, 1), dtype=torch.float32, device=dev)
        return t, True
    if torch.cuda.is_current_stream_capturing():
        return torch.empty((1, 1, 1, 1), dtype=torch.float32, device=dev), False
    with torch.cuda.stream(torch.cuda.Stream(dev)):
        t = _DUMMIES[dev] = torch.empty((1, 1, 1, 1), dtype=torch.float32, device=dev)
    return t, True


_DUMMIES: dict = {}


#: workspace offsets rounded up to this many floats (256 bytes: the allocator's own
#: alignment, which the kernels' TMA loads and the compiled variants assume)
_ALIGN = 64


def workspace_layout(shapes) -> tuple:
    """(total floats, ((shape, strides, offset), ...)): the split workspaces as views of
    one float32 buffer, so a call makes one torch.empty (~4.9 us of host time each on an
    H200, results/issue34-host-h200-2026-11-28), not one per workspace."""
    views, at = [], 0
    for shape in shapes:
        strides, n = [], 1
        for d in reversed(shape):
            strides.insert(0, n)
            n *= d
        views.append((shape, tuple(strides), at))
        at += -(-n // _ALIGN) * _ALIGN
    return at, tuple(views)


def workspaces(layout, device) -> list:
    """The workspaces of a workspace_layout: one allocation, views at aligned offsets."""
    total, views = layout
    if not views:
        return []
    import torch
    buf = torch.empty(total, dtype=torch.float32, device=device)
    return [buf.as_strided(shape, strides, off) for shape, strides, off in views]


def fmha_bwd_into(kernel_name: str, q, k, v, out, dout, lse, dq, dk, dv, *, mask=None,
                  causal: bool = False, scale: Optional[float] = None,
                  tiles: Optional[dict] = None, stream=None, hints: Optional[dict] = None):
    """The backward: ``dq``, ``dk``, ``dv`` (preallocated, q/k/v's shapes and dtype) receive
    the gradients of ``out = fmha(q, k, v)`` for the incoming gradient ``dout``, from the
    forward's ``out`` and row log-sum-exp ``lse`` (float32 [B, Hq, Sq]).

    gpu.plan_bwd.plan_fmha_bwd plans it (tiles None = its defaults), once per shape, dtype,
    flags and config (_plan_bwd_recipe); its workspaces are views of one fresh torch
    tensor on q's device each call (the caching allocator: CUDA-graph capture safe); the
    cache keeps no tensor but the dummy mask (dummy_mask: allocated outside any graph
    pool). plan_bwd is imported when first needed: the inference path never needs it.
    hints: {occupancy, num_ctas} for the dK/dV and dQ launches (a tuned store entry's;
    the memory-bound preprocess keeps its own), None = the kernels' own.
    """
    named = (q, k, v, out, dout, lse, dq, dk, dv) + (() if mask is None else (mask,))
    key = _bwd_key(kernel_name, q, k, v, mask, causal, scale, tiles, hints)
    recipe = _BWD_PLANS.get(key)
    if recipe is None:
        recipe = _plan_bwd_recipe(kernel_name, named, mask is not None, causal, scale, tiles,
                                  hints)
        if recipe is None:                  # not cacheable: planned and run as is
            from .plan_bwd import plan_fmha_bwd
            run(bwd_hinted(plan_fmha_bwd(kernel_name, q, k, v, out, dout, lse, dq, dk, dv,
                                         mask=mask, causal=causal, scale=scale, tiles=tiles,
                                         alloc=torch_alloc(q)), hints), stream)
            return dq, dk, dv
        if len(_BWD_PLANS) >= 512:
            _BWD_PLANS.clear()
        _BWD_PLANS[key] = recipe
    # this call's tensors and fresh workspaces in the places the plan put them: a pool of
    # (named, workspaces, constants), each launch's arguments taken by one itemgetter
    launches, layout, consts = recipe
    pool = named + tuple(workspaces(layout, q.device)) + consts
    stream = current_raw_stream() if stream is None else stream
    for kernel, grid, get in launches:
        ct.launch(stream, grid, kernel, get(pool))
    return dq, dk, dv


def _bwd_key(kernel_name, q, k, v, mask, causal, scale, tiles, hints) -> tuple:
    return (kernel_name, q.shape, k.shape, v.shape, q.dtype, q.device,
            None if mask is None else mask.shape, causal, scale or repr(scale),
            tuple(tiles.items()) if tiles else (),
            tuple(sorted(hints.items())) if hints else ())


def bwd_recipe(kernel_name, q, k, v, *, mask=None, causal=False, scale=None, tiles=None,
               hints=None):
    """The recipe (launches as (kernel, grid, getter), workspace_layout, constants) that
    fmha_bwd_into made for this call signature, or None (not made yet, or not cacheable):
    what spak.api's prepared backward launches without fmha_bwd_into's key."""
    return _BWD_PLANS.get(_bwd_key(kernel_name, q, k, v, mask, causal, scale, tiles, hints))


def capturing() -> bool:
    """Whether torch's current stream is capturing a CUDA graph (the raw C getter;
    torch.cuda.is_current_stream_capturing's Python wrapper when a torch lacks it)."""
    import torch
    getter = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    return torch.cuda.is_current_stream_capturing() if getter is None else getter()


#: the backward's launches a config's occupancy / num_ctas hints apply to
BWD_HINTED_LAUNCHES = ("bwd.dkdv", "bwd.dq")


def bwd_hinted(launches, hints) -> list:
    """The backward's launches with ``hints`` applied to dK/dV and dQ (not the preprocess)."""
    if not hints:
        return list(launches)
    return [apply_hints([L], hints)[0] if L.name in BWD_HINTED_LAUNCHES else L
            for L in launches]


def _plan_bwd_recipe(kernel_name, named, has_mask, causal, scale, tiles, hints=None):
    """The backward's plan as a recipe: (launches as (kernel, grid, getter), workspaces as
    one workspace_layout, constants); a launch's getter takes its arguments from the pool
    named + workspaces + constants (binding them one by one cost ~10 us a call). The
    float32 workspaces are views of one allocation per call, the never-read dummy mask
    a constant (dummy_mask): a torch.empty costs ~4.9 us of host time on an H200
    (results/issue34-host-h200-2026-11-28), and the backward made three a call. Planning
    (validation included) costs ~45 us of host time
    per call, about what a short backward kernel takes; a recipe is rebuilt in a few.
    None when the call's tensors are not distinct objects (q is k in self-attention): then
    a slot could not tell them apart, and a later call with distinct ones would be wrong."""
    from .plan_bwd import plan_fmha_bwd
    if len({id(t) for t in named}) != len(named):
        return None
    base, work, made, dummies = torch_alloc(named[0]), [], [], []

    def alloc(shape, kind):
        shape = tuple(int(n) for n in shape)
        if kind != "float32":                 # one float32 buffer holds the workspaces
            raise _NotCacheable
        if shape == (1, 1, 1, 1) and not has_mask:  # the never-read mask: kept once
            dummy, keep = dummy_mask(named[0])
            if keep:
                dummies.append(dummy)
                return dummy
        t = base(shape, kind)
        work.append(shape)
        made.append(t)
        return t
    q, k, v, out, dout, lse, dq, dk, dv = named[:9]
    try:
        launches = plan_fmha_bwd(kernel_name, q, k, v, out, dout, lse, dq, dk, dv,
                                 mask=named[9] if has_mask else None, causal=causal,
                                 scale=scale, tiles=tiles, alloc=alloc)
    except _NotCacheable:
        return None
    launches = bwd_hinted(launches, hints)
    import operator
    # the pool fmha_bwd_into binds from: named tensors, workspaces, constants
    where = {id(t): i for i, t in enumerate(named)}
    where.update({id(t): len(named) + j for j, t in enumerate(made)})
    consts, recipe = [], []
    for L in launches:
        idx = []
        for a in L.args:
            if hasattr(a, "data_ptr") and not any(a is d for d in dummies):
                # a tensor: must be one of ours (the kept dummy mask is a constant)
                if id(a) not in where:
                    return None
                idx.append(where[id(a)])
            else:
                idx.append(len(named) + len(made) + len(consts))
                consts.append(a)
        get = (operator.itemgetter(*idx) if len(idx) > 1
               else (lambda pool, i=idx[0]: (pool[i],)))
        recipe.append((L.kernel, L.grid, get))
    return recipe, workspace_layout(work), tuple(consts)


class _NotCacheable(Exception):
    """A backward plan asked for a workspace the recipe does not lay out (not float32)."""


_BWD_PLANS: dict = {}


_FUSED_PLANS: dict = {}
