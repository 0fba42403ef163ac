"""Eager host cost per call of SPAK's entry points against SDPA, in one process (issue 34).

    source .carry/setup.sh && python tools/host_cost_bench.py --out DIR [--n 2000] [--check]
    python tools/host_cost_bench.py --dry-run          # the rows on the CPU, CUDA faked
    ... --train-diag [--dry-run]    # only the training step's diagnosis rows (issue 34d)

eager_us(fn, n): n eager calls back to back, one synchronize at the end: for problems whose
GPU work is shorter than the host's, the wall time per call is the host's cost per call
(the figure a user's eager loop sees). Rows: spak.fmha (1x2x16x64 and 4x16x512x64 causal),
forward + backward (1x2x16x64 causal; and apart: the forward that records the graph, and
the backward's body api._bwd_impl without the autograd engine), spak.fmha_kvcache (1 query
x 32 heads : 8 kv heads, 256-key cache; also with two splits, the former plan),
spak.fmha_varlen (2 sequences); SDPA (cuDNN, flash, default) on the same problems; the
floor: ct.launch alone, of the fused kernel with prepared arguments, and of a trivial
kernel (no argument; 5 tensors + 8 scalars as torch tensors and as objects with a ready
__cuda_array_interface__). --check: gpu_checks (decode split counts' GPU time from CUDA
graphs, the changed paths against float64). spak.fmha against NVIDIA's sample under
do_bench is the harness's (`spak run --timing flush --peers sdpa,nvidia-sample`). Every row
fails soft. Writes host_cost.json and host_cost.md into --out (after each part); prints
the table.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def eager_us(fn, n: int = 2000, sync=None) -> float:
    """Microseconds per call of n back-to-back eager calls, one sync at the end (best of 3
    loops, after 50 warm-up calls)."""
    sync = sync or (lambda: None)
    for _ in range(50):
        fn()
    sync()
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def _rand(torch, dev, *shape, grad=False):
    return torch.randn(shape, device=dev, dtype=torch.float16).requires_grad_(grad)


def _sdpa_rows(torch, F, name, call):
    """SDPA rows of one problem: cuDNN, flash, default (backend pinned around the loop)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = {}
    for label, be in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                      ("flash", SDPBackend.FLASH_ATTENTION), ("default", None)):
        rows[f"{name} | SDPA {label}"] = (call, be)
    return rows


