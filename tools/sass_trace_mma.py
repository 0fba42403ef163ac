"""Read what the compiler made of the fused kernel on an mma.sync GPU (sm_120, sm_89), from
its SASS (no GPU): tools/sass_trace.py's companion for the archs without wgmma.

    python tools/sass_trace_mma.py --arch sm_120                # fp16, D=64, default tiles
    python tools/sass_trace_mma.py --arch sm_89 --head-dim 128 --causal --dtype bfloat16
    python tools/sass_trace_mma.py --all --json results/mmasim-sass-2026-11-24/sass.json

Compiles one variant of the fused kernel to a cubin for the arch (tileiras runs on the
CPU, tiles from spak.gpu.plan.default_tiles for that arch unless --tiles), disassembles
it with nvdisasm (`pip install nvidia-cuda-nvdisasm==13.4.92`) and executes the whole
instruction stream symbolically, in program order (straight-line: the first, peeled key
tile of the software-pipelined loop is what it reads):

* shared-memory addresses are tracked as (base register, constant offset), through the
  128-byte XOR swizzle (`LOP3.LUT d, a, 0x70, b, 0x78`, which permutes 16-byte chunks and
  keeps the logical offset) and through register spills (STL/LDL);
* every `LDSM` fragment is labelled with its offset, every `HMMA` accumulator register
  with its chain (the HMMAs that fed it, each with the A offset, i.e. the K columns of Q,
  and the B offset, i.e. the K columns and the 8 keys of the K tile), so the tool prints
  the instruction, the order of the k16 steps and which keys each n8 block holds;
* float ops on accumulator values are printed as expressions over S[n8 block][r][c]
  (row r = 0 or 8 of the m16 slice, column c = 0/1, lane t's columns being c + 2t), so the
  row max, the exponent's FFMA and the row-sum order read directly.

Limits: a value from a shuffle prints as this lane's copy of it; loop-carried registers
print by name. An analysis tool, not a test: docs/numerics-sm120.md and
docs/numerics-sm89.md record what it showed.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

_INS = re.compile(r"/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*(.*?)\s*;")
_REG = re.compile(r"^-?\|?R(\d+|Z)\|?(\.reuse)?$")


def compile_sass(arch, dtype, head_dim, causal, mask, tiles=None):
    """(SASS lines, tiles) of the fused kernel's first launch for `arch`."""
    from cuda.tile.compilation import export_kernel
    from spak.gpu.compile import _signature, variant_launches
    from spak.gpu.plan import default_tiles
    from sass_trace import nvdisasm
    tiles = dict(tiles or default_tiles(head_dim, arch, causal))
    launch = variant_launches("fused", dtype=dtype, head_dim=head_dim, causal=causal,
                              has_mask=mask, tiles=tiles)[0]
    buf = io.BytesIO()
    export_kernel(launch.kernel, [_signature(launch.kernel, launch.args, "launch")], buf,
                  gpu_code=arch, output_format="cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(buf.getvalue())
        f.flush()
        out = subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True,
                             text=True).stdout
    return out.splitlines(), tiles


def _reg(tok):
    m = _REG.match(tok.strip())
    return None if not m or m.group(1) == "Z" else int(m.group(1))


class Chain:
    """One HMMA accumulator chain: the (A fragment, B fragment) of each k16 step."""

    def __init__(self, steps, ident):
        self.steps = steps
        self.id = ident


