"""SDPA on CUDA with an additive float32 mask and fp16/bf16 queries, per backend, vs float64.
Run on the GPU machine: python3 ci/sdpa_mask_probe.py (output: results/sdpa-mask-probe-*.txt).
Why spak run hands SDPA its additive mask in the query dtype (spak.device.sdpa.sdpa_args)."""
import math, torch
F = torch.nn.functional.scaled_dot_product_attention
from torch.nn.attention import SDPBackend, sdpa_kernel
torch.manual_seed(0)
B,H,Sq,Sk,D = 2,4,77,130,64
q,k,v = (torch.randn(B,H,s,D, device="cuda") for s in (Sq,Sk,Sk))
keep = torch.rand(B,1,Sq,Sk, device="cuda") >= 0.2; keep[0,0,5] = False
m = torch.randn(B,1,Sq,Sk, device="cuda").masked_fill(~keep, -math.inf)
ref = F(q.double(), k.double(), v.double(), attn_mask=m.double()).nan_to_num().float()
ref[0,:,5] = 0
for dt in (torch.float16, torch.bfloat16):
    for mdt in (torch.float32, dt):
        for name, be in (("default", None), ("math", SDPBackend.MATH), ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                if be is None:
                    o = F(q.to(dt), k.to(dt), v.to(dt), attn_mask=m.to(mdt))
                else:
                    with sdpa_kernel([be]):
                        o = F(q.to(dt), k.to(dt), v.to(dt), attn_mask=m.to(mdt))
                o = o.float(); nan = int(o.isnan().sum()); o = o.nan_to_num(); o[0,:,5] = 0
                print(dt, "mask", mdt, name, "nan", nan, "rel", ((o-ref).norm()/ref.norm()).item())
            except RuntimeError as e:
                print(dt, "mask", mdt, name, "refused:", str(e).splitlines()[0][:100])