def eager_rows(torch, dev):
    """name -> fn (or (fn, SDPA backend)) of every eager row."""
    import spak
    F = torch.nn.functional
    r = {}
    q1, k1, v1 = (_rand(torch, dev, 1, 2, 16, 64) for _ in range(3))
    q4, k4, v4 = (_rand(torch, dev, 4, 16, 512, 64) for _ in range(3))
    r["fmha 1x2x16x64 causal | spak"] = lambda: spak.fmha(q1, k1, v1, is_causal=True)
    r.update(_sdpa_rows(torch, F, "fmha 1x2x16x64 causal",
                        lambda: F.scaled_dot_product_attention(q1, k1, v1, is_causal=True)))
    r["fmha 4x16x512x64 causal | spak"] = lambda: spak.fmha(q4, k4, v4, is_causal=True)
    r.update(_sdpa_rows(torch, F, "fmha 4x16x512x64 causal",
                        lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True)))
    qg, kg, vg = (_rand(torch, dev, 1, 2, 16, 64, grad=True) for _ in range(3))
    do = _rand(torch, dev, 1, 2, 16, 64)
    r["fwd+bwd 1x2x16x64 causal | spak"] = lambda: spak.fmha(
        qg, kg, vg, is_causal=True).backward(do)
    r.update(_sdpa_rows(torch, F, "fwd+bwd 1x2x16x64 causal", lambda: F.scaled_dot_product_attention(
        qg, kg, vg, is_causal=True).backward(do)))
    # where the training step's time goes: the forward that records the graph alone, and
    # the backward's body alone (3 launches + allocations, no autograd engine)
    r["fwd (grad) 1x2x16x64 causal | spak"] = lambda: spak.fmha(qg, kg, vg, is_causal=True)
    r.update(_sdpa_rows(torch, F, "fwd (grad) 1x2x16x64 causal",
                        lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)))
    r["bwd body 1x2x16x64 causal | spak api._bwd_impl"] = _bwd_body(spak, qg, kg, vg, do)
    qd = _rand(torch, dev, 1, 1, 32, 64)
    kc, vc = (_rand(torch, dev, 1, 256, 8, 64) for _ in range(2))
    lens = torch.tensor([256], dtype=torch.int32, device=dev)
    r["kvcache 1x1x32:8 x256 | spak"] = lambda: spak.fmha_kvcache(qd, kc, vc, lens)
    # the plan before gpu.plan_decode.SHORT_CACHE_TILES: split + combine
    r["kvcache 1x1x32:8 x256 | spak num_splits=2"] = lambda: spak.fmha_kvcache(
        qd, kc, vc, lens, num_splits=2)
    qs, ks, vs = qd.transpose(1, 2).contiguous(), *(t.transpose(1, 2).contiguous()
                                                    for t in (kc, vc))
    r.update(_sdpa_rows(torch, F, "kvcache 1x1x32:8 x256", lambda: F.scaled_dot_product_attention(
        qs, ks, vs, enable_gqa=True)))
    qv, kv, vv = (_rand(torch, dev, 40, 2, 64) for _ in range(3))
    cu = torch.tensor([0, 16, 40], dtype=torch.int32, device=dev)
    r["varlen 2 seqs (16, 24) x2x64 causal | spak"] = lambda: spak.fmha_varlen(
        qv, kv, vv, cu, cu, 24, 24, is_causal=True)
    qp, kp, vp = (_rand(torch, dev, 2, 2, 24, 64) for _ in range(3))
    r.update(_sdpa_rows(torch, F, "varlen 2 seqs (16, 24) x2x64 causal (SDPA: padded 2x2x24)",
                        lambda: F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)))
    return r, (q1, k1, v1)


