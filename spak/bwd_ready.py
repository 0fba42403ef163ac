"""The training step's backward as one prepared launcher (issue 34).

autograd runs a CUDA backward on its device thread, and every Python step run there costs
more than on the calling thread: on an H200, spak.fmha's backward node took 187 us a step
on the main thread and 363 us on the engine's thread, and 189 us with both threads pinned
to one CPU (results/issue34-host-h200-2026-11-28/run3-train-diag). So the backward runs
as little Python as it can: the forward (on the calling thread) finds this call
signature's BwdReady, made from the first backward's recipe (gpu.launch.bwd_recipe), and
the backward's body is BwdReady.run: the gradients allocated, the launches bound from one
pool of this step's tensors, a workspace kept per (stream, thread).

    ready = remembered(key)          # in _Train.forward: None until a backward made one
    dq, dk, dv = ready.run(dout, q, k, v, out, lse)     # None: take the general path

The general path (api._bwd_impl through gpu.launch.fmha_bwd_into) launches the same
kernels with the same arguments; tests/test_host_cost.py checks it.
"""
from __future__ import annotations

import os
import threading

import torch

__all__ = ["BwdReady", "remember", "remembered", "clear", "ENABLED", "KEEP_WORK_BYTES"]

#: SPAK_BWD_READY=0 turns the prepared backward off (the A/B of tools/host_cost_bench.py)
ENABLED = os.environ.get("SPAK_BWD_READY", "1") != "0"
#: a backward's float32 workspace (delta and the log2 LSE, 8 bytes a query row) is kept
#: between steps up to this size; a larger one is allocated each step as before
KEEP_WORK_BYTES = 4 << 20
#: the gradients dq, dk, dv allocated by the forward (on the calling thread), not by the
#: backward (on autograd's device thread, where each step costs more: see above), when
#: together at most this many bytes (the tiny problems whose step is host-bound; SPAK_BWD_
#: PREALLOC_BYTES=0: off). They then live from the forward to the backward: 3 more
#: tensors per recorded call, q's, k's and v's sizes, as SDPA's own backward buffers do not
PREALLOC_BYTES = int(os.environ.get("SPAK_BWD_PREALLOC_BYTES", str(1 << 20)))
#: bumped by clear(): a launcher a caller kept (api._Args.bwd) is looked up again
GEN = [0]
#: kept workspaces per call signature: one per (stream, thread) that ran its backward
MAX_KEPT = 8
#: all kept workspaces together at most this many bytes (then allocated each step)
KEEP_TOTAL_BYTES = 64 << 20
_KEPT_BYTES = [0]

_empty_like = torch.empty_like


def _never() -> bool:
    return False

_get_ident = threading.get_ident


class BwdReady:
    """One call signature's backward: device index, launches (kernel, grid, getter),
    workspace layout, constant arguments, workspaces kept per (stream, thread), and
    torch's raw device, stream and capture getters (C functions; bound here, so that the
    backward on the engine's thread makes no lookup)."""
    __slots__ = ("dev", "device", "launches", "layout", "consts", "keep", "kept", "gl",
                 "getdev", "getstream", "capturing", "grad_bytes")

    def __init__(self, device, recipe, grad_bytes: int = 0):
        import spak.gpu.launch as gl
        launches, layout, consts = recipe
        self.dev, self.device, self.gl = device.index, device, gl
        self.launches, self.layout, self.consts = tuple(launches), layout, consts
        self.keep = 0 < layout[0] * 4 <= KEEP_WORK_BYTES
        self.kept: dict = {}
        self.grad_bytes = grad_bytes
        if device.type == "cuda":
            c = torch._C
            self.getdev = getattr(c, "_cuda_getDevice", None) or gl.current_device
            self.getstream = (getattr(c, "_cuda_getCurrentRawStream", None)
                              or gl.current_raw_stream)
            self.capturing = getattr(c, "_cuda_isCurrentStreamCapturing", None) or gl.capturing
        else:       # CPU tensors (the simulator's tests, the host-cost fake): gl's getters,
            # looked up per call (the tests patch them); no CUDA graph to capture
            self.getdev = lambda: gl.current_device()
            self.getstream = lambda dev: gl.current_raw_stream(dev)
            self.capturing = _never

    def grads(self, q, k, v):
        """(dq, dk, dv) for a later run(), allocated now (by the forward, on the calling
        thread), or None: not for this signature (over PREALLOC_BYTES), or under
        CUDA-graph capture (a graph's forward and backward may be captured apart)."""
        if 0 < self.grad_bytes <= PREALLOC_BYTES and not self.capturing():
            return _empty_like(q), _empty_like(k), _empty_like(v)
        return None

    def run(self, dout, q, k, v, out, lse, grads=None):
        """(dq, dk, dv), launched on the current stream, into ``grads`` when given (from
        grads(); each given once); None when another device is current (the general path
        has the device guard). The workspaces: kept per
        (stream, thread), so that the launches of two steps on one stream are ordered by
        it and two threads never share one; fresh under CUDA-graph capture (a graph must
        own what it reads) and when large."""
        dev = self.dev
        if self.getdev() != dev:
            return None
        stream = self.getstream(dev)
        if self.keep and not self.capturing():
            key = (stream, _get_ident())
            work = self.kept.get(key)
            if work is None:
                work = tuple(self.gl.workspaces(self.layout, self.device))
                size = self.layout[0] * 4
                if len(self.kept) < MAX_KEPT and _KEPT_BYTES[0] + size <= KEEP_TOTAL_BYTES:
                    self.kept[key] = work
                    _KEPT_BYTES[0] += size
        else:
            work = tuple(self.gl.workspaces(self.layout, self.device))
        if grads is None:
            dq, dk, dv = _empty_like(q), _empty_like(k), _empty_like(v)
        else:
            dq, dk, dv = grads
        pool = (q, k, v, out, dout.contiguous(), lse, dq, dk, dv) + work + self.consts
        launch = self.gl.ct.launch
        try:                # a new specialisation (another alignment) may compile here
            for kernel, grid, get in self.launches:
                launch(stream, grid, kernel, get(pool))
        except Exception as exc:
            from spak.device import env as gpu_env
            if not gpu_env.is_compile_error(exc):
                raise
            major, minor = torch.cuda.get_device_capability(self.device)
            raise gpu_env.explain(exc, arch=f"sm_{major}{minor}") from exc
        return dq, dk, dv


_READY: dict = {}


def remembered(key):
    """The BwdReady made for this key (api._Train.forward's call signature), or None."""
    return _READY.get(key) if ENABLED else None


def remember(key, device, recipe, grad_bytes: int = 0) -> None:
    """Keep a BwdReady for `key` from gpu.launch's backward recipe (None: nothing);
    grad_bytes: dq's, dk's and v's bytes together (BwdReady.grads allocates them when
    at most PREALLOC_BYTES)."""
    if recipe is None or not ENABLED:
        return
    if len(_READY) >= 512:                  # many distinct shapes: start over
        clear()
    _READY[key] = BwdReady(device, recipe, grad_bytes)


def clear() -> None:
    """Forget every launcher (and the count of kept workspace bytes: a launcher still
    held by a recorded graph keeps its workspaces until that graph is freed)."""
    _READY.clear()
    _KEPT_BYTES[0] = 0
    GEN[0] += 1
