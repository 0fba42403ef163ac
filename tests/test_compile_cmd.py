"""`spak compile`: the plan's kernel variants compiled per arch with tileiras, on the CPU.

One real compile (a small variant for sm_120, a few seconds); the rest uses a fake
compiler to check selection, unsupported archs and exit statuses.
"""
from __future__ import annotations

import json

import pytest

import spak.cli as cli
import spak.device.compile_report as cc
from spak.recipe.schema import load_plan

ONE_VARIANT = """
schema = 1
name = "one"
title = "one small variant"

[targets.sm_90]
gpus = ["h100-sxm"]
[targets.sm_120]
gpus = ["rtx-5070"]
[targets.sm_89]
gpus = ["l4"]

[[steps]]
id = "fused"
title = "fused"
kind = "kernel"
kernel = "fused"
shapes = ["1x1x16x64/fp16/noncausal"]
[steps.gates.cpu]
rel_l2 = { fp16 = 1e-3, bf16 = 8e-3 }
[steps.gates.cpu.compile]
archs = ["sm_90", "sm_120", "sm_89"]
variants = [{ dtype = "fp16", head_dim = 64, causal = false, mask = false, tiles = { TILE_M = 32, TILE_N = 32 } }]
"""


@pytest.fixture
def one(tmp_path):
    p = tmp_path / "one.toml"
    p.write_text(ONE_VARIANT)
    return p


def fake_ok(item):
    return {**item, "tiles": item.get("tiles") or {"TILE_M": 64, "TILE_N": 64},
            "status": "ok", "ok": True, "seconds": 0.5, "cubin_bytes": 1000, "error": None,
            "kernels": []}


