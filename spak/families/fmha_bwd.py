"""The FMHA backward as a kernel family: dQ, dK, dV of O = softmax(Q K^T * scale + M) V.

Problems, grammar and named sets are the forward's (spak.attention.problems: one
ProblemSpec per attention problem); the inputs add the output gradient dO. On the CPU the
family runs the forward with LSE in the simulator first, then the backward's three
launches (spak.cpu.simrun_bwd.simulate_fmha_bwd); the float64 reference is the analytic
backward (spak.attention.reference.attention_grads_f64); the launches come from
spak.gpu.plan_bwd.plan_fmha_bwd.
"""
from __future__ import annotations

import math
import zlib
from typing import NamedTuple

import numpy as np

from spak.attention import problems as P
from spak.core.metrics import rel_l2, round_to_bf16
from spak.families.base import KernelFamily, worst_output
from spak.families.fmha_fwd import FmhaForward, attention_report_place

#: Relative-L2 gates vs float64 for dQ, dK and dV, the forward's (spak.core.metrics.GATES).
#: Measured on the simulator (sm_90 model) over the 80 `gates` problems: fp16 2.6e-4 ..
#: 3.5e-4, bf16 2.1e-3 .. 3.3e-3 (docs/fmha-backward.md), about the forward's own error:
#: the gates stay >= 2.5x above every measured error.
BWD_GATES = {"fp16": 1e-3, "bf16": 8e-3}


