"""sim.launch: run a @ct.kernel's own Python body on the CPU for every block of a grid.

How: the kernel's function is re-created with its globals' `cuda.tile` module (and the
builtins `max`/`min`) swapped for the simulator's (the trick Numba's CUDA simulator uses).
Blocks run in lock-step groups, one lane per block, so each tile op is one numpy call for
many blocks. A python-level decision that differs between blocks raises Divergence; the
group is split by that value and re-run, so every block still follows its own control flow.
"""
from __future__ import annotations

import builtins
import time
import types
from dataclasses import dataclass, field

import numpy as np
import cuda.tile as ct

from . import memory, oob
from .context import GroupContext, set_current
from .errors import ContractionConflict, Divergence, SimulationError
from .fake_ct import FAKE_CT, REAL_TO_FAKE
from .memory import SimArray
from .numerics import get_model
from .ops import builtin_max, builtin_min
from .ops import print as _kernel_print

MAX_LANES = 512          # blocks per lock-step group (bounds memory per tile)

# builtins cuTile's compiler treats specially inside kernels: max/min on tiles, and print
# (a kernel's print is ct.print: per block, with that block's values)
_BUILTINS = dict(builtins.__dict__, max=builtin_max, min=builtin_min, print=_kernel_print)
_rebound: dict = {}
_rebound_globals: dict = {}


@dataclass
class LaunchReport:
    kernel: str
    grid: tuple[int, int, int]
    model: str
    seconds: float
    groups: int                       # lock-step groups that ran to completion
    splits: int                       # divergences that split a group
    loads: int
    stores: int
    findings: list[str] = field(default_factory=list)
    mode: str = "lockstep"            # "lockstep" or "cooperative" (sim.coop)
    order: int | None = None          # None: default block order; an int: its seed
    # out-of-bounds tile accesses first seen in this launch (undefined in cuTile; run as
    # the GPU does, padded/dropped; SPAK_SIM_STRICT=1 raises instead: sim.oob)
    oob: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.findings


def _is_cuda_tile_module(val) -> bool:
    return isinstance(val, types.ModuleType) and val.__name__ == "cuda.tile"


