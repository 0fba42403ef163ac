"""Issue 36 probe: does a CPU-only export (gpu.compile, no CUDA) of a variant put the SAME
cuTile disk-cache entry as the JIT launch of that variant? If yes, compile helpers need no
CUDA context. Prints per case: JIT keys, export keys, hit/miss, the JIT's mangled symbols."""
import json, math, os, sqlite3, sys, tempfile
import torch
from cuda.tile._cext import default_tile_context as ctx
import gpu.compile as gc
from gpu.plan import plan_fmha
from gpu.launch import plan_torch, run

def entries(d):
    p = os.path.join(d, "cache.db")
    if not os.path.exists(p):
        return {}
    c = sqlite3.connect(p)
    return {k: json.loads(m or "{}").get("kernel_names") for k, m in c.execute("select key, metadata from cache")}

out = {}
for (B, H, S, D, causal, dt) in [(1, 2, 1024, 64, True, "float16"), (2, 4, 1000, 128, False, "bfloat16"),
                                 (1, 2, 4096, 128, True, "float16")]:
    name = f"{B}x{H}x{S}x{D}/{dt}/{'causal' if causal else 'noncausal'}"
    dj, de = tempfile.mkdtemp(), tempfile.mkdtemp()
    tdt = getattr(torch, dt)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=tdt) for _ in range(3))
    o = torch.empty_like(q)
    ctx.config.cache_dir = dj
    run(plan_torch("fused", q, k, v, o, causal=causal, scale=1 / math.sqrt(D)))
    torch.cuda.synchronize()
    ej = entries(dj)
    ctx.config.cache_dir = de
    specs = [gc._ArraySpec((B, H, S, D), dt) for _ in range(4)]
    alloc = lambda shape, kind: gc._ArraySpec(tuple(shape), "float32" if kind == "float32" else dt, "head")
    res = {}
    for la in plan_fmha("fused", *specs, causal=causal, scale=1 / math.sqrt(D), alloc=alloc):
        try:
            gc.export_cubin(la, "sm_90")
        except Exception as e:
            res["export_error"] = repr(e)[:300]
    ee = entries(de)
    # then JIT with the export's cache: did it add entries (miss) or not (hit)?
    o2 = torch.empty_like(q)
    run(plan_torch("fused", q, k, v, o2, causal=causal, scale=1 / math.sqrt(D)))
    torch.cuda.synchronize()
    ee2 = entries(de)
    out[name] = dict(jit=ej, export=ee, hit=set(ee2) == set(ee), same_keys=set(ej) == set(ee),
                     added_by_jit=[ee2[k] for k in set(ee2) - set(ee)], **res)
    print(name, "same_keys", set(ej) == set(ee), "hit", set(ee2) == set(ee), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "keyprobe.json"), "w"), indent=1)
