"""sm_90: the row sum of a 16-row mma tile (the decode split kernel's [16, TILE_N] scores at
groups 5, 7, 12 and the power-of-two forms' 16-row tiles) runs in the order its SASS shows:
mma.sync over 4 warps that split the keys (warp w: n8 blocks w, w + 4, ..), two chains a
lane, the quad's butterflies, then the warps through shared memory (w0 + w2) + (w1 + w3)
(numerics.fragment_row_sum_m16_f32). Checked against an H200's split workspaces of the
padded mistral-large slice (results/issue33-h200-2026-11-28b/ws-probe): the float32 p rows
and rescale factors of 6 (head, split) pairs (the simulator's, bit-equal to the GPU's where
m and acc agree) and the GPU's final row sums l."""
import importlib.util
import io
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

import cuda.tile as ct
from spak.sim.fma import fma_f32
from spak.sim.numerics import fragment_row_sum_f32, fragment_row_sum_m16_f32, get_model
from spak.sim.tile import MMA_LAYOUT
from tests import tools

ROOT = Path(__file__).resolve().parents[1]

FIXTURE = ROOT / "results" / "issue33-h200-2026-11-28b" / \
    "ws-probe" / "l_rows_mistral.npz"


def _scalar_m16(row):
    """The SASS's order written out element by element (one row of N values)."""
    f = np.float32
    n = row.shape[0]
    warp_sums = []
    for w in range(4):
        quad = []
        for t in range(4):
            even, odd = f(0.0), f(0.0)
            for j in range(n // 32):
                base = 8 * (4 * j + w) + 2 * t          # n8 block 4j + w, lane t's columns
                even = f(even + row[base])
                odd = f(odd + row[base + 1])
            quad.append(f(odd + even))
        warp_sums.append(f(f(quad[0] + quad[2]) + f(quad[1] + quad[3])))
    return f(f(warp_sums[0] + warp_sums[2]) + f(warp_sums[1] + warp_sums[3]))


@pytest.mark.parametrize("n", [32, 64, 128])
def test_m16_order_is_the_sass_order(n):
    x = np.random.default_rng(n).standard_normal((16, n)).astype(np.float32) * 100
    got = fragment_row_sum_m16_f32(x)
    want = np.array([_scalar_m16(r) for r in x], np.float32)
    assert (got.view(np.uint32) == want.view(np.uint32)).all()
    # the test can fail: the former one-quad order differs on such data
    assert (fragment_row_sum_f32(x).view(np.uint32) != want.view(np.uint32)).any()


def test_only_16_row_tiles_take_it():
    x = np.random.default_rng(1).standard_normal((1, 64, 128)).astype(np.float32) * 100
    m = get_model("sm_90")
    s16 = m.sum(x[:, :16], -1, ct.float32, MMA_LAYOUT)
    assert (s16 == fragment_row_sum_m16_f32(x[:, :16])).all()
    s64 = m.sum(x, -1, ct.float32, MMA_LAYOUT)          # wgmma tiles: unchanged
    assert (s64 == fragment_row_sum_f32(x)).all()
    for name in ("sm_120", "sm_89"):                    # read from sm_90's SASS only
        s = get_model(name).sum(x[:, :16], -1, ct.float32, MMA_LAYOUT)
        assert (s == fragment_row_sum_f32(x[:, :16])).all()


def _l(d, i, rowsum):
    l = np.float32(0.0)
    for p, a in zip(d["p"][i], d["alpha"][i]):          # the kernel's l * alpha + sum(p)
        l = fma_f32(np.float32(l), np.float32(a), rowsum(p[None])[0])
    return np.float32(l)


def test_row_sums_match_the_h200_split_workspaces():
    d = np.load(FIXTURE)
    gpu = d["gpu_l"]
    assert np.isfinite(gpu).all() and (gpu > 1).all()
    new = np.array([_l(d, i, fragment_row_sum_m16_f32) for i in range(len(gpu))], np.float32)
    old = np.array([_l(d, i, fragment_row_sum_f32) for i in range(len(gpu))], np.float32)
    assert (old.view(np.uint32) == d["sim_l_before"].view(np.uint32)).all()   # the replay
    assert (new.view(np.uint32) == gpu.view(np.uint32)).all()
    assert (old.view(np.uint32) != gpu.view(np.uint32)).sum() == 4            # can fail


def _decode_split_sass(heads, pad):
    """SASS of the split kernel the plan launches for a fp16 D 128 decode (8 splits)."""
    from cuda.tile.compilation import export_kernel
    from spak.gpu.compile_decode import _signature, decode_launches
    tiles = {"TILE_N": 128, "MAX_ROWS": 64, "GROUP_PAD": pad}
    launch = decode_launches(dtype="fp16", head_dim=128, causal=False, heads=heads, splits=8,
                             tiles=tiles)[0]
    buf = io.BytesIO()
    export_kernel(launch.kernel, [_signature(launch.kernel, launch.args)], buf,
                  gpu_code="sm_90", output_format="cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(buf.getvalue())
        f.flush()
        out = subprocess.run([tools.require("nvdisasm"), "-c", f.name], check=True,
                             capture_output=True, text=True).stdout
    return out.splitlines()


def _tracer():
    spec = importlib.util.spec_from_file_location("sass_trace_mma",
                                                  ROOT / "tools" / "sass_trace_mma.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("heads, pad", [((28, 4), 1), ((28, 4), 0), ((96, 8), 1)])
def test_the_cubin_still_sums_16_row_tiles_over_4_warps(heads, pad):
    """Padded group 7 (8 heads x 2 rows), its power-of-two form (1 head x 16 rows) and
    padded group 12 (16 heads): HMMA, no wgmma; a lane's row sum is two chains from +0
    over its 4 n8 blocks (of 16: the warps split the keys), then xor 2, xor 1; the warps'
    partials come back through shared memory and meet by xor 2, xor 1."""
    tools.require("nvdisasm")
    lines = _decode_split_sass(heads, pad)
    text = "\n".join(lines)
    assert "HMMA.16816.F32" in text and "HGMMA" not in text
    t = _tracer().run_trace(lines, head_dim=128, tile_n=128)
    lane = [re.sub(r"p[\d?]+\.", "x.", e) for _, op, _, e in t.ops
            if op.startswith("SHFL") and e.startswith("shfl2(") and re.search(r"p\d", e)]
    chains = "((((0 + x.{0}) + x.{0}) + x.{0}) + x.{0})"
    want = f"shfl2(({chains.format(1)} + {chains.format(0)}))"
    assert lane and all(e.replace("'", "") == want for e in lane), lane
    meet = re.compile(r"^\(\(shfl2\((L\d+\[0\])\) \+ \1\) \+ shfl1\(\(shfl2\(\1\) \+ \1\)\)\)$")
    assert any(meet.match(e) for _, op, _, e in t.ops if op.startswith("FADD"))


def test_32_row_order_is_the_sass_reading_and_on():
    """fragment_row_sum_m32_f32 (checked on an H200's split workspaces, so Sm90.row_warps_m32
    is on):
    rows 0-15 one chain a lane from its first value, rows 16-31 a pairwise tree, then the
    quad and the warps as for 16 rows."""
    from spak.sim.numerics import Sm90, fragment_row_sum_m32_f32
    f = np.float32
    x = np.random.default_rng(32).standard_normal((32, 128)).astype(np.float32) * 100

    def lane_vals(row, w, t):
        return [row[8 * (4 * j + w) + 2 * t + e] for j in range(4) for e in range(2)]

    def chain(v):
        acc = v[0]
        for y in v[1:]:
            acc = f(acc + y)
        return acc

    def tree(v):
        while len(v) > 1:
            v = [f(v[i] + v[i + 1]) for i in range(0, len(v), 2)]
        return v[0]
    want = []
    for r, row in enumerate(x):
        lane = chain if r < 16 else tree
        ws = []
        for w in range(4):
            q = [lane(lane_vals(row, w, t)) for t in range(4)]
            ws.append(f(f(q[0] + q[2]) + f(q[1] + q[3])))
        want.append(f(f(ws[0] + ws[2]) + f(ws[1] + ws[3])))
    got = fragment_row_sum_m32_f32(x)
    assert (got.view(np.uint32) == np.array(want, np.float32).view(np.uint32)).all()
    assert Sm90.row_warps_m32 is True
    s = get_model("sm_90").sum(x[None], -1, ct.float32, MMA_LAYOUT)[0]
    assert (s.view(np.uint32) == got.view(np.uint32)).all()     # the model uses it
    assert not (s == fragment_row_sum_f32(x)).all()    # and it is not section 10's order
