"""issue 35 round 6: does reusing one fused-dQ call object (its workspaces) hang where fresh
objects do not? Per shape: fresh call; the same object again; 3 back-to-back; each polled
10 s; on a hang the workspaces (ticket, counters) are read on a side stream and we exit.
Then, if nothing hung: timing of cur vs fused1 with a fresh object per call (events)."""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from spak import families
import spak.gpu.launch as gl
fam = families.get("fmha_bwd")
T0 = time.time()

def poll(tag, seen, p, limit=10):
    ev = torch.cuda.Event(); ev.record(); t = time.time()
    while not ev.query():
        if time.time() - t > limit:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                ws = [w.to("cpu") for w in seen if w.dtype == torch.float32 and w.dim() < 4]
            for w in ws:
                if w.numel() == 1:
                    print(f"  ticket {w.item()}", flush=True)
                else:
                    v, c = torch.unique(w[..., ::64], return_counts=True)
                    print(f"  counters {tuple(w.shape)} values {v[:16].tolist()} counts {c[:16].tolist()}", flush=True)
            print(f"HANG {p.case_id} at {tag}", flush=True); os._exit(3)
        time.sleep(0.002)
    print(f"+{time.time()-T0:5.1f}s {p.case_id} {tag}: ok {time.time()-t:.3f}s", flush=True)

def make(p, x, base, extra):
    seen = []
    def alloc(shape, dtype):
        t = gl.torch_alloc(x["q"])(shape, dtype); seen.append(t); return t
    return fam.gpu_call("fused_dq" if extra else "fused", p, x, {**base, **extra}, alloc=alloc), seen

for text in sys.argv[1:]:
    p = fam.parse(text); x = fam.gpu_input_sets(p, 0, 1, "cuda")[0]
    base = fam.gpu_config("fused", p, "cuda")
    c, seen = make(p, x, base, {"DQ_FUSED": 1})
    c(); poll("fresh", seen, p)
    c(); poll("reuse", seen, p)
    c(); c(); c(); poll("reuse x3", seen, p)
    ref = {k: v.clone() for k, v in c.outputs.items()}
    row = {"case": p.case_id, "config": base}
    for name, extra in (("cur", {}), ("fused1", {"DQ_FUSED": 1})):
        objs = [make(p, x, base, extra) for _ in range(6)]
        for o, s in objs: o()
        torch.cuda.synchronize()
        ms = []
        for r in range(4):
            for o, s in objs:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); o(); b.record(); b.synchronize(); ms.append(a.elapsed_time(b))
        row[name] = sorted(ms)[len(ms) // 2]
        if name == "fused1":
            row["same_bits"] = all(torch.equal(ref[k], objs[0][0].outputs[k]) for k in ref)
    print(f"+{time.time()-T0:5.1f}s {p.case_id}: cur {row['cur']:.3f} ms fused1 {row['fused1']:.3f} ms "
          f"ratio {row['fused1']/row['cur']:.3f} same_bits {row['same_bits']}", flush=True)
    open(os.path.join(os.environ.get("OUT", "/tmp"), "i35j.jsonl"), "a").write(json.dumps(row) + "\n")