def _toggled(flags):
    """("with", context factory): the row runs with each (module, attribute) set to its
    value (SPAK's old path for the A/B: kvcache/varlen PREPARED, bwd_ready.ENABLED)."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        saved = [(m, a, getattr(m, a)) for m, a, _ in flags]
        try:
            for m, a, v in flags:
                setattr(m, a, v)
            yield
        finally:
            for m, a, v in saved:
                setattr(m, a, v)
    return ctx


def _with(ctx, fn):
    return ("with", ctx, fn)


def ab_rows(torch, dev):
    """--ab (issue 34e): the four calls, SPAK's new path and its old one (switched off in
    this process: kvcache/varlen PREPARED, spak.bwd_ready.ENABLED) beside SDPA's backends
    and NVIDIA's sample (spak.fmha's problem); the training step also with autograd's
    multithreading off (the backward on the calling thread), with sys.setswitchinterval
    1e-6 and 1.0, and pinned to one CPU; decode's Prepared launch with its never-read
    arguments as cached __cuda_array_interface__ objects (would that cut the launch?)."""
    import sys as _sys

    import spak
    from spak import bwd_ready, kvcache, varlen
    F = torch.nn.functional
    old = _toggled([(kvcache, "PREPARED", False), (varlen, "PREPARED", False),
                    (bwd_ready, "ENABLED", False)])
    r = {}
    q1, k1, v1 = (_rand(torch, dev, 1, 2, 16, 64) for _ in range(3))
    r["fmha 1x2x16x64 causal | spak"] = lambda: spak.fmha(q1, k1, v1, is_causal=True)
    r.update(_sdpa_rows(torch, F, "fmha 1x2x16x64 causal",
                        lambda: F.scaled_dot_product_attention(q1, k1, v1, is_causal=True)))
    r["fmha 1x2x16x64 causal | NVIDIA sample (+ torch.empty(out))"] = _sample_row(
        torch, q1, k1, v1)
    qg, kg, vg = (_rand(torch, dev, 1, 2, 16, 64, grad=True) for _ in range(3))
    do = _rand(torch, dev, 1, 2, 16, 64)

    def step():
        spak.fmha(qg, kg, vg, is_causal=True).backward(do)

    def sdpa_step():
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do)
    t = "fwd+bwd 1x2x16x64 causal"
    r[f"{t} | spak"] = step
    r[f"{t} | spak old path (SPAK_BWD_READY=0)"] = _with(old, step)
    r.update(_sdpa_rows(torch, F, t, sdpa_step))
    no_mt = lambda: torch.autograd.set_multithreading_enabled(False)   # noqa: E731
    r[f"{t} | spak, autograd multithreading off"] = _with(no_mt, step)
    r[f"{t} | spak old path, autograd multithreading off"] = _with(
        lambda: _both(no_mt(), old()), step)
    r[f"{t} | SDPA default, autograd multithreading off"] = _with(no_mt, sdpa_step)
    for si in (1e-6, 1.0):
        r[f"{t} | spak, sys.setswitchinterval({si})"] = _with(_switch(_sys, si), step)
    cpus = _cpus()
    if cpus:
        r[f"{t} | spak pinned to one CPU"] = _pinned(torch, cpus[-1], step, qg, do)
        r[f"{t} | SDPA default pinned to one CPU"] = _pinned(torch, cpus[-1], sdpa_step,
                                                             qg, do)
    r.update(_decode_ab(torch, dev, spak, F, old))
    qv, kv, vv = (_rand(torch, dev, 40, 2, 64) for _ in range(3))
    cu = torch.tensor([0, 16, 40], dtype=torch.int32, device=dev)

    def vl():
        spak.fmha_varlen(qv, kv, vv, cu, cu, 24, 24, is_causal=True)
    t = "varlen 2 seqs (16, 24) x2x64 causal"
    r[f"{t} | spak"] = vl
    r[f"{t} | spak old path (SPAK_PREPARED=0)"] = _with(old, vl)
    qp, kp, vp = (_rand(torch, dev, 2, 2, 24, 64) for _ in range(3))
    r.update(_sdpa_rows(torch, F, f"{t} (SDPA: padded 2x2x24)",
                        lambda: F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)))
    # the first row again: does the process's first timed row pay for a cold GPU or CPU?
    r["fmha 1x2x16x64 causal | spak (again, last)"] = r["fmha 1x2x16x64 causal | spak"]
    return r


def _decode_ab(torch, dev, spak, F, old):
    """kvcache rows of --ab: new, old, SDPA, and the Prepared launch alone (torch tensors;
    the never-read dummies as one cached CAI object)."""
    from spak import kvcache
    r = {}
    qd = _rand(torch, dev, 1, 1, 32, 64)
    kc, vc = (_rand(torch, dev, 1, 256, 8, 64) for _ in range(2))
    lens = torch.tensor([256], dtype=torch.int32, device=dev)
    t = "kvcache 1x1x32:8 x256"

    def dec():
        spak.fmha_kvcache(qd, kc, vc, lens)
    r[f"{t} | spak"] = dec
    r[f"{t} | spak old path (SPAK_PREPARED=0)"] = _with(old, dec)
    qs, ks, vs = qd.transpose(1, 2).contiguous(), *(x.transpose(1, 2).contiguous()
                                                    for x in (kc, vc))
    r.update(_sdpa_rows(torch, F, t, lambda: F.scaled_dot_product_attention(
        qs, ks, vs, enable_gqa=True)))
    try:
        dec()
        dec()
    except Exception:                   # noqa: BLE001 -- the rows above say why
        return r
    ready = list(kvcache._READY.values())
    if ready:
        p = ready[-1]
        out = torch.empty(p.shape, dtype=p.dtype, device=dev)
        tensors = (qd, kc, vc, lens, out, None)
        r[f"{t} | floor: Prepared.launch alone (out ready)"] = lambda: p.launch(tensors)
        one, former = _one_split_launches(p, tensors)
        r[f"{t} | floor: ct.launch(decode_one_kernel, prepared args: 6 tensors)"] = one
        r[f"{t} | floor: ct.launch(the former one-split form, 9 tensors)"] = former
        # would cached __cuda_array_interface__ objects for the tensors a decode loop
        # passes unchanged every step (the caches, the lengths) cut the launch? all six?
        try:
            kc_, vc_, lens_ = _CAI(kc), _CAI(vc), _CAI(lens)
            some = (qd, kc_, vc_, lens_, out, None)
            every = (_CAI(qd), kc_, vc_, lens_, _CAI(out), None)
            r[f"{t} | floor: Prepared.launch, caches + lens as cached CAI"] = \
                lambda: p.launch(some)
            r[f"{t} | floor: Prepared.launch, all tensors as cached CAI"] = \
                lambda: p.launch(every)
        except Exception as exc:        # noqa: BLE001 -- the row says why (CPU: no CAI)
            r[f"{t} | floor: Prepared.launch as CAI"] = lambda exc=exc: (
                _ for _ in ()).throw(exc)
    return r


def _one_split_launches(p, tensors):
    """(ct.launch of decode_one_kernel with its arguments ready, the same of the form it
    replaced (issue 34e): decode_split_kernel with SPLIT False and three never-read
    (1, 1, 1, 1) workspaces): the A/B of the kernel change, 6 tensor arguments against 9."""
    import cuda.tile as ct

    import spak.gpu.launch as gl
    from spak.gpu.kernels import decode as dk
    (kernel, grid, get), = p.launches
    a = get(tensors + p.consts)
    d = gl.dummy_mask(tensors[0])[0]
    args = a[:6] + (d, d, d) + a[6:14] + (False,) + a[14:]
    stream = gl.current_raw_stream(p.dev)
    return (lambda: ct.launch(stream, grid, kernel, a),
            lambda: ct.launch(stream, grid, dk.decode_split_kernel, args))


def _both(a, b):
    import contextlib
    stack = contextlib.ExitStack()
    stack.enter_context(a)
    stack.enter_context(b)
    return stack


def _switch(sys_mod, interval):
    import contextlib

    @contextlib.contextmanager
    def ctx():
        was = sys_mod.getswitchinterval()
        sys_mod.setswitchinterval(interval)
        try:
            yield
        finally:
            sys_mod.setswitchinterval(was)
    return ctx


def _cpus():
    import os
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _sample_row(torch, q, k, v):
    """NVIDIA's cuTile FMHA sample's eager call on spak.fmha's problem (its own 64x64
    tiles; an output allocated per call as a user's would be), or a row saying why not."""
    import cuda.tile as ct

    from spak.device import peers
    path = peers.peers_dir() / "samples" / "AttentionFMHA.py"
    try:
        if not path.is_file():
            raise FileNotFoundError(str(path))
        mod = peers._load_sample(path)
    except Exception as exc:            # noqa: BLE001 -- the row says why
        return lambda exc=exc: (_ for _ in ()).throw(exc)
    B, H, S, D = q.shape
    grid = (math.ceil(S / 64), B * H, 1)
    tail = (1.0 / math.sqrt(D), 0, D, H, 64, 64, 1, True, S % 64 == 0)
    return lambda: ct.launch(torch.cuda.current_stream(), grid, mod.fmha_kernel,
                             (q, k, v, torch.empty_like(q)) + tail)


