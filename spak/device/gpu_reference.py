"""The float64 attention reference for GPU tensors (`spak run`'s accuracy gate).

Small problems go through spak.attention.reference.attention_f64 on the CPU (the very
reference `spak sim` uses); big ones through torch float64 on the inputs' device, one
(batch, head) and a block of query rows at a time, so the S x S scores never exist
whole. Both follow SPAK's conventions: bottom-right causal, a row that sees no key is
zero. torch is imported inside the functions.
"""
from __future__ import annotations

__all__ = ["CPU_REF_MAX_FLOPS", "attention_reference"]

#: float64 reference on the CPU at or below this many FLOPs, on the GPU above
CPU_REF_MAX_FLOPS = 4e9
#: elements of one block of scores (rows x Sk) in the GPU reference
_BLOCK_ELEMS = 1 << 26


def attention_reference(problem, q, k, v, mask, scale: float):
    """float64 softmax(q k^T * scale + mask) v as a tensor on q's device.

    problem: has flops, causal and dtype ("fp16" | "bf16"); mask: None, bool (True =
    attend) or additive, broadcastable to [B, Hq, Sq, Sk]."""
    if problem.flops <= CPU_REF_MAX_FLOPS:
        return _on_cpu(problem, q, k, v, mask, scale)
    return _on_device(problem, q, k, v, mask, scale)


def _on_cpu(problem, q, k, v, mask, scale):
    import numpy as np
    import torch
    from spak.attention.reference import attention_f64
    cvt = (lambda t: t.cpu().numpy()) if problem.dtype == "fp16" else \
        (lambda t: t.float().cpu().numpy())
    m = None if mask is None else mask.cpu().numpy()
    ref = attention_f64(cvt(q), cvt(k), cvt(v), mask=m, causal=problem.causal, scale=scale)
    return torch.from_numpy(np.ascontiguousarray(ref)).to(q.device)


def _on_device(problem, q, k, v, mask, scale):
    import torch
    B, Hq, Sq, _ = q.shape
    Sk, Dv = k.shape[2], v.shape[3]
    group = Hq // k.shape[1]
    dev = q.device
    out = torch.empty((B, Hq, Sq, Dv), dtype=torch.float64, device=dev)
    rows = max(1, _BLOCK_ELEMS // max(Sk, 1))
    m = None if mask is None else torch.broadcast_to(mask, (B, Hq, Sq, Sk))
    for b in range(B):
        for h in range(Hq):
            kk = k[b, h // group].double()
            vv = v[b, h // group].double()
            for r0 in range(0, Sq, rows):
                r1 = min(Sq, r0 + rows)
                s = (q[b, h, r0:r1].double() @ kk.T) * scale
                if m is not None:
                    mm = m[b, h, r0:r1]
                    s = s.masked_fill(~mm, float("-inf")) if mm.dtype == torch.bool \
                        else s + mm.double()
                if problem.causal:
                    i = torch.arange(r0, r1, device=dev)[:, None]
                    j = torch.arange(Sk, device=dev)[None, :]
                    s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
                out[b, h, r0:r1] = _softmax_times(s, vv)
    return out


def _softmax_times(s, v):
    """softmax(s) @ v for one block of rows; a row of all -inf is zero."""
    import torch
    mx = s.amax(dim=1, keepdim=True)
    dead = torch.isneginf(mx)
    p = torch.exp(s - torch.where(dead, torch.zeros_like(mx), mx))
    den = p.sum(dim=1, keepdim=True)
    o = (p @ v) / torch.where(dead, torch.ones_like(den), den)
    return torch.where(dead, torch.zeros_like(o), o)
