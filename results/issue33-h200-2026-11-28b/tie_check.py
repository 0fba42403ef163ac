"""Replay the one disagreeing decode slice of this run (mistral-large, padded `splitkv`,
fp16) in the simulator and print where and why it differs (no GPU).

    python results/issue33-h200-2026-11-28b/tie_check.py /path/to/dump_2.npz

The dump (7.7 MB: the slice's q, 16384-key K/V and the GPU's output) is not committed;
`spak run --dump` writes it. Runs the split launch and the combine of gpu.plan_decode
under the sm_90 model, keeps the split workspaces, and for each differing element
prints the splits' partial state, the combine's float32 value before the fp16
conversion and its distance from the nearest fp16 rounding midpoint (0x1000 in the low
13 bits = an exact tie). Output of the committed run: tie_check.txt.
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cuda.tile as ct                                   # noqa: E402
from spak import sim                                     # noqa: E402
from spak.gpu.plan_decode import plan_decode             # noqa: E402
from spak.sim.numerics import get_model                  # noqa: E402


def main(path):
    d = np.load(path)
    meta = json.loads(bytes(d["000/meta"]).decode())
    arr = {n: sim.SimArray(np.array(d["000/" + n]), ct.float16, name=n)
           for n in ("q", "k_cache", "v_cache")}
    gpu = d["000/gpu"]
    out = sim.SimArray(np.full(gpu.shape, np.nan, np.float16), ct.float16, name="Out")
    bufs = []

    def alloc(shape, kind):
        bufs.append(np.full(shape, np.nan, np.float32))
        return bufs[-1]
    launches = plan_decode(arr["q"], arr["k_cache"], arr["v_cache"], d["000/cache_seqlens"],
                           out, num_splits=meta["splits"], tiles=meta["tiles"], alloc=alloc)
    for L in launches:
        sim.launch(L.kernel, L.grid, L.args, model="sm_90")
    acc, mx, lx = bufs
    splits = mx.shape[-1]
    bad = np.argwhere(gpu.view(np.uint16) != out.data.view(np.uint16))
    print(f"{meta['case']}: {len(bad)} of {gpu.size} elements differ")
    model = get_model("sm_90")
    f32 = np.float32
    for b, i, h, c in bad:
        a = acc[b, i, h].reshape(splits, -1)[:, c]
        m, l = mx[b, i, h], lx[b, i, h]
        w = model.mufu_ex2((m - m.max()).astype(f32))
        # the combine of 2 splits: (x0 * w0) + (x1 * w1), the left product fused (FFMA)
        A = f32(np.float64(a[0]) * w[0] + np.float64(f32(a[1] * w[1])))
        Lr = f32(np.float64(l[0]) * w[0] + np.float64(f32(l[1] * w[1])))
        q = model.truediv(np.array([A]), np.array([Lr]), ct.float32,
                          ct.RoundingMode.APPROX, True)[0]
        bits = int(np.array([q], f32).view(np.uint32)[0])
        print(f"  (b {b}, q {i}, head {h}, column {c}): gpu {int(gpu[b, i, h, c].view(np.uint16)):#06x}"
              f" sim {int(out.data[b, i, h, c].view(np.uint16)):#06x}")
        print(f"    splits' m {m}, l {l}, acc {a}; weights {w}")
        print(f"    combined acc {A!r} (from {f32(a[0] * w[0])!r} and {f32(a[1] * w[1])!r}),"
              f" l {Lr!r}, acc / l {q!r}: float32 bits {bits:#010x}, low 13 bits"
              f" {bits & 0x1FFF:#06x} (0x1000: an exact fp16 tie)")
    assert splits == 2, "the combine above is written out for 2 splits"


if __name__ == "__main__":
    main(sys.argv[1])