def _rebind(fn: types.FunctionType, files: set) -> types.FunctionType:
    """`fn` with cuda.tile replaced by the simulator in its globals (recursively)."""
    if fn in _rebound:
        files.add(fn.__code__.co_filename)
        return _rebound[fn]
    g = fn.__globals__
    newg = _rebound_globals.get(id(g))
    fresh = newg is None
    if fresh:
        # fill the globals before creating the function: CPython binds builtins at creation
        newg = dict(g)
        newg["__builtins__"] = _BUILTINS
        _rebound_globals[id(g)] = newg
    new = types.FunctionType(fn.__code__, newg, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    _rebound[fn] = new
    files.add(fn.__code__.co_filename)
    if fresh:
        for name, val in g.items():
            if _is_cuda_tile_module(val):
                newg[name] = FAKE_CT
            elif isinstance(val, ct.kernel):
                newg[name] = _rebind(val._annotated_function.pyfunc, files)
            elif callable(val) and id(val) in REAL_TO_FAKE:
                newg[name] = REAL_TO_FAKE[id(val)]
            elif val is fn:
                # the function being rebound, seen in its own module: the rebound copy (a
                # kernel of that module calling it later must not get the real-ct original)
                newg[name] = new
            elif isinstance(val, types.FunctionType) and _uses_cuda_tile(val):
                newg[name] = _rebind(val, files)
    return new


def _uses_cuda_tile(fn) -> bool:
    return any(_is_cuda_tile_module(v) or (callable(v) and id(v) in REAL_TO_FAKE)
               for v in fn.__globals__.values())


def _signature(kernel):
    """(python function, parameter names, constant flags, int64 flags, name)."""
    if isinstance(kernel, ct.kernel):
        af = kernel._annotated_function
        fn = af.pyfunc
        const = [a.constant for a in af.parameter_annotations]
        wide = [a.scalar is not None and a.scalar.dtype == ct.int64 for a in af.parameter_annotations]
    elif isinstance(kernel, types.FunctionType):
        fn = kernel
        n = fn.__code__.co_argcount
        const, wide = [False] * n, [False] * n
    else:
        raise TypeError(f"sim.launch: kernel must be a @ct.kernel or a function, got {type(kernel).__name__}")
    names = list(fn.__code__.co_varnames[:fn.__code__.co_argcount])
    return fn, names, const, wide, fn.__name__


def _bind_args(names, const, wide, args, kname):
    if len(args) != len(names):
        raise TypeError(f"sim.launch: kernel {kname} takes {len(names)} arguments "
                        f"({', '.join(names)}), got {len(args)}")
    seen: dict[int, SimArray] = {}
    bound, arrays = [], []
    for name, is_const, is_wide, a in zip(names, const, wide, args):
        if isinstance(a, SimArray):
            if a.name == "array":
                a.name = name
            arr = seen.setdefault(id(a.data), a)
            bound.append(arr)
        elif isinstance(a, np.ndarray):
            arr = seen.get(id(a))
            if arr is None:
                arr = SimArray(a, name=name)
                seen[id(a)] = arr
            bound.append(arr)
        elif is_const:
            bound.append(a)
        elif isinstance(a, bool):
            bound.append(bool(a))
        elif isinstance(a, int):
            lim = 2**63 if is_wide else 2**31
            if not -lim <= a < lim:
                raise ValueError(f"sim.launch: argument '{name}'={a} does not fit "
                                 f"int{64 if is_wide else 32} (annotate ct.ScalarInt64)")
            bound.append(int(a))
        elif isinstance(a, float):
            bound.append(np.float32(a))      # a float kernel argument is float32 on the GPU
        elif isinstance(a, np.generic):
            bound.append(a)
        elif _array_list(a):
            # a list of arrays (TileGym's group GEMM passes As, Bs, Cs): the kernel indexes
            # it with Python ints and takes len() of it, as cuTile allows
            bound.append(tuple(_bind_one(x, f"{name}[{i}]", seen) for i, x in enumerate(a)))
            arrays.extend(x for x in bound[-1] if x not in arrays)
            continue
        else:
            raise TypeError(f"sim.launch: argument '{name}' of type {type(a).__name__} is not "
                            "supported (numpy arrays, sim.SimArray, lists of them, python scalars)")
        if isinstance(bound[-1], SimArray) and bound[-1] not in arrays:
            arrays.append(bound[-1])
    return bound, arrays


def _array_list(a) -> bool:
    return isinstance(a, (list, tuple)) and len(a) > 0 and all(
        isinstance(x, (SimArray, np.ndarray)) for x in a)


def _bind_one(a, name, seen):
    if isinstance(a, SimArray):
        return seen.setdefault(id(a.data), a)
    arr = seen.get(id(a))
    if arr is None:
        arr = seen[id(a)] = SimArray(a, name=name)
    return arr


def _grid3(grid):
    if isinstance(grid, (int, np.integer)) and not isinstance(grid, bool):
        grid = (grid,)
    if not isinstance(grid, (tuple, list)) or not all(
            isinstance(g, (int, np.integer)) and not isinstance(g, bool) for g in grid):
        raise TypeError(f"sim.launch: grid must be an int or a tuple of 1 to 3 ints, got {grid!r}")
    grid = tuple(int(g) for g in grid)
    if not 1 <= len(grid) <= 3 or any(g < 1 for g in grid):
        raise ValueError(f"sim.launch: grid must be 1 to 3 positive ints, got {grid}")
    return grid + (1,) * (3 - len(grid))


MODES = ("auto", "lockstep", "cooperative")


def launch(kernel, grid, args, *, model="sm_90", check=True, check_unwritten=True,
           max_lanes: int = MAX_LANES, mode: str = "auto", order: int | None = None,
           resident: int | None = None) -> LaunchReport:
    """Run `kernel` over `grid` with `args` (numpy arrays are updated in place).

    check: raise SimulationError when the checker finds a double write, a race or
    unwritten output elements. Out-of-bounds tiles (entirely outside, or partly with
    check_bounds=False; undefined in cuTile) run as the GPU runs them, loads padded and
    stores dropped, and are listed in report.oob; SPAK_SIM_STRICT=1 (sim.oob.set_strict)
    raises at the op instead, naming the block.
    mode: "lockstep" runs blocks as lanes of one numpy computation, stores committed per
    group (fast; blocks cannot see each other's memory); "cooperative" runs each block as
    its own thread, taking turns at atomics and acquire/release accesses, with the
    happens-before race checker (sim.coop, sim.races); "auto" (default) picks cooperative
    when the kernel's code names an atomic or a memory order.
    order: None runs blocks in the default order; an int seeds a shuffled block order
    (and, in cooperative mode, random hand-overs), as sim.find_races does.
    resident: cooperative mode's number of live blocks (default 64).
    """
    t0 = time.perf_counter()
    oob_mark = oob.mark()
    if mode not in MODES:
        raise ValueError(f"sim.launch: mode must be one of {MODES}, got {mode!r}")
    if order is not None and (not isinstance(order, (int, np.integer)) or isinstance(order, bool)):
        raise TypeError(f"sim.launch: order must be None or an int seed, got {order!r}")
    fn, names, const, wide, kname = _signature(kernel)
    grid = _grid3(grid)
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"sim.launch: args must be a tuple or list of kernel arguments, "
                        f"got {type(args).__name__}")
    bound, arrays = _bind_args(names, const, wide, tuple(args), kname)
    for a in arrays:
        a.owner = None
    files: set = set()
    run = _rebind(fn, files)
    mdl = get_model(model)
    if mode == "auto":
        mode = "cooperative" if needs_cooperative(fn) else "lockstep"
    gx, gy, gz = grid
    z, y, x = np.meshgrid(np.arange(gz), np.arange(gy), np.arange(gx), indexing="ij")
    all_blocks = np.stack([x.ravel(), y.ravel(), z.ravel()], axis=1).astype(np.int64)
    job = _Job(kname, grid, mdl, run, bound, arrays, frozenset(files))
    if mode == "cooperative":
        stats = _run_cooperative(job, all_blocks, order, resident)
    else:
        if order is not None:
            all_blocks = all_blocks[np.random.default_rng(order).permutation(len(all_blocks))]
        stats = _run_lockstep(job, all_blocks, max_lanes)
    findings = stats.pop("findings")
    if check_unwritten:
        findings += memory.unwritten_findings(arrays)
    report = LaunchReport(kernel=kname, grid=grid, model=mdl.name,
                          seconds=time.perf_counter() - t0, findings=findings, mode=mode,
                          order=order, oob=oob.since(oob_mark), **stats)
    if check and findings:
        raise SimulationError(f"kernel {kname}: checker found {len(findings)} problem(s):\n  "
                              + "\n  ".join(findings))
    return report


