"""Peers of the FMHA backward on the GPU (`spak run`, the sweep's worker): PyTorch SDPA's
backward through autograd, and forward+backward rows (SDPA's and SPAK's), in SPAK's
conventions (spak.device.sdpa: bottom-right causal; a row that sees no key has zero output
and passes no gradient). torch is imported inside the functions.

Backward peers ("sdpa-cudnn", "sdpa-flash", any of spak.device.sdpa.BACKENDS) time the
backward alone: SDPA's forward runs once per input set under the backend (its graph kept),
then each timed call is ``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)``.
Forward+backward peers ("fwd+bwd:sdpa-cudnn", ..., "fwd+bwd:spak-fused") time a training
step's attention: forward, then the gradients (SPAK: the fused forward with LSE and the
backward's launches, planned once per set; the FLOPs of such a row are 3.5x the
forward's, PeerCall.flops). `--timing eager` times SPAK through its public entry instead:
spak.fmha and autograd (spak_eager_backward for the backward's row, PeerCall.eager for
fwd+bwd:spak-fused), as a training program calls it.

Rows that see no key (a mask row all masked, causal with Sq > Sk): SDPA's softmax of such a
row is NaN, and so would be every gradient it touches. Our convention gives them no
gradient, which is what SDPA computes when the row is unmasked and its dout is zero (then
dP = 0 and delta = 0: dS = 0 on the row, and P^T dO adds nothing to dV). The peers get the
problem that way: same work, SPAK's gradients.
"""
from __future__ import annotations

import functools
import math

from spak.device.calls import PeerCall

__all__ = ["FWD_BWD", "SPAK_FWD_BWD", "bwd_peers", "bwd_peer_reference", "peer_names",
           "spak_eager_backward"]

#: the prefix of a forward+backward provider
FWD_BWD = "fwd+bwd:"
#: SPAK's own forward+backward provider
SPAK_FWD_BWD = FWD_BWD + "spak-fused"
#: forward+backward FLOPs / forward FLOPs (forward 1, backward 2.5)
FWD_BWD_FACTOR = 3.5
_GRADS = ("dq", "dk", "dv")


def peer_names() -> tuple[str, ...]:
    """Every peer name the family knows: SDPA's backends, each also as forward+backward,
    and SPAK's forward+backward."""
    from spak.device.sdpa import BACKENDS
    return (*BACKENDS, *(FWD_BWD + b for b in BACKENDS), SPAK_FWD_BWD)


def _sdpa_problem(problem, inputs):
    """(sdpa(q, k, v), live_dout(x)): SDPA with SPAK's semantics prepared once for the
    input sets of ``inputs``' shape, rows that see no key unmasked and their dout zeroed
    (see the module doc)."""
    import torch
    from spak.device.sdpa import dead_rows, sdpa_args
    q = inputs["q"]
    attn_mask, is_causal = sdpa_args(problem, inputs.get("mask"), q.device, q.dtype)
    dead = dead_rows(attn_mask)
    if dead is not None:
        attn_mask = attn_mask | dead if attn_mask.dtype == torch.bool else \
            attn_mask.masked_fill(dead, 0.0)
    scale = 1.0 / math.sqrt(problem.D)
    gqa = problem.Hq != problem.Hkv
    F = torch.nn.functional.scaled_dot_product_attention

    def sdpa(q, k, v):
        return F(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                 enable_gqa=gqa)

    def live_dout(x):
        return x["dout"] if dead is None else x["dout"].masked_fill(dead, 0.0)
    return sdpa, live_dout


def _leaves(x):
    return tuple(x[n].detach().requires_grad_() for n in ("q", "k", "v"))


def _grads(raw) -> dict:
    return dict(zip(_GRADS, raw))


def _sdpa_backward(sdpa, live_dout):
    """run(x): SDPA's backward alone; the forward (its graph kept) once per input set, on
    the set's first call (inside the backend's context)."""
    import torch
    graphs: dict = {}

    def run(x):
        key = id(x["q"])
        if key not in graphs:
            leaves = _leaves(x)
            with torch.enable_grad():
                graphs[key] = (sdpa(*leaves), leaves, live_dout(x))
        out, leaves, dout = graphs[key]
        return torch.autograd.grad(out, leaves, dout, retain_graph=True)
    return run


def _sdpa_fwd_bwd(sdpa, live_dout):
    """run(x): SDPA's forward and backward, as in a training step."""
    import torch
    douts: dict = {}

    def run(x):
        key = id(x["q"])
        if key not in douts:
            douts[key] = live_dout(x)
        leaves = _leaves(x)
        with torch.enable_grad():
            out = sdpa(*leaves)
        return torch.autograd.grad(out, leaves, douts[key])
    return run


