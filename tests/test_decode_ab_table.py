"""The GPU job's before/after path (.gpujobs/i33h.sh part A, then tools/decode_ab_table.py)
on the simulator: every kernel of the family on one case through the harness, splitkv
(the plan now) beside splitkv_prev (without issue 33h's INDEX32 / TN_FIT rules) and the
same-size copy, the rows written as `spak run --out` writes them, and the table's
after/before column and agreement lines computed from them."""
from __future__ import annotations

import importlib.util
import json

import pytest

torch = pytest.importorskip("torch")

from spak.device import case  # noqa: E402
from spak.families import get  # noqa: E402
from tests.helpers_gpu_loop import run_args, sim_env  # noqa: E402
from tests.test_gpu_loop_cpu import fake_cuda, sim_launch  # noqa: E402,F401


def _tool():
    spec = importlib.util.spec_from_file_location("ab", "tools/decode_ab_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_all_kernels_then_the_table(sim_launch, monkeypatch, tmp_path):
    monkeypatch.setenv("SPAK_PEERS", "/nonexistent")
    dec = get("fmha_decode")
    spec = dec.parse("2x12:2x4:100x128/causal/page16/lens=100:37/fp16")   # a paged Sq 4 case
    rows = case.run_case(spec, list(dec.kernels),
                         run_args(no_time=False, no_sim=True, peers=None, repeats=1,
                                  timing=["kernel"]),
                         sim_env(), 500.0, lambda r: None, dec)
    by = {r["provider"]: r for r in rows}
    assert by["spak-splitkv_prev"]["passed"] and by["spak-splitkv"]["passed"]
    assert by["spak-splitkv_prev"]["tiles"]["TN_FIT"] == 0
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({**r, "family": "fmha_decode"}, default=str) + "\n"
                            for r in rows))
    lines = _tool().table([str(path)])
    (line,) = [ln for ln in lines if spec.case_id in ln]
    ratio = by["spak-splitkv_prev"]["ms_median"] / by["spak-splitkv"]["ms_median"]
    assert line.rstrip(" |").endswith(f"{ratio:.2f}")
    assert "splitkv_prev" in line and "copy" not in line.split("|")[3]


def test_agreement_lines(tmp_path):
    rows = [{"provider": "spak-splitkv", "case": "c1", "passed": True, "rel_l2": 1e-4,
             "sim": {"fraction_bit_identical": 1.0, "max_ulp": 0, "slice": "s"}},
            {"provider": "spak-splitkv", "case": "c2", "passed": True, "rel_l2": 1e-4,
             "sim": {"fraction_bit_identical": 0.99, "max_ulp": 1, "slice": "s"}},
            {"provider": "copy", "case": "c1"}]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut by a timeo')
    out = _tool().agree(str(p))
    assert out[0] == "simulator agreement: 1/2 cases passed and bit-identical"
    assert out[1].startswith("ok ") and out[2].startswith("BAD ")
