"""Compare the sm_90 SASS of forward-kernel variants at one tile config, without a GPU.

    python ci/fwd_variants.py /tmp/var
    python ci/fwd_sass_diff.py --config 64x64/o4/K2 --causal /tmp/var/nosafe.py /tmp/var/epilogue.py

Each PATH is a copy of gpu/kernels/fused.py (ci/fwd_variants.py writes them); the current
gpu/kernels/fused.py is always the first column ("spak"). For each: registers per thread,
spill bytes, instruction count of the whole kernel and of its loop bodies (the code between
backward branches: the interior and the boundary key-tile loops), and the opcode classes
that differ. Launch arguments come from gpu.plan.plan_fmha on stand-in arrays
(spak.gpu.compile.variant_launches), so a variant must keep fmha_fwd_kernel's signature.
An analysis aid for predictions (issue 17, round 4): instruction counts are not time.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "ci"))

_INS = re.compile(r"/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*(.*?)\s*;")


def parse_config(text: str) -> tuple[dict, dict]:
    """'64x64/o4/c1/K2/V4' -> (tiles, hints)."""
    parts = text.split("/")
    m, n = (int(x) for x in parts[0].split("x"))
    tiles, hints = {"TILE_M": m, "TILE_N": n}, {}
    for p in parts[1:]:
        key = {"o": "occupancy", "c": "num_ctas", "K": "LAT_K", "V": "LAT_V"}[p[0]]
        (hints if key in ("occupancy", "num_ctas") else tiles)[key] = int(p[1:])
    return tiles, hints


def load(path: str):
    spec = importlib.util.spec_from_file_location(f"variant_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sass(kernel, args) -> list[str]:
    from cuda.tile.compilation import export_kernel
    from spak.gpu.compile import _signature
    from sass_trace import nvdisasm
    buf = io.BytesIO()
    export_kernel(kernel, [_signature(kernel, args, "launch")], buf, gpu_code="sm_90",
                  output_format="cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(buf.getvalue())
        f.flush()
        res = subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True,
                             text=True).stdout
        cubin = buf.getvalue()
    return res.splitlines(), cubin


def summarize(lines) -> dict:
    ins, labels, pending = [], {}, []
    for ln in lines:
        lab = re.match(r"\s*(\.L_x_\d+):", ln)
        if lab:
            pending.append(lab.group(1))
            continue
        m = _INS.search(ln)
        if m:
            addr, _, op, rest = m.groups()
            ins.append((int(addr, 16), op, rest))
            for name in pending:
                labels[name] = int(addr, 16)
            pending = []
    # loop bodies: [target, branch] of every backward branch (nvdisasm names targets by label)
    loops = []
    for addr, op, rest in ins:
        t = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
        if t and labels.get(t.group(1), addr + 1) < addr:
            loops.append((labels[t.group(1)], addr))
    ops = collections.Counter(op.split(".")[0] for _, op, _ in ins)
    body = [sum(1 for a, _, _ in ins if lo <= a <= hi) for lo, hi in loops]
    body = [n for n in body if n > 40]      # the key-tile loops, not the barrier spins
    return {"total": len(ins), "ops": ops, "loops": body}


def _sample_run(launch, hints, heads):
    """(kernel, args) of NVIDIA's sample at our launch's tiles: its signature is
    (Q, K, V, Out, qk_scale, input_pos, TILE_D, H, TILE_M, TILE_N, QUERY_GROUP_SIZE, CAUSAL,
    EVEN_K); arrays and tiles are ours."""
    from spak.gpu.variants import with_hints
    sample = load(str(ROOT / "ci" / "peers" / "ab_sample.py"))
    names = ("Q", "K", "V", "Out", "Mask", "scale", "scale_log2_pow2", "HEAD_DIM",
             "HEAD_DIM_V", "TILE_M", "TILE_N", "CAUSAL")
    a = dict(zip(names, launch.args))
    args = (a["Q"], a["K"], a["V"], a["Out"], float(a["scale"]), 0, a["HEAD_DIM"], heads,
            a["TILE_M"], a["TILE_N"], 1, a["CAUSAL"], True)
    return with_hints(sample.fmha_fwd_kernel, **hints), args


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--config", default="64x64/o4/K2")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--sample-heads", type=int, metavar="H",
                    help="also NVIDIA's sample (ci/peers/ab_sample.py) at the same tiles and "
                         "hints, compiled for H heads, no GQA, EVEN_K (its own K2/V4 hints)")
    ns = ap.parse_args(argv)
    from spak.gpu.compile import variant_launches
    from spak.gpu.resources import kernel_facts
    from spak.gpu.variants import with_hints
    tiles, hints = parse_config(ns.config)
    launch = variant_launches("fused", dtype=ns.dtype, head_dim=ns.head_dim,
                              causal=ns.causal, has_mask=False, tiles=tiles)[0]
    import spak.gpu.kernels.fused as fused
    mods = {"spak": fused, **{Path(p).stem: load(p) for p in ns.paths}}
    runs = [(name, with_hints(mod.fmha_fwd_kernel, **hints), launch.args)
            for name, mod in mods.items()]
    if ns.sample_heads:
        runs.append(("sample", *_sample_run(launch, hints, ns.sample_heads)))
    rows = {}
    for name, kernel, args in runs:
        lines, cubin = sass(kernel, args)
        s = summarize(lines)
        f = kernel_facts(cubin, "sm_90")
        s["res"] = {k: f[k] for k in ("registers", "threads", "shared_bytes", "stack_bytes",
                                      "blocks_per_sm")}
        rows[name] = s
    base = rows["spak"]
    print(f"fused {ns.dtype} D={ns.head_dim} causal={ns.causal} {ns.config}")
    for name, s in rows.items():
        diff = {k: s["ops"][k] - base["ops"][k] for k in set(s["ops"]) | set(base["ops"])
                if s["ops"][k] != base["ops"][k]}
        print(f"  {name:10s} total {s['total']:5d}  loops {s['loops']}  res {s['res']}")
        if name != "spak":
            print(f"  {'':10s} ops vs spak: {dict(sorted(diff.items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