class Trace:
    """Symbolic state: registers and spill slots -> values.

    Values: ("tok", n) an opaque integer; ("addr", tok, off); ("frag", trans, tok, off, i)
    matrix i of an LDSM; ("acc", chain, i) accumulator register i of an HMMA; str: a float
    expression."""

    def __init__(self, head_dim=64, tile_n=64):
        self.row_bytes, self.boxes = _box_geometry(head_dim)
        self.tile_n = tile_n
        self.regs = {}
        self.slots = {}
        self.n = 0
        self.chains = []
        self.ops = []          # (line index, opcode, dest, expression) of float ops
        self.loads = 0
        self.counts = Counter()

    def fresh(self):
        self.n += 1
        return ("tok", self.n)

    def get(self, r):
        if r is None:
            return ("zero",)
        if r not in self.regs:
            self.regs[r] = self.fresh()
        return self.regs[r]

    def name(self, tok):
        """A float expression for an operand token."""
        t = tok.replace(".reuse", "").strip()
        neg = t.startswith("-")
        t = t.lstrip("-")
        absv = t.startswith("|")
        t = t.strip("|")
        r = _reg(t)
        if r is not None:
            v = self.expr(self.get(r), r)
        elif t == "RZ":
            v = "0"
        else:
            v = t
        if absv:
            v = f"|{v}|"
        return f"-({v})" if neg else v

    def expr(self, v, r):
        if isinstance(v, str):
            return v
        if v[0] == "acc":
            ch, i = v[1], v[2]
            return f"s{self.n_block(ch)}.{i % 2}" + ("'" if i >= 2 else "")
        return f"R{r}"

    def n_block(self, ch):
        """The n8 block (8 keys of the K tile) of a Q K^T chain, from its B fragment's
        shared-memory offset; '?' when not a tracked K-tile fragment."""
        fb = ch.steps[0][1]
        if fb[0] != "frag" or fb[1]:
            return "?"
        box = self.tile_n * self.row_bytes
        return str((fb[3] % box) // (8 * self.row_bytes))

    def step(self, idx, op, args):
        kind = op.split(".")[0]
        a = [x.strip() for x in args.split(",")] if args else []
        if kind == "SHFL" and a and a[0] == "PT":
            a = a[1:]                        # SHFL.BFLY PT, dest, src, lane mask, clamp
        d = _reg(a[0]) if a else None
        self.counts[kind] += 1
        if kind in ("IADD", "IADD3", "VIADD") and d is not None:
            src = _reg(a[1])
            imm = next((x for x in a[2:] if x.startswith("0x") or x.lstrip("-").isdigit()),
                       None)
            others = [x for x in a[2:] if x not in (imm, "RZ", "!PT", "PT")]
            if src is not None and imm is not None and not others:
                v = self.get(src)
                off = int(imm, 0)
                if v[0] == "addr":
                    self.regs[d] = ("addr", v[1], v[2] + off)
                else:
                    self.regs[d] = ("addr", v, off)
                return
            self.regs[d] = self.fresh()
            return
        if kind == "LOP3" and d is not None and len(a) >= 5 and a[2] == "0x70" and a[4] == "0x78":
            v = self.get(_reg(a[1]))          # the 128B swizzle: keeps the logical offset
            self.regs[d] = v if v[0] == "addr" else ("addr", v, 0)
            return
        if kind == "MOV" and d is not None:
            wide = ".64" in op
            for i in range(2 if wide else 1):
                s = _reg(a[1])
                self.regs[d + i] = self.get(s + i) if s is not None else self.fresh()
            return
        if op.startswith("IMAD.MOV") and d is not None and _reg(a[3]) is not None and a[1] == "RZ":
            self.regs[d] = self.get(_reg(a[3]))
            return
        if kind == "STL":
            m = re.match(r"\[R1(\+0x[0-9a-f]+)?\]", a[0])
            off = int(m.group(1)[1:], 16) if m and m.group(1) else 0
            width = {".64": 2, ".128": 4}.get(next((w for w in (".64", ".128") if w in op), ""), 1)
            s = _reg(a[1])
            for i in range(width):
                self.slots[off + 4 * i] = self.get(s + i) if s is not None else ("zero",)
            return
        if kind == "LDL" and d is not None:
            m = re.match(r"\[R1(\+0x[0-9a-f]+)?\]", a[1])
            off = int(m.group(1)[1:], 16) if m and m.group(1) else 0
            width = {".64": 2, ".128": 4}.get(next((w for w in (".64", ".128") if w in op), ""), 1)
            for i in range(width):
                self.regs[d + i] = self.slots.get(off + 4 * i, self.fresh())
            return
        if kind == "LDSM" and d is not None:
            m = re.match(r"\[R(\d+)(\+0x[0-9a-f]+)?\]", a[1])
            n = int(op.rsplit(".", 1)[1])
            v = self.get(int(m.group(1)))
            add = int(m.group(2)[1:], 16) if m.group(2) else 0
            trans = ".MT88" in op
            for i in range(n):
                self.regs[d + i] = (("frag", trans, v[1], v[2] + add, i) if v[0] == "addr"
                                    else self.fresh())
            return
        if kind in ("LDS", "LDG") and d is not None:
            # a vector load: value i of load n (the row-sum probe reads its tile this way)
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            self.loads += 1
            for i in range(width):
                self.regs[d + i] = f"L{self.loads}[{i}]"
            return
        if kind == "HMMA" and d is not None:
            ra, rb, rc = _reg(a[1]), _reg(a[2]), _reg(a[3])
            step = (self.get(ra), self.get(rb), self.get(rb + 1), op)
            prev = self.get(rc) if rc is not None else None
            if prev is not None and prev[0] == "acc":
                ch = Chain(prev[1].steps + [step], len(self.chains))
            else:
                ch = Chain([step], len(self.chains))
                ch.init = "0" if rc is None else self.expr(prev, rc)
            if prev is not None and prev[0] == "acc":
                ch.init = prev[1].init
            self.chains.append(ch)
            for i in range(4):
                self.regs[d + i] = ("acc", ch, i)
            return
        fl = {"FADD": lambda: f"({self.name(a[1])} + {self.name(a[2])})",
              "FFMA": lambda: f"fma({self.name(a[1])}, {self.name(a[2])}, {self.name(a[3])})",
              "FMUL": lambda: f"({self.name(a[1])} * {self.name(a[2])})",
              "FMNMX": lambda: "M",        # a max: exact, its order does not matter
              "MUFU": lambda: self.mufu(op, self.name(a[1])),
              "FSEL": lambda: f"sel({self.name(a[1])}, {self.name(a[2])})",
              "SHFL": lambda: f"shfl{int(a[2], 16) if a[2].startswith('0x') else a[2]}"
                              f"({self.name(a[1])})"}.get(kind)
        if fl is not None and d is not None:
            e = fl()
            if len(e) > 20000:                     # keep long loop-carried chains bounded
                e = f"<R{d}: long>"
            self.regs[d] = e
            self.ops.append((idx, op, d, e))
            return
        if d is not None and kind not in ("ST", "STS", "STG", "BAR", "BRA", "EXIT", "SYNCS",
                                          "MEMBAR", "FENCE", "ISETP", "FSETP", "UISETP"):
            for i in range(4 if ".128" in op else 2 if ".64" in op else 1):
                self.regs[d + i] = self.fresh()      # every register a wide op writes


def _mufu(op, x):
    """ex2 of a score (fma(s, c, -m) or s * c - m) -> p<n8 block>.<c>: the softmax
    numerator, named like its score."""
    fn = op.split(".")[1].lower()
    m = re.match(r"(?:fma\(|\()+(s[?\d]+\.\d'?)", x)
    if fn == "ex2" and m:
        return "p" + m.group(1)[1:]
    return f"{fn}({x})"


Trace.mufu = staticmethod(_mufu)


def run_trace(lines, head_dim=64, tile_n=64):
    t = Trace(head_dim, tile_n)
    for i, ln in enumerate(lines):
        m = _INS.search(ln)
        if m:
            t.step(i, m.group(3), re.sub(r"\(\*.*?\*\)", "", m.group(4)).strip())
    return t


def _box_geometry(head_dim):
    """Bytes per smem row (TMA boxes of 64 fp16/bf16 columns, 128B swizzle)."""
    return 128, max(1, head_dim * 2 // 128)


def describe_chains(t, head_dim, tile_n):
    """The QK^T chains (first fed by Q's fragments, started from +0): per chain its keys
    (n8 block) and the K columns of each k16 step, from the LDSM offsets."""
    row_bytes, boxes = _box_geometry(head_dim)
    out = []
    full = [c for c in t.chains if c.init == "0" and len(c.steps) == head_dim // 16
            and not c.steps[0][1][1]]        # B non-transposed: a K tile, not V
    for c in full:
        steps = []
        for fa, fb0, fb1, op in c.steps:
            if fb0[0] != "frag" or fb1[0] != "frag":
                steps.append(None)
                continue
            a_k = None                 # Q's K columns, where Q came through LDSM (sm_120)
            if fa[0] == "frag":
                a_k = (fa[3] % row_bytes) // 2 + 64 * ((fa[3] // (row_bytes * 16 * 4)) % boxes)
            box = tile_n * row_bytes
            b_off = fb0[3]
            b_k = (b_off % row_bytes) // 2 + 8 * fb0[4] + 64 * ((b_off // box) % boxes)
            nblk = (b_off % box) // (8 * row_bytes)
            steps.append({"op": op, "a_off": fa[3] if fa[0] == "frag" else None, "a_k": a_k,
                          "b_off": b_off, "b_k": b_k, "b_matrices": [fb0[4], fb1[4]],
                          "n_block": nblk})
        out.append({"chain": c.id, "steps": steps})
    return out


def analyse(arch, dtype, head_dim, causal, mask, tiles=None, show=2):
    lines, tiles = compile_sass(arch, dtype, head_dim, causal, mask, tiles)
    t = run_trace(lines, head_dim, tiles["TILE_N"])
    hmma = Counter(m.group(3) for m in map(_INS.search, lines) if m and m.group(3).startswith("HMMA"))
    chains = describe_chains(t, head_dim, tiles["TILE_N"])
    names = {}
    ascending, resolved = True, 0
    for ch in chains:
        st = [s for s in ch["steps"] if s]
        if len(st) < len(ch["steps"]) or len({s["n_block"] for s in st}) != 1:
            continue
        resolved += 1
        names[ch["chain"]] = st[0]["n_block"]
        # the k16 step order is B's K columns (A's must match them for the product)
        ks = [s["b_k"] for s in st]
        ascending &= ks == list(range(0, 16 * len(ks), 16))
        ascending &= all(s["a_k"] in (None, s["b_k"]) for s in st)
    ex2_of_scores = [(op, d, e) for _, op, d, e in t.ops if op.startswith("MUFU.EX2")
                     and re.match(r"p[?\d]", e)]
    ffma_scores = [e for _, op, _, e in t.ops if op.startswith("FFMA") and re.match(r"fma\(s[?\d]", e)]
    fmul_scores = [e for _, op, _, e in t.ops if op.startswith("FMUL") and re.match(r"\(s[?\d]", e)]
    shapes = Counter(re.sub(r"R\d+|UR\d+|c\[0x0\]\[0x[0-9a-f]+\]|L\d+\[\d\]", "r",
                            re.sub(r"s[?\d]+\.\d'?", "s", e)) for e in ffma_scores)
    exps = [(op, e) for _, op, _, e in t.ops if op.startswith(("FFMA", "FMUL", "FADD"))
            and re.match(r"(fma\(|\()s[?\d]", e)]
    sums = [e for _, op, _, e in t.ops if op.startswith(("FADD", "FFMA"))
            and len(re.findall(r"p[?\d]", e)) >= 4]
    lane_sums = [e for e in sums if "shfl" not in e]
    quad_sums = [e for e in sums if "shfl" in e]
    full = [e for e in quad_sums if "shfl1" in e]
    updates = []
    for _, op, _, e in t.ops:           # what consumes a finished quad row sum
        for q in full:
            if q in e and e != q:
                updates.append(f"{op.split('.')[0]} " + e.replace(q, "ROWSUM"))
                break
    return {
        "arch": arch, "dtype": dtype, "head_dim": head_dim, "causal": causal, "mask": mask,
        "tiles": tiles, "sass_lines": len(lines), "hmma": dict(hmma),
        "spill_lines": sum("SpillRefill" in ln for ln in lines),
        "shfl_bfly": [m.group(4).split(",")[3].strip() for m in map(_INS.search, lines)
                      if m and m.group(3).startswith("SHFL.BFLY")][:8],
        "qk_chains": chains, "k_steps_ascending": ascending and resolved > 0,
        "chains_resolved": resolved,
        "n_blocks_seen": sorted(set(names.values())),
        "ffma_on_scores": len(ffma_scores), "fmul_on_scores": len(fmul_scores),
        "ex2_of_scores": len(ex2_of_scores),
        "ffma_on_scores_forms": dict(shapes),
        "exponent_sample": [f"{op.split('.')[0]} {e}"[:300] for op, e in exps[:2]],
        "row_sum_lane": [e[:1500] for e in lane_sums[-show:]],
        "row_sum_quad": [e[:3000] for e in full[:show]],
        "row_sum_matches_model": fragment_sum_matches(next((e for e in full if "?" not in e),
                                                           None), arch),
        "row_sum_update": [e[:600] for e in updates[:2 * show]],
        "float_ops": {k: v for k, v in t.counts.items() if k.startswith(("F", "MUFU", "HMMA", "SHFL"))},
    }


def print_report(r, verbose=False):
    print(f"== {r['arch']} fused {r['dtype']} D={r['head_dim']} causal={r['causal']} "
          f"mask={r['mask']} tiles {r['tiles']}: {r['sass_lines']} SASS lines, "
          f"{r['spill_lines']} spill lines")
    print(f"   mma instructions: {r['hmma']}")
    print(f"   Q K^T chains from +0: {len(r['qk_chains'])}, {r['chains_resolved']} with every "
          f"fragment traced; their k16 steps in ascending K (B's K columns, A's where traced "
          f"matching): {r['k_steps_ascending']}; n8 blocks: {r['n_blocks_seen']}")
    if verbose:
        for ch in r["qk_chains"]:
            print("     chain", ch["chain"], [(s["n_block"], s["a_k"], s["b_k"]) if s else None
                                          for s in ch["steps"]])
    print(f"   on scores: FFMA {r['ffma_on_scores']}, FMUL {r['fmul_on_scores']}, "
          f"EX2 {r['ex2_of_scores']}; butterfly shuffles (first): {r['shfl_bfly']}")
    for form, n in r["ffma_on_scores_forms"].items():
        print(f"   FFMA on a score, {n}x: {form[:200]}")
    for e in r["exponent_sample"]:
        print("   exponent:", e)
    for e in r["row_sum_lane"]:
        print("   lane row sum:", e)
    for e in r["row_sum_quad"]:
        print("   quad row sum:", e)
    for e in r["row_sum_update"]:
        print("   row-sum update:", e)
    print(f"   the traced row sum, evaluated, equals the model's fragment order bit for bit: "
          f"{r['row_sum_matches_model']}")


def compile_rowsum(arch, m=64, n=128):
    """SASS of gpu/probes' rowsum_probe (ct.sum over the last axis of an [m, n] float32
    tile loaded from global memory: the order the naive kernel's softmax sums in)."""
    import cuda.tile as ct
    from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                       export_kernel)
    from spak.gpu.probes import kernels as P
    from sass_trace import nvdisasm

    def arr(nd):
        return ArrayConstraint(ct.float32, nd, index_dtype=ct.int32,
                               stride_lower_bound_incl=0, alias_groups=(),
                               may_alias_internally=False,
                               stride_constant=(None,) * (nd - 1) + (1,),
                               base_addr_divisible_by=16,
                               stride_divisible_by=(4,) * (nd - 1) + (1,),
                               shape_divisible_by=(1,) * (nd - 1) + (16,))
    sig = KernelSignature([arr(3), arr(2), m, n], CallingConvention.cutile_python_v1())
    buf = io.BytesIO()
    export_kernel(P.rowsum_probe, [sig], buf, gpu_code=arch, output_format="cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(buf.getvalue())
        f.flush()
        return subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True,
                              text=True).stdout.splitlines()


def analyse_rowsum(arch, m=64, n=128):
    """The row sum of a loaded [m, n] float32 tile: each lane's 4 neighbours
    (L<load>[0..3], one 16-byte vector load) and the butterflies that combine the lanes."""
    lines = compile_rowsum(arch, m, n)
    t = run_trace(lines)
    # the last add of a row: the deepest shuffle nesting
    adds = [e for _, op, _, e in t.ops if op.startswith("FADD")]
    stages = max((len(set(re.findall(r"shfl(\d+)\(", e))) for e in adds), default=0)
    final = [e for e in adds if len(set(re.findall(r"shfl(\d+)\(", e))) == stages]
    e = min(final, key=len) if final else ""
    inner = re.search(r"\(\((L\d+)\[(\d)\] \+ L\d+\[(\d)\]\) \+ \(L\d+\[(\d)\] \+ "
                      r"L\d+\[(\d)\]\)\)", e)
    chunk = (f"(x{inner.group(2)} + x{inner.group(3)}) + (x{inner.group(4)} + x{inner.group(5)})"
             if inner else None)
    if chunk is None:
        inner = re.search(r"\((L\d+)\[(\d)\] \+ L\d+\[(\d)\]\)", e)
        chunk = f"x{inner.group(2)} + x{inner.group(3)}" if inner else None
    order = [int(x) for x in re.findall(r"shfl(\d+)\(", e)]
    lane_order = []
    for v in order:                       # the innermost (first applied) comes first
        if v not in lane_order:
            lane_order.append(v)
    return {"arch": arch, "tile": [m, n], "sass_lines": len(lines),
            "loads": sorted({m.group(3) for m in map(_INS.search, lines)
                             if m and m.group(3).startswith(("LDS", "LDG"))}),
            "fadd": sum(1 for _, op, _, _ in t.ops if op.startswith("FADD")),
            "shfl": sum(1 for _, op, _, _ in t.ops if op.startswith("SHFL")),
            "chunk_order": chunk, "butterfly_masks_first_to_last": lane_order,
            "row_sum_matches_model": loaded_sum_matches(e, n, arch),
            "row_expression": e[:2000]}


def _evaluator(code: str, env: dict):
    """The traced expression as a function of the lane t: shfl<m>(x) reads x at lane t ^ m."""
    code = re.sub(r"shfl(\d+)\(", lambda m: f"_S({m.group(1)}, t, lambda t: ", code)
    env = dict(env, _S=lambda m, t, fn: fn(t ^ m))
    return eval("lambda t: " + code, env)      # noqa: S307 -- our own traced expression


def fragment_sum_matches(expr, arch, rows=256, seed=0):
    """Evaluate the traced quad row sum (lane 0's) in float32 on random rows and compare it
    bit for bit with the model's order for mma tiles (sim.numerics.fragment_row_sum_f32):
    None when there is no fully traced expression."""
    import numpy as np
    from spak.sim.numerics import fragment_row_sum_f32
    if not expr:
        return None
    nb = 1 + max(int(b) for b in re.findall(r"p(\d+)\.", expr))
    code = re.sub(r"p(\d+)\.(\d)'?", lambda m: f"_P[{int(m.group(1)) * 8} + 2 * t + "
                  f"{m.group(2)}]", expr)
    rng = np.random.default_rng(seed)
    ok = True
    for _ in range(rows):
        x = (rng.standard_normal(nb * 8) * 2.0 ** rng.integers(-20, 20, nb * 8)).astype(np.float32)
        got = np.float32(_evaluator(code, {"_P": x})(0))
        want = fragment_row_sum_f32(x[None])[0]
        ok &= bool(np.float32(got).view(np.uint32) == np.float32(want).view(np.uint32))
    return ok


def loaded_sum_matches(expr, n, arch, rows=256, seed=0):
    """The same for the row sum of a loaded tile: lane t holds x[4t .. 4t+3] (the lane's
    16-byte load, from the address code), compared with the model's tree_sum_f32."""
    import numpy as np
    from spak.sim.numerics import MODELS, tree_sum_f32
    if not expr:
        return None
    code = re.sub(r"L\d+\[(\d)\]", lambda m: f"_X[4 * t + {m.group(1)}]", expr)
    chunk = MODELS[arch].sum_chunk
    rng = np.random.default_rng(seed)
    ok = True
    for _ in range(rows):
        x = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
        got = np.float32(_evaluator(code, {"_X": x})(0))
        want = tree_sum_f32(x[None], 1, chunk)[0]
        ok &= bool(got.view(np.uint32) == want.view(np.uint32))
    return ok


def analyse_naive_softmax(arch, head_dim=64):
    """The naive kernel's softmax launch (rows of P = exp2((S - m) * log2e) loaded from
    global memory) at the arch's default tiles: its row-sum expression, with each exp2 of
    loaded value i named x_i, evaluated against the model's loaded-tile order."""
    from spak.gpu.compile import export_cubin, variant_launches
    from spak.gpu.plan import default_tiles
    from sass_trace import nvdisasm
    tiles = default_tiles(head_dim, arch, False)
    launch = next(L for L in variant_launches("naive", dtype="float16", head_dim=head_dim,
                                              causal=False, has_mask=False, tiles=tiles)
                  if "softmax" in L.name)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(export_cubin(launch, arch))
        f.flush()
        lines = subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True,
                               text=True).stdout.splitlines()
    t = run_trace(lines)
    adds = [e for _, op, _, e in t.ops if op.startswith("FADD") and "shfl" in e]
    stages = max((len(set(re.findall(r"shfl(\d+)\(", e))) for e in adds), default=0)
    final = [e for e in adds if len(set(re.findall(r"shfl(\d+)\(", e))) == stages]
    e = min(final, key=len) if final else ""
    # exp2 of loaded value i -> L0[i], so the loaded-tile evaluator applies
    e = re.sub(r"ex2\(\(\(-\(sel\(M, 0\)\) \+ L\d+\[(\d)\]\) \* [0-9.]+\)\)", r"L0[\1]", e)
    inner = re.search(r"\(\(L0\[(\d)\] \+ L0\[(\d)\]\) \+ \(L0\[(\d)\] \+ L0\[(\d)\]\)\)", e)
    return {"arch": arch, "kernel": launch.name, "tiles": tiles,
            "chunk_order": (f"(p{inner.group(1)} + p{inner.group(2)}) + (p{inner.group(3)} + "
                            f"p{inner.group(4)})") if inner else None,
            "butterfly_masks_first_to_last": list(dict.fromkeys(
                int(x) for x in re.findall(r"shfl(\d+)\(", e))),
            "row_sum_matches_model": loaded_sum_matches(e, tiles["TILE_N"], arch)}


