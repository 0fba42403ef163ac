"""Issue 18 (2026-11-24e): the sm_90 facts of our split-KV decode kernel beside NVIDIA
TileGym's (ci/peers/tilegym_flash_decode.py) at the two shapes where TileGym is ahead at
the same split count, on the CPU (no GPU): registers, threads, shared memory, stack
(spill), instruction count of the whole kernel and of its key-tile loops, and the opcode
classes that differ. An analysis aid for predictions: instruction counts are not time.

    python ci/decode_gap_facts.py [--json OUT]
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "ci"))
sys.path.insert(0, str(ROOT / "ci" / "peers"))

#: (label, B, Hq, Hkv, Sk): the two shapes of the brief
SHAPES = [("8x32:1x1:8192", 8, 32, 1, 8192), ("1x32:8x1:8192", 1, 32, 8, 8192)]
#: our variants, one difference each: the default (rows form), the keys forms
OURS = {"spak": {}, "kt1": {"KT_FORM": 1}, "kt2": {"KT_FORM": 2},
        "occ2": {"OCCUPANCY": 2}}


def _disasm(cubin: bytes) -> list[str]:
    from sass_trace import nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True,
                              text=True).stdout.splitlines()


def _facts(kernel, args) -> dict:
    from cuda.tile.compilation import export_kernel
    from spak.gpu.compile_decode import _signature
    from spak.gpu.resources import kernel_facts
    from fwd_sass_diff import summarize
    buf = io.BytesIO()
    export_kernel(kernel, [_signature(kernel, args)], buf, gpu_code="sm_90",
                  output_format="cubin")
    f = kernel_facts(buf.getvalue(), "sm_90")
    s = summarize(_disasm(buf.getvalue()))
    f.update(total=s["total"], loops=s["loops"], ops=dict(s["ops"]))
    return f


def ours(B, Hq, Hkv, Sk, tiles) -> dict:
    from spak.gpu.compile_decode import _Spec
    from spak.gpu.plan_decode import auto_splits, plan_decode
    splits = auto_splits(B, Hq, Hkv, 1, Sk, 128, 64, 132, 128)
    q = _Spec((B, 1, Hq, 128), "float16")
    k = _Spec((B, Sk, Hkv, 128), "float16")
    launches = plan_decode(q, k, k, _Spec((B,), "int32"), q, num_splits=splits,
                           tiles=tiles, alloc=lambda s, kind: _Spec(tuple(s), "float32"))
    out = {"splits": splits}
    for L in launches:
        kern = L.kernel
        out[L.name] = _facts(kern, L.args)
    return out


def tilegym(B, Hq, Hkv, Sk) -> dict:
    """TileGym's split kernel and reduce kernel, their host code's arguments (its
    fmha_decode), on stand-in arrays."""
    import tilegym_flash_decode as tg
    from spak.gpu.compile_decode import _Spec
    D, TN = 128, 128
    splits = max(1, 132 // (B * Hkv))
    tile_size = max(TN, tg.next_power_of_2(-(-Sk // splits)))
    splits = -(-Sk // tile_size)
    g = Hq // Hkv
    qg = max(8, tg.next_power_of_2(g))
    args = (_Spec((B, Hkv, g, D), "float16"), _Spec((B, Hkv, Sk, D), "float16"),
            _Spec((B, Hkv, Sk, D), "float16"), _Spec((B, Hkv, g, splits, D), "float16"),
            _Spec((B, Hkv, g, splits), "float32"), 0.088, 0, 0, 0, 0, 0, B, Hq, Hkv, Sk,
            D, TN, tile_size, g, qg, splits)
    sp2 = tg.next_power_of_2(splits)
    red = (_Spec((B, Hq, splits, D), "float16"), _Spec((B, Hq, splits), "float32"),
           _Spec((B, Hq, D), "float16"), B, Sk, Hq, D, splits, sp2, 128, sp2 >= 16)
    return {"splits": splits, "tilegym.split": _facts(tg._attention_decode_kernel_grouped, args),
            "tilegym.reduce": _facts(tg._splitk_reduce_kernel, red)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {}
    for label, B, Hq, Hkv, Sk in SHAPES:
        res[label] = {name: ours(B, Hq, Hkv, Sk, t) for name, t in OURS.items()}
        res[label]["tilegym"] = tilegym(B, Hq, Hkv, Sk)
        for name, r in res[label].items():
            for kn, f in r.items():
                if isinstance(f, dict):
                    print(f"{label:15s} {name:8s} {kn:16s} regs {f['registers']:3d} x "
                          f"{f['threads']:3d} smem {f['shared_bytes']:6d} stack "
                          f"{f['stack_bytes']:4d} ins {f['total']:5d} loops {f['loops']}",
                          flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
