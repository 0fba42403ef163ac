"""The PyTorch entry points' host path on the CPU: CUDA faked, the launch a no-op.

    with fake_cuda():                           # CPU tensors pass for one CUDA device
        calls = count_calls(lambda: spak.fmha(q, k, v, is_causal=True))
        us = per_call_us(lambda: spak.fmha(q, k, v, is_causal=True), 2000)

An eager call of a short kernel costs its host time: validation, config lookup, custom-op
dispatch, workspace allocation, argument packing, ``ct.launch``, autograd bookkeeping.
Everything but the launch and the CUDA runtime queries is Python and torch on the host, so
it runs here on CPU tensors: ``fake_cuda`` lets them through the CUDA-only checks, answers
torch.cuda's device queries (an sm_90 "NVIDIA H100 80GB HBM3" with 132 SMs, device 0,
stream 0) and replaces ``ct.launch`` by a recorder that launches nothing. The real launch
and driver calls are what this leaves out (tools/host_cost_bench.py times them on a GPU).

``count_calls`` counts the calls the repository's code makes during one call (Python
functions and C functions alike: torch ops, builtins, ``ct.launch``), a number that does not
depend on the machine's speed; tests/test_host_cost.py holds each entry point to a budget.
tools/host_profile_cpu.py prints both and a cProfile per entry point.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

__all__ = ["fake_cuda", "count_calls", "device_calls", "per_call_us", "FAKE_GPU", "LAUNCHES",
           "GPU_US"]

FAKE_GPU = "NVIDIA H100 80GB HBM3"
#: (grid, kernel, args) of every launch under fake_cuda (cleared on entry)
LAUNCHES: list = []
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _NoDevice:
    """torch.cuda.device(i) on one device: nothing to switch."""

    def __init__(self, index=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


#: calls of the faked torch.cuda functions ("cuda_query") and of torch._C's raw device
#: and stream getters ("raw_getter": C calls, cheap on a GPU too)
QUERIES = {"cuda_query": 0, "raw_getter": 0}


def _counted(fn, kind="cuda_query"):
    """fn, counting its calls in QUERIES[kind] (a real one asks the CUDA runtime)."""
    def query(*args, **kwargs):
        QUERIES[kind] += 1
        return fn(*args, **kwargs)
    # named like a lambda: count_calls counts what it calls, not the counter itself
    query.__code__ = query.__code__.replace(co_name="<query>")
    return query


def _launch(stream, grid, kernel, args):
    LAUNCHES.append((grid, kernel, args))


@contextlib.contextmanager
def fake_cuda():
    """CPU tensors pass for CUDA ones of device 0 of an H100; ct.launch records (LAUNCHES).
    Restores everything it replaced, and empties the caches that saw the fake device."""
    import types

    import cuda.tile as ct
    import torch

    import spak.api as api
    import spak.gpu.launch as gl
    import spak.kvcache as kvc
    import spak.torch_checks as tc
    real_check = tc.check_devices

    def check_devices(named, optional, require_cuda, entry, cpu_hint):
        return real_check(named, optional, False, entry, cpu_hint)
    props = types.SimpleNamespace(multi_processor_count=132, L2_cache_size=50 << 20,
                                  major=9, minor=0, name=FAKE_GPU)
    cuda = {"current_device": _counted(lambda: None), "device": _counted(_NoDevice),
            "get_device_capability": _counted(lambda *a: (9, 0)),
            "get_device_name": _counted(lambda *a: FAKE_GPU),
            "get_device_properties": _counted(lambda *a: props),
            "is_current_stream_capturing": _counted(lambda: False)}
    patches = [(torch.cuda, name, val) for name, val in cuda.items()]
    patches += [(torch._C, "_cuda_getCurrentRawStream", _counted(lambda device: 0, "raw_getter")),
                (torch._C, "_cuda_getDevice", _counted(lambda: None, "raw_getter")),
                (torch._C, "_cuda_isCurrentStreamCapturing",
                 _counted(lambda: False, "raw_getter")),
                (ct, "launch", _launch)]
    patches += [(mod, "check_devices", check_devices) for mod in (api, kvc, _varlen(), tc)]
    saved = [(obj, name, getattr(obj, name, _MISSING)) for obj, name, _ in patches]
    caches = [api._device_info.cache_clear, kvc._num_sms.cache_clear, _bwd_ready().clear]
    caches += [getattr(mod, name).clear for mod, names in (
        (api, ("_VALIDATED", "_lookup_cache", "_READY")),
        (gl, ("_FUSED_PLANS", "_BWD_PLANS", "_DUMMIES")), (kvc, ("_PLANS", "_VALIDATED", "_READY")),
        (_varlen(), ("_PLANS", "_VALIDATED", "_READY"))) for name in names if hasattr(mod, name)]
    try:
        for obj, name, val in patches:
            setattr(obj, name, val)
        for clear in caches:
            clear()
        LAUNCHES.clear()
        yield LAUNCHES
    finally:
        for obj, name, val in saved:
            if val is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, val)
        for clear in caches:
            clear()


_MISSING = object()


def _bwd_ready():
    import spak.bwd_ready as bwd_ready
    return bwd_ready


def _varlen():
    import spak.varlen as varlen
    return varlen


#: the interpreter's own trees (a venv may sit inside the repository, as CI's .venv does)
_PREFIXES = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})


def count_calls(fn, *, where=_ROOT, inside=None) -> int:
    """Calls made by code under ``where`` (the repository) while ``fn()`` runs: each call
    of a Python or C function whose caller is a frame of a file under ``where``.
    Comprehension frames are not counted themselves (Python 3.12 inlines them); the calls
    made inside them are. inside: a code object (api._Train.backward's): count only while
    a frame of it runs (the Python the autograd engine's thread runs for spak.fmha)."""
    count = 0
    ours: dict = {}
    if inside is not None:
        active = [0]
        counter = _count_inside(inside, active)

    def mine(code):
        m = ours.get(code)
        if m is None:
            # a virtual environment inside the checkout (CI's .venv) holds torch: not ours
            f = code.co_filename
            m = ours[code] = f.startswith(where) and (
                not where or ("site-packages" not in f and not f.startswith(_PREFIXES)))
        return m

    def prof(frame, event, arg):
        nonlocal count
        if inside is not None and not counter(frame, event):
            return
        if event == "call":
            back = frame.f_back
            if (back is not None and mine(back.f_code)
                    and not frame.f_code.co_name.startswith("<")):
                count += 1
        elif event == "c_call" and mine(frame.f_code):
            count += 1
    _profiled(fn, prof)
    return count


def _count_inside(code, active):
    """A profile filter: True while a frame of ``code`` is on the stack (active[0] > 0);
    the frame's own call is not counted, the calls it makes are."""
    def counter(frame, event):
        if frame.f_code is code:
            if event == "call":
                active[0] += 1
                return False
            if event == "return":
                active[0] -= 1
        return active[0] > 0
    return counter


def _profiled(fn, prof) -> None:
    """fn() with ``prof`` as the profile hook (removed however fn ends)."""
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)


#: torch functions and Tensor methods that allocate a tensor (on a GPU: the CUDA caching
#: allocator, ~4.9 us of host time each on an H200, results/issue34-host-h200-2026-11-28)
ALLOC_NAMES = frozenset({"empty", "empty_like", "empty_strided", "zeros", "zeros_like",
                         "ones", "ones_like", "full", "full_like", "tensor", "new_empty",
                         "new_zeros", "new_ones", "new_full", "new_tensor", "clone"})
#: the allocations among ALLOC_NAMES that take another tensor's size, dtype and device:
#: they parse no size, dtype or device argument, half the host time of torch.empty(shape,
#: dtype=, device=) (CPU box: 1.0 against 2.1 us; H200 host: 3.8 against 6.4); the others
#: are counted apart ("alloc_sized")
LIKE_NAMES = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "clone"})
#: host microseconds of each device-side call on an H200 (issue 34's floor rows): a
#: launch, each torch tensor argument of a launch, an allocation, a torch.cuda query
#: (its Python wrapper and lazy-init check; an estimate, not a floor row)
GPU_US = {"launch": 4.4, "tensor_arg": 1.3, "alloc": 4.9, "cuda_query": 1.0}


