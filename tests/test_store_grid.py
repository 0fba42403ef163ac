"""Small-grid entries of the tuned store ("max_rows"): the lookup by query rows, what
spak.fmha passes, and the back-compatibility of files that have them."""
import json

import pytest

from spak.tune import store as tuned

GPU = "NVIDIA H100 80GB HBM3"


def _store(tmp_path, entries, version=2):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"version": version, "configs": entries}))
    return p


def _entries():
    general = tuned.make_entry(GPU, "fused", "fp16", 64, False, 512,
                               {"TILE_M": 64, "TILE_N": 64, "occupancy": 4, "num_ctas": 1})
    small = tuned.make_entry(GPU, "fused", "fp16", 64, False, 512,
                             {"TILE_M": 64, "TILE_N": 128, "occupancy": 2, "num_ctas": 1},
                             max_rows=8448)
    other = tuned.make_entry(GPU, "fused", "fp16", 64, False, 2048,
                             {"TILE_M": 128, "TILE_N": 128, "occupancy": 4, "num_ctas": 1})
    return general, small, other


@pytest.mark.parametrize("rows,want", [(None, 64), (1, 128), (4096, 128), (8448, 128),
                                       (8449, 64), (32 * 32 * 512, 64)])
def test_lookup_by_rows(tmp_path, rows, want):
    p = _store(tmp_path, list(_entries()))
    t = tuned.lookup(GPU, "fused", "fp16", 64, False, 512, path=p, rows=rows, strict=True)
    assert t["TILE_N"] == want


def test_the_bucket_comes_before_the_grid(tmp_path):
    """A small grid of another bucket does not take the small-grid entry of bucket 512
    when its own bucket has a general entry; a bucket without entries takes the nearest,
    where the small-grid entry wins the tie."""
    p = _store(tmp_path, list(_entries()))
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 2048, path=p, rows=4096)["TILE_M"] == 128
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 256, path=p, rows=4096)["TILE_N"] == 128
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 256, path=p, rows=10 ** 6)["TILE_N"] == 64


def test_only_a_small_grid_entry_serves_no_big_problem(tmp_path):
    _, small, _ = _entries()
    p = _store(tmp_path, [small])
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 512, path=p, rows=10 ** 6) is None
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 512, path=p) is None
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 512, path=p, rows=10)["TILE_N"] == 128


def test_keys_upsert_and_old_readers(tmp_path):
    general, small, _ = _entries()
    assert tuned.entry_key(small) == tuned.entry_key(general) + (("max_rows", 8448),)
    store = {"version": 2, "configs": [general, small]}
    newer = dict(general, tiles={"TILE_M": 128, "TILE_N": 128})
    store = tuned.upsert(store, newer)          # replaces the general entry only
    assert small in store["configs"] and newer in store["configs"] and len(store["configs"]) == 2
    # a reader without the rule takes the first candidate: the sorted file has the general
    # entry (the shorter key) first
    from spak.tune.choose import _sort_key
    assert sorted([small, general], key=_sort_key)[0] is general
    # version-1 files may carry it too (it is not a family field)
    p = _store(tmp_path, [general, small], version=1)
    assert len(tuned.load_store(p)["configs"]) == 2


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8448"])
def test_bad_max_rows_is_reported(tmp_path, bad):
    general, small, _ = _entries()
    p = _store(tmp_path, [general, dict(small, max_rows=bad)])
    with pytest.raises(tuned.TunedStoreError, match="max_rows"):
        tuned.load_store(p)
    with pytest.warns(RuntimeWarning):
        assert tuned.lookup(GPU, "fused", "fp16", 64, False, 512, path=p, rows=5) is None