VARIANTS = [(arch, dt, d, c, m) for arch in ("sm_120", "sm_89")
            for dt, d, c, m in (("float16", 64, False, False), ("float16", 64, True, False),
                                ("bfloat16", 128, False, False), ("float16", 64, False, True),
                                ("float16", 128, True, True))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_120", choices=("sm_120", "sm_89", "sm_80", "sm_86",
                                                         "sm_90"))
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--mask", action="store_true")
    ap.add_argument("--tiles", default=None, help="TILE_MxTILE_N, e.g. 64x64 (default: the "
                    "arch's default tiles)")
    ap.add_argument("--show", type=int, default=2, help="row-sum expressions to print")
    ap.add_argument("--all", action="store_true", help="the sm_120 and sm_89 variant matrix")
    ap.add_argument("--json", default=None, help="write the analyses here")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--rowsum", action="store_true",
                    help="instead: the row-sum order of a loaded tile (gpu/probes rowsum_probe)"
                         " for sm_90, sm_120 and sm_89")
    ns = ap.parse_args(argv)
    if ns.rowsum:
        res = [analyse_rowsum(a, 64, n) for a in ("sm_90", "sm_120", "sm_89")
               for n in (128, 64, 32, 16)]
        for r in res:
            print(f"== {r['arch']} rowsum_probe {r['tile']} fp32: loads {r['loads']}, "
                  f"{r['fadd']} FADD, {r['shfl']} SHFL; per lane {r['chunk_order']}, then "
                  f"butterflies xor {r['butterfly_masks_first_to_last']}; evaluated, equal "
                  f"to the {r['arch']} model's order: {r['row_sum_matches_model']}")
            if ns.verbose:
                print("   ", r["row_expression"])
        for arch in ("sm_90", "sm_120", "sm_89"):
            r = analyse_naive_softmax(arch)
            print(f"== {arch} {r['kernel']} (fp16 D=64, tiles {r['tiles']}): per lane "
                  f"{r['chunk_order']}, then butterflies xor "
                  f"{r['butterfly_masks_first_to_last']}; evaluated, equal to the {arch} "
                  f"model's order: {r['row_sum_matches_model']}")
            res.append(r)
        if ns.json:
            Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
            Path(ns.json).write_text(json.dumps(res, indent=1))
        return 0
    tiles = None
    if ns.tiles:
        tm, tn = (int(x) for x in ns.tiles.lower().split("x"))
        tiles = {"TILE_M": tm, "TILE_N": tn}
    todo = VARIANTS if ns.all else [(ns.arch, ns.dtype, ns.head_dim, ns.causal, ns.mask)]
    results = []
    for arch, dt, d, c, m in todo:
        r = analyse(arch, dt, d, c, m, tiles, ns.show)
        print_report(r, ns.verbose)
        results.append(r)
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
