"""A stand-in for the `cuda.tile` module, swapped into a kernel's globals by the launcher.

Ops the simulator implements come from sim.ops and sim.memory; dtypes, enums and type
annotations are cuTile's own objects; every other public name raises SimNotSupported when
called, naming the op, so the simulator never silently approximates an op it lacks.
"""
from __future__ import annotations

import types

import cuda.tile as ct

from . import atomics, indexing, memory, ops, tileops
from .errors import SimNotSupported
from .tile import counted

# names that are data (dtypes, enums, annotations, classes) and pass through unchanged
_PASS_THROUGH = {
    "Constant", "ConstantAnnotation", "ArrayAnnotation", "ListAnnotation", "ScalarInt64",
    "IndexedWithInt64", "DType", "PaddingMode", "RoundingMode", "MemoryOrder", "MemoryScope",
    "ByTarget", "Tile", "Scalar", "TiledView",
}

_FROM_MEMORY = {"load": memory.load, "store": memory.store}
# ops added for issue 19 live in their own modules (sim.tileops, sim.indexing, sim.atomics)
_EXTRA_MODULES = (tileops, indexing, atomics)
# host-side names that pass through unchanged: a kernel never calls them, host code may
_HOST = {"foreign_pointer_dtype"}


def _unsupported(name):
    def f(*args, **kwargs):
        raise SimNotSupported(f"spak sim: ct.{name} is not supported by the simulator")
    f.__name__ = name
    return f


def build() -> types.ModuleType:
    mod = types.ModuleType("cuda.tile[spak.sim]")
    for name in dir(ct):
        if name.startswith("_"):
            continue
        val = getattr(ct, name)
        if isinstance(val, ct.DType) or name in _PASS_THROUGH or isinstance(val, type) \
                or isinstance(val, types.ModuleType):
            setattr(mod, name, val)
        # every op the kernel can call counts its tile arguments' uses (sim.tile.note_use):
        # the numeric model fuses a multiply into an add only when the product has one use
        elif name in _FROM_MEMORY:
            setattr(mod, name, counted(_FROM_MEMORY[name]))
        elif name in _HOST:
            setattr(mod, name, val)
        elif any(callable(getattr(m, name, None)) for m in _EXTRA_MODULES):
            impl = next(getattr(m, name) for m in _EXTRA_MODULES if callable(getattr(m, name, None)))
            setattr(mod, name, impl if name == "compiler_timeout" else counted(impl))
        elif hasattr(ops, name) and callable(getattr(ops, name)):
            setattr(mod, name, counted(getattr(ops, name)))
        elif callable(val):
            setattr(mod, name, _unsupported(name))
        else:
            setattr(mod, name, val)
    mod.kernel = _passthrough_decorator
    mod.function = _passthrough_decorator
    mod.Slice = indexing.Slice          # cuTile's Slice can only be built by its compiler
    mod.Array = _KernelArray
    mod.launch = _launch_in_kernel
    return mod


class _KernelArray:
    """ct.Array as a simulated kernel sees it: kernel arrays are sim.memory.SimArray; the
    class itself is reached only for its static constructor from_foreign."""
    from_foreign = staticmethod(memory.SimArray.from_foreign)


def _launch_in_kernel(*args, **kwargs):
    raise SimNotSupported("spak sim: ct.launch inside a kernel: launches are host code "
                          "(on the CPU, sim.launch or spak.sim.enable() runs ct.launch)")


def _passthrough_decorator(fn=None, /, **kw):
    if fn is None:
        return lambda f: f
    return fn


FAKE_CT = build()

# ids of real cuTile callables -> simulator versions, for names imported directly
# (`from cuda.tile import load`)
REAL_TO_FAKE = {id(getattr(ct, n)): getattr(FAKE_CT, n) for n in dir(ct)
                if not n.startswith("_") and callable(getattr(ct, n))
                and not isinstance(getattr(ct, n), type)}