def train_diag_rows(torch, dev):
    """--train-diag (issue 34d): where the training step's host time goes beyond the
    forward (32.6 us) and the backward's body (64.1 us) on an H200, where the step costs
    457 us. Rows: the step by .backward() and by autograd.grad (no AccumulateGrad); the
    forward + the backward node called on this thread (no engine, no device thread); a
    Python autograd.Function that only clones (its backward returns dout) against the
    same step through torch's C++ clone node: the cost of any Python backward on the
    engine's device thread, SPAK's code aside; and, pinned (both threads on one CPU),
    the SPAK and SDPA steps again: does the GIL's hand-off across cores cost it?"""
    import os

    import spak
    F = torch.nn.functional
    q, k, v = (_rand(torch, dev, 1, 2, 16, 64, grad=True) for _ in range(3))
    do = _rand(torch, dev, 1, 2, 16, 64)

    class PyClone(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, dout):
            return dout

    def node():
        o = spak.fmha(q, k, v, is_causal=True)
        with torch.no_grad():                   # as on the engine's thread
            o.grad_fn.apply(do)
    r = {"train diag | spak step .backward": lambda: spak.fmha(
            q, k, v, is_causal=True).backward(do),
         "train diag | spak step autograd.grad (no AccumulateGrad)": lambda: torch.autograd.grad(
            spak.fmha(q, k, v, is_causal=True), (q, k, v), do),
         "train diag | spak fwd + backward node on this thread (no engine)": node,
         "train diag | python Function clone step": lambda: PyClone.apply(q).backward(do),
         "train diag | C++ clone step": lambda: q.clone().backward(do)}
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cpus:
        r["train diag | pinned | spak step .backward"] = _pinned(
            torch, cpus[-1], r["train diag | spak step .backward"], q, do)
        r["train diag | pinned | SDPA default step"] = _pinned(
            torch, cpus[-1], lambda: F.scaled_dot_product_attention(
                q, k, v, is_causal=True).backward(do), q, do)
    return r