def test_resolve_tiles_passes_rows(monkeypatch, tmp_path):
    """spak.fmha's resolve_tiles with the problem's rows (device info stubbed: no GPU)."""
    import torch
    from spak import api
    p = _store(tmp_path, list(_entries()))
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(p))
    monkeypatch.setattr(api, "_device_info", lambda device: ("sm_90", GPU))
    api._lookup_cache.clear()
    small = api.resolve_tiles("fused", torch.float16, 64, False, 512, "cuda", rows=2 * 8 * 512)
    big = api.resolve_tiles("fused", torch.float16, 64, False, 512, "cuda", rows=32 * 32 * 512)
    none = api.resolve_tiles("fused", torch.float16, 64, False, 512, "cuda")
    assert (small["TILE_N"], small["occupancy"]) == (128, 2)
    assert (big["TILE_N"], big["occupancy"]) == (64, 4) and none == big
    api._lookup_cache.clear()


def test_the_backward_looks_up_its_tuned_entry(monkeypatch, tmp_path):
    """spak.fmha's backward takes the fmha_bwd store entry of the GPU (tiles and hints, by
    dtype, head dim, causal and key-length bucket); none: the defaults (None, None)."""
    from types import SimpleNamespace
    from spak import api
    cfg = {"DKV_TILE_M": 32, "DKV_TILE_N": 128, "DQ_TILE_M": 128, "DQ_TILE_N": 64,
           "occupancy": 1, "num_ctas": 1}
    e = tuned.make_entry(GPU, "fused", "bf16", 128, True, 8192, cfg, family="fmha_bwd")
    fwd = tuned.make_entry(GPU, "fused", "bf16", 64, True, 8192, {"TILE_M": 128,
                                                                   "TILE_N": 64})
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(_store(tmp_path, [e, fwd])))
    monkeypatch.setattr(api, "_device_info", lambda device: ("sm_90", GPU))
    import torch
    cuda = SimpleNamespace(type="cuda", index=0)
    api._bwd_cache.clear()
    tiles, hints = api._bwd_config(cuda, torch.bfloat16, 128, True, 8000)
    assert tiles == {k: cfg[k] for k in ("DKV_TILE_M", "DKV_TILE_N", "DQ_TILE_M", "DQ_TILE_N")}
    assert hints == {"occupancy": 1, "num_ctas": 1}
    # another dtype, head dim or causal flag: no entry; the forward's entry is not taken
    assert api._bwd_config(cuda, torch.float16, 128, True, 8000) == (None, None)
    assert api._bwd_config(cuda, torch.bfloat16, 64, True, 8000) == (None, None)
    assert api._bwd_config(SimpleNamespace(type="cpu", index=None), torch.bfloat16, 128, True,
                           8000) == (None, None)
    api._bwd_cache.clear()


def test_keys_off_the_16_grid_take_a_config_that_does_not_spill(monkeypatch, tmp_path):
    """spak.fmha at D <= 64 with 128 x 128 tiles and Sk % 16 != 0: 64 query rows at
    occupancy 2 (the 128-row cubin spills there); aligned lengths, other head dims, other
    tiles, other archs and explicit tiles keep their config."""
    import torch
    from spak import api
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(_store(tmp_path, [])))
    monkeypatch.setattr(api, "_device_info", lambda device: ("sm_90", GPU))
    api._lookup_cache.clear()
    r = lambda D, causal, Sk, tiles=None: api.resolve_tiles(   # noqa: E731
        "fused", torch.float16, D, causal, Sk, "cuda", tiles)
    assert r(64, False, 1024) == {"TILE_M": 128, "TILE_N": 128}
    assert r(64, False, 1000) == {"TILE_M": 64, "TILE_N": 128, "occupancy": 2}
    assert r(64, False, 8191) == {"TILE_M": 64, "TILE_N": 128, "occupancy": 2}
    assert r(64, True, 1000) == {"TILE_M": 128, "TILE_N": 64}          # no spill: kept
    assert r(64, False, 100) == {"TILE_M": 128, "TILE_N": 128}         # one key tile: kept
    assert r(128, False, 1000) == {"TILE_M": 64, "TILE_N": 128}
    assert r(64, False, 1000, {"TILE_M": 128}) == {"TILE_M": 128, "TILE_N": 128}
    assert api.off_grid_config({"TILE_M": 128, "TILE_N": 128}, 64, 1000, "sm_120") == \
        {"TILE_M": 128, "TILE_N": 128}
    api._lookup_cache.clear()
