"""GPU timing: the one CUDA-event method behind `spak run`, `spak sweep`'s worker and the
ci/ probes.

The method (`time_events`), for a callable ``fn(i)`` that enqueues one call of a
provider on input set ``i`` (i rotating over ``n_sets`` sets):

1. warm-up: ``warmup`` calls (compiles, loads modules, creates handles), then a sync;
2. estimate: one call between a CUDA event pair gives ``est`` ms;
3. batches: ``batches`` times, a short GPU sleep (``torch.cuda._sleep``; about 50 us of
   launch work per call, at most 20 ms) is queued first so that the CPU can enqueue the
   whole batch behind it, then ``per_batch`` back-to-back calls (``batch_ms / est``, at
   least 1, at most ``max_per_batch``) between one CUDA event pair. Each batch gives
   one sample: its elapsed time over ``per_batch``, the mean time of one call with the
   CPU's launch overhead hidden (the GPU never waits for the host inside a batch).

The result is `spak.core.stats.stats` of the samples, so ``ms_median`` is the median
batch's mean time per call and ``ms_p25``/``ms_p75`` the spread between batches; then
``runs`` (calls timed: ``per_batch * batches``), ``batches`` and ``per_batch``.
Inputs rotate over several sets (`input_set_count`) so that the L2 cache does not flatter
small shapes; the sets hold fresh random data, never zeros.

`time_turns` times several providers of one shape with that method in turns (forward,
backward and shuffled order; each provider's best turn counts): the provider timed first
after a pause runs a few % fast. `matmul_ceiling` is an fp16 matmul timed the same way.

Timing modes (`MODES`, `spak run --timing`): "kernel" is the method above (GPU time of one
call, back to back, the L2 defeated by rotating input sets); "flush" is triton's do_bench
method (each call alone between its own event pair after a 256 MiB L2 flush; the median);
"eager" is the cost of a call as a program sees it: ``calls`` eager calls one after another,
then ONE synchronize, wall time over ``calls`` (when the host is slower than the kernel
this is the host's cost per call; otherwise the GPU's). Adding a mode is one function with
`time_events`' signature here and one `MODES` entry.

torch is imported inside the functions.
"""
from __future__ import annotations

import contextlib
import math
import random
import time

from spak.core.stats import stats

__all__ = ["time_events", "time_flushed", "time_eager", "MODES", "time_turns",
           "time_alternating", "matmul_ceiling", "input_set_count", "input_sets_for",
           "SLEEP_PER_CALL_S", "SLEEP_MAX_S", "FLUSH_BYTES"]

#: GPU sleep queued before each batch: this much per call of the batch, at most SLEEP_MAX_S
#: (enough for the CPU to enqueue the batch behind it; the sleep itself is not timed).
SLEEP_PER_CALL_S = 50e-6
SLEEP_MAX_S = 20e-3
#: torch.cuda._sleep counts clock cycles; this rate turns seconds into cycles (a GPU with
#: a faster clock sleeps shorter, which only shortens an untimed wait).
_SLEEP_HZ = 1.4e9


def input_set_count(set_bytes: float, l2_bytes: int, max_sets: int) -> int:
    """Input sets to rotate while timing: enough that together they hold at least three
    times the L2 cache (so a call never finds its inputs left there by the previous one),
    between 1 and ``max_sets``. ``set_bytes``: what one call reads and writes."""
    return int(min(max_sets, max(1, math.ceil(3 * l2_bytes / max(set_bytes, 1)))))


def input_sets_for(fam, problem, l2_bytes: int, max_sets: int) -> int:
    """`input_set_count` for one problem of a family: what one call reads and writes is the
    family's ``bytes_moved`` (a family that does not say gets ``max_sets``)."""
    try:
        moved = fam.bytes_moved(problem)
    except NotImplementedError:
        moved = 0
    return input_set_count(moved, l2_bytes, max_sets)


def _warm_estimate(fn, n_sets: int, warmup: int):
    """``warmup`` calls over the sets, a sync, then one call of set 0 between a CUDA event
    pair: (its ms, at least 1e-3; the two events, for reuse)."""
    import torch
    for i in range(warmup):
        fn(i % n_sets)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn(0)
    e.record()
    e.synchronize()
    return max(s.elapsed_time(e), 1e-3), s, e


def time_events(fn, n_sets: int, *, warmup: int = 3, batches: int = 10,
                target_s: float = 0.3, max_per_batch: int = 100) -> dict:
    """Time ``fn(i)`` (i rotating over ``n_sets`` input sets) by the module's method:
    ``batches`` batches of about ``target_s / batches`` seconds each. Returns stats (ms)
    plus runs, batches and per_batch."""
    import torch
    est_ms, s, e = _warm_estimate(fn, n_sets, warmup)
    batch_ms = 1e3 * target_s / max(batches, 1)
    per_batch = int(min(max_per_batch, max(1, round(batch_ms / est_ms))))
    sleep = getattr(torch.cuda, "_sleep", None)
    samples = []
    k = 0
    for _ in range(max(batches, 1)):
        if sleep is not None:
            sleep(int(min(SLEEP_MAX_S, SLEEP_PER_CALL_S * per_batch) * _SLEEP_HZ))
        s.record()
        for _ in range(per_batch):
            fn(k % n_sets)
            k += 1
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e) / per_batch)
    st = stats(samples)
    st.update(runs=per_batch * len(samples), batches=len(samples), per_batch=per_batch)
    return st