def _pinned(torch, cpu, step, x, dout):
    """step, run with this thread and the autograd engine's thread (that runs the
    backward: a Python backward that pins itself) pinned to one CPU; masks restored."""
    import os

    class Pin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            ctx_mask.append(os.sched_getaffinity(0))
            os.sched_setaffinity(0, ctx_target)
            return g
    ctx_mask, ctx_target = [], {cpu}

    class Unpin(Pin):
        @staticmethod
        def backward(ctx, g):
            os.sched_setaffinity(0, ctx_mask.pop())
            return g

    def run(steps):
        mine = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpu})
        Pin.apply(x).backward(dout)               # the engine's thread: pinned
        try:
            for _ in range(steps):
                step()
        finally:
            Unpin.apply(x).backward(dout)
            os.sched_setaffinity(0, mine)
    return ("pinned", run)


#: steps per timed loop of a pinned row (the row's figure is us per step)
PINNED_STEPS = 1000


def _pinned_us(run, steps, sync) -> float:
    """us per step of run(steps) (pinning included, ~2 steps' worth): best of 3 after
    one warm-up loop."""
    best = math.inf
    for i in range(4):
        t0 = time.perf_counter()
        run(steps)
        sync()
        if i:
            best = min(best, (time.perf_counter() - t0) / steps * 1e6)
    return best


def _bwd_body(spak, q, k, v, dout):
    """One call of the backward's body (api._bwd_impl: allocations, config, 3 launches)
    on the state a training forward saved, without the autograd engine."""
    from spak import api
    o = spak.fmha(q, k, v, is_causal=True)
    sq, sk, sv, out, lse, mask = o.grad_fn.saved_tensors
    scale = o.grad_fn.scale
    return lambda: api._bwd_impl(dout, sq, sk, sv, out, lse, mask, True, scale)


def floor_rows(torch, dev, q1, k1, v1):
    """ct.launch alone: the fused kernel with prepared arguments (what spak.fmha's cached
    path launches), and a trivial kernel."""
    import cuda.tile as ct

    import spak
    from spak import api
    rows = {}
    spak.fmha(q1, k1, v1, is_causal=True)
    ready = [r for key, r in api._READY.items() if key[0] == q1.shape and key[-1]]
    nop0, nop13 = trivial_kernels()
    if ready:
        d, shape, gl, grid, kernel, dummy, tail = ready[0]
        out = torch.empty(shape, dtype=q1.dtype, device=dev)
        args = (q1, k1, v1, out, dummy) + tail
        stream = gl.current_raw_stream(d)
        rows["floor | ct.launch(fused, prepared args)"] = lambda: ct.launch(
            stream, grid, kernel, args)
        rows["floor | torch.empty(out) + ct.launch(fused, prepared args)"] = lambda: ct.launch(
            stream, grid, kernel, (q1, k1, v1, torch.empty(shape, dtype=q1.dtype, device=dev),
                                   dummy) + tail)
        # would a cached __cuda_array_interface__ object for the never-read dummy mask be
        # cheaper than a torch tensor's DLPack conversion?
        cai_args = (q1, k1, v1, out, _CAI(dummy)) + tail
        rows["floor | ct.launch(fused, prepared args, dummy mask as CAI)"] = lambda: ct.launch(
            stream, grid, kernel, cai_args)
    stream = torch.cuda.current_stream()
    ts = tuple(torch.empty(64, device=dev, dtype=torch.float16) for _ in range(5))
    consts = (0.125, 0, 64, 64, 1, 2, True, False)
    rows["floor | ct.launch(trivial kernel, no args)"] = lambda: ct.launch(
        stream, (1, 1, 1), nop0, ())
    rows["floor | ct.launch(trivial kernel, 5 torch tensors + 8 scalars)"] = lambda: ct.launch(
        stream, (1, 1, 1), nop13, ts + consts)

    cais = tuple(_CAI(t) for t in ts)
    rows["floor | ct.launch(trivial kernel, 5 CAI objects + 8 scalars)"] = lambda: ct.launch(
        stream, (1, 1, 1), nop13, cais + consts)
    return rows