@pytest.mark.slow
def test_compiles_one_small_variant_for_real(one, tmp_path, capsys):
    pytest.importorskip("cuda.tile")
    out = tmp_path / "compile.json"
    rc = cli.main(["compile", "--plan", str(one), "--arch", "sm_120", "--json",
                   "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    assert doc == json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["ok"] and row["status"] == "ok" and row["arch"] == "sm_120"
    assert row["cubin_bytes"] > 10_000 and row["seconds"] > 0
    assert row["tiles"] == {"TILE_M": 32, "TILE_N": 32}
    assert "sm_120" in (doc["tileiras_archs"] or [])
    assert "1/1 variants compiled" in cap.err


def test_tileiras_lists_the_target_archs():
    archs, how = cc.supported_archs()
    if archs is None:
        pytest.skip(how)
    assert {"sm_89", "sm_90", "sm_120"} <= set(archs)


def test_plan_items_cover_every_variant_and_arch():
    plan = load_plan()
    items = cc.plan_items(plan, ["sm_90", "sm_120", "sm_89"])
    assert len(items) == 12           # 2 kernels x 2 variants x 3 archs
    assert {(i["kernel"], i["arch"]) for i in items} == {
        (k, a) for k in ("naive", "fused") for a in ("sm_90", "sm_120", "sm_89")}
    assert len(cc.plan_items(plan, ["sm_120"], ["fused"])) == 2
    sw = cc.sweep_items(plan, ["sm_90"])
    sp = plan.sweep_space("sm_90")
    assert len(sw) == 2 * 2 * len(sp.configs())        # x D 64/128 x causal or not
    assert {(i["head_dim"], i["causal"]) for i in sw} == {
        (d, c) for d in (64, 128) for c in (False, True)}
    # the hints travel with each config: they change the cubin
    assert {(i["hints"]["occupancy"], i["hints"]["num_ctas"]) for i in sw} == {
        (o, c) for o in sp.occupancy for c in sp.num_ctas}
    assert all(set(i["tiles"]) == {"TILE_M", "TILE_N"} for i in sw)


def _row(tiles, hints, regs, shared, blocks, code, d=128, causal=False, limited="registers"):
    return {"kernel": "fused", "arch": "sm_90", "dtype": "fp16", "head_dim": d,
            "causal": causal, "mask": False, "tiles": tiles, "hints": hints, "status": "ok",
            "ok": True, "seconds": 1.0, "cubin_bytes": 1000, "error": None,
            "kernels": [{"name": "fused", "registers": regs, "threads": 256,
                         "shared_bytes": shared, "stack_bytes": 0, "code_sha1": code,
                         "blocks_per_sm": blocks, "limited_by": limited}]}


def test_hint_findings_name_unmet_occupancy_and_identical_kernels():
    t = {"TILE_M": 64, "TILE_N": 128}
    rows = [_row(t, {"occupancy": 2, "num_ctas": 1}, 128, 83040, 2, "aa"),
            _row(t, {"occupancy": 3, "num_ctas": 1}, 128, 83040, 2, "aa"),
            _row(t, {"occupancy": 4, "num_ctas": 1}, 255, 83040, 1, "bb"),
            _row(t, {"occupancy": 4, "num_ctas": 1}, 64, 33880, 4, "cc", d=64),
            _row(t, {"occupancy": 2, "num_ctas": 1}, 128, 83040, 2, "aa", causal=True)]
    lines = cc.hint_findings(rows)
    text = "\n".join(lines)
    assert lines[0].startswith("hints")
    assert "occupancy 3 not met: fused fp16 D=128 noncausal 64x128/o3/c1 on sm_90 fits 2" in text
    assert "occupancy 4 not met: fused fp16 D=128 noncausal 64x128/o4/c1 on sm_90 fits 1" in text
    assert "D=64" not in text.split("same kernel")[0]          # 4 blocks: met
    assert "same kernel: fused fp16 D=128 noncausal on sm_90: 64x128/o2/c1, 64x128/o3/c1" in text
    assert text.count("same kernel") == 1     # the causal build is another variant
    assert cc.hint_findings(rows[3:4]) == []  # nothing to say


def test_the_table_shows_the_resources(capsys):
    row = _row({"TILE_M": 64, "TILE_N": 128}, {"occupancy": 3}, 128, 83040, 2, "aa")
    line = cc.format_row(row)
    assert "64x128/o3" in line and "2 (registers)" in line and " 81.1 " in line
    knob = _row({"TILE_M": 64, "TILE_N": 64, "LAT_K": 10}, {"occupancy": 4}, 64, 41040, 4, "x")
    assert "64x64/o4/LAT_K=10" in cc.format_row(knob)
    naive = {**row, "kernel": "naive", "kernels": [
        {**row["kernels"][0], "name": n} for n in ("naive.scores", "naive.softmax")]}
    assert cc.format_row(naive).count("2 (registers)") == 2


def test_unsupported_arch_is_reported_and_fails(one, monkeypatch, capsys):
    called = []
    monkeypatch.setattr(cc, "supported_archs", lambda *a, **k: (["sm_90", "sm_120"], "fake"))
    monkeypatch.setattr(cc, "_compile_one", lambda it: called.append(it["arch"]) or fake_ok(it))
    rc = cli.main(["compile", "--plan", str(one)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "sm_89: arch not supported by this tileiras" in out
    assert called == ["sm_90", "sm_120"]          # sm_89 was not attempted
    assert "UNSUPPORTED" in out and "2/3 variants compiled" in out


def test_a_failed_variant_fails_the_command(one, monkeypatch, capsys):
    def fail_89(item):
        r = fake_ok(item)
        if item["arch"] == "sm_89":
            r.update(ok=False, status="FAIL", error="TileCompileError: nope")
        return r
    monkeypatch.setattr(cc, "supported_archs", lambda *a, **k: (None, "fake"))
    monkeypatch.setattr(cc, "_compile_one", fail_89)
    assert cli.main(["compile", "--plan", str(one), "--arch", "sm_90,sm_89"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "TileCompileError: nope" in out
    monkeypatch.setattr(cc, "_compile_one", fake_ok)
    assert cli.main(["compile", "--plan", str(one), "--arch", "sm_90,sm_89"]) == 0


def test_usage_errors(one, capsys):
    with pytest.raises(SystemExit) as ei:
        cli.main(["compile", "--arch", "hopper"])
    assert ei.value.code == 2
    assert "not an arch such as sm_90" in capsys.readouterr().err
    assert cli.main(["compile", "--plan", str(one), "--kernel", "naive"]) == 2
    assert cli.main(["compile", "--plan", str(one), "--list"]) == 0


def _coded(item, code):
    return {**fake_ok(item), "kernels": [{"name": "fused", "code_sha1": code, "registers": 128,
                                          "threads": 256, "shared_bytes": 0, "stack_bytes": 0,
                                          "blocks_per_sm": 1, "limited_by": "registers"}]}


def test_same_code_as_passes_on_identical_code_and_fails_on_a_change(one, tmp_path,
                                                                     monkeypatch, capsys):
    monkeypatch.setattr(cc, "supported_archs", lambda *a, **k: (None, "fake"))
    before = tmp_path / "before.json"
    monkeypatch.setattr(cc, "_compile_one", lambda it: _coded(it, "c0de"))
    assert cli.main(["compile", "--plan", str(one), "--out", str(before)]) == 0
    capsys.readouterr()
    assert cli.main(["compile", "--plan", str(one), "--same-code-as", str(before)]) == 0
    assert "machine code of all 3 kernel(s) identical" in capsys.readouterr().out
    # one arch's code changes: named, and the command fails
    monkeypatch.setattr(cc, "_compile_one",
                        lambda it: _coded(it, "beef" if it["arch"] == "sm_120" else "c0de"))
    assert cli.main(["compile", "--plan", str(one), "--same-code-as", str(before)]) == 1
    out = capsys.readouterr().out
    assert "code changed: fused fp16 D=64 noncausal" in out and "on sm_120" in out
    assert out.count("code changed") == 1
    # a variant compiled now that the file lacks (another arch set) is not "identical"
    assert cc.code_changes([], json.loads(before.read_text())["rows"])[0].startswith("  new:")
