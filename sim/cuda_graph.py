"""Interpreter mode's CUDA graphs: `torch.cuda.CUDAGraph`, `torch.cuda.graph(g)`, replay.

Benchmarks capture the work once and replay it (TileGym's benchmark_fn_cudagraph; most of
its perf tests). Here:

- capture records, in order, every aten op (a TorchDispatchMode) and every `ct.launch`
  (sim.interpret) the captured code makes, on the tensor objects themselves: the graph keeps
  them alive, as a GPU graph keeps its memory pool, so their addresses stay static;
- replay() re-runs the record: a launch runs again (on the arrays as they are now; the launch
  memo makes an unchanged one cheap), an in-place op runs again as is, an op that made a
  tensor writes its new result into the captured tensor (raw bytes: no autograd version
  bump, as on a GPU), a view needs nothing, an allocation (empty*) keeps its memory.

Capture also runs the work once (the outputs must exist to be recorded), but memory that
existed before the capture ends as it was: whatever the captured ops or launches change in
it (in-place ops, kernel stores) is saved first and put back at capture_end, so after
`with torch.cuda.graph(g): f()` only g.replay() has f's effects on pre-existing tensors, as on
a GPU (an accumulation `x += y` replayed n times adds n times, not n + 1). Deviation: tensors
the capture allocated hold the captured run's values, where a GPU leaves them unwritten.

Ops that a GPU cannot capture either (a host sync such as Tensor.item(), data-dependent
output sizes such as nonzero) raise SimNotSupported naming the op; make_graphed_callables is
not emulated (named SimNotSupported from sim.host_gpu).
"""
from __future__ import annotations

import contextlib

import numpy as np

from .errors import SimNotSupported

_state = {"graph": None, "paused": 0}

# aten ops a capture refuses (a GPU capture fails on them: host syncs, data-dependent sizes)
_REFUSED = {"_local_scalar_dense": "Tensor.item() / int() / float(): a host sync",
            "nonzero": "data-dependent output size", "nonzero_static": None,
            "masked_select": "data-dependent output size",
            "unique": "data-dependent output size", "_unique": "data-dependent output size",
            "_unique2": "data-dependent output size", "unique_dim": "data-dependent output size",
            "unique_consecutive": "data-dependent output size",
            "is_nonzero": "a host sync", "equal": "a host sync"}
# allocations: replay keeps the captured memory (a graph's pool does not reallocate)
_ALLOCS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


def capturing() -> bool:
    return _state["graph"] is not None


@contextlib.contextmanager
def recorded_launch(fn, call):
    """Around interpret.launch: while capturing, record the launch (fn(*call) replays it),
    save the pre-existing tensors it may write, and keep its own torch calls (copies in and
    out of the simulator) out of the record."""
    g = _state["graph"]
    if g is None or _state["paused"]:
        yield
        return
    g._save_pre_existing(_tensors(call[3]))
    g._record.append(("launch", fn, call))
    _state["paused"] += 1
    try:
        yield
    finally:
        _state["paused"] -= 1


def _tensors(args):
    import torch
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _flat_tensors(x):
    import torch
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _flat_tensors(y)]
    return []


def _storage(t) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _same_memory(a, b) -> bool:
    return (a is b) or (_storage(a) == _storage(b) and a.storage_offset() == b.storage_offset()
                        and a.shape == b.shape and a.stride() == b.stride())


_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def raw_copy(dst, src) -> None:
    """dst's elements = src's, byte for byte, without an autograd version bump (a GPU graph
    writes memory; it does not tell autograd)."""
    import torch
    d, s = dst.detach(), src.detach()
    it = getattr(torch, _INT.get(d.element_size(), ""), None)
    if it is None or d.is_complex() or s.dtype != d.dtype:
        with torch.no_grad():
            d.copy_(s)
        return
    dv, sv = d.view(it).numpy(), s.reshape(d.shape).contiguous().view(it).numpy()
    np.copyto(dv, sv)


def _written_args(func, args, kwargs):
    """The tensors an aten op writes (its schema's mutable arguments)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        val = args[i] if i < len(args) else kwargs.get(a.name)
        out.extend(_flat_tensors(val))
    return out


def _recorder_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        """Records every aten op of the capture (sim.cuda_graph)."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            g = _state["graph"]
            if g is None or _state["paused"]:
                return func(*args, **kwargs)
            name = func._schema.name.split("::")[-1]
            if name in _REFUSED:
                why = _REFUSED[name] or "data-dependent output size"
                raise SimNotSupported(f"spak sim: aten::{name} ({why}) inside CUDA graph "
                                      "capture cannot be captured (a GPU's capture fails too)")
            g._save_pre_existing(_written_args(func, args, kwargs))
            out = func(*args, **kwargs)
            g._record.append(("op", func, args, kwargs, out, name in _ALLOCS))
            ins = {_storage(t) for t in _flat_tensors(args) + _flat_tensors(kwargs)}
            g._new.update(s for s in map(_storage, _flat_tensors(out)) if s and s not in ins)
            return out

    return Recorder


class CUDAGraph:
    """torch.cuda.CUDAGraph in interpreter mode (module doc): capture_begin/capture_end
    record, replay() re-runs, reset() forgets, pool() names the graph's (notional) pool."""

    def __init__(self, keep_graph=False):
        self._record: list = []
        self._new: set = set()
        self._saved: list = []
        self._mode = None
        self._captured = False

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if _state["graph"] is not None:
            raise RuntimeError("spak sim: a CUDA graph capture is already under way "
                               "(one capture at a time, as on one stream)")
        self.reset()
        self._mode = _recorder_class()()
        self._mode.__enter__()
        _state["graph"] = self

    def capture_end(self):
        if _state["graph"] is not self:
            raise RuntimeError("spak sim: capture_end() without capture_begin() on this graph")
        _state["graph"] = None
        self._mode.__exit__(None, None, None)
        self._mode = None
        for t, before in reversed(self._saved):
            raw_copy(t, before)          # memory that existed before: as it was
        self._saved = []
        self._captured = True

    def _save_pre_existing(self, tensors):
        for t in tensors:
            s = _storage(t)
            if s and s not in self._new and not any(_same_memory(t, u) for u, _ in self._saved):
                self._saved.append((t, t.detach().clone()))

    def replay(self):
        if not self._captured:
            raise RuntimeError("spak sim: CUDAGraph.replay() before a capture")
        for entry in self._record:
            if entry[0] == "launch":
                entry[1](*entry[2])
            else:
                _rerun(*entry[1:])

    def reset(self):
        self._record, self._new, self._saved, self._captured = [], set(), [], False

    def pool(self):
        return (id(self), 0)

    def instantiate(self):
        return None

    def enable_debug_mode(self):
        return None

    def debug_dump(self, path):
        raise SimNotSupported("spak sim: CUDAGraph.debug_dump (no CUDA graph exists to dump)")


def _rerun(func, args, kwargs, out, alloc):
    if alloc:
        return
    new = func(*args, **kwargs)
    for o, n in zip(_flat_tensors(out), _flat_tensors(new)):
        if not _same_memory(o, n):
            raw_copy(o, n)


class graph:
    """torch.cuda.graph(g, pool=None, stream=None, capture_error_mode="global")."""

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.cuda_graph = cuda_graph
        self.pool = pool

    def __enter__(self):
        self.cuda_graph.capture_begin(self.pool)
        return self.cuda_graph

    def __exit__(self, *exc):
        self.cuda_graph.capture_end()
        return False


def graph_pool_handle():
    return ("spak-sim-pool", 0)


def is_current_stream_capturing() -> bool:
    return capturing()