class _CAI:
    """A tensor's __cuda_array_interface__, built once (the tensor must outlive it)."""
    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, t):
        self.__cuda_array_interface__ = t.__cuda_array_interface__


def trivial_kernels():
    """(no-argument kernel, 5 arrays + 8 scalars kernel); both do nothing. Defined here, at
    module level: cuTile resolves the annotations in the module's globals."""
    global _KERNELS
    if _KERNELS is None:
        global ct
        import cuda.tile as ct

        def nop0():
            ct.bid(0)

        def nop13(A, B, C, D, E, s, i, n1: ct.Constant[int], n2: ct.Constant[int],
                  n3: ct.Constant[int], n4: ct.Constant[int], b1: ct.Constant[bool],
                  b2: ct.Constant[bool]):
            ct.bid(0)
        _KERNELS = ct.kernel(nop0), ct.kernel(nop13)
    return _KERNELS


_KERNELS = None


def run_eager(torch, rows, n, sync=None):
    from torch.nn.attention import sdpa_kernel
    sync = sync or torch.cuda.synchronize
    results = {}
    for name, fn in rows.items():
        try:
            if isinstance(fn, tuple) and fn[0] == "pinned":
                us = _pinned_us(fn[1], min(n, PINNED_STEPS), sync)
            elif isinstance(fn, tuple) and fn[0] == "with":
                with fn[1]():
                    us = eager_us(fn[2], n, sync)
            elif isinstance(fn, tuple):
                call, be = fn
                if be is None:
                    us = eager_us(call, n, sync)
                else:
                    with sdpa_kernel(be):
                        us = eager_us(call, n, sync)
            else:
                us = eager_us(fn, n, sync)
            results[name] = round(us, 2)
        except Exception as exc:                  # fail soft: the row says why
            results[name] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
        print(f"  {name:<70} {results[name]}", flush=True)
    return results


