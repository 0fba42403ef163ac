"""`spak report` from a synthetic results file: markdown, PNGs, leaderboard, --check."""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

import spak.cli.report as report
from spak.report.load import load_rows, sections
from spak.report.tables import markdown

GPU = "NVIDIA H100 80GB HBM3"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(S, D, causal, provider, cid, tflops, *, status="ok", cfg=None, commit="1111111",
         error=None):
    B, H = 16384 // S, 2048 // D
    case = f"{B}x{H}x{S}x{D}/fp16/{'causal' if causal else 'noncausal'}"
    return {"schema": "spak.sweep/1", "kind": "result", "sweep_id": "s", "gpu": GPU,
            "arch": "sm_90", "commit": commit, "date": "2026-11-22T03:00:00Z",
            "kernel": "fused", "case": case, "shape": f"{B}x{H}x{S}x{D}", "B": B, "Hq": H,
            "Hkv": H, "Sq": S, "Sk": S, "D": D, "dtype": "fp16", "causal": causal,
            "flops": 4.0 * B * H * S * S * D / (2 if causal else 1), "provider": provider,
            "config_id": cid, "config": cfg, "status": status,
            "tflops": tflops if status == "ok" else None, "error": error}


def synthetic(scale=1.0, commit="1111111") -> list[dict]:
    rows = [{"schema": "spak.sweep/1", "kind": "start", "sweep_id": "s", "gpu": GPU}]
    for D in (64, 128):
        for causal in (False, True):
            for S in (512, 2048, 8192):
                base = 300 + S / 100 + D
                rows.append(_row(S, D, causal, "sdpa-cudnn", "-", base))
                rows.append(_row(S, D, causal, "sdpa-flash", "-", base * 0.7))
                rows.append(_row(S, D, causal, "spak-fused-default", "default", base * 0.9,
                                 cfg={"TILE_M": 64, "TILE_N": 64 if D == 64 else 128,
                                      "occupancy": None, "num_ctas": None}))
                for tm in (64, 128):
                    for tn in (64, 128):
                        for occ in (1, 2):
                            cid = f"{tm}x{tn}/o{occ}"
                            cfg = {"TILE_M": tm, "TILE_N": tn, "occupancy": occ,
                                   "num_ctas": None}
                            if tm == 128 and tn == 128 and occ == 2:
                                rows.append(_row(S, D, causal, "spak-fused", cid, None,
                                                 status="compile_error", cfg=cfg,
                                                 error="TileCompilerError: too many registers"))
                                continue
                            tf = base * (0.8 + 0.1 * occ + (0.15 if (tm, tn) == (64, D) else 0))
                            rows.append(_row(S, D, causal, "spak-fused", cid, tf * scale,
                                             cfg=cfg, commit=commit))
    rows.append(_row(512, 64, False, "spak-fused", "64x64/o3", None, status="timeout",
                     cfg={"TILE_M": 64, "TILE_N": 64, "occupancy": 3, "num_ctas": None},
                     error="no result within --timeout 120 s"))
    rows.append({"schema": "spak.sweep/1", "kind": "end", "sweep_id": "s", "status": "complete"})
    return rows


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_report_markdown_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    res = _write(tmp_path / "sweep.jsonl", synthetic())
    out = tmp_path / "rep"
    lb = tmp_path / "lb.json"
    assert report.main([str(res), "--out-dir", str(out), "--leaderboard", str(lb),
                        "--update-leaderboard"]) == 0
    md = (out / "report.md").read_text()
    assert f"## {GPU} · kernel `fused` · fp16" in md
    # providers per shape, best config named, ratios and geomeans
    assert "| 32x32x512x64 | 64 | no | **" in md and "64x64/o2" in md
    assert "Geometric means: tuned/default" in md and "Tuned >= default tiles on 12/12" in md
    # configs x shapes per (D, causal), best starred, failures abbreviated
    assert "### Configs x shapes: D=64, non-causal" in md
    assert "| config | S=512 | S=2048 | S=8192 |" in md
    table = md.split("### Configs x shapes: D=64, non-causal")[1].split("###")[0]
    best_line = next(ln for ln in table.splitlines() if ln.startswith("| 64x64/o2 |"))
    assert best_line.count("★") == 3
    assert "| 128x128/o2 | CE | CE | CE |" in table
    assert next(ln for ln in table.splitlines() if ln.startswith("| 64x64/o3 |")).startswith(
        "| 64x64/o3 | TO |")
    assert table.index("| default (64x64) |") < table.index("| 64x64/o1 |") < \
        table.index("| 128x64/o1 |")
    assert "### Failures" in md and "too many registers" in md
    # leaderboard section with the commit
    assert "## Leaderboard" in md and "1111111" in md
    # plots exist, are PNGs, are linked
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(["tflops-nvidia-h100-80gb-hbm3-fused-fp16.png"] +
                          [f"heatmap-nvidia-h100-80gb-hbm3-fused-fp16-d{d}-{c}.png"
                           for d in (64, 128) for c in ("noncausal", "causal")])
    for name in pngs:
        w, h = _png_size(out / name)
        assert w > 400 and h > 200
        assert f"]({name})" in md
    doc = json.loads(lb.read_text())
    assert len(doc["entries"]) == 12 and all(e["commit"] == "1111111" for e in doc["entries"])