class BwdInputs(NamedTuple):
    """The forward's inputs (as spak.attention.problems.Inputs) plus dout, the gradient of
    the loss w.r.t. the output: [B, Hq, Sq, D], the inputs' storage dtype. out and lse:
    the forward's output and float32 [B, Hq, Sq] row log-sum-exp when given (a GPU's, to
    simulate the backward kernels alone); None: the simulator runs the forward first."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray | None
    dout: np.ndarray
    out: np.ndarray | None = None
    lse: np.ndarray | None = None


class FmhaBackward(KernelFamily):
    name = "fmha_bwd"
    title = "fused multi-head attention, backward: dQ, dK, dV (causal, masks, GQA, Sq != Sk)"
    #: fused_dq: the fused-dQ backward (tiles DQ_FUSED, default 1 here: dQ summed in the dK/dV
    #: pass; gpu/kernels/fmha_bwd.py section 4), opt-in until a GPU says it is faster
    kernels = ("fused", "fused_dq")
    outputs = ("dq", "dk", "dv")
    metric = "TFLOPS"
    space_keys = ("DKV_TILE_M", "DKV_TILE_N", "DQ_TILE_M", "DQ_TILE_N", "occupancy",
                  "num_ctas")
    store_fields = ("dtype", "head_dim", "causal", "seq_bucket")
    peers = ("sdpa-cudnn", "sdpa-flash")
    entry_point = "spak.fmha"          # through autograd: out.backward()
    shape_sets = P.SHAPE_SETS
    example_shape = "1x8x128x64"
    metric_definition = ("TFLOPS = 2.5 x 4·B·Hq·Sq·Sk·D / time (the forward's FLOPs x 2.5; "
                         "halved for causal with Sq = Sk)")
    compared_peers = ("sdpa-cudnn", "sdpa-flash")

    # problems: the forward's grammar and sets
    grammar_help = FmhaForward.grammar_help
    parse = FmhaForward.parse
    check_shape_text = FmhaForward.check_shape_text
    select = FmhaForward.select

    def make_inputs(self, problem, seed: int = 0) -> BwdInputs:
        """The forward's inputs for (problem, seed) and an N(0, 1) dout from its own stream
        (so q, k, v and the mask are the very ones the forward family draws)."""
        q, k, v, mask = P.make_inputs(problem, seed)
        rng = np.random.default_rng([seed, zlib.crc32(problem.case_id.encode()), 1])
        d = rng.standard_normal((problem.B, problem.Hq, problem.Sq, problem.D),
                                dtype=np.float32)
        dout = d.astype(np.float16) if problem.dtype == "fp16" else round_to_bf16(d)
        return BwdInputs(q, k, v, mask, dout)

    # reference and gates
    def reference(self, problem, inputs) -> dict:
        from spak.attention.reference import attention_grads_f64
        dq, dk, dv = attention_grads_f64(inputs.q, inputs.k, inputs.v, inputs.dout,
                                         mask=inputs.mask, causal=problem.causal)
        return {"dq": dq, "dk": dk, "dv": dv}

    def gate(self, problem, output: str = "dq") -> float:
        if output not in self.outputs:
            raise ValueError(f"output must be one of {self.outputs}, got {output!r}")
        return BWD_GATES[problem.dtype]

    def error(self, output: str, out, ref, inputs, scale: float | None = None) -> float:
        """Relative L2 error of one gradient vs float64. Where the true gradient is exactly
        zero while the inputs are not (dQ and dK when every row sees one key: softmax is
        constant), it is measured against the size the gradient has in general,
        scale * ||dO||_F * max_j ||v_j|| * max ||k_j|| (dQ) or ... * max ||q_i|| (dK): the
        kernel's rounding noise there is ~eps of that, not an infinite relative error."""
        rel = rel_l2(out, ref)
        if not math.isinf(rel) or output == "dv":
            return rel
        f = lambda x: np.asarray(x, np.float64)                       # noqa: E731
        rows = lambda x: float(np.sqrt((f(x) ** 2).sum(-1)).max(initial=0.0))  # noqa: E731
        sc = 1.0 / math.sqrt(inputs.q.shape[-1]) if scale is None else abs(scale)
        other = inputs.k if output == "dq" else inputs.q
        size = sc * float(np.linalg.norm(f(inputs.dout))) * rows(inputs.v) * rows(other)
        return float(np.linalg.norm(f(out))) / size if size > 0 else rel

    # the plan
    def plan(self, kernel, arrays, *, tiles=None, alloc=None, mask=None, causal=False,
             scale=None):
        """arrays: q, k, v, out, dout, lse (the forward's), dq, dk, dv."""
        from spak.gpu.plan_bwd import plan_fmha_bwd
        a = arrays
        return plan_fmha_bwd("fused", a["q"], a["k"], a["v"], a["out"], a["dout"], a["lse"],
                             a["dq"], a["dk"], a["dv"], mask=mask, causal=causal,
                             scale=scale, tiles=kernel_tiles(kernel, tiles), alloc=alloc)

    def simulate(self, kernel, problem, inputs, *, tiles=None, model="sm_90"):
        from spak.cpu.simrun_bwd import simulate_fmha_bwd
        g, reports = simulate_fmha_bwd("fused", inputs.q, inputs.k, inputs.v, inputs.dout,
                                       mask=inputs.mask, causal=problem.causal,
                                       tiles=kernel_tiles(kernel, bwd_tiles_dict(tiles)),
                                       model=model,
                                       dtype=problem.dtype, out=inputs.out, lse=inputs.lse)
        return {"dq": g["dq"], "dk": g["dk"], "dv": g["dv"]}, reports

    def compile_variant(self, item) -> dict:
        from spak.gpu.compile import compile_bwd_variant
        from spak.gpu.plan_bwd import default_bwd_tiles
        tiles = bwd_tiles_dict(item.get("tiles")) or default_bwd_tiles(
            item["head_dim"], item["arch"], causal=item["causal"])
        dtype = {"fp16": "float16", "bf16": "bfloat16"}[item["dtype"]]
        tiles = kernel_tiles(item.get("kernel", "fused"), dict(tiles))
        r = compile_bwd_variant(arch=item["arch"], dtype=dtype, head_dim=item["head_dim"],
                                causal=item["causal"], has_mask=item["mask"],
                                tiles=tiles, hints=item.get("hints"))
        return {**r, "tiles": dict(tiles)}

    # the GPU loop (`spak run`, the sweep's worker): spak/device/bwd_gpu.py, bwd_peers.py.
    # Input sets: q, k, v, mask, kmask, dout and the forward's out, lse (our fused forward,
    # once per set); outputs dq, dk, dv; our call times the backward's launches alone.
    #: the backward peers `spak run` lists in its table (all: peer_calls(names=None))
    run_peers = ("sdpa-cudnn", "sdpa-flash")
    #: forward + backward rows `spak run` times beside them (FLOPs: 3.5x the forward's)
    fwd_bwd_peers = ("fwd+bwd:spak-fused", "fwd+bwd:sdpa-cudnn", "fwd+bwd:sdpa-flash")

    def gpu_inputs(self, problem, seed=0, set_index=0, device="cuda") -> dict:
        from spak.device.bwd_gpu import bwd_gpu_inputs
        return bwd_gpu_inputs(problem, seed, set_index, device)

    def gpu_input_sets(self, problem, seed, n_sets, device="cuda") -> list[dict]:
        from spak.device.bwd_gpu import bwd_input_sets
        return bwd_input_sets(problem, seed, n_sets, device)

    def gpu_reference(self, problem, inputs) -> dict:
        from spak.device.bwd_gpu import bwd_reference
        return bwd_reference(self, problem, inputs)

    def gpu_config(self, kernel, problem, device, tiles=None) -> dict:
        """--tiles MxN: M query rows and N keys per step in both kernels (no hints); else
        the tuned store's entry for the device's GPU, else the default tiles."""
        if tiles is not None:
            return kernel_tiles(kernel, bwd_tiles_dict(tiles))
        from spak.device.bwd_gpu import bwd_config
        if kernel == "fused_dq":     # the store's entries are the first kernel's
            return kernel_tiles(kernel, bwd_config(self, "fused", problem, device))
        return bwd_config(self, kernel, problem, device)

    def workspace_bytes(self, kernel, problem) -> int:
        rows = problem.B * problem.Hq * problem.Sq
        if kernel == "fused_dq":     # + the float32 dQ accumulator and a counter per row
            return rows * (12 + 4 * problem.D) + 4
        return 8 * rows                                      # delta and lse2, float32

    def gpu_call(self, kernel, problem, inputs, config, *, alloc=None):
        if kernel not in self.kernels:
            raise ValueError(f"kernel must be one of {self.kernels}, got {kernel!r}")
        from spak.device.bwd_gpu import bwd_call
        return bwd_call(problem, inputs, kernel_tiles(kernel, config), alloc=alloc)

    def compile_call(self, unit, device="cuda"):
        from spak.device.bwd_gpu import bwd_compile_call
        return bwd_compile_call(self, unit, device)

    def stand_in_launches(self, unit, arch):
        """bwd_compile_call's launches on stand-ins of the unit's problem: the fused forward
        with LSE at the arch's default tiles (the worker's inputs take the store's forward
        config, which a helper with no GPU cannot look up: a miss there costs the worker
        one compile per shape) and the backward's three launches at the unit's config."""
        import math
        from spak.device.calls import distinct
        from spak.families.fmha_fwd import attention_stand_ins
        from spak.gpu.plan import default_tiles, plan_fmha
        from spak.gpu.plan_bwd import plan_fmha_bwd
        from spak.device.bwd_gpu import hinted
        from spak.gpu.variants import split_config
        p = self.parse(unit["case"])
        (q, k, v, out), alloc = attention_stand_ins(p)
        kmask = alloc((p.B, 1, p.Sq, p.Sk), "float32") if p.mask is not None else None
        lse = alloc(q.shape[:3], "float32")
        scale = 1.0 / math.sqrt(p.D)
        fwd = plan_fmha("fused", q, k, v, out, mask=kmask, causal=p.causal, scale=scale,
                        tiles=default_tiles(p.D, arch, p.causal), alloc=alloc, lse=lse)
        tiles, hints = split_config(unit["config"])
        bwd = plan_fmha_bwd("fused", q, k, v, out, out, lse, q, k, v, mask=kmask,
                            causal=p.causal, scale=scale, tiles=tiles, alloc=distinct(alloc))
        return fwd + hinted(bwd, hints)

    def eager_call(self, kernel, problem, inputs):
        """`--timing eager`: the backward through spak.fmha's autograd (forward once per
        set, graph kept; each call torch.autograd.grad), what loss.backward() pays for the
        attention; fwd+bwd:spak-fused's eager mode times spak.fmha + autograd together."""
        from spak.device.bwd_peers import spak_eager_backward
        return spak_eager_backward(problem, inputs, kernel)

    def peer_calls(self, problem, inputs, names=None) -> dict:
        from spak.device.bwd_peers import bwd_peers
        names = (*self.run_peers, *self.fwd_bwd_peers) if names is None else names
        return bwd_peers(self, problem, inputs, names)

    def peer_reference(self, problem, inputs) -> dict:
        from spak.device.bwd_peers import bwd_peer_reference
        return bwd_peer_reference(problem, inputs)

    def gpu_check(self, problem, inputs, outputs, reference, peer_reference=None) -> dict:
        """The base checks (the worst of dq, dk, dv at the top level, each one's under
        "outputs"), `error`'s measure where a true gradient is exactly zero, and dQ rows
        that see no key must be zero (dead_rows, masked_rows_zero)."""
        from spak.device.attention import dead_row_check
        from spak.device.bwd_gpu import zero_gradient_errors
        row = super().gpu_check(problem, inputs, outputs, reference, peer_reference)
        per = row["outputs"]
        if zero_gradient_errors(self, problem, inputs, outputs, reference, per):
            row = {**per[worst_output(per)], "passed": all(p["passed"] for p in per.values()),
                   "outputs": per}
        extra = dead_row_check(problem, inputs, outputs["dq"])
        row.update(extra)
        row["passed"] = row["passed"] and extra.get("masked_rows_zero", True)
        return row

    def sim_slice(self, kernel, problem, inputs, outputs, config, *, heads=1, work=1 << 29):
        """spak.device.bwd_gpu.bwd_sim_slices: the backward alone from the GPU's out and
        lse, on the whole head group or on two exact cuts (dK/dV: last keys, all rows; dQ:
        last rows, all keys)."""
        from spak.device.bwd_gpu import bwd_sim_slices
        from spak.gpu.variants import split_config
        tiles, _ = split_config(config)
        return bwd_sim_slices(problem, inputs, outputs, tiles, BwdInputs, heads=heads,
                              work=work)

    # cost
    def flops(self, problem) -> float:
        """2.5x the forward's FLOPs (five matmuls to the forward's two: FlashAttention's
        convention, which peers' backward TFLOPS use)."""
        return 2.5 * problem.flops

    def bytes_moved(self, problem) -> float:
        p = problem
        q_like = p.B * p.Hq * p.Sq * p.D          # q, out, dout, dq
        kv_like = p.B * p.Hkv * p.Sk * p.D        # k, v, dk, dv
        return 2.0 * (4 * q_like + 4 * kv_like) + 4.0 * p.B * p.Hq * p.Sq \
            + (4.0 * p.B * p.Sq * p.Sk if p.mask else 0.0)

    # tuning
    def default_config(self, problem, arch: str = "sm_90") -> dict:
        from spak.gpu.plan_bwd import default_bwd_tiles
        return default_bwd_tiles(problem.D, arch, problem.causal)

    store_key = FmhaForward.store_key                 # the same fields as the forward's

    # the GPU sweep (plans/fmha_bwd.toml's [sweep.<arch>]; the worker: spak.tune.worker)
    sweep_plan = "plans/fmha_bwd.toml"
    #: where the plan has no [sweep.<arch>]: small enough for one 10-minute run
    sweep_fallback = {
        "sm_90": {"DKV_TILE_M": [32, 64], "DKV_TILE_N": [64, 128], "DQ_TILE_M": [64],
                  "DQ_TILE_N": [64, 128], "occupancy": [1, 2], "num_ctas": [1]},
        "sm_120": {"DKV_TILE_M": [32, 64], "DKV_TILE_N": [32, 64], "DQ_TILE_M": [32, 64],
                   "DQ_TILE_N": [32, 64], "occupancy": [1, 2], "num_ctas": [1]},
        "sm_89": {"DKV_TILE_M": [32, 64], "DKV_TILE_N": [32, 64], "DQ_TILE_M": [32, 64],
                  "DQ_TILE_N": [32, 64], "occupancy": [1, 2], "num_ctas": [1]},
    }
    sweep_peers = ("sdpa-cudnn", "sdpa-flash")

    def knob_keys(self) -> tuple[str, ...]:
        """DQ_FUSED (gpu.plan_bwd.DQ_FUSED_VALUES): 0 the three-launch backward, 1/2/4 the
        fused-dQ pass with dQ's columns in that many parts; DQ_EARLY 0/1 (with DQ_FUSED:
        dQ's product before the wait). A sweep space's ``knobs``."""
        return ("DQ_FUSED", "DQ_EARLY")

    # the forward's: masked problems are not swept; rows carry B, Hq, Hkv, Sq, Sk, D
    sweep_skip = FmhaForward.sweep_skip
    row_fields = FmhaForward.row_fields

    def compile_unit(self, kernel, problem, config, config_id):
        from spak.device.bwd_gpu import bwd_compile_unit
        return bwd_compile_unit(kernel, problem, config, config_id)

    # plans and reports
    peers_name = "PyTorch SDPA (autograd)"

    peer_label = FmhaForward.peer_label

    def report_place(self, problem):
        return attention_report_place(problem, "Backward")