#: bytes written between two calls by the "flush" mode (more than any GPU's L2; do_bench's)
FLUSH_BYTES = 256 << 20


def time_flushed(fn, n_sets: int, *, warmup: int = 3, target_s: float = 0.3,
                 max_calls: int = 200, device: str = "cuda", **_) -> dict:
    """do_bench's method: before each call a FLUSH_BYTES memset evicts the L2, then the
    call alone between its own CUDA event pair; stats of the calls (ms), runs. Each call
    pays its launch latency (no batch hides it): on a short kernel this reads higher than
    "kernel"."""
    import torch
    cache = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device)
    est_ms, _, _ = _warm_estimate(fn, n_sets, warmup)
    n = int(min(max_calls, max(5, 1e3 * target_s / est_ms)))
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(n)]
    for k, (a, b) in enumerate(pairs):
        cache.zero_()
        a.record()
        fn(k % n_sets)
        b.record()
    torch.cuda.synchronize()
    st = stats([a.elapsed_time(b) for a, b in pairs])
    st.update(runs=n)
    del cache
    return st


def time_eager(fn, n_sets: int, *, warmup: int = 3, batches: int = 5, target_s: float = 0.3,
               max_calls: int = 1000, **_) -> dict:
    """``batches`` samples of: ``calls`` eager calls one after another, one synchronize,
    host wall time over ``calls`` (ms per call). The first sample's length sets ``calls``."""
    import torch
    for i in range(warmup):
        fn(i % n_sets)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(0)
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    calls = int(min(max_calls, max(1, target_s / max(batches, 1) / one)))
    samples = []
    for _ in range(max(batches, 1)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for k in range(calls):
            fn(k % n_sets)
        torch.cuda.synchronize()
        samples.append(1e3 * (time.perf_counter() - t0) / calls)
    st = stats(samples)
    st.update(runs=calls * len(samples), batches=len(samples), per_batch=calls)
    return st


#: timing mode -> timer(fn, n_sets, *, target_s) -> stats in ms (`spak run --timing`)
#: (looked up when called, so a test's stand-in for time_events is the one used)
MODES = {"kernel": lambda *a, **k: time_events(*a, **k),
         "flush": lambda *a, **k: time_flushed(*a, **k),
         "eager": lambda *a, **k: time_eager(*a, **k)}


def time_turns(fns: dict, spin, seed: int, *, n_sets: int = 3, reps: int = 3,
               target_s: float = 0.12, spin_s: float = 1.0, contexts=None,
               mode: str = "kernel") -> dict:
    """Timing stats (time_events) of each provider fn(i), i over n_sets input sets, timed
    in turns; per provider the turn with the lowest median counts.

    The provider timed first after a pause runs a few % fast (GPU cool, clocks high; two
    copies of one kernel measured 5% apart, results/ab-h100-2026-11-22): so spin the GPU
    with ``spin(0)`` for ``spin_s`` seconds, then time every provider in forward, backward
    and shuffled order (``seed`` fixes the shuffle). Compile (call each fn once) before this.
    ``contexts``: provider -> a factory of a context manager held around that provider's
    timing (SDPA's backend choice: entered per call it would cost more than a short kernel).
    ``mode``: which timer of MODES times each turn.
    """
    import torch
    if mode not in MODES:
        raise ValueError(f"unknown timing mode {mode!r}; known: {', '.join(MODES)}")
    timer = MODES[mode]
    contexts = contexts or {}
    t0 = time.time()
    while time.time() - t0 < spin_s:
        spin(0)
    torch.cuda.synchronize()
    best: dict = {}
    order = list(fns)
    for rep in range(reps):
        seq = order if rep == 0 else order[::-1] if rep == 1 else \
            random.Random(seed + rep).sample(order, len(order))
        for name in seq:
            with contexts.get(name, contextlib.nullcontext)():
                st = timer(fns[name], n_sets, target_s=target_s)
            if name not in best or st["ms_median"] < best[name]["ms_median"]:
                best[name] = st
    return best


def time_alternating(fns: dict, spin, seed: int, *, reps: int = 3,
                     target_s: float = 0.12) -> dict:
    """Best median ms of each provider fn(i) (i over 3 input sets): time_turns' medians."""
    return {k: st["ms_median"] for k, st in
            time_turns(fns, spin, seed, reps=reps, target_s=target_s).items()}


def matmul_ceiling(n: int = 8192, target_s: float = 0.2) -> dict:
    """fp16 n^3 torch.matmul on random data: the practical tensor-core ceiling (TFLOPS),
    timed by time_events (one input set: n^3 work dwarfs the cache)."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(1234)
    a = torch.randn(n, n, device="cuda", dtype=torch.float16, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16, generator=g)
    c = torch.empty(n, n, device="cuda", dtype=torch.float16)
    st = time_events(lambda i: torch.matmul(a, b, out=c), 1, warmup=5, batches=5,
                     target_s=target_s)
    st["tflops"] = 2.0 * n ** 3 / (st["ms_median"] * 1e-3) / 1e12
    st["n"] = n
    del a, b, c
    return st
