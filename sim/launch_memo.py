"""Interpreter mode's launch memo: a launch that repeats an earlier one restores its result.

Benchmarks call one kernel on unchanged inputs many times (TileGym's perf tests: the
correctness call, the runtime estimate, warm-up, the timed repeats, CUDA graph replays). The
simulator is deterministic: a launch whose kernel, grid, scalars, options and array arguments
(dtype, shape, strides, how they overlap, and the bytes of every array the kernel READ) equal
an earlier launch's computes the same thing. Such a launch restores the earlier one's effects
instead of simulating again:

- the elements it wrote (each array's write record, sim.memory: elements no block wrote keep
  what they hold now, as a re-run would leave them);
- its findings: the report's checker findings, and every out-of-bounds access it recorded
  (sim.oob), recorded again so the exit summary counts them as a re-run would.

Why keying on the arrays READ is enough: the kernel's path and every value it computes depend
only on the scalars and on the values it loads; arrays it only stored to (an output made with
torch.empty, whose old bytes differ from call to call) cannot change either. The first run of
a signature hashes every array (blake2b) before it runs, and learns which it read (loads,
gathers, atomics mark their array: SimArray._read_bits). A later launch matches an entry when
the arrays in that entry's read set hash the same (sha256; only those are hashed for a hit).

Not memoised: cooperative-mode launches (atomics: the order of blocks may matter), launches
that print from the kernel (a hit would not print), launches that raised, a kernel whose first
STOP_AFTER stored launches were never hit (a new seed each call), and in strict mode
(SPAK_SIM_STRICT=1) a hit whose launch had out-of-bounds accesses is simulated again (it raises).

SPAK_SIM_MEMO_MB: the memo's size (LRU by bytes held; default 2048; 0 turns it off). On in
interpreter mode (sim.interpret.launch); sim.launch itself never memoises.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import time
from collections import OrderedDict

import numpy as np

from . import memory, oob
from .memory import SimArray

DEFAULT_MB = 2048
stats = {"hits": 0, "misses": 0, "stored": 0, "evicted": 0, "bytes": 0}
_table: OrderedDict = OrderedDict()     # (signature, read set, their hashes) -> _Entry
_read_sets: dict = {}                   # signature -> read sets seen for it
_keep: dict = {}                        # id(code) -> code (_code: ids stay unique while kept)
_use: dict = {}                         # id(code) -> [entries stored, hits]
# a kernel whose first STOP_AFTER stored launches were never hit stops being stored (TileGym's
# dropout draws a new seed each call: 256 MiB outputs copied and held for nothing)
STOP_AFTER = 4


@dataclasses.dataclass
class _Entry:
    effects: list          # (array index, values after the launch, written mask or None)
    report: object         # the LaunchReport of the simulated launch
    oob_calls: list        # (key, message, n) recorded by sim.oob during the launch
    nbytes: int


def limit_bytes() -> int:
    try:
        mb = float(os.environ.get("SPAK_SIM_MEMO_MB", DEFAULT_MB))
    except ValueError:
        raise ValueError(f"SPAK_SIM_MEMO_MB must be a number of MiB, got "
                         f"{os.environ['SPAK_SIM_MEMO_MB']!r}") from None
    return int(mb * 2**20)


def clear() -> None:
    _table.clear()
    _read_sets.clear()
    _keep.clear()
    _use.clear()
    stats.update(hits=0, misses=0, stored=0, evicted=0, bytes=0)


def summary() -> str:
    s = stats
    return (f"launch memo: {s['hits']} hit(s), {s['misses']} simulated; "
            f"{s['bytes'] / 2**20:.0f} MiB held (SPAK_SIM_MEMO_MB={limit_bytes() // 2**20})")


def _arrays(args) -> list:
    out = []
    for a in args:
        if isinstance(a, SimArray):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, SimArray))
    return out


def _scalar_key(a):
    if isinstance(a, SimArray):
        return "array"
    if isinstance(a, (list, tuple)):
        return tuple(_scalar_key(x) for x in a)
    if isinstance(a, np.generic):
        return (a.dtype.str, a.tobytes())
    if isinstance(a, (bool, int, float, str, type(None), enum.Enum)) or _is_dtype(a):
        return (type(a).__qualname__, repr(a))
    return None                     # anything else: not memoised (unknown identity)


def _is_dtype(a) -> bool:
    """A torch or cuTile dtype (constants kernels take): named by its repr."""
    t = type(a)
    return (t.__module__ == "torch" and t.__name__ == "dtype") or t.__module__.startswith(
        "cuda.tile") and t.__name__ == "DType"


def _span(a: SimArray):
    """The byte range [lo, hi) of an array's elements in process memory."""
    d = a.data
    lo = d.__array_interface__["data"][0]
    hi = lo + d.itemsize * (1 + sum((n - 1) * abs(st) // d.itemsize
                                    for n, st in zip(d.shape, d.strides)) if d.size else 0)
    return lo, hi


def _layout(arrays) -> tuple:
    """dtype, shape, strides of each array, and which earlier array it overlaps (at what
    byte distance): a kernel given one buffer twice computes differently than given two."""
    spans = [_span(a) for a in arrays]
    out = []
    for i, (a, (lo, hi)) in enumerate(zip(arrays, spans)):
        first = next((j for j in range(i) if spans[j][0] < hi and lo < spans[j][1]), -1)
        out.append((a.dtype.name, a.shape, a.data.strides, first,
                    lo - spans[first][0] if first >= 0 else 0))
    return tuple(out)