def markdown(meta, eager, bench) -> str:
    """host_cost.md: the eager table (and do_bench rows, when a caller adds them)."""
    lines = [f"# Eager host cost per call ({meta['gpu']}, {meta['date']})", "",
             f"{meta['n']} eager calls, one synchronize at the end, best of 3 loops; us per call.",
             "", "| problem | provider | us |", "|---|---|---|"]
    lines += [f"| {k.split(' | ')[0]} | {k.split(' | ')[-1]} | {v} |" for k, v in eager.items()]
    if bench:
        lines += ["", "do_bench 2x8x512x64 causal (median ms, TFLOPS):", ""]
        lines += [f"- {k}: {v}" for k, v in bench.items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="host_cost_out")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--dry-run", action="store_true", help="the rows on the CPU, CUDA faked")
    ap.add_argument("--check", action="store_true",
                    help="then the changed paths' GPU checks (gpu_checks)")
    ap.add_argument("--train-diag", action="store_true",
                    help="only the training step's diagnosis rows (train_diag_rows)")
    ap.add_argument("--ab", action="store_true",
                    help="only the A/B rows of issue 34e (ab_rows) and the floor rows")
    ap.add_argument("--check-only", action="store_true", help="only gpu_checks")
    args = ap.parse_args(argv)
    import torch
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run and (args.train_diag or args.ab):   # the rows' logic, CPU tensors
        from spak.cpu import host_cost as hc
        rows = train_diag_rows if args.train_diag else ab_rows
        with hc.fake_cuda():
            res = run_eager(torch, rows(torch, torch.device("cpu")), args.n,
                            sync=lambda: None)
        print(json.dumps(res, indent=1))
        return 0
    if args.dry_run:
        from spak.cpu import host_cost as hc
        with hc.fake_cuda():
            res = {k: round(hc.per_call_us(fn, args.n), 2) for k, fn in hc.cases().items()}
        print(json.dumps(res, indent=1))
        return 0
    dev = torch.device("cuda")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "n": args.n,
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(f"{meta['gpu']} torch {meta['torch']} {meta['date']}; us per eager call:")
    eager, bench = {}, {}
    if args.train_diag:
        eager.update(run_eager(torch, train_diag_rows(torch, dev), args.n))
        write(out, meta, eager, bench)
        return 0
    if args.check_only:
        bench.update(gpu_checks(torch, dev))
        write(out, meta, eager, bench)
        return 0
    try:
        if args.ab:
            q1 = [_rand(torch, dev, 1, 2, 16, 64) for _ in range(3)]
            eager.update(run_eager(torch, ab_rows(torch, dev), args.n))
            write(out, meta, eager, bench)
            eager.update(run_eager(torch, floor_rows(torch, dev, *q1), args.n))
        else:
            rows, qkv = eager_rows(torch, dev)
            eager.update(run_eager(torch, rows, args.n))
            eager.update(run_eager(torch, floor_rows(torch, dev, *qkv), args.n))
    except Exception:
        traceback.print_exc()
    # spak.fmha vs NVIDIA's sample under do_bench is the harness's job: `spak run --family
    # fmha_fwd --shapes 2x8x512x64/causal --timing flush --peers sdpa,nvidia-sample`
    write(out, meta, eager, bench)
    if args.check:
        try:
            bench.update(gpu_checks(torch, dev))
        except Exception:
            traceback.print_exc()
        write(out, meta, eager, bench)
    return 0


def write(out, meta, eager, bench):
    (out / "host_cost.json").write_text(json.dumps({"meta": meta, "eager_us": eager,
                                                    "checks": bench}, indent=1))
    (out / "host_cost.md").write_text(markdown(meta, eager, bench))


