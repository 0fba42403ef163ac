"""spak.fmha_kvcache's tiles from the tuned-config store (the fmha_decode family's entries,
what `spak sweep --family fmha_decode --update-store` files): found for the GPU and the
problem class, else the defaults; a rewritten store is read again. CPU only: the lookup is
the pure function the op body calls."""
import pytest

from spak import families
from spak.gpu.plan_decode import default_decode_tiles
from spak.kvcache import decode_tiles
from spak.tune import store as tuned

GPU = "NVIDIA H100 80GB HBM3"


def _store(tmp_path, monkeypatch, tiles, **key):
    fam = families.get("fmha_decode")
    problem = fam.parse(key.pop("shape"))
    entry = {"gpu": GPU, "family": "fmha_decode", "kernel": "splitkv",
             **fam.store_key(problem), "tiles": tiles, "date": "2026-11-24", "source": "test"}
    path = tmp_path / "store.json"
    tuned.write_store({"version": tuned.FORMAT_VERSION, "configs": [entry]}, path)
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(path))
    return path


def test_store_entry_is_used_for_its_problem_class(tmp_path, monkeypatch):
    _store(tmp_path, monkeypatch, {"TILE_N": 64, "MAX_ROWS": 32, "num_splits": 0,
                                    "occupancy": 1}, shape="8x32:8x1:8192x128")
    # same class (dtype fp16, D 128, group 4, Sq 1, contiguous): another batch and length
    assert decode_tiles(GPU, "torch.float16", 128, 4, 1, False) == {"TILE_N": 64, "MAX_ROWS": 32}
    default = {k: default_decode_tiles(128)[k] for k in ("TILE_N", "MAX_ROWS")}
    assert default != {"TILE_N": 64, "MAX_ROWS": 32}          # the test can tell them apart
    # another class, another GPU model: the defaults
    assert decode_tiles(GPU, "torch.float16", 128, 4, 4, False) == default
    assert decode_tiles(GPU, "torch.float16", 128, 4, 1, True) == default
    assert decode_tiles(GPU, "torch.bfloat16", 128, 4, 1, False) == default
    assert decode_tiles("NVIDIA GeForce RTX 5070", "torch.float16", 128, 4, 1, False) == default


def test_rewritten_store_is_read_again(tmp_path, monkeypatch):
    path = _store(tmp_path, monkeypatch, {"TILE_N": 64, "MAX_ROWS": 32, "num_splits": 0,
                                           "occupancy": 1}, shape="1x32:1x1:32768x128")
    assert decode_tiles(GPU, "fp16", 128, 32, 1, False)["MAX_ROWS"] == 32
    s = tuned.load_store(path)
    s["configs"][0]["tiles"]["MAX_ROWS"] = 16
    import os
    import time
    time.sleep(0.01)
    tuned.write_store(s, path)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))   # a new mtime, surely
    assert decode_tiles(GPU, "fp16", 128, 32, 1, False)["MAX_ROWS"] == 16


def test_no_store_entry_gives_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(tmp_path / "absent.json"))
    for D in (64, 128, 256):
        want = {k: default_decode_tiles(D)[k] for k in ("TILE_N", "MAX_ROWS")}
        assert decode_tiles(GPU, "fp16", D, 1, 1, False) == want