def _spak_fwd_bwd(fam, problem, device):
    """run(x): SPAK's fused forward with LSE, then the backward (the family's config for
    the device), into buffers of the set planned on its first call."""
    import torch
    import spak.gpu.launch as gl
    from spak.device.bwd_gpu import bwd_call, forward_config, forward_launches
    fwd_cfg = forward_config(problem, device)
    bwd_cfg = fam.gpu_config("fused", problem, device)
    plans: dict = {}

    def plan(x):
        q, v = x["q"], x["v"]
        out = torch.full(tuple(q.shape[:3]) + (v.shape[3],), float("nan"), dtype=q.dtype,
                         device=q.device)
        lse = torch.full(tuple(q.shape[:3]), float("nan"), dtype=torch.float32,
                         device=q.device)
        fwd = forward_launches(problem, q, x["k"], v, x.get("kmask"), out, lse, fwd_cfg)
        call = bwd_call(problem, {**x, "out": out, "lse": lse}, bwd_cfg)
        return fwd + call.launches, tuple(call.outputs[n] for n in _GRADS)

    def run(x):
        key = id(x["q"])
        if key not in plans:
            plans[key] = plan(x)
        launches, grads = plans[key]
        gl.run(launches)
        return grads
    return run


def _spak_fmha(problem, kernel: str = "fused"):
    """f(q, k, v, x): spak.fmha, the public entry, on leaves q, k, v with set x's mask
    (SPAK's own conventions: no peer adjustment)."""
    from spak.api import fmha
    gqa = problem.Hq != problem.Hkv

    def f(q, k, v, x):
        return fmha(q, k, v, is_causal=problem.causal, attn_mask=x.get("mask"),
                    enable_gqa=gqa, kernel=kernel)
    return f


def spak_eager_backward(problem, x, kernel: str = "fused"):
    """call(): the backward as a training program runs it, timed like SDPA's backward
    peers: spak.fmha's forward on set x once (on the first call, its graph kept), then
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), i.e. the autograd node
    calling torch.ops.spak.fmha_bwd with the config spak.fmha looks up."""
    import torch
    f, leaves, graph = _spak_fmha(problem, kernel), _leaves(x), []

    def call():
        if not graph:
            with torch.enable_grad():
                graph.append(f(*leaves, x))
        return torch.autograd.grad(graph[0], leaves, x["dout"], retain_graph=True)
    return call


def _spak_eager_fwd_bwd(problem):
    """run(x): a training step's attention through the public entry: spak.fmha, then
    torch.autograd.grad (`--timing eager` of fwd+bwd:spak-fused)."""
    import torch
    f = _spak_fmha(problem)

    def run(x):
        leaves = _leaves(x)
        with torch.enable_grad():
            out = f(*leaves, x)
        return torch.autograd.grad(out, leaves, x["dout"])
    return run


def bwd_peers(fam, problem, inputs, names) -> dict:
    """{name: PeerCall} for the names (peer_names()), on input sets shaped like
    ``inputs``; ValueError for a name the family does not know."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from spak.device.sdpa import BACKENDS
    unknown = [n for n in names if n not in peer_names()]
    if unknown:
        raise ValueError(f"unknown fmha_bwd peer(s) {unknown}; known: "
                         f"{', '.join(peer_names())}")
    sdpa, live_dout = _sdpa_problem(problem, inputs)
    fwd_bwd_flops = FWD_BWD_FACTOR * problem.flops
    out = {}
    for name in names:
        if name == SPAK_FWD_BWD:
            out[name] = PeerCall(run=_spak_fwd_bwd(fam, problem, inputs["q"].device),
                                 outputs=_grads, flops=fwd_bwd_flops,
                                 eager=_spak_eager_fwd_bwd(problem))
            continue
        both = name.startswith(FWD_BWD)
        backend = getattr(SDPBackend, BACKENDS[name[len(FWD_BWD):] if both else name])
        run = (_sdpa_fwd_bwd if both else _sdpa_backward)(sdpa, live_dout)
        out[name] = PeerCall(run=run, outputs=_grads,
                             context=functools.partial(sdpa_kernel, [backend]),
                             flops=fwd_bwd_flops if both else None)
    return out


def bwd_peer_reference(problem, inputs) -> dict:
    """dq, dk, dv of SDPA with torch's own backend choice, in SPAK's conventions (input
    dtype): the fast check of our gradients (rel_l2_vs_sdpa, the sweep's check)."""
    sdpa, live_dout = _sdpa_problem(problem, inputs)
    return _grads(_sdpa_fwd_bwd(sdpa, live_dout)(inputs))
