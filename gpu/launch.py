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

from typing import Optional, Sequence

import cuda.tile as ct

from .plan import Launch, plan_fmha
from .variants import apply_hints

__all__ = ["torch_alloc", "plan_torch", "run", "current_raw_stream", "fmha_into",
           "fmha_bwd_into"]


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
               scale: Optional[float] = None, tiles: Optional[dict] = None) -> list[Launch]:
    """gpu.plan.plan_fmha with torch workspaces on q's device."""
    return plan_fmha(kernel_name, q, k, v, out, mask=mask, causal=causal, scale=scale,
                     tiles=tiles, alloc=torch_alloc(q))


def run(launches: Sequence[Launch], stream=None) -> None:
    """Enqueue the launches in order on ``stream`` (default: torch's current stream).

    cuTile compiles each kernel variant on its first launch (and caches the cubin);
    compile errors surface here as cuTile exceptions (spak.device.env explains them).
    """
    if stream is None:
        stream = current_raw_stream()
    for L in launches:
        ct.launch(stream, L.grid, L.kernel, L.args)


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
    if kernel_name == "fused" and mask is None and lse is not None:
        # the training forward: same reuse, one more tensor (args[5], the LSE)
        key = (q.shape, k.shape, v.shape, q.dtype, q.device, causal, scale,
               tuple(tiles.items()) if tiles else (), tuple(hints.items()) if hints else (),
               "lse")
        cached = _FUSED_PLANS.get(key)
        if cached is None:
            if len(_FUSED_PLANS) >= 512:
                _FUSED_PLANS.clear()
            (L,) = apply_hints(plan_fmha(kernel_name, q, k, v, out, mask=None, causal=causal,
                                         scale=scale, tiles=tiles, alloc=torch_alloc(q),
                                         lse=lse), hints)
            cached = _FUSED_PLANS[key] = (L, L.args[4])
        L, dummy = cached
        ct.launch(current_raw_stream() if stream is None else stream, L.grid, L.kernel,
                  (q, k, v, out, dummy, lse) + L.args[6:])
        return out
    if kernel_name == "fused" and mask is None:
        # torch.Size hashes as a tuple; the config dicts are keyed in their own order (an
        # equal dict in another order only adds an entry): cheaper than sorting per call
        key = (q.shape, k.shape, v.shape, q.dtype, q.device, causal, scale,
               tuple(tiles.items()) if tiles else (), tuple(hints.items()) if hints else ())
        cached = _FUSED_PLANS.get(key)
        if cached is None:
            if len(_FUSED_PLANS) >= 512:          # many distinct shapes: start over
                _FUSED_PLANS.clear()
            (L,) = apply_hints(plan_torch(kernel_name, q, k, v, out, mask=None, causal=causal,
                                          scale=scale, tiles=tiles), hints)
            cached = _FUSED_PLANS[key] = (L, L.args[4])      # args[4]: the dummy mask
        L, dummy = cached
        # run() of the plan with this call's tensors, without building a new Launch
        ct.launch(current_raw_stream() if stream is None else stream, L.grid, L.kernel,
                  (q, k, v, out, dummy) + L.args[5:])
        return out
    if lse is not None:
        run(apply_hints(plan_fmha(kernel_name, q, k, v, out, mask=mask, causal=causal,
                                  scale=scale, tiles=tiles, alloc=torch_alloc(q), lse=lse),
                        hints), stream)
        return out
    run(apply_hints(plan_torch(kernel_name, q, k, v, out, mask=mask, causal=causal,
                               scale=scale, tiles=tiles), hints), stream)
    return out


def fmha_bwd_into(kernel_name: str, q, k, v, out, dout, lse, dq, dk, dv, *, mask=None,
                  causal: bool = False, scale: Optional[float] = None,
                  tiles: Optional[dict] = None, stream=None):
    """The backward: ``dq``, ``dk``, ``dv`` (preallocated, q/k/v's shapes and dtype) receive
    the gradients of ``out = fmha(q, k, v)`` for the incoming gradient ``dout``, from the
    forward's ``out`` and row log-sum-exp ``lse`` (float32 [B, Hq, Sq]).

    gpu.plan_bwd.plan_fmha_bwd plans it (tiles None = its defaults); its workspaces are
    torch tensors on q's device (the caching allocator: CUDA-graph capture safe). Imported
    here, not at module level: the inference path never needs the backward kernels.
    """
    from .plan_bwd import plan_fmha_bwd
    run(plan_fmha_bwd(kernel_name, q, k, v, out, dout, lse, dq, dk, dv, mask=mask,
                      causal=causal, scale=scale, tiles=tiles, alloc=torch_alloc(q)), stream)
    return dq, dk, dv


_FUSED_PLANS: dict = {}
