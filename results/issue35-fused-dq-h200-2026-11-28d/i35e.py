"""issue 35 round 3: one process, stages timed (plan, first call = compile + launch, sync),
faulthandler dumps the stack every 20 s (a hang in synchronize = a deadlock; in the compiler
= a slow compile). Then the A/B timing of tools/bwd_fused_dq_ab.py per problem."""
import faulthandler, os, sys, time
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tools"))
faulthandler.dump_traceback_later(20, repeat=True)
import torch
from spak import families
import bwd_fused_dq_ab as ab
fam = families.get("fmha_bwd")
T0 = time.time()
BUDGET = float(os.environ.get("I35_BUDGET", 250))
shapes = sys.argv[1:]
out = open(os.path.join(os.environ.get("OUT", "/tmp"), "ab.jsonl"), "a")
import json
for text in shapes:
    for dt in os.environ.get("I35_DTYPES", "fp16 bf16").split():
        if time.time() - T0 > BUDGET:
            print(f"{text} {dt}: not run (budget)", flush=True); continue
        p = fam.parse(f"{text}/{dt}")
        x = fam.gpu_input_sets(p, 0, 1, "cuda")[0]
        base = fam.gpu_config("fused", p, "cuda")
        for name, (kernel, extra) in ab.OURS.items():
            t = time.time(); call = fam.gpu_call(kernel, p, x, {**base, **extra})
            t1 = time.time(); call(); t2 = time.time(); torch.cuda.synchronize(); t3 = time.time()
            print(f"+{t3 - T0:6.1f}s {text} {dt} {name}: plan {t1 - t:.2f}s first call {t2 - t1:.2f}s "
                  f"sync {t3 - t2:.3f}s", flush=True)
        row = {"case": p.case_id, "dtype": dt, "gpu": torch.cuda.get_device_name(0)}
        prov = ab._providers(fam, p, x, "cuda")
        small = p.B * p.Hq * p.Sq <= 16 * 32 * 1024
        ab._check(fam, p, x, prov, row, small, "cuda")
        row["ms"] = ab._time(prov, 2, 0.1, "cuda", row.setdefault("errors", {}))
        row["tflops"] = {n: fam.flops(p) / (ms * 1e9) for n, ms in row["ms"].items()}
        print(f"+{time.time() - T0:6.1f}s " + ab._line(text, dt, row), flush=True)
        out.write(json.dumps(row) + "\n"); out.flush()
        del x, prov
faulthandler.cancel_dump_traceback_later()
print(f"i35e done {time.time() - T0:.0f}s", flush=True)
