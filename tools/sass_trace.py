"""Read what the compiler made of the fused kernel's softmax, from its SASS (no GPU).

    python tools/sass_trace.py                       # fp16, D=64, non-causal, default tiles
    python tools/sass_trace.py --head-dim 128 --causal --show 4

Compiles one variant of the fused kernel to a cubin for sm_90 (tileiras runs on the CPU),
disassembles it with nvdisasm (`pip install nvidia-cuda-nvdisasm==13.4.92`, or on PATH) and
symbolically executes the first key-tile loop body: from the Q K^T wgmma group to the P V
one. Accumulator registers are named by their place in the wgmma fragment
(S<half>[r<row offset>][c<column>], lane t's columns being c + 2t), so the printed
expressions show how each row statistic is computed: which multiplies became FFMAs and in
what order the row sum adds (docs/numerics-sm90.md, section 10). Limits: a value from a
shuffle prints as this lane's copy of it, and loop-carried registers (m, l from the
previous tile) print by register name or as whatever last wrote that register. An analysis
tool, not a test: the kernel agreement on a GPU (`spak run`) is what checks the model.
"""
from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_INS = re.compile(r"/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*(.*?)\s*;")


def nvdisasm() -> str:
    try:
        import nvidia.cu13 as cu
        for base in cu.__path__:
            p = Path(base) / "bin" / "nvdisasm"
            if p.exists():
                return str(p)
    except ImportError:
        pass
    found = shutil.which("nvdisasm")
    if not found:
        sys.exit("nvdisasm not found: pip install nvidia-cuda-nvdisasm==13.4.92")
    return found


def compile_sass(dtype, head_dim, causal, mask) -> list[str]:
    from cuda.tile.compilation import export_kernel
    from spak.gpu.compile import _signature, variant_launches
    launch = variant_launches("fused", dtype=dtype, head_dim=head_dim, causal=causal,
                              has_mask=mask)[0]
    buf = io.BytesIO()
    export_kernel(launch.kernel, [_signature(launch.kernel, launch.args, "launch")], buf,
                  gpu_code="sm_90", output_format="cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(buf.getvalue())
        f.flush()
        out = subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True,
                             text=True).stdout
    return out.splitlines()


def loop_body(lines):
    """(accumulator base registers, N, lines) of the first Q K^T group up to the P V one."""
    qk = [i for i, ln in enumerate(lines) if "HGMMA" in ln and "gdesc" in ln.split(",")[1]]
    pv = [i for i, ln in enumerate(lines) if "HGMMA" in ln and "tnspB" in ln]
    start = next(i for i in qk if i > 0 and any(j > i for j in pv))
    group = [i for i in qk if start <= i < min(j for j in pv if j > start)]
    end = min(j for j in pv if j > group[-1])
    bases = sorted({int(re.search(r"HGMMA\S*\s+R(\d+)", lines[i]).group(1)) for i in group})
    n = int(re.search(r"HGMMA\.64x(\d+)x", lines[group[0]]).group(1))
    return bases, n, lines[group[-1] + 1:end]


def execute(bases, n, body):
    env = {}
    for h, base in enumerate(bases):
        for i in range(n // 2):
            env[f"R{base + i}"] = f"S{h}[r{((i // 2) % 2) * 8}][c{(i // 4) * 8 + i % 2}]"

    def val(tok):
        tok = tok.replace(".reuse", "").strip()
        neg = tok.startswith("-")
        v = env.get(tok.lstrip("-|").rstrip("|"), tok.lstrip("-|").rstrip("|"))
        return f"-({v})" if neg else v
    ops = []
    for ln in body:
        m = _INS.search(ln)
        if not m:
            continue
        _, op, rest = m.groups()
        a = [x.strip() for x in rest.split(",")]
        kind = op.split(".")[0]
        e = {"FADD": lambda: f"({val(a[1])} + {val(a[2])})",
             "FFMA": lambda: f"fma({val(a[1])}, {val(a[2])}, {val(a[3])})",
             "FMUL": lambda: f"({val(a[1])} * {val(a[2])})",
             "FMNMX": lambda: "M",
             "MUFU": lambda: f"{op.split('.')[1].lower()}({val(a[1])})",
             "FSEL": lambda: f"sel({val(a[1])}, {val(a[2])})",
             "SHFL": lambda: f"shfl{int(a[3], 16)}({val(a[2])})"}.get(kind)
        if e is not None:
            env[a[0]] = e()
            ops.append((op, a[0], env[a[0]]))
    return ops


def compact(e: str) -> str:
    """ex2(fma(S0[r8][c9], c, -(...))) -> p9 and the like, so the sum order reads."""
    e = re.sub(r"sel\([^()]*\)", "M", e)
    e = re.sub(r"ex2\(fma\(S\d\[r\d+\]\[c(\d+)\], \w+, -\(M\)\)\)", r"p\1", e)   # FFMA form
    e = re.sub(r"ex2\(\(\(S\d\[r\d+\]\[c(\d+)\] \* \w+\) \+ -\(M\)\)\)", r"p\1", e)  # FMUL+FADD
    return e


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--mask", action="store_true")
    ap.add_argument("--show", type=int, default=2, help="row-sum updates to print")
    ns = ap.parse_args(argv)
    lines = compile_sass(ns.dtype, ns.head_dim, ns.causal, ns.mask)
    bases, n, body = loop_body(lines)
    ops = execute(bases, n, body)
    counts = {}
    for op, _, _ in ops:
        counts[op.split(".")[0]] = counts.get(op.split(".")[0], 0) + 1
    print(f"fused {ns.dtype} D={ns.head_dim} causal={ns.causal} mask={ns.mask}: accumulators "
          f"R{bases} (m64n{n}), loop body {len(body)} lines; float ops: {counts}")
    fmas = [e for op, _, e in ops if op.startswith("FFMA")]
    print(f"FFMAs on scores: {sum('S' in e.split(',')[0] for e in fmas)}; "
          f"row-sum updates (fma(alpha, l, sum)):")
    for e in [e for e in fmas if "RZ +" in e][:ns.show]:
        print("  " + compact(e)[:1200])
    return 0


if __name__ == "__main__":
    sys.exit(main())