def device_calls(fn) -> dict:
    """What the fake makes free but a GPU does not, in one call of ``fn`` (under
    fake_cuda): {"launch": ct.launch calls, "tensor_arg": torch tensors passed to them,
    "alloc": tensor allocations made from Python anywhere (ALLOC_NAMES; the autograd
    engine's own, in C++, are not seen), "alloc_sized": those of them not in LIKE_NAMES,
    "cuda_query": torch.cuda.* calls, "raw_getter": torch._C's device and stream getters
    (the fake answers both)}, and "gpu_us": these weighted by GPU_US, the host time they
    add on an H200 beyond the CPU's."""
    import torch
    n0, q0 = len(LAUNCHES), dict(QUERIES)
    allocs = sized = 0

    def prof(frame, event, arg):
        nonlocal allocs, sized
        name = getattr(arg, "__name__", None) if event == "c_call" else None
        if name in ALLOC_NAMES:
            owner = getattr(arg, "__self__", None)
            if owner is torch or isinstance(owner, torch.Tensor) or owner is None \
                    or getattr(owner, "__name__", "") == "torch._C._VariableFunctions":
                allocs += 1
                sized += name not in LIKE_NAMES
    _profiled(fn, prof)
    launches = LAUNCHES[n0:]
    out = {"launch": len(launches),
           "tensor_arg": sum(isinstance(a, torch.Tensor) for _, _, args in launches
                             for a in args),
           "alloc": allocs, "alloc_sized": sized,
           **{k: QUERIES[k] - q0[k] for k in QUERIES}}
    out["gpu_us"] = round(sum(GPU_US[k] * out[k] for k in GPU_US), 1)
    return out


