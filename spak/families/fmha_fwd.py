"""The FMHA forward as a kernel family: O = softmax(Q K^T * scale + M) V.

Problems, grammar and inputs come from spak.attention.problems, the float64 reference
from spak.attention.reference, the launches from spak.gpu.plan.plan_fmha and the CPU
run from spak.cpu.simrun; this module only says which is which.
"""
from __future__ import annotations

from spak.attention import problems as P
from spak.core.metrics import gate_for
from spak.families.base import KernelFamily, ReportPlace


class FmhaForward(KernelFamily):
    name = "fmha_fwd"
    title = "fused multi-head attention, forward (causal, masks, GQA, Sq != Sk)"
    kernels = ("fused", "naive")
    outputs = ("out",)
    metric = "TFLOPS"
    space_keys = ("TILE_M", "TILE_N", "occupancy", "num_ctas")
    store_fields = ("dtype", "head_dim", "causal", "seq_bucket")
    peers = ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient")
    entry_point = "spak.fmha"
    shape_sets = P.SHAPE_SETS

    # problems
    def grammar_help(self) -> str:
        return P.GRAMMAR_HELP

    def parse(self, text: str) -> P.ProblemSpec:
        return P.parse_spec(text)

    def check_shape_text(self, text: str) -> None:
        if text.strip().lower() not in self.shape_sets:
            P.parse_case(text)

    def select(self, items, *, dtype="all", causal="both") -> list[P.ProblemSpec]:
        return P.select_cases(items, dtype=dtype, causal=causal)

    def make_inputs(self, problem, seed: int = 0) -> P.Inputs:
        return P.make_inputs(problem, seed)

    # reference and gates
    def reference(self, problem, inputs) -> dict:
        from spak.attention.reference import attention_f64
        return {"out": attention_f64(inputs.q, inputs.k, inputs.v, mask=inputs.mask,
                                     causal=problem.causal)}

    def gate(self, problem, output: str = "out") -> float:
        return gate_for(problem.dtype)

    # the plan
    def plan(self, kernel, arrays, *, tiles=None, alloc=None, mask=None, causal=False,
             scale=None):
        from spak.gpu.plan import plan_fmha
        a = arrays
        return plan_fmha(kernel, a["q"], a["k"], a["v"], a["out"], mask=mask, causal=causal,
                         scale=scale, tiles=tiles, alloc=alloc)

    def simulate(self, kernel, problem, inputs, *, tiles=None, model="sm_90"):
        from spak.cpu.simrun import simulate_fmha
        out, reports = simulate_fmha(kernel, inputs.q, inputs.k, inputs.v, mask=inputs.mask,
                                     causal=problem.causal, tiles=tiles, model=model,
                                     dtype=problem.dtype)
        return {"out": out}, reports

    def compile_variant(self, item) -> dict:
        from spak.gpu.compile import compile_variant
        from spak.gpu.plan import default_tiles
        tiles = item.get("tiles") or default_tiles(item["head_dim"], item["arch"],
                                                   causal=item["causal"])
        dtype = {"fp16": "float16", "bf16": "bfloat16"}[item["dtype"]]
        r = compile_variant(item["kernel"], arch=item["arch"], dtype=dtype,
                            head_dim=item["head_dim"], causal=item["causal"],
                            has_mask=item["mask"], tiles=dict(tiles), hints=item.get("hints"))
        return {**r, "tiles": dict(tiles)}

    # the GPU loop (`spak run`, the sweep's worker): inputs q, k, v, mask, kmask; output out
    #: the peers `spak run` checks and times, in the order it lists them
    run_peers = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")

    def gpu_inputs(self, problem, seed=0, set_index=0, device="cuda") -> dict:
        from spak.device.attention import attention_gpu_inputs
        return attention_gpu_inputs(problem, seed, set_index, device)

    def gpu_reference(self, problem, inputs) -> dict:
        import math
        from spak.device.gpu_reference import attention_reference
        return {"out": attention_reference(problem, inputs["q"], inputs["k"], inputs["v"],
                                           inputs.get("mask"), 1.0 / math.sqrt(problem.D))}

    def gpu_config(self, kernel, problem, device, tiles=None) -> dict:
        if tiles is not None:                       # --tiles MxN: exactly these, no hints
            return {"TILE_M": tiles[0], "TILE_N": tiles[1]}
        from spak.api import resolve_tiles
        from spak.device.attention import torch_dtype
        return resolve_tiles(kernel, torch_dtype(problem.dtype), problem.D, problem.causal,
                             problem.Sk, device,
                             rows=problem.B * problem.Hq * problem.Sq)   # as spak.fmha

    def workspace_bytes(self, kernel, problem) -> int:
        p = problem                                 # naive: S (float32) and P (2 bytes)
        return p.B * p.Hq * p.Sq * p.Sk * 6 if kernel == "naive" else 0

    @staticmethod
    def _kernel_config(kernel, config) -> tuple[dict, dict]:
        """(tiles, hints) of a config; the naive kernel takes TILE_M/TILE_N only (the store's
        and the defaults' knobs are the fused kernel's)."""
        from spak.gpu.variants import split_config
        tiles, hints = split_config(config)
        if kernel != "fused":
            tiles = {k: tiles[k] for k in ("TILE_M", "TILE_N")}
        return tiles, hints

    def gpu_call(self, kernel, problem, inputs, config, *, alloc=None):
        import math
        import torch
        import spak.gpu.launch as gl
        from spak.device.calls import GpuCall
        from spak.gpu.variants import apply_hints
        tiles, hints = self._kernel_config(kernel, config)
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        out = torch.full(tuple(q.shape[:3]) + (v.shape[3],), float("nan"), dtype=q.dtype,
                         device=q.device)
        kw = dict(mask=inputs.get("kmask"), causal=problem.causal,
                  scale=1.0 / math.sqrt(problem.D), tiles=tiles)
        launches = gl.plan_torch(kernel, q, k, v, out, **kw) if alloc is None else \
            gl.plan_fmha(kernel, q, k, v, out, alloc=alloc, **kw)
        return GpuCall({"out": out}, apply_hints(launches, hints), tiles, hints)

    def compile_call(self, unit, device="cuda"):
        import math
        import torch
        import spak.gpu.launch as gl
        from spak.device.attention import torch_dtype
        from spak.device.calls import GpuCall
        from spak.gpu.variants import apply_hints
        tiles, hints = self._kernel_config(unit["kernel"], unit["config"])
        dt = torch_dtype(unit["dtype"])
        q, k, v = (torch.randn(unit[n], device=device, dtype=dt) for n in ("q", "k", "k"))
        out = torch.empty(unit["q"], device=device, dtype=dt)
        launches = gl.plan_torch(unit["kernel"], q, k, v, out, causal=unit["causal"],
                                 scale=1.0 / math.sqrt(unit["q"][-1]), tiles=tiles)
        return GpuCall({"out": out}, apply_hints(launches, hints), tiles, hints)

    def eager_call(self, kernel, problem, inputs):
        """spak.fmha on the input set (tiles from the store: what users get)."""
        from spak.api import fmha
        gqa = problem.Hq != problem.Hkv
        return lambda: fmha(inputs["q"], inputs["k"], inputs["v"],
                                 is_causal=problem.causal, attn_mask=inputs.get("mask"),
                                 enable_gqa=gqa, kernel=kernel)

    def peer_calls(self, problem, inputs, names=None) -> dict:
        from spak.device.sdpa import sdpa_peers
        return sdpa_peers(problem, inputs, self.run_peers if names is None else names)

    def peer_reference(self, problem, inputs) -> dict:
        from spak.device.sdpa import sdpa_reference
        return {"out": sdpa_reference(problem, inputs)}

    def gpu_check(self, problem, inputs, outputs, reference, peer_reference=None) -> dict:
        """The base checks, and rows that see no key must be zero (dead_rows,
        masked_rows_zero)."""
        from spak.device.attention import dead_row_check
        row = super().gpu_check(problem, inputs, outputs, reference, peer_reference)
        extra = dead_row_check(problem, inputs, outputs["out"])
        row.update(extra)
        row["passed"] = row["passed"] and extra.get("masked_rows_zero", True)
        return row

    def sim_slice(self, kernel, problem, inputs, outputs, config, *, heads=1, work=1 << 29):
        from spak.device.attention import attention_sim_slice
        tiles, _ = self._kernel_config(kernel, config)
        return attention_sim_slice(problem, inputs, outputs["out"], tiles, heads=heads,
                                   work=work)

    # cost
    def flops(self, problem) -> float:
        return problem.flops

    def bytes_moved(self, problem) -> float:
        p = problem
        elems = p.B * p.Hq * p.Sq * p.D * 2 + p.B * p.Hkv * p.Sk * p.D * 2
        return 2.0 * elems + (4.0 * p.B * p.Sq * p.Sk if p.mask else 0.0)

    # tuning
    def default_config(self, problem, arch: str = "sm_90") -> dict:
        from spak.gpu.plan import default_tiles
        return default_tiles(problem.D, arch, problem.causal)

    def store_key(self, problem) -> dict:
        from spak.core.buckets import seq_bucket
        return {"dtype": problem.dtype, "head_dim": problem.D, "causal": problem.causal,
                "seq_bucket": seq_bucket(problem.Sk)}

    # the GPU sweep
    sweep_plan = "plans/fmha.toml"
    #: where the plan has no [sweep.<arch>]: small enough for one 10-minute run
    sweep_fallback = {
        "sm_90": {"TILE_M": [64, 128], "TILE_N": [64, 128], "occupancy": [1, 2], "num_ctas": [1]},
        "sm_100": {"TILE_M": [64, 128], "TILE_N": [64, 128], "occupancy": [1, 2],
                   "num_ctas": [1]},
        "sm_120": {"TILE_M": [64, 128], "TILE_N": [32, 64], "occupancy": [1, 2], "num_ctas": [1]},
        "sm_89": {"TILE_M": [64, 128], "TILE_N": [32, 64], "occupancy": [1, 2], "num_ctas": [1]},
    }
    sweep_peers = ("sdpa-cudnn", "sdpa-flash")

    def knob_keys(self) -> tuple[str, ...]:
        try:
            from spak.gpu.plan import LATENCY_KEYS
        except ImportError:
            return ()
        return tuple(LATENCY_KEYS)

    def sweep_skip(self, problem):
        return "masked (the sweep times unmasked attention)" if problem.mask is not None \
            else None

    def row_fields(self, problem) -> dict:
        return {"B": problem.B, "Hq": problem.Hq, "Hkv": problem.Hkv, "Sq": problem.Sq,
                "Sk": problem.Sk, "D": problem.D}

    def compile_unit(self, kernel, problem, config, config_id):
        from spak.tune.jobs import attention_compile_unit
        return attention_compile_unit(kernel, problem, config, config_id)

    def stand_in_launches(self, unit, arch):
        """gpu_call's launches for the unit's problem (its first case) on stand-ins; None for
        a masked problem (the unit carries no mask: the sweep times unmasked attention)."""
        import math
        from spak.gpu.plan import plan_fmha
        from spak.gpu.variants import apply_hints
        p = self.parse(unit["case"])
        if p.mask is not None:
            return None
        (q, k, v, out), alloc = attention_stand_ins(p)
        tiles, hints = self._kernel_config(unit["kernel"], unit["config"])
        launches = plan_fmha(unit["kernel"], q, k, v, out, causal=p.causal,
                             scale=1.0 / math.sqrt(p.D), tiles=tiles, alloc=alloc)
        return apply_hints(launches, hints)

    # plans and reports
    example_shape = "1x8x128x64"
    metric_definition = "TFLOPS = 4·B·Hq·Sq·Sk·D / time (halved for causal with Sq = Sk)"
    compared_peers = ("sdpa-cudnn", "sdpa-flash")
    peers_name = "PyTorch SDPA"

    def peer_label(self, peer: str) -> str:
        return PEER_LABELS.get(peer, peer)

    def report_place(self, problem) -> ReportPlace:
        return attention_report_place(problem, "Forward")


