"""The objects a kernel family hands the GPU loop (`spak run`, the sweep's worker):
a planned call of our kernel (`GpuCall`), a peer's call (`PeerCall`) and the slice of a
problem the simulator re-computes (`SimSlice`); and the workspace allocator that calls
timed one after another share. Nothing here imports torch at module level.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, ContextManager, Mapping, Optional

__all__ = ["GpuCall", "PeerCall", "SimSlice", "shared_alloc", "distinct", "first_tensor"]


@dataclasses.dataclass
class GpuCall:
    """One planned call of a family's kernel on one input set.

    outputs   output name -> the tensor the launches write (allocated by the family and
              filled with NaN first, so an element no block writes stays NaN)
    launches  spak.gpu.plan.Launch objects, hints applied, in launch order
    tiles     the kernel's constants used (tiles and knobs)
    hints     the launch hints used (occupancy, num_ctas; None = cuTile's choice)

    ``call()`` enqueues the launches on torch's current stream (``call(stream)`` on
    another); callers synchronize. A runner with its own launcher iterates ``launches``.
    """
    outputs: dict
    launches: list
    tiles: dict
    hints: dict

    def __call__(self, stream=None) -> None:
        from spak.gpu.launch import run
        run(self.launches, stream)


def _single_output(raw) -> dict:
    return {"out": raw}


def _as_is(outputs: dict) -> dict:
    return outputs


@dataclasses.dataclass
class PeerCall:
    """Another implementation of a family's outputs, timed beside ours (e.g. an SDPA
    backend).

    run       run(inputs) -> what the peer returns, on one input set (a mapping as the
              family's gpu_inputs gives); the part that is timed. Everything the peer
              needs besides the inputs (masks in its own convention) is prepared before.
              A peer that refuses the problem raises RuntimeError on its first call.
    outputs   the raw result -> {output name: tensor} as the peer computed it (NaN/Inf
              are counted on these)
    conform   {output name: tensor} -> the same in SPAK's conventions (e.g. rows that see
              no key zeroed), for comparing with the reference
    context   a factory of the context held around checking and timing the peer (e.g.
              torch's sdpa_kernel backend choice: entered per call it would cost more
              than a short kernel)
    flops     FLOPs of one call when they are not the family's ``flops`` (e.g. a forward +
              backward row beside a backward's peers); None: the family's
    checked   False for a peer that computes something else at the same cost (the
              same-size copy of a bandwidth-bound family): timed, never compared
    eager     eager(inputs): the same work through a public entry, which `--timing eager`
              times instead of ``run`` (SPAK's forward + backward through spak.fmha's
              autograd); None: ``run``
    """
    run: Callable[[Mapping], Any]
    outputs: Callable[[Any], dict] = _single_output
    conform: Callable[[dict], dict] = _as_is
    context: Callable[[], ContextManager] = contextlib.nullcontext
    flops: Optional[float] = None
    checked: bool = True
    eager: Optional[Callable[[Mapping], Any]] = None


@dataclasses.dataclass
class SimSlice:
    """The part of a GPU problem that the CPU simulator re-computes to compare bits.

    problem      the slice as a problem of the family (what ``simulate`` takes)
    inputs       its inputs in the family's numpy form (as ``make_inputs`` gives)
    gpu          output name -> the GPU's outputs on the slice (numpy, same form)
    tiles        the kernel constants to simulate with (the GPU call's)
    text         what the slice is, for the row's sim.slice ("full problem", or which
                 batch, heads and rows)
    full         True when the slice is the whole problem
    dump_arrays  what --dump keeps of a disagreeing slice to replay it (numpy arrays;
                 the GPU's output under "gpu")
    dump_meta    JSON-able facts the replay needs besides the arrays (scale, causal,
                 dtype, tiles)
    """
    problem: Any
    inputs: Any
    gpu: dict
    tiles: dict
    text: str
    full: bool = False
    dump_arrays: dict = dataclasses.field(default_factory=dict)
    dump_meta: dict = dataclasses.field(default_factory=dict)


def first_tensor(inputs: Mapping):
    """The first tensor of an input set (its dtype is "the inputs' dtype")."""
    return next(t for t in inputs.values() if t is not None)


def shared_alloc(like):
    """alloc(shape, kind) for a family's planner that hands every plan the same workspaces
    (one per shape and kind; kind "float32", else ``like``'s dtype, on ``like``'s device):
    the timed plans of one provider run one after another on one stream, so sharing is
    safe, and e.g. the naive kernel's S/P workspaces exist once, not once per input set."""
    import torch
    cache = {}

    def alloc(shape, kind):
        key = (tuple(int(n) for n in shape), kind)
        if key not in cache:
            dt = torch.float32 if kind == "float32" else like.dtype
            cache[key] = torch.empty(key[0], dtype=dt, device=like.device)
        return cache[key]
    return alloc


def distinct(alloc):
    """``alloc`` for one plan that asks for several workspaces of one shape and kind (the
    backward's delta and lse2, float32 [B, Hq, Sq] both; the decode split kernel's running
    max and sum, float32 [B, Sq, Hq, splits] both), which must not be one tensor: the
    n-th request of a (shape, kind) asks ``alloc`` for shape + (1,) * n, viewed as shape. A
    shared allocator (spak.device.calls.shared_alloc, one workspace per shape and kind)
    then still hands every plan the same workspaces, and never one twice to a plan."""
    seen: dict = {}

    def alloc_one(shape, kind):
        shape = tuple(int(n) for n in shape)
        n = seen[(shape, kind)] = seen.get((shape, kind), -1) + 1
        return alloc(shape + (1,) * n, kind).reshape(shape)
    return alloc_one
