"""The tuned-config store: choosing entries from sweep results, the round trip through
spak.tune.store.lookup (what spak.fmha reads), and the bucket rule."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spak.tune import choose as store

from spak.tune import store as tuned

ROOT = Path(__file__).resolve().parents[1]
GPU = "NVIDIA H100 80GB HBM3"


def row(case_S, cid, tflops, *, D=64, causal=False, status="ok", gpu=GPU, default=False,
        occ=None, ctas=None, tm=None, tn=None, dtype="fp16", date="2026-11-22T01:00:00Z"):
    B = max(1, 16384 // case_S)
    if tm is None:
        tm, tn = (int(x) for x in cid.split("/")[0].split("x")) if not default else (64, 64)
    return {"schema": "spak.sweep/1", "kind": "result", "gpu": gpu, "kernel": "fused",
            "case": f"{B}x{2048 // D}x{case_S}x{D}/{dtype}/{'causal' if causal else 'noncausal'}",
            "B": B, "Hq": 2048 // D, "Hkv": 2048 // D, "Sq": case_S, "Sk": case_S, "D": D,
            "dtype": dtype, "causal": causal,
            "provider": "spak-fused-default" if default else "spak-fused",
            "config_id": "default" if default else cid,
            "config": {"TILE_M": tm, "TILE_N": tn, "occupancy": occ, "num_ctas": ctas},
            "status": status, "tflops": tflops if status == "ok" else None, "date": date,
            "commit": "c0ffee", "sweep_id": "s1"}


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_choose_scores_by_geomean_and_default_competes():
    rows = [row(1000, "64x128/o2", 400, tn=128, occ=2), row(1024, "64x128/o2", 300, tn=128, occ=2),
            row(1000, "128x64/o1", 350, occ=1), row(1024, "128x64/o1", 350, occ=1),
            row(1000, "x", 200, default=True), row(1024, "x", 200, default=True),
            # measured on one shape only: cannot win a two-shape bucket
            row(1000, "64x64/o1", 900, occ=1),
            # failures never compete
            row(1000, "128x128/o2", None, status="timeout", occ=2),
            row(1024, "128x128/o2", None, status="timeout", occ=2)]
    (e,) = store.choose(rows)
    assert e["seq_bucket"] == 1024 and e["head_dim"] == 64 and not e["causal"]
    # geomean(400, 300) = 346.4 < geomean(350, 350) = 350
    assert e["tiles"] == {"TILE_M": 128, "TILE_N": 64, "occupancy": 1}
    assert e["tflops"] == 350.0 and e["default_tflops"] == 200.0
    assert e["speedup_vs_default"] == 1.75 and e["commit"] == "c0ffee"
    assert e["cases"] == sorted({r["case"] for r in rows[:2]}) and e["date"] == "2026-11-22"
    # the default tiles win when nothing beats them; hints-free configs only with tiles_only
    rows2 = [row(4096, "x", 500, default=True), row(4096, "64x64/o2", 450, occ=2)]
    (d,) = store.choose(rows2)
    assert d["tiles"] == {"TILE_M": 64, "TILE_N": 64} and d["config_id"].startswith("default")
    (t,) = store.choose(rows[:6], tiles_only=True)
    assert t["config_id"].startswith("default")


def test_update_store_round_trip_and_lookup_rule(tmp_path, monkeypatch):
    res = write(tmp_path / "sweep.jsonl", [
        row(512, "64x64/o1", 300, occ=1), row(512, "x", 250, default=True),
        row(4096, "128x128/o2", 500, tm=128, tn=128, occ=2),
        row(16384, "64x128", 520, tn=128),
        row(4096, "64x128/c2", 600, D=128, causal=True, tn=128, ctas=2),
        row(4096, "64x64/o1", 100, gpu="NVIDIA H200", occ=1)])
    path = tmp_path / "tuned.json"
    lines = store.update_store([res], path)
    assert lines[-1].startswith("wrote 5 entries")
    doc = json.loads(path.read_text())
    assert doc["version"] == tuned.FORMAT_VERSION and len(doc["configs"]) == 5
    assert all(e["source"].endswith("sweep.jsonl") for e in doc["configs"])

    def look(*a, **kw):
        return tuned.lookup(*a, path=path, strict=True, **kw)
    # exact bucket; hints come back with the tiles
    assert look(GPU, "fused", "fp16", 64, False, 4096) == \
        {"TILE_M": 128, "TILE_N": 128, "occupancy": 2}
    # same bucket for Sk = 3000 (bucket 4096); torch-style dtype names
    assert look(GPU, "fused", "float16", 64, False, 3000)["TILE_M"] == 128
    # nearest bucket in log2: 600 -> 1024, nearest 512 (one step) over 4096 (two)
    assert look(GPU, "fused", "fp16", 64, False, 600) == {"TILE_M": 64, "TILE_N": 64,
                                                          "occupancy": 1}
    # a tie: the store has buckets 512, 4096 and 16384; 8192 is one step from 4096 and one
    # from 16384 -> the larger bucket wins
    assert look(GPU, "fused", "fp16", 64, False, 8192) == {"TILE_M": 64, "TILE_N": 128}
    assert look(GPU, "fused", "fp16", 64, False, 1 << 20) == {"TILE_M": 64, "TILE_N": 128}
    assert look(GPU, "fused", "fp16", 64, False, 1)["TILE_M"] == 64      # bucket 128 -> 512
    # other keys must match exactly
    assert look(GPU, "fused", "fp16", 128, False, 4096) is None
    assert look(GPU, "fused", "bf16", 64, False, 4096) is None
    assert look(GPU, "naive", "fp16", 64, False, 4096) is None
    # no entry for this GPU: a sibling's (same arch per spak.device.archs), never another arch's
    assert look("NVIDIA H100 PCIe", "fused", "fp16", 64, False, 4096) in (
        {"TILE_M": 128, "TILE_N": 128, "occupancy": 2}, {"TILE_M": 64, "TILE_N": 64,
                                                          "occupancy": 1})
    assert look("NVIDIA GeForce RTX 5070", "fused", "fp16", 64, False, 4096) is None
    assert look("Some Unknown GPU", "fused", "fp16", 64, False, 4096) is None
    assert look("NVIDIA H200", "fused", "fp16", 64, False, 4096) == {"TILE_M": 64, "TILE_N": 64,
                                                                     "occupancy": 1}
    assert look(GPU, "fused", "fp16", 128, True, 4096) == {"TILE_M": 64, "TILE_N": 128,
                                                           "num_ctas": 2}
    # the default path: $SPAK_TUNED_CONFIGS points spak.fmha's lookup at this store
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(path))
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 512) == {"TILE_M": 64, "TILE_N": 64,
                                                                  "occupancy": 1}
    # a newer sweep replaces an entry, keeps the others
    res2 = write(tmp_path / "sweep2.jsonl", [row(4096, "64x64/o2", 700, occ=2,
                                                 date="2026-11-23T00:00:00Z")])
    lines = store.update_store([res2], path)
    assert any("was 128x128/o2" in ln for ln in lines)
    doc = json.loads(path.read_text())
    assert len(doc["configs"]) == 5
    assert look(GPU, "fused", "fp16", 64, False, 4096) == {"TILE_M": 64, "TILE_N": 64,
                                                           "occupancy": 2}


def test_dry_run_and_empty_results(tmp_path):
    path = tmp_path / "t.json"
    res = write(tmp_path / "r.jsonl", [row(512, "64x64", 10, status="crash")])
    assert store.update_store([res], path) == ["no ok results to choose from: store unchanged"]
    assert not path.exists()
    res = write(tmp_path / "r2.jsonl", [row(512, "64x64", 10)])
    assert "[new]" in store.update_store([res], path, dry_run=True)[0]
    assert not path.exists()


def test_shipped_store_is_valid():
    doc = tuned.load_store(tuned.DEFAULT_PATH)
    assert doc["version"] == tuned.FORMAT_VERSION
    for e in doc["configs"]:                  # every "..._bucket" key field is a bucket
        for f in tuned.key_fields(tuned.entry_family(e)) or ():
            if f == "seq_bucket":
                assert tuned.seq_bucket(e[f]) == e[f]
            assert e.get(f) is not None, (f, e)


def test_store_cli(tmp_path):
    res = write(tmp_path / "r.jsonl", [row(2048, "64x128", 321, tn=128)])
    path = tmp_path / "t.json"
    env = {"PYTHONPATH": str(ROOT)}

    def cli(*a):
        return subprocess.run([sys.executable, "-m", "spak", "store", "--store", str(path), *a],
                              capture_output=True, text=True, cwd=ROOT,
                              env={**__import__("os").environ, **env})
    r = cli("update", str(res))
    assert r.returncode == 0 and "wrote 1 entries" in r.stdout, r.stderr
    r = cli("show")
    assert "64x128" in r.stdout and "321.0" in r.stdout
    r = cli("lookup", GPU, "fused", "fp16", "64", "no", "2000")
    assert r.stdout.startswith("64x128")
    r = cli("lookup", GPU, "fused", "fp16", "64", "yes", "2000")
    assert r.stdout.startswith("none")
    path.write_text("{not json")
    r = cli("show")
    assert r.returncode == 1 and "cannot read" in r.stderr
    r = cli("update", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2


@pytest.mark.parametrize("n, b", [(0, 128), (1, 128), (128, 128), (129, 256), (1000, 1024),
                                  (1024, 1024), (1025, 2048), (16384, 16384)])
def test_buckets(n, b):
    assert tuned.seq_bucket(n) == b


# ------------------------------------------------------------------ kernel families

def _toy_family(monkeypatch):
    """A second family with its own tile keys (as a backward's), registered for the test."""
    import types
    from spak import families
    from spak.families.fmha_fwd import FmhaForward

    class Toy(FmhaForward):
        name = "toy_bwd"
        space_keys = ("DKV_TILE_M", "DKV_TILE_N", "DQ_TILE_M", "DQ_TILE_N", "occupancy")
        sweep_plan = ""
        sweep_fallback = {}
        sweep_peers = ()

        def default_config(self, problem, arch="sm_90"):
            return {"DKV_TILE_M": 64, "DKV_TILE_N": 64, "DQ_TILE_M": 64, "DQ_TILE_N": 64}

        def knob_keys(self):
            return ()

        def compile_unit(self, kernel, problem, config, config_id):
            return None
    mod = types.ModuleType("spak_test_toy_family")
    mod.FAMILY = Toy()
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(families.MODULES, "toy_bwd", mod.__name__)
    return mod.FAMILY


def test_version_1_files_read_as_version_2_and_the_forward_keeps_their_key(tmp_path):
    from spak.families.fmha_fwd import FAMILY
    assert tuned.V1_FIELDS == FAMILY.store_fields         # what a version-1 entry is filed under
    # a version-1 file: the committed store's forward entries as SPAK wrote them before
    # families (the committed file itself may be either version)
    committed = tuned.load_store(tuned.DEFAULT_PATH)["configs"]
    v1 = [{k: v for k, v in e.items() if k != "family"} for e in committed
          if e.get("family", tuned.DEFAULT_FAMILY) == tuned.DEFAULT_FAMILY]
    assert v1
    p = tmp_path / "v1.json"
    p.write_text(json.dumps({"version": 1, "configs": v1}))
    doc = tuned.load_store(p)
    assert doc["version"] == 2 and doc["configs"] == v1
    assert tuned.FORMAT_VERSION == 2 and tuned.READ_VERSIONS == (1, 2)


def test_a_family_field_in_a_version_1_file_is_an_error(tmp_path):
    e = tuned.make_entry(GPU, "fused", "fp16", 64, False, 4096, {"TILE_M": 64, "TILE_N": 64})
    p = write(tmp_path / "s.json", [])
    p.write_text(json.dumps({"version": 1, "configs": [{**e, "family": "fmha_fwd"}]}))
    with pytest.raises(tuned.TunedStoreError, match="configs\\[0\\].family"):
        tuned.load_store(p)
    p.write_text(json.dumps({"version": 2, "configs": [{**e, "family": 7}]}))
    with pytest.raises(tuned.TunedStoreError, match="configs\\[0\\].family"):
        tuned.load_store(p)


def test_families_are_filed_apart(tmp_path, monkeypatch):
    toy = _toy_family(monkeypatch)
    fwd = [row(4096, "64x64/o1", 300, occ=1), row(4096, "x", 250, default=True)]
    bwd = [{**r, "family": "toy_bwd", "config_id": cid, "tflops": tf,
            "config": {"DKV_TILE_M": 64, "DKV_TILE_N": n, "DQ_TILE_M": 64, "DQ_TILE_N": 64,
                       "occupancy": None}}
           for r, cid, tf, n in ((row(4096, "64x64", 1), "DKV64x128/DQ64x64", 150, 128),
                                 (row(4096, "64x64", 1), "DKV64x64/DQ64x64", 120, 64))]
    res = write(tmp_path / "r.jsonl", fwd + bwd)
    path = tmp_path / "t.json"
    lines = store.update_store([res], path)                 # the default family: fwd rows only
    assert len(lines) == 2 and "toy_bwd" not in lines[0]
    lines = store.update_store([res], path, family="toy_bwd")
    assert lines[0].startswith(f"{GPU} toy_bwd fused") and "DKV64x128/DQ64x64" in lines[0]
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and [e["family"] for e in doc["configs"]] == \
        ["fmha_fwd", "toy_bwd"]
    look = dict(path=path, strict=True)
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 4096, **look) == \
        {"TILE_M": 64, "TILE_N": 64, "occupancy": 1}
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 4096, family="toy_bwd", **look) == \
        {"DKV_TILE_M": 64, "DKV_TILE_N": 128, "DQ_TILE_M": 64, "DQ_TILE_N": 64}
    key = toy.store_key(toy.parse("1x4x3000x64/fp16/noncausal"))
    assert tuned.lookup_key("toy_bwd", GPU, "fused", key, **look)["DKV_TILE_N"] == 128
    assert tuned.lookup_key("toy_bwd", GPU, "fused", {**key, "causal": True}, **look) is None
    # a newer forward sweep replaces the forward's entry only
    store.update_store([write(tmp_path / "r2.jsonl", [row(4096, "128x64/o2", 900, occ=2)])],
                       path)
    doc = json.loads(path.read_text())
    assert len(doc["configs"]) == 2 and doc["configs"][1]["tiles"]["DKV_TILE_N"] == 128
    assert "toy_bwd" not in store.format_store(doc) and "DKV64x128" in \
        store.format_store(doc, "toy_bwd")


def test_min_gain_keeps_the_default_on_a_near_tie_and_negative_knobs_are_absent():
    rows = [row(2048, "64x128/o2", 102, tn=128, occ=2), row(2048, "x", 100, default=True)]
    assert store.choose(rows)[0]["tiles"]["TILE_N"] == 128              # any margin wins
    e = store.choose(rows, min_gain=0.03)[0]
    assert e["config_id"].startswith("default") and e["tiles"]["TILE_N"] == 64
    assert store.choose(rows, min_gain=0.01)[0]["tiles"]["TILE_N"] == 128
    auto = row(2048, "x", 100, default=True)
    auto["config"]["KT_FORM"] = -1            # a planner's "choose for me" knob
    assert "KT_FORM" not in store.choose([auto])[0]["tiles"]