def _digest(a: SimArray) -> bytes:
    # sha256: hardware-accelerated (SHA-NI) on current x86, 1.3 GB/s on the project's CPU
    # against blake2b's 0.3 GB/s (2026-11-28); 256 bits: no collision to fear
    data = np.ascontiguousarray(a.data)
    return hashlib.sha256(memoryview(data.reshape(-1).view(np.uint8))).digest()


class _Digests:
    """Each array's digest, computed when first asked (a hit hashes only what it read)."""

    def __init__(self, arrays):
        self.arrays, self.done = arrays, {}

    def __getitem__(self, i):
        if i not in self.done:
            self.done[i] = _digest(self.arrays[i])
        return self.done[i]

    def all(self):
        return [self[i] for i in range(len(self.arrays))]


def _code(kernel):
    """What the simulator runs of a kernel: a @ct.kernel's Python function. kernel.replace_hints
    wraps the same function in a new ct.kernel (its own compile cache) with other compiler
    hints (num_ctas, occupancy, ...), which the simulator does not read: hinted copies share
    entries. TileGym's autotuned ops run the plain kernel in exhaustive_search, then a hinted
    copy on the same arguments; keyed by the ct.kernel object, that second launch was
    simulated again (half of every autotuned perf test's time)."""
    af = getattr(kernel, "_annotated_function", None)
    return getattr(af, "pyfunc", kernel)


def signature(kernel, grid, args, options):
    """The launch's identity apart from array contents; None when it cannot be keyed."""
    scalars = tuple(_scalar_key(a) for a in args)
    if any(s is None for s in scalars):
        return None
    return (id(_code(kernel)), tuple(grid) if isinstance(grid, (tuple, list)) else grid, scalars,
            tuple(sorted(options.items())), memory._UNDETERMINED["fill"],
            _layout(_arrays(args)))


def run(kernel, grid, args, options, simulate):
    """simulate() (a sim.launch of these args), or the restored result of an equal earlier one."""
    cap = limit_bytes()
    arrays = _arrays(args)
    sig = signature(kernel, grid, args, options) if cap > 0 else None
    if sig is None:
        return simulate()
    t0 = time.perf_counter()
    digests = _Digests(arrays)
    for reads in _read_sets.get(sig, ()):
        key = (sig, reads, tuple(digests[i] for i in reads))
        entry = _table.get(key)
        if entry is not None and not (oob.strict() and entry.oob_calls):
            _table.move_to_end(key)
            stats["hits"] += 1
            _use.setdefault(id(_code(kernel)), [0, 0])[1] += 1
            return _restore(entry, arrays, t0)
    stats["misses"] += 1
    return _simulate_and_store(kernel, sig, arrays, digests.all(), simulate, cap)


def _restore(entry, arrays, t0):
    for i, after, mask in entry.effects:
        np.copyto(arrays[i].data, after, where=True if mask is None else mask)
    mark = oob.mark()
    for key, message, n in entry.oob_calls:
        oob.record(key, message, n)
    return dataclasses.replace(entry.report, seconds=time.perf_counter() - t0,
                               findings=list(entry.report.findings), oob=oob.since(mark))


def _simulate_and_store(kernel, sig, arrays, digests, simulate, cap):
    from . import ops
    prints = ops.PRINTS[0]
    with oob.tap() as calls:
        report = simulate()
    code = _code(kernel)
    use = _use.setdefault(id(code), [0, 0])
    _keep[id(code)] = code
    if report.mode != "lockstep" or ops.PRINTS[0] != prints or use == [STOP_AFTER, 0]:
        return report
    reads = tuple(i for i, a in enumerate(arrays) if a._root._was_read)
    written, nbytes = [], 0
    for i, a in enumerate(arrays):
        own = a.owner_view()
        if own is None:
            continue
        mask = own >= 0                  # a new array: kept as is
        if not mask.any():
            continue
        full = bool(mask.all())
        written.append((i, None if full else mask))
        nbytes += a.data.nbytes + (0 if full else mask.size)
    if nbytes > cap:                     # sized before copying: no copies made for nothing
        return report
    effects = [(i, arrays[i].data.copy(), mask) for i, mask in written]
    key = (sig, reads, tuple(digests[i] for i in reads))
    _read_sets.setdefault(sig, set()).add(reads)
    old = _table.pop(key, None)          # (strict mode re-simulates a kept entry's launch)
    if old is not None:
        stats["bytes"] -= old.nbytes
    _table[key] = _Entry(effects, report, list(calls), nbytes)
    use[0] = min(use[0] + 1, STOP_AFTER)
    stats["stored"] += 1
    stats["bytes"] += nbytes
    _evict(cap)
    return report


def _evict(cap):
    while stats["bytes"] > cap and _table:
        (sig, reads, _), entry = _table.popitem(last=False)
        stats["bytes"] -= entry.nbytes
        stats["evicted"] += 1
        if not any(k[0] == sig and k[1] == reads for k in _table):
            _read_sets.get(sig, set()).discard(reads)
