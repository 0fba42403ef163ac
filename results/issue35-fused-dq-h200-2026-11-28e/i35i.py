"""issue 35 round 5: the fused-dQ pass on growing shapes. Per shape: each of our providers'
first call polled for 20 s; if it does not finish, the ticket and the counters are read on
a second stream (the kernel still spinning) and the process exits. Then determinism (two
calls' bits), float64 errors on small shapes, and do_bench-style times with SDPA cuDNN/flash.
Rows -> $OUT/i35i.jsonl."""
import json, os, sys, time
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tools"))
import torch
from spak import families
import spak.gpu.launch as gl
import bwd_fused_dq_ab as ab
fam = families.get("fmha_bwd")
T0 = time.time(); BUDGET = float(os.environ.get("I35_BUDGET", 240))
out = open(os.path.join(os.environ.get("OUT", "/tmp"), "i35i.jsonl"), "a")
ab.OURS.pop("fused1e", None) if os.environ.get("I35_NO_EARLY") else None

def first_call(name, kernel, extra, p, x, base):
    seen = []
    def alloc(shape, dtype):
        t = gl.torch_alloc(x["q"])(shape, dtype); seen.append(t); return t
    call = fam.gpu_call(kernel, p, x, {**base, **extra}, alloc=alloc)
    t = time.time(); call(); ev = torch.cuda.Event(); ev.record()
    while not ev.query():
        if time.time() - t > 20:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                ws = [w.to("cpu") for w in seen]
            info = {str(tuple(w.shape)): (w.flatten()[:4].tolist() if w.numel() < 8 else
                    {"min": w.min().item(), "max": w.max().item(),
                     "hist": torch.unique(w[~w.isnan()], return_counts=True)[1][:12].tolist()})
                    for w in ws if w.dtype == torch.float32 and w.dim() != 4}
            print(f"HANG {p.case_id} {name}: not done after 20 s; workspaces {info}", flush=True)
            out.write(json.dumps({"case": p.case_id, "hang": name, "ws": str(info)}) + "\n"); out.close()
            os._exit(3)
        time.sleep(0.01)
    print(f"+{time.time() - T0:6.1f}s {p.case_id} {name}: first call {time.time() - t:.2f}s", flush=True)

for text in sys.argv[1:]:
    for dt in os.environ.get("I35_DTYPES", "fp16 bf16").split():
        if time.time() - T0 > BUDGET:
            print(f"{text} {dt}: not run (budget)", flush=True); continue
        p = fam.parse(f"{text}/{dt}")
        x = fam.gpu_input_sets(p, 0, 1, "cuda")[0]
        base = fam.gpu_config("fused", p, "cuda")
        for name, (kernel, extra) in ab.OURS.items():
            first_call(name, kernel, extra, p, x, base)
        row = {"case": p.case_id, "dtype": dt, "gpu": torch.cuda.get_device_name(0), "config": base}
        prov = ab._providers(fam, p, x, "cuda")
        small = p.B * p.Hq * p.Sq <= 8 * 32 * 1024
        t = time.time(); ab._check(fam, p, x, prov, row, small, "cuda")
        print(f"+{time.time() - T0:6.1f}s check {time.time() - t:.1f}s", flush=True)
        row["ms"] = ab._time(prov, 2, 0.1, "cuda", row.setdefault("errors", {}))
        row["tflops"] = {n: fam.flops(p) / (ms * 1e9) for n, ms in row["ms"].items()}
        print(f"+{time.time() - T0:6.1f}s " + ab._line(text, dt, row), flush=True)
        out.write(json.dumps(row) + "\n"); out.flush()
        del x, prov
print(f"i35i done {time.time() - T0:.0f}s", flush=True)
