"""PyTorch's scaled_dot_product_attention as a peer of SPAK's attention kernels, with SPAK's
conventions: causal is bottom-right aligned (query i sees keys j <= i + Sk - Sq, as in
FlashAttention 2), and a query row that sees no key is zero.

SDPA's own causal flag is top-left aligned, so when Sq != Sk (or with a mask) the causal
part goes in as a boolean mask. SDPA's output on a row that sees no key is not zero (NaN,
or in recent versions a mean of V): comparisons zero those rows on SDPA's side.

For any attention family whose inputs carry "q", "k", "v" and "mask" (the caller's mask:
bool, True = attend, or additive float; None when there is none) and whose problems
have B, Hq, Hkv, Sq, Sk, D and causal. torch is imported inside the functions.
"""
from __future__ import annotations

import functools
import math

from spak.device.calls import PeerCall

__all__ = ["BACKENDS", "bottom_right", "sdpa_args", "dead_rows", "zero_dead", "sdpa_peers",
           "sdpa_reference"]

#: peer name -> torch.nn.attention.SDPBackend member
BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
            "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-math": "MATH"}


def bottom_right(Sq: int, Sk: int, device):
    """bool [Sq, Sk]: True where query i may see key j under bottom-right causal."""
    import torch
    i = torch.arange(Sq, device=device)[:, None]
    j = torch.arange(Sk, device=device)[None, :]
    return j <= i + (Sk - Sq)


def sdpa_args(problem, mask, device, dtype=None):
    """(attn_mask, is_causal) giving SPAK's semantics in SDPA.

    An additive mask is handed to SDPA in the query's dtype (``dtype``): SDPA documents
    attn_mask as bool or the query's dtype, and on CUDA (torch 2.11) a float32 mask with
    fp16/bf16 queries gave wrong outputs (seen on an H200, 2026-11-22)."""
    import torch
    if mask is not None and mask.dtype != torch.bool and dtype is not None:
        mask = mask.to(dtype)
    if not problem.causal:
        return mask, False
    if problem.Sq == problem.Sk and mask is None:
        return None, True
    br = bottom_right(problem.Sq, problem.Sk, device)
    if mask is None:
        return br, False
    if mask.dtype == torch.bool:
        return mask & br, False
    return mask.masked_fill(~br, float("-inf")), False


def dead_rows(sdpa_mask):
    """[.., Sq, 1] True where SDPA's mask lets a query row see no key, or None."""
    import torch
    if sdpa_mask is None:
        return None
    if sdpa_mask.dtype == torch.bool:
        return ~sdpa_mask.any(dim=-1, keepdim=True)
    return torch.isneginf(sdpa_mask).all(dim=-1, keepdim=True)


def zero_dead(o, dead):
    """SDPA's output in SPAK's convention: NaN -> 0 and rows that see no key zero."""
    import torch
    o = torch.nan_to_num(o, nan=0.0)
    return o if dead is None else o.masked_fill(dead, 0.0)


def _prepared(problem, inputs):
    """The SDPA call on one input set, its mask prepared once: (run, dead rows)."""
    import torch
    q = inputs["q"]
    attn_mask, is_causal = sdpa_args(problem, inputs.get("mask"), q.device, q.dtype)
    scale = 1.0 / math.sqrt(problem.D)
    gqa = problem.Hq != problem.Hkv
    F = torch.nn.functional.scaled_dot_product_attention

    def run(x):
        return F(x["q"], x["k"], x["v"], attn_mask=attn_mask, is_causal=is_causal,
                 scale=scale, enable_gqa=gqa)
    return run, dead_rows(attn_mask)


def sdpa_peers(problem, inputs, names) -> dict:
    """{name: PeerCall} for SDPA backends (names from BACKENDS), on input sets shaped like
    ``inputs`` (the mask is taken from these: every timing set shares it)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown SDPA peer(s) {unknown}; known: {', '.join(BACKENDS)}")
    run, dead = _prepared(problem, inputs)

    def conform(outs):
        return {"out": zero_dead(outs["out"], dead)}
    return {n: PeerCall(run=run, conform=conform,
                        context=functools.partial(sdpa_kernel,
                                                  [getattr(SDPBackend, BACKENDS[n])]))
            for n in names}


def sdpa_reference(problem, inputs):
    """SDPA's output with torch's own backend choice, in SPAK's convention (input dtype):
    a fast check of our output where the float64 reference is slow."""
    run, dead = _prepared(problem, inputs)
    return zero_dead(run(inputs), dead)
