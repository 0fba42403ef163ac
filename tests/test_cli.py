"""The `spak` command line, the shape grammar, the named shape sets and input generation.

`spak sim`'s executor (spak/simrun.py) is replaced by a fake here: these tests
check the CLI's own logic (selection, table, JSON, exit codes) in milliseconds.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

import spak.cli as cli
import spak.cli.args as cli_args
import spak.cli.sim as cli_sim
from spak.core.metrics import GATES
from spak import families
from spak.attention.problems import (SHAPE_SETS, ProblemSpec, ShapeError, expand, make_inputs, parse_case,
                           parse_spec, select_cases)

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ grammar

def test_grammar_examples():
    assert parse_spec("1x8x128x64") == ProblemSpec(1, 8, 8, 128, 128, 64)
    s = parse_spec("2x8:2x100:300x64/causal/bf16/mask")
    assert (s.B, s.Hq, s.Hkv, s.Sq, s.Sk, s.D) == (2, 8, 2, 100, 300, 64)
    assert s.causal and s.dtype == "bf16" and s.mask == "additive" and s.group == 4
    assert s.label == "2x8:2x100:300x64" and s.display == "2x8:2x100:300x64+mask"
    assert parse_spec(" 1X4x17x128/NonCausal ").label == "1x4x17x128"
    assert parse_case("1x4:1x5x64")[1] == {}


@given(B=st.integers(1, 64), Hkv=st.integers(1, 16), g=st.integers(1, 8), Sq=st.integers(1, 10**5),
       Sk=st.integers(1, 10**5), D=st.sampled_from([16, 64, 128, 256]),
       dtype=st.sampled_from(["fp16", "bf16"]), causal=st.booleans(),
       mask=st.sampled_from([None, "additive", "bool"]))
def test_grammar_round_trip(B, Hkv, g, Sq, Sk, D, dtype, causal, mask):
    spec = ProblemSpec(B, Hkv * g, Hkv, Sq, Sk, D, dtype, causal, mask)
    assert parse_spec(spec.case_id) == spec
    assert parse_spec(spec.label) == spec.replace(dtype="fp16", causal=False, mask=None)


@pytest.mark.parametrize("text, match", [
    ("1x8x128", "not a shape"),
    ("1x8x128x64x2", "not a shape"),
    ("1x6:4x128x64", "multiple"),
    ("0x8x128x64", "B must be >= 1"),
    ("1x8x128x64/fp8", "unknown qualifier 'fp8'"),
    ("1x8x128x64/fp16/bf16", "conflicting"),
    ("1x8x-3x64", "not a shape"),
])
def test_grammar_errors(text, match):
    with pytest.raises(ShapeError, match=match):
        parse_case(text)


def test_spec_validation():
    with pytest.raises(ValueError, match="Hq"):
        ProblemSpec(1, 6, 4, 8, 8, 64)
    with pytest.raises(ValueError, match="dtype"):
        ProblemSpec(1, 1, 1, 8, 8, 64, dtype="fp32")
    with pytest.raises(ValueError, match="Sq"):
        ProblemSpec(1, 1, 1, 0, 8, 64)


def test_flops():
    assert ProblemSpec(2, 8, 8, 512, 512, 64).flops == 4 * 2 * 8 * 512 * 512 * 64
    assert ProblemSpec(2, 8, 8, 512, 512, 64, causal=True).flops == 2 * 2 * 8 * 512 * 512 * 64
    # Sq < Sk causal: query i sees i + Sk - Sq + 1 keys, counted exactly
    s = ProblemSpec(1, 1, 1, 2, 5, 1, causal=True)
    assert s.flops == 4 * (4 + 5)
    assert ProblemSpec(1, 1, 1, 5, 2, 1, causal=True).flops == 4 * (1 + 2)  # rows 0-2 see nothing


# ------------------------------------------------------------- named sets

def test_default_set_covers_the_gate_features():
    specs = expand(["default"])
    assert specs == select_cases(["default"])
    assert 8 <= len(specs) <= 16
    assert {s.causal for s in specs} == {False, True}
    assert {s.D for s in specs} == {64, 128}
    assert {(s.dtype, s.D) for s in specs} == {("fp16", 64), ("fp16", 128), ("bf16", 64), ("bf16", 128)}
    assert any(s.group == 4 for s in specs)
    assert any(s.Sq < s.Sk for s in specs) and any(s.Sq > s.Sk and s.causal for s in specs)
    assert {1, 17, 100, 1000} <= {s.Sq for s in specs} | {s.Sk for s in specs}
    assert any(s.mask == "additive" for s in specs)
    # small: the whole default run must be quick on a 2-core CPU
    assert max(s.B * s.Hq * s.Sq * s.Sk * s.D for s in specs) <= 2 * 1000 * 1000 * 128
    assert sum(s.flops for s in specs) < 3e9


def test_standard_set():
    specs = select_cases(["standard"], dtype="fp16")
    assert len(specs) == 24
    assert all(s.B * s.Sq == 16384 and s.Hq * s.D == 2048 and s.Sq == s.Sk for s in specs)
    assert {s.Sq for s in specs} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {(s.D, s.causal) for s in specs} == {(64, False), (64, True), (128, False), (128, True)}
    assert len(select_cases(["standard"])) == 48  # dtype open: expanded over fp16 and bf16


def test_seed_and_gates_sets():
    seed = select_cases(["seed"], dtype="fp16", causal="no")
    assert [(s.B, s.Hq, s.Sq, s.D) for s in seed] == [(16, 16, 2048, 64), (2, 8, 512, 64),
                                                     (1, 8, 512, 64), (4, 16, 2048, 128)]
    gates = expand(["gates"])
    assert len(gates) == len(SHAPE_SETS["gates"]) == 80
    for feature in (lambda s: s.group == 4, lambda s: s.Sq != s.Sk, lambda s: s.mask):
        for D in (64, 128):
            for dt in ("fp16", "bf16"):
                for c in (False, True):
                    assert any(feature(s) and (s.D, s.dtype, s.causal) == (D, dt, c) for s in gates)


def test_selection_filters_and_expands():
    assert all(s.dtype == "bf16" for s in select_cases(["default"], dtype="bf16"))
    assert 0 < len(select_cases(["default"], dtype="bf16")) < len(select_cases(["default"]))
    four = select_cases(["1x2x17x64"])
    assert [(s.dtype, s.causal) for s in four] == [("fp16", False), ("fp16", True),
                                                   ("bf16", False), ("bf16", True)]
    assert select_cases(["1x2x17x64/causal", "1x2x17x64/causal"], dtype="fp16") == \
        [ProblemSpec(1, 2, 2, 17, 17, 64, causal=True)]                    # duplicates dropped
    assert len(select_cases(["1x2x17x64,1x2x18x64"], dtype="fp16", causal="no")) == 2
    assert select_cases(["1x2x17x64/bf16"], dtype="fp16") == []             # filtered away
    with pytest.raises(ShapeError, match="neither a shape set"):
        expand(["defualt"])


# ------------------------------------------------------------------ inputs

def test_make_inputs_fp16(rng):
    spec = parse_spec("2x8:2x100:300x64/fp16/mask")
    q, k, v, m = make_inputs(spec, seed=5)
    assert q.dtype == np.float16 and q.shape == (2, 8, 100, 64) and k.shape == v.shape == (2, 2, 300, 64)
    assert abs(float(q.astype(np.float64).mean())) < 0.02 and abs(float(q.astype(np.float64).std()) - 1) < 0.02
    assert not np.array_equal(k, v) and np.count_nonzero(q) == q.size
    assert m.dtype == np.float32 and m.shape == (2, 1, 100, 300)
    assert np.isneginf(m).any() and np.isfinite(m).any()
    dead = np.all(np.isneginf(m), axis=-1)
    assert dead[0, 0, 50] and dead.sum() == 1           # exactly one fully masked row
    again = make_inputs(spec, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v, m), again))
    assert not np.array_equal(q, make_inputs(spec, seed=6).q)


def test_make_inputs_bf16_and_bool():
    spec = parse_spec("1x4x33x128/bf16/boolmask")
    q, k, v, m = make_inputs(spec, seed=0)
    assert q.dtype == np.float32 and np.all(q.view(np.uint32) & 0xFFFF == 0)  # bf16 values
    assert m.dtype == bool and (~m).any() and m.any()
    assert make_inputs(spec.replace(mask=None), 0).mask is None


def test_make_inputs_same_case_same_inputs_alone_or_in_a_set():
    spec = expand(["default"])[3]
    alone = make_inputs(parse_spec(spec.case_id), seed=1)
    assert np.array_equal(alone.q, make_inputs(spec, seed=1).q)


# --------------------------------------------------------------------- CLI

def run_main(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def expect_usage_error(argv, capsys, *needles):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    for n in needles:
        assert n in err, err
    return err


def test_parse_tiles():
    assert cli_args.parse_tiles("64x128") == (64, 128)
    assert cli_args.parse_tiles(" 16X16 ") == (16, 16)


@pytest.mark.parametrize("argv, needles", [
    (["sim", "--tiles", "63x64"], ["argument --tiles", "TILE_M must be a power of two"]),
    (["sim", "--tiles", "64"], ["argument --tiles", "TILE_MxTILE_N"]),
    (["sim", "--shapes", "defualt"], ["argument --shapes", "neither a shape set"]),
    (["sim", "--shapes", "1x6:4x128x64"], ["argument --shapes", "multiple"]),
    (["sim", "--shapes", "1x8x128x64/fp8"], ["argument --shapes", "unknown qualifier"]),
    (["sim", "--dtype", "fp32"], ["argument --dtype", "invalid choice"]),
    (["sim", "--causal", "maybe"], ["argument --causal"]),
    (["sim", "--kernel", "flash"], ["argument --kernel"]),
    (["sim", "--model", "h100"], ["argument --model", "sm_90"]),
    (["sim", "--seed", "x"], ["argument --seed"]),
    (["frobnicate"], ["invalid choice"]),
])
def test_bad_arguments_exit_2_naming_the_argument(argv, needles, capsys):
    expect_usage_error(argv, capsys, *needles)


def test_no_command_prints_help(capsys):
    code, _, err = run_main([], capsys)
    assert code == 2 and "sim" in err


def test_help_text(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["sim", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for needle in ("shape grammar", "Hq:Hkv", "Sq:Sk", "default (13)", "standard (24, dtype open)",
                   "--tiles", "--json", "0.001", "0.008"):
        assert needle in out, needle


def test_empty_selection_is_a_usage_error(capsys):
    code, _, err = run_main(["sim", "--shapes", "1x2x17x64/bf16", "--dtype", "fp16"], capsys)
    assert code == 2 and "argument --shapes" in err and "no case" in err


def test_list(capsys):
    code, out, _ = run_main(["sim", "--list", "--dtype", "fp16", "--causal", "yes"], capsys)
    lines = out.split()
    assert code == 0 and lines and all(re.search(r"/fp16/causal", ln) for ln in lines)


def fake_run_case(fail_on=None, raise_on=None, nan_on=None):
    """A stand-in for spak.cpu.simrun.run_case with the same signature and keys."""
    calls = []

    def run_case(kernel_name, spec, *, tiles=None, model="sm_90", seed=0):
        calls.append((kernel_name, spec, tiles, model, seed))
        if raise_on and raise_on(kernel_name, spec):
            raise RuntimeError("planted failure\nsecond line")
        rel = 5e-4 if spec.dtype == "fp16" else 4e-3
        if fail_on and fail_on(kernel_name, spec):
            rel = 0.5
        nonfinite = 0
        if nan_on and nan_on(kernel_name, spec):
            rel, nonfinite = float("nan"), 3
        gate = GATES[spec.dtype]
        return {"kernel": kernel_name, "shape": spec.label, "causal": spec.causal,
                "dtype": spec.dtype, "rel_l2": rel, "max_abs": 1e-3, "nonfinite": nonfinite,
                "seconds": 0.01, "gate": gate, "passed": nonfinite == 0 and rel <= gate,
                "error": None}
    run_case.calls = calls
    return run_case


def test_sim_all_pass_table(monkeypatch, capsys):
    fake = fake_run_case()
    monkeypatch.setattr(cli_sim, "_load_run_case", lambda family: fake)
    code, out, _ = run_main(["sim", "--tiles", "64x32", "--seed", "7"], capsys)
    n = len(SHAPE_SETS["default"])
    assert code == 0
    assert len(fake.calls) == 2 * n and {c[0] for c in fake.calls} == {"fused", "naive"}
    assert all(c[2:] == ((64, 32), "sm_90", 7) for c in fake.calls)
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("kernel"))
    for col in ("shape", "causal", "dtype", "rel L2", "max abs", "NaN/Inf", "sim s", "result"):
        assert col in header
    rows = [ln for ln in lines if ln.startswith(("fused", "naive"))]
    assert len(rows) == 2 * n and all(ln.rstrip().endswith("PASS") for ln in rows)
    assert any("2x4:2x77:130x64+mask" in ln for ln in rows)
    assert f"{2 * n}/{2 * n} cases passed" in lines[-1] and "FAILED" not in lines[-1]


def test_sim_failures_exit_1(monkeypatch, capsys):
    fake = fake_run_case(fail_on=lambda k, s: k == "naive" and s.D == 128,
                         raise_on=lambda k, s: k == "fused" and s.Sq == 1,
                         nan_on=lambda k, s: k == "fused" and s.Sq == 17)
    monkeypatch.setattr(cli_sim, "_load_run_case", lambda family: fake)
    code, out, _ = run_main(["sim"], capsys)
    assert code == 1
    assert "RuntimeError: planted failure" in out and "    second line" in out
    fails = [ln for ln in out.splitlines() if ln.rstrip().endswith("FAIL")]
    specs = expand(["default"])
    expected = sum(s.D == 128 for s in specs) + sum(s.Sq in (1, 17) for s in specs)
    assert len(fails) == expected
    assert any(" nan " in ln and " 3 " in ln for ln in fails)
    assert f"{expected} FAILED" in out.splitlines()[-1]


def test_sim_passed_flag_is_not_trusted_over_an_error(monkeypatch, capsys):
    def run_case(kernel_name, spec, **kw):
        return {"rel_l2": 0.0, "max_abs": 0.0, "nonfinite": 0, "seconds": 0.0, "gate": 1e-3,
                "passed": True, "error": "checker: block (0, 1, 0) wrote out of bounds"}
    monkeypatch.setattr(cli_sim, "_load_run_case", lambda family: run_case)
    code, out, _ = run_main(["sim", "--shapes", "1x2x17x64/fp16/causal", "--kernel", "fused"], capsys)
    assert code == 1 and "FAIL" in out and "out of bounds" in out


def test_sim_json(monkeypatch, capsys):
    fake = fake_run_case(nan_on=lambda k, s: s.Sq == 17)
    monkeypatch.setattr(cli_sim, "_load_run_case", lambda family: fake)
    code, out, _ = run_main(["sim", "--json", "--kernel", "fused", "--shapes", "1x2x17x64",
                             "1x2x100x128/bf16", "--causal", "no"], capsys)
    doc = json.loads(out)  # the whole of stdout is one strict JSON document
    assert code == 1
    assert doc["command"] == "sim" and doc["model"] == "sm_90"
    assert [(r["case"], r["passed"]) for r in doc["results"]] == [
        ("1x2x17x64/fp16/noncausal", False), ("1x2x17x64/bf16/noncausal", False),
        ("1x2x100x128/bf16/noncausal", True)]
    assert doc["results"][0]["rel_l2"] is None and doc["results"][0]["nonfinite"] == 3
    assert doc["results"][2]["gate"] == GATES["bf16"]
    assert doc["summary"]["cases"] == 3 and doc["summary"]["failed"] == 2
    assert doc["summary"]["all_passed"] is False


def test_format_row_handles_missing_values():
    row = cli_sim.format_row({"kernel": "fused", "shape": "1x1x1x64", "causal": True, "dtype": "fp16",
                          "rel_l2": None, "max_abs": math.nan, "nonfinite": None, "seconds": None,
                          "passed": False, "error": "boom"})
    assert "fused" in row and "yes" in row and "nan" in row and "FAIL" in row and "error: boom" in row


def test_broken_command_module_does_not_break_the_others(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["spak.cli.sim", "spak.no_such_command"])
    code, _, err = run_main(["no_such_command"], capsys)
    assert code == 1 and "unavailable" in err and "ModuleNotFoundError" in err
    code, out, _ = run_main(["sim", "--list", "--shapes", "1x1x1x64/fp16/causal"], capsys)
    assert code == 0 and out.strip() == "1x1x1x64/fp16/causal"


def test_python_m_spak_and_version():
    r = subprocess.run([sys.executable, "-m", "spak", "--version"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and re.fullmatch(r"spak \d+\.\d+\.\d+\s*", r.stdout)


# --------------------------------------------------------- README and CI agree

def _bash_blocks(section: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return [ln.strip() for b in re.findall(r"```bash\n(.*?)```", body, re.S)
            for ln in b.splitlines() if ln.strip()]


def _ci_commands() -> list[str]:
    """Commands in ci/cpu.sh, without `time`, comments or `|| rc=$?` tails."""
    cmds = []
    for ln in (ROOT / "ci" / "cpu.sh").read_text().splitlines():
        ln = re.sub(r"\s+#.*$", "", ln).split("||")[0].strip()
        cmds.append(re.sub(r"^time ", "", ln))
    return cmds


def test_ci_runs_exactly_the_readme_commands():
    setup, tests = _bash_blocks("Set-up"), _bash_blocks("Tests")
    assert setup == ['pip install -e ".[test]"', "spak sim"] and len(tests) == 1
    assert "bash ci/cpu.sh" in (ROOT / ".ci" / "run").read_text()
    cmds = _ci_commands()
    assert 'python -m pip install -e ".[test]"' in cmds  # = README's pip, of the venv's python
    assert "spak sim" in cmds
    assert tests[0] in cmds


def test_train_set_names_its_models():
    """Issue 35's `train` set: the heads of widely trained models (GQA 4:1, 7:1, 8:1, 2:1,
    MHA; D 64/96/128/256), 512..32k, causal decoders, lengths off the tile grid and off the
    16-grid; every row named by a model; realistic memory per batch."""
    from spak.attention.problems import TRAIN_MODELS, train_model
    specs = select_cases(["train"], dtype="fp16")
    assert len(specs) == len(SHAPE_SETS["train"]) >= 20
    assert all(train_model(s) for s in specs)
    assert {s.D for s in specs} == {64, 96, 128, 256}
    assert {s.Hq // s.Hkv for s in specs} >= {1, 2, 4, 7, 8}
    assert min(s.Sq for s in specs) == 512 and max(s.Sq for s in specs) == 32768
    assert any(s.Sk % 16 for s in specs) and any(s.Sk % 128 and not s.Sk % 16 for s in specs)
    assert all(s.causal for s in specs if train_model(s) != "BERT-base")
    assert all(s.B * s.Hq * s.Sq * s.D * 2 <= 256 << 20 for s in specs)   # q <= 256 MiB
    assert train_model(parse_spec("1x32:8x100x128/causal")) == "Llama-3 8B / Mistral 7B"
    assert train_model(parse_spec("1x32:8x100x128/noncausal")) == ""
    assert set(TRAIN_MODELS) >= {"Llama-3 8B", "Llama-3 70B", "Qwen2.5 7B", "Gemma-2 9B",
                                 "Phi-3 mini", "GPT-2"}
    assert len(select_cases(["train"])) == 2 * len(specs)    # dtype open: fp16 and bf16


#: every family's named shape sets ("models-gate", "train", ...): a name lists its members
_FAMILY_SETS = {n for f in ("fmha_fwd", "fmha_bwd", "fmha_decode")
                for n in families.get(f).shape_sets}


def test_readme_headline_commands_parse_and_name_cases(capsys):
    """Every row of README's headline table names a GPU, a results folder that exists and a
    `spak run` command that parses and lists the figure's shape (issue 38's gate: each
    figure reproducible with one documented command)."""
    import shlex
    text = (ROOT / "README.md").read_text()
    table = text.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "`spak " in ln]
    assert len(rows) >= 6
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] in ("H100", "H200"), row
        assert (ROOT / cells[2]).is_dir(), cells[2]
        cmd = re.search(r"`(spak [^`]*)`", cells[3]).group(1)
        capsys.readouterr()
        assert cli.main([*shlex.split(cmd)[1:], "--list"]) == 0, cmd
        listed = capsys.readouterr().out
        shapes = re.findall(r"--shapes ((?:[^ -][^ ]* ?)+)", cmd)
        for shape in (shapes[0].split() if shapes else []):
            if shape not in SHAPE_SETS and shape not in _FAMILY_SETS:
                assert shape.split("/")[0] in listed, (cmd, listed[:200])
