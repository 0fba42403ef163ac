"""The kernel-family interface: what the simulate-then-run loop needs to know about one
kind of kernel, so that every command (`spak sim/run/sweep/store/report/plan/compile`)
works through it instead of knowing attention.

A family is one object (a subclass of `KernelFamily`, registered in spak/families/
__init__.py). Data flows one way through it:

    shape text --parse/select--> problem --make_inputs--> numpy inputs
        --plan (framework-agnostic Launches)--> sim.launch (CPU) or cuTile (GPU)
        --compare with reference (float64) under gates--> result row

A *problem* is any frozen, hashable object with a ``case_id`` (its full text in the
family's grammar, ``parse(case_id) == problem``), a ``display`` (shorter, for tables),
``dtype`` ("fp16" | "bf16") and ``causal`` attributes. Inputs are a mapping or a
NamedTuple of numpy arrays (float16, or float32 holding bf16 values).

Outputs are named (the forward has one, "out"; a backward has "dq", "dk", "dv"); each is
checked against its float64 reference with the family's gate for the problem's dtype.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from spak.core.errors import ShapeError
from spak.core.metrics import max_abs, nonfinite_count, rel_l2

__all__ = ["KernelFamily", "ReportPlace", "ShapeError"]


def worst_output(per: Mapping[str, dict]) -> str:
    """The output a row's top level shows: a failing one first, then the one nearest its
    gate (rel_l2 / gate)."""
    return max(per, key=lambda n: (not per[n]["passed"], per[n]["rel_l2"] / per[n]["gate"]))


class ReportPlace(NamedTuple):
    """Where `spak report` puts one problem (`KernelFamily.report_place`).

    Problems with the same ``group`` share one configs x shapes table and one plot panel,
    shown as ``heading`` (table), ``title`` (plot panel) and ``tag`` (file names).
    ``columns`` are the provider table's per-shape cells: (header, text, markdown
    alignment). ``size`` is the problem's place on the plot's x axis (titled ``axis``);
    ``sized``: the size alone names the shape in its group's table ("S=512"). ``order``
    sorts the problems in the report."""
    group: tuple
    heading: str
    title: str
    tag: str
    columns: tuple
    size: Optional[int]
    sized: bool
    axis: str
    order: tuple


class KernelFamily:
    """Base class of the kernel families. Subclasses fill the class attributes and
    implement the methods marked "required"; the rest have working defaults.

    Class attributes:
      name          the --family value and the results rows' "family" field, e.g. "fmha_fwd"
      title         one line for `--help` and reports
      kernels       the family's kernel variants, e.g. ("fused", "naive"); the first is the
                    one users get and the sweeper tunes
      outputs       names of the checked outputs, e.g. ("out",) or ("dq", "dk", "dv")
      metric        "TFLOPS" (compute-bound: `flops`) or "GB/s" (memory-bound: `bytes_moved`)
      space_keys    the sweep space's knobs, e.g. ("TILE_M", "TILE_N", "occupancy", "num_ctas")
      store_fields  the fields the tuned-config store files a config under (besides gpu,
                    kernel and family); `store_key` gives their values for a problem
      peers         names of the GPU providers `spak run` and `spak sweep` time beside ours
      entry_point   the PyTorch callable users call, e.g. "spak.fmha"
    """

    name: str = ""
    title: str = ""
    kernels: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ("out",)
    metric: str = "TFLOPS"
    space_keys: tuple[str, ...] = ()
    store_fields: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()
    entry_point: str = ""

    # ------------------------------------------------------------------ problems
    #: Named sets of shape strings, e.g. {"default": [...], "standard": [...]}.
    shape_sets: Mapping[str, Sequence[str]] = {}

    def grammar_help(self) -> str:
        """The shape grammar and the named sets, for `--help` epilogs (required)."""
        raise NotImplementedError

    def parse(self, text: str):
        """One shape string -> a problem; raises ShapeError saying what is wrong (required)."""
        raise NotImplementedError

    def check_shape_text(self, text: str) -> None:
        """Validate one --shapes item at argument-parse time (a set name or a shape);
        raises ShapeError. Default: a set name, or anything `parse` accepts."""
        if text.strip().lower() not in self.shape_sets:
            self.parse(text)

    def select(self, items: Iterable[str], *, dtype: str = "all", causal: str = "both") -> list:
        """Set names and shape strings -> problems, in order, without duplicates; open
        attributes are expanded over `dtype` (fp16/bf16/all) and `causal`
        (yes/no/both) (required)."""
        raise NotImplementedError

    def make_inputs(self, problem, seed: int = 0):
        """Fresh random inputs for the problem, reproducible from (seed, problem.case_id);
        never zeros (required)."""
        raise NotImplementedError

    # -------------------------------------------------------- reference and gates
    def reference(self, problem, inputs) -> dict[str, np.ndarray]:
        """The float64 reference of every output, by name (required)."""
        raise NotImplementedError

    def gate(self, problem, output: str) -> float:
        """The largest relative L2 error vs float64 that passes, for one output (required)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the plan
    def plan(self, kernel: str, arrays: Mapping[str, Any], *, tiles=None, alloc=None,
             **options) -> list:
        """Framework-agnostic launches (spak.gpu.plan.Launch) computing the outputs into
        the arrays given (numpy/SimArray for the simulator, torch tensors on a GPU);
        validates everything first (required)."""
        raise NotImplementedError

    def simulate(self, kernel: str, problem, inputs, *, tiles=None,
                 model: str = "sm_90") -> tuple[dict[str, np.ndarray], list]:
        """Run the kernel's launches in the CPU simulator: (outputs by name, the
        sim.LaunchReport of every launch) (required)."""
        raise NotImplementedError

    def compile_variant(self, item: Mapping[str, Any]) -> dict:
        """Compile one variant to cubins for ``item["arch"]`` on the CPU (tileiras), launching
        nothing. item: kernel, arch, dtype ("fp16"/"bf16"), head_dim, causal, mask, tiles
        (None: the default), hints (occupancy, num_ctas; optional). Returns
        {"ok", "seconds", "cubin_bytes", "error", "kernels" (resources per cubin), "tiles"}
        (what `spak compile` tabulates)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ cost
    def flops(self, problem) -> float:
        """Floating-point operations of one call, by the convention peers use."""
        raise NotImplementedError

    def bytes_moved(self, problem) -> float:
        """Bytes one call must read and write at least (for GB/s of memory-bound kernels)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ tuning
    def default_config(self, problem, arch: str = "sm_90") -> dict:
        """The config used when the store has none (required by sweep and run)."""
        raise NotImplementedError

    def store_key(self, problem) -> dict:
        """Values of `store_fields` for a problem: what a tuned config is filed under."""
        raise NotImplementedError

    # ------------------------------------------------------------ the GPU sweep
    #: The plan file (relative to the repository root) whose ``[sweep.<arch>]`` tables hold
    #: this family's sweep space (lists of values per `space_keys` entry); "" for none
    sweep_plan: str = ""
    #: arch -> space ({key: [values]}) the sweeper uses where the plan has no [sweep.<arch>]
    sweep_fallback: Mapping[str, Mapping[str, Sequence]] = {}
    #: the peers `spak sweep` times once per shape beside the configs (among `peers`)
    sweep_peers: tuple[str, ...] = ()
    #: the shape sets `spak sweep` takes when --shapes is not given
    sweep_shapes: tuple[str, ...] = ("standard",)
    #: the shape sets `spak run` takes when --shapes is not given
    run_shapes: tuple[str, ...] = ("standard", "seed")

    def knob_keys(self) -> tuple[str, ...]:
        """Kernel Constant knobs a sweep config may carry besides `space_keys` (integers in
        [0, 10], 0 = the compiler's choice). Default: none."""
        return ()

    def sweep_skip(self, problem) -> str | None:
        """Why `spak sweep` cannot time this problem (a phrase for the user), or None."""
        return None

    def row_fields(self, problem) -> dict:
        """The problem's own fields a sweep result row carries besides case, shape (the
        problem's ``display``), dtype, causal and flops. Default: none."""
        return {}

    def compile_unit(self, kernel: str, problem, config: dict, config_id: str) -> dict | None:
        """What the sweeper's compile helpers build ahead of the measuring worker for one
        (kernel, problem, config): a JSON-able description of a small launch with the same
        JIT specialisation, whose ``unit_id`` names the cubin (jobs with the same unit_id
        share it); or None: the worker compiles on its first launch. Default: None."""
        return None

    def stand_in_launches(self, unit: Mapping[str, Any], arch: str) -> list | None:
        """The launches of a compile unit (``compile_unit``) planned on shape-only stand-ins
        (spak.gpu.launch_sig.LaunchArray, as torch allocates the unit's real problem), hints
        applied: what a CPU compile helper builds into cuTile's disk cache with no GPU and
        no torch (spak.tune.worker, role compile-cpu). None: not modelled, a GPU helper
        (compile_call) builds the unit. Default: None."""
        return None

    # ------------------------------------------------------- plans and reports
    #: a shape in the family's grammar, for messages ("... nor a shape such as 1x8x128x64")
    example_shape: str = ""
    #: the metric as reports define it, one line, e.g. "TFLOPS = 4·B·Hq·Sq·Sk·D / time"
    metric_definition: str = ""
    #: the peers `spak report` puts beside ours, in column order (empty: every peer)
    compared_peers: tuple[str, ...] = ()
    #: the peers together, for figure titles ("SPAK fused vs PyTorch SDPA")
    peers_name: str = "peers"

    @property
    def tile_keys(self) -> tuple[str, ...]:
        """The tile sizes among `space_keys` (e.g. TILE_M, TILE_N): the keys of a plan
        step's ``tiles`` table and of `spak run --tiles`."""
        return tuple(k for k in self.space_keys if "TILE" in k)

    def check_shape_item(self, text: str) -> None:
        """One item of a plan's shape list: a set name or one shape; raises ShapeError, which
        says "neither a shape set nor a shape" for a text that looks like neither (no "x")."""
        item = text.strip()
        if item.lower() in self.shape_sets:
            return
        try:
            self.check_shape_text(item)
        except ShapeError:
            if "x" not in item.lower():
                like = f"such as {self.example_shape}" if self.example_shape else \
                    f"of the {self.name} family"
                raise ShapeError(f"{item!r} is neither a shape set "
                                 f"({', '.join(self.shape_sets)}) nor a shape {like}") from None
            raise

    def peer_label(self, peer: str) -> str:
        """A peer's name in report tables and plot legends (default: the provider name)."""
        return peer

    def report_place(self, problem) -> "ReportPlace":
        """Where `spak report` puts the problem among its tables and plots. Default: one
        group per causal flag, shapes in case order, no size axis."""
        causal = bool(getattr(problem, "causal", False))
        return ReportPlace(
            group=(("causal", causal),), heading="causal" if causal else "non-causal",
            title=f"{self.title}, {'causal' if causal else 'non-causal'}",
            tag="causal" if causal else "noncausal",
            columns=(("causal", "yes" if causal else "no", ":---:"),),
            size=None, sized=False, axis="Shape", order=(causal, problem.case_id))

    # ------------------------------------------------------------ the CPU loop
    def error(self, output: str, out, ref, inputs, scale: Optional[float] = None) -> float:
        """The error `sim_case` gates one output by: relative L2 vs the float64 reference
        (a family whose outputs may be exactly zero measures otherwise: fmha_bwd)."""
        return rel_l2(out, ref)

    def sim_case(self, kernel: str, problem, *, tiles=None, model: str = "sm_90",
                 seed: int = 0) -> dict:
        """One row of `spak sim`: every output's errors vs float64 and the verdict.

        The row's top-level rel_l2 / max_abs / nonfinite / gate are those of the output
        that is worst against its gate, so single-output families read as before."""
        inputs = self.make_inputs(problem, seed)
        t0 = time.perf_counter()
        outs, reports = self.simulate(kernel, problem, inputs, tiles=tiles, model=model)
        seconds = time.perf_counter() - t0
        ref = self.reference(problem, inputs)
        per = {}
        for name in self.outputs:
            rel = self.error(name, outs[name], ref[name], inputs)
            bad = nonfinite_count(outs[name])
            per[name] = {"rel_l2": rel, "max_abs": max_abs(outs[name], ref[name]),
                         "nonfinite": bad, "gate": self.gate(problem, name),
                         "passed": bad == 0 and rel <= self.gate(problem, name)}
        worst = worst_output(per)
        row = {"kernel": kernel, "shape": problem.display, "causal": problem.causal,
               "dtype": problem.dtype, **{k: per[worst][k] for k in
                                          ("rel_l2", "max_abs", "nonfinite", "gate")},
               "seconds": seconds, "passed": all(p["passed"] for p in per.values()),
               "error": None,
               "launches": [{"kernel": r.kernel, "grid": list(r.grid), "groups": r.groups,
                             "splits": r.splits, "seconds": r.seconds} for r in reports]}
        if len(self.outputs) > 1:
            row["outputs"] = per
        return row

    # ------------------------------------------------------------ the GPU loop
    # `spak run` (spak.device.case) and the sweep's worker (spak.tune.worker) drive a
    # family through these. Tensors are torch tensors on one device; torch and cuTile are
    # imported inside the methods. Input sets are mappings name -> tensor (or None);
    # outputs are mappings output name (of `outputs`) -> tensor.

    def gpu_inputs(self, problem, seed: int = 0, set_index: int = 0,
                   device="cuda") -> dict:
        """Fresh random inputs on ``device``, reproducible from (problem.case_id, seed,
        set_index); never zeros (required for `spak run`).

        Set 0 is the checked set and holds every input. Sets 1, 2, .. exist only to be
        timed (rotated so the L2 cache does not flatter small shapes): they may hold only
        the inputs that should vary between calls; callers lay them over set 0
        (`gpu_input_sets`), so inputs left out are set 0's tensors, shared."""
        raise NotImplementedError

    def gpu_input_sets(self, problem, seed: int, n_sets: int, device="cuda") -> list[dict]:
        """`gpu_inputs` sets 0 .. n_sets-1, each complete (set 0's inputs filling the gaps)."""
        first = self.gpu_inputs(problem, seed, 0, device)
        return [first] + [{**first, **self.gpu_inputs(problem, seed, i, device)}
                          for i in range(1, n_sets)]

    def gpu_reference(self, problem, inputs) -> dict:
        """The float64 reference of every output, as tensors on the inputs' device (the
        family may compute it on the CPU for small problems) (required for `spak run`)."""
        raise NotImplementedError

    def gpu_config(self, kernel: str, problem, device, tiles=None) -> dict:
        """The launch config `spak run` uses for ``kernel``: ``tiles`` from --tiles (a
        (TILE_M, TILE_N) pair) when given, else the tuned store's entry for the device,
        else the default. Default: `default_config` for the device's arch; --tiles refused."""
        if tiles is not None:
            raise ValueError(f"--tiles: family {self.name} takes no TILE_M x TILE_N pair")
        return self.default_config(problem, _device_arch(device))

    def workspace_bytes(self, kernel: str, problem) -> int:
        """Scratch memory one call of ``kernel`` needs besides inputs and outputs (`spak run`
        skips a kernel over --naive-max-gb). Default 0."""
        return 0

    def gpu_call(self, kernel: str, problem, inputs, config, *, alloc=None):
        """Plan ``kernel`` with ``config`` (tiles, knobs and hints, as `default_config`, the
        store or a sweep give it) on one input set, into outputs it allocates and fills
        with NaN: a spak.device.calls.GpuCall (outputs, launches, tiles, hints). Launches
        nothing. Raises ValueError/TypeError for a config or input the kernel cannot take.
        alloc(shape, kind): workspace allocator to share between calls that run one after
        another (None: fresh torch workspaces) (required for `spak run` and the sweep)."""
        raise NotImplementedError

    def compile_call(self, unit: Mapping[str, Any], device="cuda"):
        """A GpuCall on small stand-in inputs with the specialisation of the sweep's compile
        unit (spak.tune.sweep.compile_unit), so that launching it once puts the variant's
        cubin in cuTile's disk cache (required for the sweep's compile helpers)."""
        raise NotImplementedError

    def peer_calls(self, problem, inputs, names=None) -> dict:
        """{peer name: spak.device.calls.PeerCall}: other implementations of the outputs,
        on input sets shaped like ``inputs`` (set 0), checked and timed beside ours.
        names=None: the peers `spak run` times, in the order it lists them; else those
        named (ValueError for a name the family does not know). Default: none."""
        return {}

    def peer_reference(self, problem, inputs) -> dict | None:
        """Every output computed by a trusted, fast peer, in SPAK's conventions (e.g. SDPA
        with torch's own backend choice): `spak run` reports our error against it
        (rel_l2_vs_sdpa) and the sweep checks each config against it. None: no peer."""
        return None

    def gpu_check(self, problem, inputs, outputs, reference, peer_reference=None) -> dict:
        """The row fields of our outputs' check: nonfinite, rel_l2, max_abs (vs float64),
        rel_l2_vs_sdpa (vs ``peer_reference``), gate and passed. As in `sim_case`, the top
        level is the output that is worst against its gate; with several outputs,
        "outputs" holds each one's. Families add their own checks (override, call this)."""
        from spak.device.checks import output_errors
        per = {}
        for name in self.outputs:
            e = output_errors(outputs[name], reference[name],
                              None if peer_reference is None else peer_reference[name])
            e["gate"] = self.gate(problem, name)
            e["passed"] = e["nonfinite"] == 0 and e["rel_l2"] <= e["gate"]
            per[name] = e
        row = dict(per[worst_output(per)])
        row["passed"] = all(p["passed"] for p in per.values())
        if len(self.outputs) > 1:
            row["outputs"] = per
        return row

    def sim_slice(self, kernel: str, problem, inputs, outputs, config, *, heads: int = 1,
                  work: int = 1 << 29):
        """The part of the problem the simulator re-computes to compare bits with the GPU's
        ``outputs``: a spak.device.calls.SimSlice (its problem, numpy inputs cut from the GPU
        inputs, the GPU outputs on it, tiles, text). ``work`` bounds the simulated work
        (for attention: query rows x keys x head dim x heads); ``heads``: query heads
        wanted (required for `spak run`'s agreement check). A list of SimSlices when the
        outputs need different cuts (each simulated and compared on its own ``gpu``
        outputs; e.g. the backward's dK/dV, which need every query row, and dQ, which
        needs every key)."""
        raise NotImplementedError

    def eager_call(self, kernel: str, problem, inputs):
        """A callable running the family's public PyTorch entry (e.g. spak.fmha) on one
        input set, for `spak run --timing eager` (what a program pays per call, host work
        included). None (default): eager mode times the planned launches (GpuCall)."""
        return None

    def has_gpu_loop(self) -> bool:
        """True when the family implements what `spak run` needs."""
        cls = type(self)
        return all(getattr(cls, m) is not getattr(KernelFamily, m)
                   for m in ("gpu_inputs", "gpu_reference", "gpu_call", "sim_slice"))

    def __repr__(self) -> str:
        return f"<kernel family {self.name}: {self.title}>"


def _device_arch(device) -> str:
    """"sm_XY" of a CUDA device; "sm_90" for anything else (tests on the CPU)."""
    import torch
    dev = torch.device(device)
    if dev.type != "cuda":
        return "sm_90"
    major, minor = torch.cuda.get_device_capability(dev)
    return f"sm_{major}{minor}"
