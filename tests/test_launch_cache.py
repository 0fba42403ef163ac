"""gpu.launch.fmha_into plans the fused kernel once per shape/config and reuses the plan
with each call's own tensors (no GPU: ct.launch is replaced by a recorder)."""
import torch

import spak.gpu.launch as gl


def test_fused_plan_is_reused_with_new_tensors(monkeypatch):
    import cuda.tile as ct
    calls, plans = [], []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: calls.append((grid, kernel, args)))
    real_plan = gl.plan_torch
    monkeypatch.setattr(gl, "plan_torch", lambda *a, **k: plans.append(1) or real_plan(*a, **k))
    gl._FUSED_PLANS.clear()
    mk = lambda: [torch.randn(2, 4, 100, 64, dtype=torch.float16) for _ in range(4)]
    a, b = mk(), mk()
    for t in (a, b):
        gl.fmha_into("fused", *t, causal=True, scale=0.125, tiles={"TILE_M": 64, "TILE_N": 64},
                     hints={"occupancy": 2}, stream=object())
    assert len(plans) == 1 and len(calls) == 2
    (g1, k1, a1), (g2, k2, a2) = calls
    assert g1 == g2 and k1 is k2 and a1[5:] == a2[5:]
    assert all(x is y for x, y in zip(a2[:4], b)) and a2[4] is a1[4]   # new q,k,v,out; same dummy mask
    gl.fmha_into("fused", *a, causal=False, scale=0.125, stream=object())   # other flags: new plan
    assert len(plans) == 2


def test_backward_hints_reach_dkdv_and_dq_only(monkeypatch):
    """gpu.launch.fmha_bwd_into(hints=) (issue 35: the tuned store's fmha_bwd entry): the
    dK/dV and dQ launches run the hinted kernel variants, the preprocess its own; hints
    are part of the plan cache's key; DKV_SPLIT reaches the dK/dV grid."""
    import cuda.tile as ct
    from spak.gpu.kernels import fmha_bwd as K
    from spak.gpu.variants import with_hints
    calls = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: calls.append(
        (grid, kernel)))
    gl._BWD_PLANS.clear()
    B, H, S, D = 1, 2, 100, 64
    q, k, v, out, dout = (torch.randn(B, H, S, D, dtype=torch.float16) for _ in range(5))
    lse = torch.randn(B, H, S)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    gl.fmha_bwd_into("fused", q, k, v, out, dout, lse, *grads, causal=True, stream=object(),
                     hints={"occupancy": 1}, tiles={"DKV_SPLIT": 2})
    (g0, k0), (g1, k1), (g2, k2) = calls
    assert k0 is K.fmha_bwd_preprocess_kernel
    assert k1 is with_hints(K.fmha_bwd_dkdv_kernel, occupancy=1) and g1[2] == 2
    assert k2 is with_hints(K.fmha_bwd_dq_kernel, occupancy=1)
    gl.fmha_bwd_into("fused", q, k, v, out, dout, lse, *grads, causal=True, stream=object())
    assert calls[4][1] is K.fmha_bwd_dkdv_kernel and calls[4][0][2] == 1   # no hints: own
    assert len(gl._BWD_PLANS) == 2
    gl._BWD_PLANS.clear()