@dataclass
class _Job:
    kname: str
    grid: tuple
    model: object
    run: object
    bound: list
    arrays: list
    files: frozenset


def _dedupe(findings):
    return list(dict.fromkeys(findings))


def _run_lockstep(job, all_blocks, max_lanes) -> dict:
    queue = [all_blocks[i:i + max_lanes] for i in range(0, len(all_blocks), max_lanes)]
    findings: list[str] = []
    groups = splits = loads = stores = 0
    unfused: set = set()
    while queue:
        blocks = queue.pop()
        ctx = GroupContext(model=job.model, grid=job.grid, block_ids=blocks,
                           kernel_files=job.files, unfused_sites=unfused)
        set_current(ctx)
        try:
            job.run(*job.bound)
        except ContractionConflict as c:
            # a product fused as single-use turned out to have more uses: run the group
            # again without fusing that multiply (its pending stores are dropped with ctx)
            unfused.add(c.site)
            queue.append(blocks)
            continue
        except Divergence as d:
            splits += 1
            vals = np.broadcast_to(np.asarray(d.values), (len(blocks),) + np.shape(d.values)[1:])
            keys = vals.reshape(len(blocks), -1)
            _, inverse = np.unique(keys, axis=0, return_inverse=True)
            inverse = inverse.reshape(-1)
            for k in range(inverse.max(), -1, -1):
                queue.append(blocks[inverse == k])
            continue
        except Exception as e:
            if hasattr(e, "add_note"):
                first = tuple(int(v) for v in blocks[0])
                e.add_note(f"spak sim: raised in kernel {job.kname} while running {len(blocks)} "
                           f"block(s) in lock-step, first block {first}")
            raise
        finally:
            set_current(None)
        loads += ctx.loads
        stores += ctx.stores
        findings += ctx.findings
        findings += memory.commit(ctx, job.grid)
        groups += 1
    return dict(groups=groups, splits=splits, loads=loads, stores=stores,
                findings=_dedupe(findings))


