"""Committed results are kept compressed (.gz or .xz: the tree travels to the GPU machine
under a size limit); spak's results reader must read both as it reads plain JSON lines."""
import gzip
import json
import lzma
from pathlib import Path

from spak.results.jsonl import read_results

ROOT = Path(__file__).resolve().parents[1]


def test_gz_and_xz_read_like_plain(tmp_path):
    rows = [{"shape": "2x4x64x64", "ok": True, "tflops": 1.5}, {"shape": "1x1x1x64", "ok": False}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    plain = tmp_path / "r.jsonl"
    plain.write_text(text)
    gz = tmp_path / "r.jsonl.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    xz = tmp_path / "r.jsonl.xz"
    xz.write_bytes(lzma.compress(text.encode()))
    assert read_results(plain) == rows
    assert read_results(gz) == rows
    assert read_results(xz) == rows


def test_a_committed_xz_result_reads():
    """A recorded H200 `spak run` file, compressed in the tree since 2026-11-24."""
    rows = read_results(ROOT / "results" / "run-awkward-nvidia-h200-2026-11-22.jsonl.xz")
    assert len(rows) > 10
    assert rows[0]["schema"] == "spak.run/1" and rows[0]["gpu"] == "NVIDIA H200"