def graph_us(torch, fn, calls: int = 50, replays: int = 20) -> float:
    """GPU microseconds per call: ``calls`` calls captured in one CUDA graph, replayed
    ``replays`` times between two events (no host cost in the figure)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(replays):
        g.replay()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) * 1e3 / (calls * replays)


def gpu_checks(torch, dev) -> dict:
    """The changed paths on the GPU (issue 34c): decode at 256 and 512 keys, one split
    (the new plan at 256) vs two, GPU time per call in a CUDA graph and both against a
    float64 reference; fwd+bwd gradients (views of one workspace buffer, the kept dummy
    mask, _Train's C apply) against float64. The training check first: its kernels are
    compiled already; each decode split count may compile a variant."""
    import spak
    from spak.core.metrics import gate_for
    gate = gate_for("fp16")
    res = {}
    g = torch.Generator(device=dev).manual_seed(0)
    name = "check | fwd+bwd 1x2x16x64 causal grads vs float64"
    try:
        qkv = [torch.randn(1, 2, 16, 64, device=dev, generator=g).half().requires_grad_()
               for _ in range(3)]
        dout = torch.randn(1, 2, 16, 64, device=dev, generator=g).half()
        ref = [t.detach().double().requires_grad_() for t in qkv]
        torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True).backward(
            dout.double())
        res[name] = {}
        # step 1 the general backward (it makes spak.bwd_ready's launcher), step 2 the
        # prepared one, step 3 the prepared one with the workspace it kept
        for step in range(3):
            for t in qkv:
                t.grad = None
            spak.fmha(*qkv, is_causal=True).backward(dout)
            res[name].update({f"{n}{step + 1}": round(float(
                (t.grad.double() - r.grad).norm() / r.grad.norm()), 6)
                for n, t, r in zip("qkv", qkv, ref)})
            if step == 0:
                first = [t.grad.clone() for t in qkv]
        res[name]["same bits, steps 1 and 3"] = all(
            torch.equal(a, t.grad) for a, t in zip(first, qkv))
        res[name]["pass"] = all(v <= gate for k, v in res[name].items()
                                if k[0] in "qkv") and res[name]["same bits, steps 1 and 3"]
    except Exception as exc:
        res[name] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    print(f"  {name:<58} {res[name]}", flush=True)
    for keys in (256, 512):
        q = torch.randn(1, 1, 32, 64, device=dev, generator=g).half()
        kc, vc = (torch.randn(1, keys, 8, 64, device=dev, generator=g).half() for _ in range(2))
        lens = torch.tensor([keys - 7], dtype=torch.int32, device=dev)
        ref = _decode_ref(torch, q, kc, vc, keys - 7)
        for splits in (None, 1, 2):
            name = f"check | kvcache 1x1x32:8 x{keys} num_splits={splits}"
            try:
                def fn():
                    return spak.fmha_kvcache(q, kc, vc, lens, num_splits=splits)
                outs = [fn() for _ in range(3)]     # the third: kvcache.Prepared (1 split)
                err = max(float((o.double() - ref).norm() / ref.norm()) for o in outs)
                res[name] = {"rel_l2_vs_f64": round(err, 6), "pass": bool(
                    all(torch.isfinite(o).all() for o in outs)) and err <= gate and all(
                    torch.equal(o, outs[0]) for o in outs),
                    "gpu_us_graph": round(graph_us(torch, fn), 2)}
            except Exception as exc:
                res[name] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
            print(f"  {name:<58} {res[name]}", flush=True)
    res.update(_varlen_check(torch, dev, g, gate))
    return res


def _varlen_check(torch, dev, g, gate) -> dict:
    """spak.fmha_varlen (2 sequences, 16 and 24 rows, causal) against float64 per
    sequence, three calls (the third through kvcache.Prepared), the bits equal."""
    import spak
    name = "check | varlen 2 seqs (16, 24) x2x64 causal vs float64"
    try:
        q, k, v = (torch.randn(40, 2, 64, device=dev, generator=g).half() for _ in range(3))
        cu = torch.tensor([0, 16, 40], dtype=torch.int32, device=dev)
        outs = [spak.fmha_varlen(q, k, v, cu, cu, 24, 24, is_causal=True) for _ in range(3)]
        F = torch.nn.functional
        ref = torch.cat([F.scaled_dot_product_attention(
            *(t[a:b].double().transpose(0, 1)[None] for t in (q, k, v)),
            is_causal=True)[0].transpose(0, 1) for a, b in ((0, 16), (16, 40))])
        err = max(float((o.double() - ref).norm() / ref.norm()) for o in outs)
        ok = all(torch.isfinite(o).all() and torch.equal(o, outs[0]) for o in outs)
        res = {"rel_l2_vs_f64": round(err, 6), "pass": bool(ok) and err <= gate}
    except Exception as exc:
        res = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    print(f"  {name:<58} {res}", flush=True)
    return {name: res}


def _decode_ref(torch, q, kc, vc, n):
    """float64 decode attention of q [1, 1, Hq, D] over the first n keys of the cache."""
    qd = q.double()[0, 0]                                    # [Hq, D]
    k, v = kc.double()[0, :n], vc.double()[0, :n]            # [n, Hkv, D]
    group = qd.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)   # [n, Hq, D]
    s = torch.einsum("hd,nhd->hn", qd, k) / qd.shape[-1] ** 0.5
    return torch.einsum("hn,nhd->hd", s.softmax(-1), v)[None, None]


if __name__ == "__main__":
    sys.exit(main())
