"""spak run --dump's file format round-trips through tools/agree_replay.py (no GPU needed)."""
import importlib.util
from pathlib import Path

import numpy as np

from spak.device.agreement import dump_slice
from spak.cpu.simrun import simulate_fmha

_spec = importlib.util.spec_from_file_location(
    "agree_replay", Path(__file__).resolve().parents[1] / "tools" / "agree_replay.py")
agree_replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agree_replay)


def test_a_dumped_slice_replays_and_a_flipped_bit_is_found(tmp_path):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 1, 40, 64)).astype(np.float16) for _ in range(3))
    tiles = {"TILE_M": 64, "TILE_N": 64}
    out, _ = simulate_fmha("fused", q, k, v, causal=True, scale=0.125, tiles=tiles)
    gpu = out.copy()
    gpu.view(np.uint16)[0, 0, 3, 5] ^= 1                    # one element one ulp off
    dump = {}
    dump_slice(dump, "fused|1x1x40x64/causal/fp16", {"q": q, "k": k, "v": v, "gpu": gpu},
               {"scale": 0.125, "causal": True, "dtype": "fp16", "tiles": tiles})
    path = tmp_path / "dump.npz"
    np.savez_compressed(path, **{k: v for k, v in dump.items() if not k.startswith("_")})
    items = agree_replay.load(path)
    assert len(items) == 1 and items[0]["tiles"] == tiles
    r = agree_replay.replay(items[0], "sm_90")
    assert r["elements"] == 40 * 64
    assert r["bit"] == 1 - 1 / (40 * 64) and r["ulp"] == 1
    assert agree_replay.main([str(path)]) == 1             # not all identical: exit 1