def per_call_us(fn, n: int = 2000, repeats: int = 3, clock=time.perf_counter) -> float:
    """Best of ``repeats`` loops of ``n`` calls: microseconds per call (after a warm-up).
    clock=time.process_time counts this process's CPU time only: steadier than the wall
    clock on a machine shared with other work. Under fake_cuda the launch records nothing
    while timing: LAUNCHES would keep every launched tensor alive, so that each allocation
    took fresh memory (issue 34h: the training step read 90 us on the CPU box with the
    recorder, 60 without)."""
    import cuda.tile as ct
    real = ct.launch
    if real is _launch:
        ct.launch = _drop
    try:
        for _ in range(20):
            fn()
        best = float("inf")
        for _ in range(repeats):
            t0 = clock()
            for _ in range(n):
                fn()
            best = min(best, (clock() - t0) / n * 1e6)
    finally:
        ct.launch = real
    return best


def _drop(stream, grid, kernel, args):
    """fake_cuda's launch while per_call_us times: nothing recorded."""


def cases(seed: int = 0) -> dict:
    """name -> fn: one eager call of each entry point on CPU tensors (use under fake_cuda),
    at the shapes of tools/host_cost_bench.py. Random inputs (the launch is a recorder, so
    only the host path runs)."""
    import torch

    import spak
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, grad=False):
        return torch.randn(shape, generator=g).half().requires_grad_(grad)
    q1, k1, v1 = rnd(1, 2, 16, 64), rnd(1, 2, 16, 64), rnd(1, 2, 16, 64)
    q4, k4, v4 = rnd(4, 16, 512, 64), rnd(4, 16, 512, 64), rnd(4, 16, 512, 64)
    qg, kg, vg = (rnd(1, 2, 16, 64, grad=True) for _ in range(3))
    dout = rnd(1, 2, 16, 64)
    qd, kc, vc = rnd(1, 1, 32, 64), rnd(1, 256, 8, 64), rnd(1, 256, 8, 64)
    lens = torch.tensor([200], dtype=torch.int32)
    qv, kv, vv = rnd(40, 2, 64), rnd(40, 2, 64), rnd(40, 2, 64)
    cu = torch.tensor([0, 16, 40], dtype=torch.int32)

    def train():
        spak.fmha(qg, kg, vg, is_causal=True).backward(dout)
    return {
        "fmha 1x2x16x64 causal": lambda: spak.fmha(q1, k1, v1, is_causal=True),
        "fmha 4x16x512x64 causal": lambda: spak.fmha(q4, k4, v4, is_causal=True),
        "fmha fwd+bwd 1x2x16x64 causal": train,
        "fmha_kvcache 1x1x32:8 x256": lambda: spak.fmha_kvcache(qd, kc, vc, lens),
        "fmha_varlen 2 seqs (16, 24) x2x64 causal": lambda: spak.fmha_varlen(
            qv, kv, vv, cu, cu, 24, 24, is_causal=True),
    }