def kernel_tiles(kernel: str, tiles):
    """The planner's tiles for one of the family's kernels: "fused" as given; "fused_dq"
    with DQ_FUSED set (1 unless the tiles name a number of parts)."""
    if kernel not in FmhaBackward.kernels:
        raise ValueError(f"kernel must be one of {FmhaBackward.kernels}, got {kernel!r}")
    if kernel == "fused":
        return tiles
    t = dict(tiles or {})
    t["DQ_FUSED"] = t.get("DQ_FUSED") or 1
    return t


def bwd_tiles_dict(tiles) -> dict | None:
    """None, a backward tiles dict (gpu.plan_bwd.BWD_TILE_KEYS), or an (M, N) pair (what
    `spak sim --tiles MxN` passes): M query rows and N keys per step in both kernels."""
    if tiles is None or isinstance(tiles, dict):
        return tiles
    if isinstance(tiles, (str, bytes)) or not hasattr(tiles, "__len__") or len(tiles) != 2:
        raise TypeError(f"tiles must be None, an (M, N) pair or a dict of "
                        f"DKV_TILE_M/DKV_TILE_N/DQ_TILE_M/DQ_TILE_N, got {tiles!r}")
    m, n = tiles
    return {"DKV_TILE_M": m, "DKV_TILE_N": n, "DQ_TILE_M": m, "DQ_TILE_N": n}


FAMILY = FmhaBackward()
