"""tools/decode_models_table.py (issue 33's README table) on rows made here: the best peer
is the fastest one that ran cleanly (a NaN or out-of-gate peer never counts), paged and
bf16 ratios pair cases that differ only there, a case in two files is a run-to-run pair,
and the README block is replaced between its markers only."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("decode_models_table",
                                                  ROOT / "tools" / "decode_models_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(case_over, provider, ms, **kw):
    base = {"family": "fmha_decode", "B": 8, "Hq": 28, "Hkv": 4, "Sq": 1, "Sk": 16384,
            "D": 128, "dtype": "fp16", "causal": False, "page": 0, "ragged": False,
            "lens": None, "model": "qwen2.5-7b", "gpu": "GPU", "date": "2026-11-28T00:00:00Z",
            "commit": "abc", "command": "spak run", "gate": 1e-3}
    base.update(case_over)
    case = f"{base['B']}x{base['Hq']}:{base['Hkv']}x{base['Sk']}x{base['D']}/" \
           f"{base['dtype']}/p{base['page']}"
    r = {**base, "case": case, "provider": provider, "rel_l2": 3e-4, "nonfinite": 0}
    if ms is not None:
        r.update(ms_median=ms, ms_p25=ms * 0.99, ms_p75=ms * 1.01, gb_per_s=1000.0 / ms)
    if provider.startswith("spak-"):
        r["passed"] = True
    r.update(kw)
    return r


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{cut line\n")
    return str(path)


def test_tables(tool, tmp_path):
    gate = [_row({}, "spak-splitkv", 0.100), _row({}, "copy", 0.090),
            _row({}, "tilegym", 0.095),
            _row({}, "sdpa-flash", 0.050, nonfinite=12),           # NaN: never the best
            _row({}, "sdpa-cudnn", 0.060, rel_l2=0.5),             # out of gate: neither
            _row({}, "sdpa-efficient", None, skipped="No available kernel")]
    second = [_row({}, "spak-splitkv", 0.102), _row({}, "copy", 0.0909),
              _row({"page": 16}, "spak-splitkv", 0.108),
              _row({"page": 16}, "copy", 0.090),
              _row({"dtype": "bf16"}, "spak-splitkv", 0.103),
              _row({"dtype": "bf16"}, "copy", 0.091)]
    a, b = _write(tmp_path / "gate.jsonl", gate), _write(tmp_path / "second.jsonl", second)
    files = {p: tool.by_case(tool.load(p))[p] for p in (a, b)}
    [d] = tool.gate_rows(files[a])
    assert d["peer"] == ("tilegym", 0.095) and d["vs_peer"] == pytest.approx(0.95)
    assert d["of_copy"] == pytest.approx(0.9)
    text = "\n".join(tool.render(files, summary=True))
    assert "| Qwen2.5-7B | 8x28:4x16384x128 | contiguous | 7 | 0.100 |" in text
    assert "TileGym 0.095 | 0.95 | PASS" in text
    assert "1 of the 1 cases with a peer" in text
    assert "| Qwen2.5-7B | 8x28:4x16384x128 | fp16 | 0.1020 | 1.059 | - | - |" in text
    assert "| 0.1020 | 0.1030 | 1.010 |" in text               # bf16 / fp16, same run
    assert "| spak-splitkv | 0.1000 | 0.1020 | 2.00% |" in text  # run to run, with the
    assert "| 1.00% |" in text                                  # copy's 1.00% beside it
    short = "\n".join(tool.render(files, summary=False, short=True))
    assert "16-key pages 1.059-1.059" in short and "bf16 / fp16 time, same run: 1.010-1.010" \
        in short and "ours 2.00%-2.00%, the same-size copy 1.00%-1.00% over 1 cases" in short
    assert "| 0.1020 | 0.1030 |" not in short                   # no full tables there


def test_readme_block(tool, tmp_path):
    md = tmp_path / "R.md"
    md.write_text(f"a\n{tool.MARK_BEGIN}\nold\n{tool.MARK_END}\nb\n")
    tool.rewrite_readme(str(md), ["new 1", "new 2"])
    assert md.read_text() == f"a\n{tool.MARK_BEGIN}\nnew 1\nnew 2\n{tool.MARK_END}\nb\n"
    md.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no block"):
        tool.rewrite_readme(str(md), ["x"])