def _run_cooperative(job, all_blocks, order, resident) -> dict:
    """Every block a thread (sim.coop) with the happens-before checker (sim.races). A
    multiply that turns out to have two uses after it was fused restarts the launch from
    the arrays as they were: other blocks may already have seen this block's stores."""
    from .coop import Cooperative
    from .races import HappensBefore
    snapshot = [a.data.copy() for a in job.arrays]
    unfused: set = set()
    while True:
        hb = HappensBefore(job.grid)
        coop = Cooperative(job.grid, all_blocks, resident=resident, seed=order, hb=hb)
        totals = {"loads": 0, "stores": 0, "findings": []}

        def body(blk):
            ctx = GroupContext(model=job.model, grid=job.grid,
                               block_ids=np.array([blk.xyz], np.int64),
                               kernel_files=job.files, unfused_sites=unfused, coop=coop,
                               coop_block=blk)
            set_current(ctx)
            try:
                job.run(*job.bound)
            finally:
                set_current(None)
            totals["loads"] += ctx.loads
            totals["stores"] += ctx.stores
            totals["findings"] += ctx.findings

        try:
            coop.run(body)
        except ContractionConflict as c:
            unfused.add(c.site)
            for a, snap in zip(job.arrays, snapshot):
                a.data[...] = snap
                a.owner = None
            continue
        except Exception as e:
            if hasattr(e, "add_note"):
                e.add_note(f"spak sim: raised in kernel {job.kname} (cooperative mode)")
            raise
        totals["findings"] += hb.findings()
        return dict(groups=len(all_blocks), splits=0, loads=totals["loads"],
                    stores=totals["stores"], findings=_dedupe(totals["findings"]))


_COOP_NAMES = ("atomic_", "get_raw_memory", "MemoryOrder")
_needs: dict = {}


def needs_cooperative(fn) -> bool:
    """Whether the kernel (or a function it calls) names an atomic, raw memory or a memory
    order: blocks of such kernels may talk to each other through memory."""
    hit = _needs.get(fn)
    if hit is None:
        _needs[fn] = False          # recursion guard
        hit = _needs[fn] = _scan(fn.__code__, fn.__globals__, set())
    return hit


def _scan(code, globs, seen) -> bool:
    if code in seen:
        return False
    seen.add(code)
    for name in code.co_names:
        if name.startswith(_COOP_NAMES) or name.startswith("atomic_"):
            return True
        val = globs.get(name)
        if callable(val) and id(val) in REAL_TO_FAKE and getattr(val, "__name__", "").startswith("atomic_"):
            return True
        if isinstance(val, ct.kernel):
            val = val._annotated_function.pyfunc
        if isinstance(val, types.FunctionType) and _scan(val.__code__, val.__globals__, seen):
            return True
    return any(isinstance(c, types.CodeType) and _scan(c, globs, seen) for c in code.co_consts)
