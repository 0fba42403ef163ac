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
Round 5: --segments adds the straight-line parts (each warp role's code before, between and
after its loops: run once per block); --tiles BxHxSQxSK prints the key tiles each block of
one (b, h) visits, spak's and the sample's, in launch order (no compile).
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


def _parse(lines):
    """(instructions as (address, opcode, operands, predicate), label -> address) of an
    nvdisasm listing; a label names the next instruction's address."""
    ins, labels, pending = [], {}, []
    for ln in lines:
        lab = re.match(r"\s*(\.L_x_\d+):", ln)
        if lab:
            pending.append(lab.group(1))
            continue
        m = _INS.search(ln)
        if m:
            addr, pred, op, rest = m.groups()
            ins.append((int(addr, 16), op, rest, pred))
            for name in pending:
                labels[name] = int(addr, 16)
            pending = []
    return ins, labels


def summarize(lines) -> dict:
    ins, labels = _parse(lines)
    ins = [(addr, op, rest) for addr, op, rest, _ in ins]
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


def _branches(ins, labels):
    """(branch address, target address, conditional?) of every BRA with a label target."""
    out = []
    for addr, op, rest, pred in ins:
        t = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
        if t and t.group(1) in labels:
            out.append((addr, labels[t.group(1)], bool(pred)))
    return out


def _minimal_loops(ins, branches, lo, hi, marker):
    """[start, end] of the innermost backward-branch ranges inside [lo, hi] holding an
    instruction whose opcode starts with ``marker`` (HGMMA: the consumer's key-tile loops,
    UTMALDG: the producer's)."""
    spans = [(t, a) for a, t, _ in branches if t < a and lo <= t and a <= hi]
    spans = [s for s in spans if any(s[0] <= a <= s[1] and op.startswith(marker)
                                     for a, op, _, _ in ins)]
    return sorted(s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1]
                                              for o in spans))


# long: one pass over the listing, every segment named in reading order
def segments(lines) -> dict:
    """Instruction counts of the kernel's straight-line parts (issue 17, round 5): where a
    block spends what is NOT a key-tile loop body. tileiras warp-specialises the kernel: after
    the first block-wide barrier a forward branch splits the consumer warp group (Q K^T,
    softmax, P V, the epilogue's STSM) from the producer warps (TMA loads, the TMA store).
    Consumer: `pre` (block ids, loop bounds, state set-up: before the first loop), `mid`
    (between its loops), `post` (normalise, convert, STSM). Producer: `pre` (to its first
    load loop), `post` (after the last: the output's TMA store). `setup`: every warp's code
    before the split (barrier initialisation). Counts, not time: each runs once per block."""
    ins, labels = _parse(lines)
    br = _branches(ins, labels)
    bar = next(a for a, op, rest, _ in ins if op.startswith("BAR.SYNC"))
    split, prod = next((a, t) for a, t, cond in br if a > bar and t > a and cond)
    end = next(a for a, op, _, _ in ins if a > prod and op == "EXIT")

    def count(lo, hi):          # instructions in [lo, hi)
        return sum(1 for a, _, _, _ in ins if lo <= a < hi)

    def part(lo, hi, marker):
        loops = _minimal_loops(ins, br, lo, hi, marker)
        if not loops:
            return {"loops": [], "pre": count(lo, hi), "mid": [], "post": 0}
        return {"loops": [count(s, e + 1) for s, e in loops],
                "pre": count(lo, loops[0][0]),
                "mid": [count(loops[i][1] + 1, loops[i + 1][0]) for i in range(len(loops) - 1)],
                "post": count(loops[-1][1] + 1, hi)}
    return {"setup": count(0, split + 1), "consumer": part(split + 1, prod, "HGMMA"),
            "producer": part(prod, end + 1, "UTMALDG")}


def key_tiles(shape: str, tm: int, tn: int, causal: bool = True) -> dict:
    """Per launched block, in launch order (x fastest), the key tiles it visits: spak's
    (gpu.kernels.common.causal_key_range, causal tiles reversed: longest first) and the
    sample's (its loop bound and mask start, natural order, input_pos 0).
    -> {"spak": [(query tile, interior, boundary), ...], "sample": [...]} for one (b, h)."""
    from spak.gpu.kernels.common import causal_key_range
    _b, _h, sq, sk = (int(x) for x in shape.split("x")[:4])
    nq = -(-sq // tm)
    rows = {"spak": [], "sample": []}
    for x in range(nq):
        i = nq - 1 - x if causal else x
        kv_end, mask_from = causal_key_range(i, sq, sk, tm, tn, causal)
        n = -(-kv_end // tn)
        rows["spak"].append((i, min(mask_from, n), n - min(mask_from, n)))
        # the sample: Tc = cdiv(min((x+1)*TM, Sk), TN) tiles, masked from
        # min(x*TM // TN, Sk // TN) (causal); noncausal: cdiv(Sk, TN), masked from Sk // TN
        if causal:
            tc, ms = -(-min((x + 1) * tm, sk) // tn), min(x * tm // tn, sk // tn)
        else:
            tc, ms = -(-sk // tn), sk // tn
        rows["sample"].append((x, min(ms, tc), tc - min(ms, tc)))
    return rows


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
    ap.add_argument("--segments", action="store_true",
                    help="also the straight-line parts' lengths (segments(): the consumer's "
                         "and the producer's code before, between and after their loops)")
    ap.add_argument("--tiles", metavar="BxHxSQxSK",
                    help="only print the key tiles each block of one (b, h) visits, spak's "
                         "and the sample's, at --config's tiles (no compile)")
    ns = ap.parse_args(argv)
    if ns.tiles:
        tiles = parse_config(ns.config)[0]
        return _print_tiles(ns.tiles, tiles["TILE_M"], tiles["TILE_N"], ns.causal)
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
        if ns.segments:
            s["seg"] = segments(lines)
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
        if "seg" in s:
            print(f"  {'':10s} segments: {s['seg']}")
    return 0


def _print_tiles(shape, tm, tn, causal) -> int:
    rows = key_tiles(shape, tm, tn, causal)
    for name, blocks in rows.items():
        total = sum(a + b for _, a, b in blocks)
        print(f"{name:7s} launch order (query tile, interior, boundary): {blocks}  "
              f"key tiles per (b, h): {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