#: provider -> its name in report tables and legends
PEER_LABELS = {"sdpa-cudnn": "SDPA cuDNN", "sdpa-flash": "SDPA flash",
               "sdpa-efficient": "SDPA efficient"}


def attention_report_place(problem, pass_name: str) -> ReportPlace:
    """Reports of attention problems: one table and plot panel per (head dim, causal),
    shapes along the sequence length (the FlashAttention papers' figure layout)."""
    d, causal = problem.D, problem.causal
    return ReportPlace(
        group=(("D", d), ("causal", causal)),
        heading=f"D={d}, {'causal' if causal else 'non-causal'}",
        title=f"{pass_name}, {'with' if causal else 'without'} causal mask, head dim {d}",
        tag=f"d{d}-{'causal' if causal else 'noncausal'}",
        columns=(("D", str(d), "---:"), ("causal", "yes" if causal else "no", ":---:")),
        size=problem.Sk, sized=problem.Sq == problem.Sk, axis="Sequence length",
        order=(d, causal, problem.Sk, problem.Sq, problem.B, problem.case_id))

FAMILY = FmhaForward()


def attention_stand_ins(problem):
    """((q, k, v, out), alloc) of an attention problem as spak.gpu.launch_sig.LaunchArray
    stand-ins: fresh contiguous tensors, as spak.device.attention.attention_gpu_inputs and
    gpu_call allocate them; alloc(shape, kind) the workspaces' (float32 or the input's
    dtype), as spak.device.calls.shared_alloc hands them out."""
    from spak.gpu.launch_sig import LaunchArray
    dt = {"fp16": "float16", "bf16": "bfloat16"}[problem.dtype]
    q, k, v = (LaunchArray(s, dt) for s in (problem.q_shape, problem.kv_shape, problem.kv_shape))
    out = LaunchArray(tuple(problem.q_shape[:3]) + (problem.kv_shape[3],), dt)

    def alloc(shape, kind):
        return LaunchArray(tuple(int(n) for n in shape), "float32" if kind == "float32" else dt)
    return (q, k, v, out), alloc