def test_leaderboard_check_passes_and_fails(tmp_path, capsys):
    lb = tmp_path / "lb.json"
    base = _write(tmp_path / "base.jsonl", synthetic())
    assert report.main([str(base), "--no-plots", "--out-dir", str(tmp_path / "r0"),
                        "--leaderboard", str(lb), "--update-leaderboard"]) == 0
    # 3% slower: within 5%
    ok = _write(tmp_path / "ok.jsonl", synthetic(scale=0.97, commit="2222222"))
    assert report.main(["--check", str(ok), "--tolerance", "0.05", "--leaderboard",
                        str(lb)]) == 0
    assert "PASS" in capsys.readouterr().out
    # 10% slower: a regression
    bad = _write(tmp_path / "bad.jsonl", synthetic(scale=0.9, commit="3333333"))
    assert report.main(["--check", str(bad), "--tolerance", "0.05", "--leaderboard",
                        str(lb)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "0.900x" in out and "1111111" in out
    # ... which a wider tolerance lets through
    assert report.main(["--check", str(bad), "--tolerance", "0.15", "--leaderboard",
                        str(lb)]) == 0
    # --check writes nothing; a faster run raises the leaderboard when merged
    before = lb.read_text()
    fast = _write(tmp_path / "fast.jsonl", synthetic(scale=1.2, commit="4444444"))
    assert report.main(["--check", str(fast), "--leaderboard", str(lb)]) == 0
    assert lb.read_text() == before
    assert report.main([str(fast), "--no-plots", "--out-dir", str(tmp_path / "r1"),
                        "--leaderboard", str(lb), "--update-leaderboard"]) == 0
    assert {e["commit"] for e in json.loads(lb.read_text())["entries"]} == {"4444444"}
    assert report.main(["--check", str(ok), "--leaderboard", str(lb)]) == 1
    # no leaderboard: a usage error, not a silent pass
    assert report.main(["--check", str(ok), "--leaderboard", str(tmp_path / "none.json")]) == 2


def test_missing_matplotlib_says_how_to_install(tmp_path, monkeypatch, capsys):
    res = _write(tmp_path / "s.jsonl", synthetic())
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib -> ImportError
    assert report.main([str(res), "--out-dir", str(tmp_path / "r"), "--leaderboard",
                        str(tmp_path / "lb.json")]) == 1
    err = capsys.readouterr().err
    assert 'pip install -e ".[report]"' in err and "--no-plots" in err
    assert report.main([str(res), "--out-dir", str(tmp_path / "r"), "--no-plots",
                        "--leaderboard", str(tmp_path / "lb.json")]) == 0
    assert (tmp_path / "r" / "report.md").exists()


def test_run_results_are_read_too(tmp_path):
    """`spak run` rows (spak.run/1) join the providers table and the leaderboard."""
    rows = []
    for prov, tf in (("spak-fused", 410.0), ("sdpa-cudnn", 450.0), ("sdpa-flash", 300.0)):
        rows.append({"schema": "spak.run/1", "gpu": GPU, "date": "2026-11-22T00:00:00Z",
                     "commit": "abc", "provider": prov, "kernel": "fused" if prov[0] == "s"
                     and prov.startswith("spak") else None, "case": "4x16x4096x128/fp16/causal",
                     "shape": "4x16x4096x128", "B": 4, "Hq": 16, "Hkv": 16, "Sq": 4096,
                     "Sk": 4096, "D": 128, "dtype": "fp16", "causal": True, "tflops": tf,
                     "passed": True, "error": None,
                     "tiles": {"TILE_M": 64, "TILE_N": 128} if prov == "spak-fused" else None})
    rows.append({"schema": "spak.run/1", "provider": "matmul-fp16-8192", "tflops": 700})
    res = _write(tmp_path / "run.jsonl", rows)
    loaded = load_rows([res])
    assert len(loaded) == 3
    secs = sections(loaded)
    (cases,) = secs.values()
    c = cases["4x16x4096x128/fp16/causal"]
    assert c["tuned"]["tflops"] == 410.0 and c["sdpa-cudnn"]["tflops"] == 450.0
    md = markdown(loaded, sources=["run.jsonl"], plots={}, leaderboard=None)
    assert "| 4x16x4096x128 | 128 | yes | **410.0** | run 64x128 |" in md
    assert "0.911" in md                                  # tuned / cuDNN


def test_later_rows_replace_earlier_ones(tmp_path):
    a = _row(512, 64, False, "spak-fused", "64x64/o1", None, status="timeout",
             cfg={"TILE_M": 64, "TILE_N": 64, "occupancy": 1, "num_ctas": None})
    b = dict(a, status="ok", tflops=123.0)
    res = _write(tmp_path / "x.jsonl", [a, b])
    (r,) = load_rows([res])
    assert r["status"] == "ok" and r["tflops"] == 123.0


# ------------------------------------------------------------------ families and old rows

def test_result_row_view_reads_old_and_new_rows():
    from spak.results.rows import ResultRow
    old = ResultRow({"schema": "spak.sweep/1", "kind": "result", "provider": "spak-fused",
                     "case": "1x2x64x64/fp16/noncausal", "status": "ok", "tflops": 12.5})
    assert old.command == "sweep" and old.family == "fmha_fwd" and old.is_spak
    assert old.measure("TFLOPS") == 12.5 and old["tflops"] == 12.5 and old.D is None
    assert ResultRow({"schema": "spak.sweep/2"}).command == "sweep"
    run = ResultRow({"schema": "spak.run/2", "family": "fmha_bwd", "provider": "sdpa-cudnn",
                     "tflops": 0, "gbps": 900.0})
    assert run.command == "run" and run.family == "fmha_bwd" and not run.is_spak
    assert run.value("TFLOPS") is None and run.value("GB/s") == 900.0
    assert run.measure("GB/s") is None                     # no status "ok": not a measurement
    assert ResultRow({"status": "timeout"}).ok is False and ResultRow({}).ok is True
    with pytest.raises(ValueError, match="unknown metric"):
        run.value("FLOP/J")


def test_sweep_rows_written_before_the_package_split_are_read(tmp_path):
    rows = synthetic()
    new = _write(tmp_path / "new.jsonl", rows)
    old = _write(tmp_path / "old.jsonl", [dict(r, schema="spak.sweep/1") for r in rows])
    md = [markdown(load_rows([p]), sources=["x"], plots={}, leaderboard=None)
          for p in (new, old)]
    assert md[0] == md[1] and "### Configs x shapes: D=64, non-causal" in md[0]


def _bwd(rows):
    """The same measurements as rows of the backward family."""
    return [dict(r, family="fmha_bwd") for r in rows if r.get("kind") == "result"]


def test_rows_of_several_families_are_reported_family_by_family(tmp_path, capsys):
    fwd = synthetic()
    bwd = [dict(r, tflops=r["tflops"] and r["tflops"] / 2) for r in _bwd(synthetic())]
    res = _write(tmp_path / "both.jsonl", fwd + bwd)
    loaded = load_rows([res])
    assert len(loaded) == 2 * len(_bwd(fwd))                  # same case, other family
    assert {k[1] for k in sections(loaded)} == {"fmha_fwd", "fmha_bwd"}
    lb = tmp_path / "lb.json"
    out = tmp_path / "r"
    assert report.main([str(res), "--no-plots", "--out-dir", str(out), "--leaderboard",
                        str(lb), "--update-leaderboard"]) == 0
    md = (out / "report.md").read_text()
    assert f"## {GPU} · fmha_fwd · kernel `fused` · fp16" in md
    assert f"## {GPU} · fmha_bwd · kernel `fused` · fp16" in md
    assert "| GPU | family | kernel |" in md
    entries = json.loads(lb.read_text())["entries"]
    fams = [e.get("family") for e in entries]
    assert fams.count(None) == 12 and fams.count("fmha_bwd") == 12   # forward: no field
    # --family keeps one family's rows; --check compares each family with its own entries
    assert report.main([str(res), "--no-plots", "--family", "fmha_bwd", "--out-dir",
                        str(tmp_path / "r2"), "--leaderboard", str(lb)]) == 0
    md2 = (tmp_path / "r2" / "report.md").read_text()
    assert "kernel `fused`" in md2 and "fmha_fwd ·" not in md2
    slower_bwd = _write(tmp_path / "slow.jsonl", [dict(r, tflops=r["tflops"] and
                                                       r["tflops"] * 0.8) for r in bwd])
    capsys.readouterr()
    assert report.main(["--check", str(slower_bwd), "--leaderboard", str(lb)]) == 1
    assert report.main(["--check", str(res), "--leaderboard", str(lb)]) == 0
    assert "24 shape(s)" in capsys.readouterr().out


def test_rows_of_an_unknown_family_are_skipped_with_a_warning(tmp_path, capsys):
    rows = [synthetic()[1], dict(synthetic()[1], family="fmha_nope")]
    (good,) = load_rows([_write(tmp_path / "x.jsonl", rows)])
    assert good.family == "fmha_fwd"
    assert "unknown kernel family 'fmha_nope'" in capsys.readouterr().err


def test_backward_runs_show_forward_plus_backward_rows(tmp_path):
    """`spak run --family fmha_bwd`'s fwd+bwd rows get a table of their own, the model
    named for a `--shapes train` shape, ratios and their geometric mean."""
    rows = []
    case, shape = "4x32:8x4096x128/fp16/causal", "4x32:8x4096x128"
    for prov, tf in (("spak-fused", 400.0), ("sdpa-cudnn", 500.0), ("sdpa-flash", 300.0),
                     ("fwd+bwd:spak-fused", 420.0), ("fwd+bwd:sdpa-cudnn", 480.0),
                     ("fwd+bwd:sdpa-flash", 350.0)):
        rows.append({"schema": "spak.run/2", "family": "fmha_bwd", "gpu": GPU,
                     "date": "2026-11-28T00:00:00Z", "commit": "abc", "provider": prov,
                     "kernel": "fused" if prov == "spak-fused" else None, "case": case,
                     "shape": shape, "B": 4, "Hq": 32, "Hkv": 8, "Sq": 4096, "Sk": 4096,
                     "D": 128, "dtype": "fp16", "causal": True, "tflops": tf, "passed": True,
                     "error": None, "tiles": {"DKV_TILE_M": 64, "DKV_TILE_N": 64,
                                              "DQ_TILE_M": 64, "DQ_TILE_N": 64}
                     if prov == "spak-fused" else None})
    loaded = load_rows([_write(tmp_path / "run.jsonl", rows)])
    assert len(loaded) == 6
    md = markdown(loaded, sources=["run.jsonl"], plots={}, leaderboard=None)
    assert "### Forward + backward" in md
    line = next(x for x in md.splitlines() if x.startswith(f"| {shape} | yes | Llama-3 8B"))
    assert "**420.0** | 480.0 | 350.0 | 0.875 | 1.200 |" in line
    assert "spak-fused/sdpa-cudnn 0.875x over 1 shapes" in md
    # the backward's own table is unchanged: 400 vs cuDNN 500
    assert "0.800" in md
