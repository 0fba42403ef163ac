"""Plans: the schema and its error messages, and `spak plan` on small plans.

The schema tests edit a copy of plans/fmha.toml one field at a time and check that the
loader rejects it with a message naming that field. The `spak plan` tests run the real
CPU loop (prototype, simulator, checker) on a tiny plan, with the tileiras compile
replaced by a fake (tests/test_compile_cmd.py compiles for real), and feed the GPU-side
judges synthetic `spak run` / `spak sweep` rows.
"""
from __future__ import annotations

import copy
import itertools
import json
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

import spak.cli as cli
import spak.device.compile_report as compile_cmd
import spak.recipe.runner as plan_runner
from spak.recipe.schema import DEFAULT_PLAN, PlanError, load_plan, parse_plan
from spak.recipe.runner import FAIL, PASS, PlanRunner

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def real_doc() -> dict:
    return tomllib.loads(DEFAULT_PLAN.read_text())


def errors_of(doc) -> list[str]:
    with pytest.raises(PlanError) as ei:
        parse_plan(doc)
    return ei.value.errors


def one_error(doc, path: str, *fragments: str) -> str:
    errs = errors_of(doc)
    hits = [e for e in errs if e.startswith(path + ":")]
    assert hits, f"no error for {path}; got {errs}"
    for f in fragments:
        assert any(f in h for h in hits), f"{fragments} not in {hits}"
    return hits[0]


# ------------------------------------------------------------------ the real plan

def test_fmha_plan_loads():
    plan = load_plan()
    assert plan.name == "fmha"
    assert plan.archs == ["sm_90", "sm_120", "sm_89"]
    assert [s.id for s in plan.steps] == ["prototype", "naive", "fused", "tuned"]
    assert [s.kind for s in plan.steps] == ["prototype", "kernel", "kernel", "sweep"]
    assert plan.step("fused").kernel == "fused" and plan.step("naive").kernel == "naive"
    for arch in plan.archs:
        sp = plan.sweep_space(arch)
        assert sp.TILE_M and sp.TILE_N and sp.occupancy and sp.num_ctas
        product = [dict(zip(("TILE_M", "TILE_N", "occupancy", "num_ctas"), c))
                   for c in itertools.product(sp.TILE_M, sp.TILE_N, sp.occupancy, sp.num_ctas)]
        cut = sum(any(all(c.get(k) == v for k, v in dict(e).items()) for e in sp.exclude)
                  for c in product)
        assert len(sp.configs()) == len(product) - cut
    # sm_90 leaves out 64-row tiles over 2-CTA clusters (25-45x slower in every sweep)
    sm90 = plan.sweep_space("sm_90")
    assert not any(c["TILE_M"] == 64 and c["num_ctas"] == 2 for c in sm90.configs())
    assert any(c["TILE_M"] == 128 and c["num_ctas"] == 2 for c in sm90.configs())
    # every kernel variant compiles for every target arch (what `spak compile` runs)
    kv = plan.kernel_variants()
    assert {k for k, _, _ in kv} == {"naive", "fused"}
    assert {a for _, a, _ in kv} == {"sm_90", "sm_120", "sm_89"}
    # the sm_90 floors are DESIGN.md's, verified; sm_120/sm_89 ones are not
    floors = plan.step("fused").gpu["tflops"]
    assert {(f.arch, f.head_dim, f.floor) for f in floors if f.verified} == \
        {("sm_90", 64, 430.0), ("sm_90", 128, 540.0)}
    assert all(not f.verified for f in floors if f.arch != "sm_90")
    assert all(f.source for f in floors)
    # the seed's RTX 5070 claim exceeds the derived peak: a warning, not an error
    assert any("61.7" in w and "sm_120" in w for w in plan.warnings)


def test_sweep_space_is_what_the_sweeper_reads():
    sp = load_plan().sweep_space("sm_90")
    d = sp.as_dict()
    assert set(d) >= {"TILE_M", "TILE_N", "occupancy", "num_ctas", "max_tile", "knobs"}
    assert all(isinstance(x, int) for k in ("TILE_M", "TILE_N") for x in d[k])
    with pytest.raises(KeyError, match="sm_75"):
        load_plan().sweep_space("sm_75")


def test_sweep_exclude_is_validated(real_doc):
    doc = copy.deepcopy(real_doc)
    doc["sweep"]["sm_90"]["exclude"] = [{"TILE_M": 32}]
    one_error(doc, "sweep.sm_90.exclude[0].TILE_M", "32 is not among the space's TILE_M")
    doc["sweep"]["sm_90"]["exclude"] = [{"tile_m": 64}]
    one_error(doc, "sweep.sm_90.exclude[0].tile_m", "unknown key")
    doc["sweep"]["sm_90"]["exclude"] = [{}]
    one_error(doc, "sweep.sm_90.exclude[0]", "every config")
    doc["sweep"]["sm_90"]["exclude"] = [{"TILE_M": 64}, {"TILE_M": 128}]
    one_error(doc, "sweep.sm_90.exclude", "excludes every config")
    doc["sweep"]["sm_90"]["exclude"] = {"TILE_M": 64}
    one_error(doc, "sweep.sm_90.exclude", "expected a list")


def test_exclude_reaches_the_sweeper_and_the_compile_command():
    from spak.device.compile_report import sweep_items
    from spak.tune.space import expand_space, load_space
    space, _ = load_space(None, "sm_90")
    assert space["exclude"] == [{"TILE_M": 64, "num_ctas": 2}]
    configs = expand_space(space)
    assert len(configs) == len(load_plan().sweep_space("sm_90").configs()) == 18
    assert not any(c["TILE_M"] == 64 and c["num_ctas"] == 2 for c in configs)
    # a --space override keeps the plan's exclusions
    assert len(expand_space({**space, "TILE_M": [64], "num_ctas": [1, 2]})) == 2 * 3
    assert len(expand_space({k: v for k, v in space.items() if k != "exclude"})) == 24
    items = sweep_items(load_plan(), ["sm_90"])
    assert not any(i["tiles"]["TILE_M"] == 64 and i["hints"]["num_ctas"] == 2 for i in items)


def test_step_cases_expand_shapes():
    step = load_plan().step("naive")
    cases = step.cases()
    assert len(cases) > 13 and all(c.dtype in ("fp16", "bf16") for c in cases)
    assert any(c.label == "1x8x512x64" and c.causal for c in cases)


# ------------------------------------------------------------------ rejection

def test_wrong_type_names_the_field(real_doc):
    doc = copy.deepcopy(real_doc)
    doc["steps"][2]["gates"]["cpu"]["rel_l2"]["fp16"] = "x"
    msg = one_error(doc, "steps[2].gates.cpu.rel_l2.fp16", "expected a number, got 'x'")
    assert msg == "steps[2].gates.cpu.rel_l2.fp16: expected a number, got 'x'"


def test_unknown_key_names_the_field(real_doc):
    doc = copy.deepcopy(real_doc)
    doc["steps"][1]["gates"]["cpu"]["rel_l3"] = 1e-3
    one_error(doc, "steps[1].gates.cpu.rel_l3", "unknown key", "rel_l2")
    doc = copy.deepcopy(real_doc)
    doc["steps"][0]["kernal"] = "fused"
    one_error(doc, "steps[0].kernal", "unknown key")
    doc = copy.deepcopy(real_doc)
    doc["sweeps"] = {}
    one_error(doc, "sweeps", "unknown key")


def test_unknown_kernel(real_doc):
    doc = copy.deepcopy(real_doc)
    doc["steps"][1]["kernel"] = "fast"
    one_error(doc, "steps[1].kernel", "unknown kernel 'fast'", "fused, naive")


@pytest.mark.parametrize("tiles,fragment", [
    ([64, 96], "96 is not a power of two"),
    ([8], "8 is below the smallest tile 16"),
    ([512], "512 is above the largest tile 256"),
    ([256], "256 is larger than sweep.sm_120.max_tile (128) allows"),
    ([64, "64"], "expected an integer, got '64'"),
])
def test_impossible_sweep_tile(real_doc, tiles, fragment):
    doc = copy.deepcopy(real_doc)
    doc["sweep"]["sm_120"]["TILE_N"] = tiles
    one_error(doc, f"sweep.sm_120.TILE_N[{len(tiles) - 1}]", fragment)


def test_step_tile_larger_than_the_sweep_allows(real_doc):
    doc = copy.deepcopy(real_doc)
    doc["steps"][2]["tiles"] = {"TILE_M": 64, "TILE_N": 256}
    one_error(doc, "steps[2].tiles.TILE_N", "larger than sweep.sm_120.max_tile (128)")
    doc = copy.deepcopy(real_doc)
    doc["steps"][1]["gates"]["cpu"]["compile"]["variants"][0]["tiles"] = {"TILE_M": 48,
                                                                          "TILE_N": 64}
    one_error(doc, "steps[1].gates.cpu.compile.variants[0].tiles.TILE_M", "not a power of two")


def test_unknown_arch(real_doc):
    doc = copy.deepcopy(real_doc)
    doc["targets"]["sm_75"] = {"gpus": ["l4"]}
    one_error(doc, "targets.sm_75", "unknown arch 'sm_75'", "sm_90, sm_120, sm_89")
    doc = copy.deepcopy(real_doc)
    doc["steps"][2]["gates"]["cpu"]["compile"]["archs"].append("sm_100")
    one_error(doc, "steps[2].gates.cpu.compile.archs[3]", "'sm_100' is not in [targets]")
    doc = copy.deepcopy(real_doc)
    doc["targets"]["sm_120"]["gpus"] = ["l4"]
    one_error(doc, "targets.sm_120.gpus[0]", "'l4' is an sm_89 GPU")
    doc = copy.deepcopy(real_doc)
    doc["steps"][2]["gates"]["gpu"]["tflops"][0]["arch"] = "sm_100"
    one_error(doc, "steps[2].gates.gpu.tflops[0].arch", "not in [targets]")


def test_unknown_shape_set_and_bad_shape(real_doc):
    doc = copy.deepcopy(real_doc)
    doc["steps"][1]["shapes"] = ["defualt"]
    one_error(doc, "steps[1].shapes[0]", "'defualt' is neither a shape set")
    doc = copy.deepcopy(real_doc)
    doc["steps"][2]["gates"]["gpu"]["shapes"] = ["standard", "1x8:3x128x64"]
    one_error(doc, "steps[2].gates.gpu.shapes[1]", "multiple of key/value heads")


def test_other_rejections(real_doc):
    doc = copy.deepcopy(real_doc)
    del doc["steps"][0]["kind"]
    one_error(doc, "steps[0].kind", "missing (required)")
    doc = copy.deepcopy(real_doc)
    doc["steps"][2]["kind"] = "fuse"
    one_error(doc, "steps[2].kind", "'fuse' is not one of: prototype, kernel, sweep")
    doc = copy.deepcopy(real_doc)
    doc["steps"][2]["id"] = "naive"
    one_error(doc, "steps[2].id", "duplicate step id 'naive'")
    doc = copy.deepcopy(real_doc)
    doc["sweep"]["sm_89"]["num_ctas"] = [1, 2]
    one_error(doc, "sweep.sm_89.num_ctas[1]", "clusters")
    doc = copy.deepcopy(real_doc)
    doc["sweep"]["sm_90"]["occupancy"] = [0]
    one_error(doc, "sweep.sm_90.occupancy[0]", "out of range")
    doc = copy.deepcopy(real_doc)
    del doc["sweep"]["sm_89"]
    one_error(doc, "sweep.sm_89", "missing")
    doc = copy.deepcopy(real_doc)
    doc["steps"][3]["gates"]["gpu"]["rel_l2"] = {"fp16": 1e-3}     # the sweeper checks itself
    one_error(doc, "steps[3].gates.gpu.rel_l2", "unknown key")
    doc = copy.deepcopy(real_doc)
    doc["steps"][0]["gates"]["gpu"] = {}
    one_error(doc, "steps[0].gates.gpu", "no GPU gates")
    doc = copy.deepcopy(real_doc)
    doc["schema"] = 2
    one_error(doc, "schema", "schema 1")
    doc = copy.deepcopy(real_doc)
    doc["steps"][2]["gates"]["gpu"]["tflops"][1]["verified"] = "yes"
    one_error(doc, "steps[2].gates.gpu.tflops[1].verified", "expected true or false")


def test_all_problems_reported_at_once(real_doc):
    doc = copy.deepcopy(real_doc)
    doc["steps"][1]["kernel"] = "fast"
    doc["steps"][2]["gates"]["cpu"]["rel_l2"]["bf16"] = -1
    doc["sweep"]["sm_90"]["TILE_M"] = [100]
    errs = errors_of(doc)
    assert len(errs) == 3
    with pytest.raises(PlanError, match="3 problems"):
        parse_plan(doc)


def test_load_plan_file_errors(tmp_path):
    p = tmp_path / "broken.toml"
    p.write_text("schema = 1\nname = \n")
    with pytest.raises(PlanError, match="not valid TOML"):
        load_plan(p)
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(tmp_path / "missing.toml")


def test_malformed_plan_is_rejected_before_anything_runs(tmp_path, real_doc, monkeypatch,
                                                          capsys):
    text = DEFAULT_PLAN.read_text().replace('kernel = "naive"', 'kernel = "fast"', 1)
    bad = tmp_path / "bad.toml"
    bad.write_text(text)

    def boom(*a, **k):
        raise AssertionError("nothing may run for a malformed plan")
    monkeypatch.setattr(PlanRunner, "run", boom)
    monkeypatch.setattr(compile_cmd, "compile_items", boom)
    assert cli.main(["plan", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "steps[1].kernel: unknown kernel 'fast'" in err and "rejected" in err
    assert cli.main(["compile", "--plan", str(bad)]) == 2
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ spak plan

TINY = """
schema = 1
name = "tiny"
title = "tiny plan for the tests"

[targets.sm_90]
gpus = ["h100-sxm"]
sim_model = "sm_90"

[targets.sm_120]
gpus = ["rtx-5070"]
sim_model = "sm_120"

[[steps]]
id = "prototype"
title = "prototype"
kind = "prototype"
[steps.gates.cpu]
max_abs = 1e-12

[[steps]]
id = "naive"
title = "naive kernel"
kind = "kernel"
kernel = "naive"
shapes = ["1x2x17x64/fp16/causal", "1x2:1x40:70x32/bf16/noncausal/mask"]
models = ["sm_90", "sm_120"]
[steps.gates.cpu]
rel_l2 = { fp16 = 1e-3, bf16 = 8e-3 }
[steps.gates.cpu.compile]
archs = ["sm_90", "sm_120"]
variants = [{ dtype = "fp16", head_dim = 64, causal = true }]
[steps.gates.gpu]
rel_l2 = { fp16 = 1e-3, bf16 = 8e-3 }
sim_agreement = 0.0

[[steps]]
id = "fused"
title = "fused kernel"
kind = "kernel"
kernel = "fused"
shapes = ["1x2x17x64/fp16/causal"]
[steps.gates.cpu]
rel_l2 = { fp16 = 1e-3, bf16 = 8e-3 }
[steps.gates.gpu]
timed_shapes = ["1x2x4096x64/noncausal"]
[[steps.gates.gpu.tflops]]
arch = "sm_90"
head_dim = 64
min_seq = 4096
causal = false
floor = 430
verified = true
source = "test"
[[steps.gates.gpu.tflops]]
arch = "sm_120"
head_dim = 64
floor = 100
verified = false
source = "test"

[[steps]]
id = "tuned"
title = "sweep"
kind = "sweep"
kernel = "fused"
shapes = ["1x2x4096x64"]
sim_shapes = ["1x2x33x64/fp16/noncausal"]
[steps.gates.cpu]
rel_l2 = { fp16 = 1e-3, bf16 = 8e-3 }
[steps.gates.gpu]
tuned_vs_default = 1.0

[sweep.sm_90]
TILE_M = [64]
TILE_N = [64, 128]
occupancy = [1]
num_ctas = [1]

[sweep.sm_120]
TILE_M = [32, 64]
TILE_N = [64]
occupancy = [1, 2]
num_ctas = [1]
max_tile = 128
"""


def fake_compile(item):
    return {**item, "tiles": item.get("tiles") or {"TILE_M": 64, "TILE_N": 64}, "status": "ok",
            "ok": True, "seconds": 0.01, "cubin_bytes": 1234, "error": None, "kernels": []}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    monkeypatch.setattr(compile_cmd, "_compile_one", fake_compile)
    monkeypatch.setattr(compile_cmd, "supported_archs",
                        lambda *a, **k: (["sm_89", "sm_90", "sm_120"], "fake tileiras"))
    return p


def test_spak_plan_cpu_loop_on_a_tiny_plan(tiny, tmp_path, capsys):
    out = tmp_path / "report"
    rc = cli.main(["plan", str(tiny), "--out", str(out), "--no-gpu"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "[2/4 naive]" in text and "PASS" in text          # progress lines
    doc = json.loads((out / "report.json").read_text())
    md = (out / "report.md").read_text()
    assert doc["status"] == PASS and doc["cpu_gates_passed"] and doc["stopped"] is None
    cpu = [g for g in doc["gates"] if g["loop"] == "cpu"]
    assert cpu and all(g["status"] == PASS for g in cpu)
    metrics = {g["metric"] for g in cpu}
    assert {"Numerical error: online vs global softmax", "Numerical error (simulator vs float64)",
            "Correctness (simulator checker)", "Compiles (tileiras)"} <= metrics
    naive = doc["evidence"]["naive"]["cases"]
    assert len(naive) == 4 and {r["model"] for r in naive} == {"sm_90", "sm_120"}
    assert all(r["passed"] for r in naive)
    assert len(doc["evidence"]["tuned"]["cases"]) == 3     # 64x64, 64x128, 32x64
    gpu = [g for g in doc["gates"] if g["loop"] == "gpu"]
    assert gpu and all(g["status"] == "not run here" for g in gpu)
    assert {g["arch"] for g in gpu} == {"sm_90", "sm_120"}
    assert any(line.startswith("sm_120: not run here") for line in doc["not_checked"])
    assert "## Evaluation metrics" in md and "| Throughput |" in md
    assert "Targets not checked on this machine" in md


def test_spak_plan_stops_at_the_first_failed_gate(tiny, tmp_path):
    from spak.cpu.simrun import run_case

    def bad_bf16(kernel, spec, **kw):
        r = run_case(kernel, spec, **kw)
        if spec.dtype == "bf16":
            r["rel_l2"] = 0.5
        return r
    plan = load_plan(tiny)
    runner = PlanRunner(plan, out_dir=tmp_path, log=lambda m: None, run_case=bad_bf16,
                        gpu_info={"present": False, "reason": "test"})
    doc = runner.run()
    assert doc["status"] == FAIL and not doc["cpu_gates_passed"]
    st = doc["stopped"]
    assert st["step"] == "naive" and st["metric"] == "Numerical error (simulator vs float64)"
    assert "1x2:1x40:70x32/bf16/noncausal/mask" in st["reason"] and "5.00e-01" in st["reason"]
    # nothing after the failed gate ran: no compile, later steps stopped
    assert "compile" not in doc["evidence"]["naive"]
    assert "fused" not in doc["evidence"]
    later = [g for g in doc["gates"] if g["step"] in ("fused", "tuned") and g["loop"] == "cpu"]
    assert later and all(g["status"].startswith("not run (stopped") for g in later)


def test_compile_failure_stops_the_plan(tiny, tmp_path, monkeypatch):
    def fail_sm120(item):
        r = fake_compile(item)
        if item["arch"] == "sm_120":
            r.update(ok=False, status="FAIL", error="TileCompileError: boom")
        return r
    monkeypatch.setattr(compile_cmd, "_compile_one", fail_sm120)
    runner = PlanRunner(load_plan(tiny), out_dir=tmp_path, log=lambda m: None,
                        gpu_info={"present": False, "reason": "test"})
    doc = runner.run()
    assert doc["stopped"]["metric"] == "Compiles (tileiras)"
    assert "sm_120" in doc["stopped"]["reason"] and "boom" in doc["stopped"]["reason"]
    comp = [g for g in doc["gates"] if g["metric"] == "Compiles (tileiras)"]
    assert {(g["arch"], g["status"]) for g in comp} == {("sm_90", PASS), ("sm_120", FAIL)}


def test_gpu_loop_tolerates_missing_gpu_side(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(plan_runner, "_importable",
                        lambda mod: (False, f"{mod} cannot be imported (test)"))
    runner = PlanRunner(load_plan(tiny), out_dir=tmp_path, log=lambda m: None,
                        compile=False,
                        gpu_info={"present": True, "name": "NVIDIA H100 80GB HBM3",
                                  "arch": "sm_90", "profile": "h100-sxm"})
    doc = runner.run()
    assert doc["status"] == PASS
    here = [g for g in doc["gates"] if g["loop"] == "gpu" and g["arch"] == "sm_90"]
    assert here and all(g["status"] == "not available" for g in here)
    other = [g for g in doc["gates"] if g["loop"] == "gpu" and g["arch"] == "sm_120"]
    assert other and all(g["status"] == "not run here" for g in other)


def _run_row(case, **kw):
    row = {"schema": "spak.run/1", "provider": "spak-fused", "case": case, "dtype": "fp16",
           "rel_l2": 3e-4, "nonfinite": 0, "passed": True, "error": None,
           "sim": {"fraction_bit_identical": 0.97, "max_ulp": 2}, "ceiling_tflops": 750.0}
    row.update(kw)
    return row


def test_gpu_rows_are_judged(tiny, tmp_path):
    plan = load_plan(tiny)
    runner = PlanRunner(plan, out_dir=tmp_path, log=lambda m: None,
                        gpu_info={"present": True, "arch": "sm_90", "profile": "h100-sxm"})
    step = plan.step("fused")
    rows = [_run_row("1x2x17x64/fp16/causal"),
            _run_row("1x2x4096x64/fp16/noncausal", tflops=450.0),
            _run_row("2x2x8192x64/fp16/noncausal", tflops=420.0),     # below 430
            _run_row("1x2x4096x64/fp16/causal", tflops=200.0),        # causal: not judged
            {"provider": "sdpa-cudnn", "case": "1x2x4096x64/fp16/noncausal", "tflops": 500.0}]
    runner.judge_gpu_rows(step, "sm_90", rows)
    by = {g["metric"]: g for g in runner.gates}
    assert by["Numerical error (GPU vs float64)"]["status"] == PASS
    thr = by["Throughput"]
    assert thr["status"] == FAIL and "min 420.0" in thr["measured"]
    assert "2x2x8192x64" in thr["measured"] and "% of NVIDIA H100" in thr["measured"]
    assert "56% of the run's matmul ceiling" in thr["measured"]

    runner.gates.clear()
    rows[2]["rel_l2"] = 5e-3
    runner.judge_gpu_rows(plan.step("naive"), "sm_90",
                          [dict(r, provider="spak-naive") for r in rows])
    by = {g["metric"]: g for g in runner.gates}
    assert by["Numerical error (GPU vs float64)"]["status"] == FAIL
    assert "2x2x8192x64" in by["Numerical error (GPU vs float64)"]["measured"]
    assert by["Correctness (simulator agrees with GPU)"]["status"] == PASS
    assert "0.9700" in by["Correctness (simulator agrees with GPU)"]["measured"]


def test_sim_agreement_per_arch(tiny, tmp_path, real_doc):
    """A {arch: fraction} table gates each arch on its own model's figure; archs it does not
    list are recorded only; unknown archs and fractions outside [0, 1] are refused."""
    doc = tomllib.loads(tiny.read_text())
    doc["steps"][1]["gates"]["gpu"]["sim_agreement"] = {"sm_90": 1.0, "sm_120": 0.0}
    plan = parse_plan(doc)
    runner = PlanRunner(plan, out_dir=tmp_path, log=lambda m: None,
                        gpu_info={"present": True, "arch": "sm_90", "profile": "h100-sxm"})
    rows = [_run_row("1x2x17x64/fp16/causal", provider="spak-naive")]   # 0.97 bit-identical
    for arch, status in (("sm_90", FAIL), ("sm_120", PASS), ("sm_89", PASS)):
        runner.gates.clear()
        runner.judge_gpu_rows(plan.step("naive"), arch, rows)
        g = [g for g in runner.gates if g["metric"].startswith("Correctness")][0]
        assert g["status"] == status, (arch, g)
        assert g["goal"].endswith(">= 1" if arch == "sm_90" else ">= 0")
    runner.gates.clear()
    rows[0]["sim"] = {"fraction_bit_identical": 1.0, "max_ulp": 0}
    runner.judge_gpu_rows(plan.step("naive"), "sm_90", rows)
    assert [g for g in runner.gates if g["metric"].startswith("Correctness")][0]["status"] == PASS

    bad = copy.deepcopy(real_doc)
    bad["steps"][1]["gates"]["gpu"]["sim_agreement"] = {"sm_91": 1.0, "sm_90": 1.5}
    errs = errors_of(bad)
    assert any("sim_agreement.sm_91: unknown arch" in e for e in errs)
    assert any("sim_agreement.sm_90: 1.5 is out of range" in e for e in errs)


def test_unverified_floor_is_advisory(tiny, tmp_path):
    plan = load_plan(tiny)
    runner = PlanRunner(plan, out_dir=tmp_path, log=lambda m: None,
                        gpu_info={"present": True, "arch": "sm_120", "profile": "rtx-5070"})
    runner.judge_gpu_rows(plan.step("fused"), "sm_120",
                          [_run_row("1x2x4096x64/fp16/noncausal", tflops=55.0)])
    thr = [g for g in runner.gates if g["metric"] == "Throughput"]
    assert thr[0]["status"] == "FAIL (advisory)" and not thr[0]["verified"]
    assert "89% of NVIDIA GeForce RTX 5070 peak" in thr[0]["measured"]
    assert not any(g["status"] == FAIL for g in runner.gates)


def test_sweep_rows_are_judged(tiny, tmp_path):
    plan = load_plan(tiny)
    runner = PlanRunner(plan, out_dir=tmp_path, log=lambda m: None,
                        gpu_info={"present": True, "arch": "sm_90", "profile": "h100-sxm"})
    case = "1x2x4096x64/fp16/noncausal"
    rows = [{"kind": "start"},
            {"kind": "result", "provider": "spak-fused-default", "case": case, "status": "ok",
             "tflops": 400.0, "config": {"TILE_M": 64, "TILE_N": 64}},
            {"kind": "result", "provider": "spak-fused", "case": case, "status": "ok",
             "tflops": 440.0, "config": {"TILE_M": 64, "TILE_N": 128}},
            {"kind": "result", "provider": "spak-fused", "case": case, "status": "timeout",
             "tflops": None, "config": {"TILE_M": 128, "TILE_N": 128}},
            {"kind": "result", "provider": "sdpa-cudnn", "case": case, "status": "ok",
             "tflops": 900.0}]
    runner.judge_sweep_rows(plan.step("tuned"), "sm_90", rows)
    by = {g["metric"]: g for g in runner.gates}
    assert by["Tuned >= default tiles"]["status"] == PASS
    assert "1.100" in by["Tuned >= default tiles"]["measured"]
    assert "1 configs failed" in by["Tuned >= default tiles"]["measured"]


def test_gpu_gates_from_recorded_results(tiny, tmp_path, capsys):
    base = {"schema": "spak.run/1", "gpu": "NVIDIA H200", "arch": "sm_90"}
    rows = [dict(_run_row("1x2x4096x64/fp16/noncausal", tflops=460.0), **base),
            dict(_run_row("1x2x17x64/fp16/causal"), **base),
            dict(_run_row("1x2x17x64/fp16/causal"), provider="spak-naive", **base)]
    rec = tmp_path / "run.jsonl"
    rec.write_text("\n".join(json.dumps(r) for r in rows) + "\n{torn")
    out = tmp_path / "rep"
    rc = cli.main(["plan", str(tiny), "--out", str(out), "--no-compile",
                   "--gpu-results", str(rec)])
    assert rc == 0, capsys.readouterr().out
    doc = json.loads((out / "report.json").read_text())
    assert doc["gpu"]["name"] == "NVIDIA H200" and doc["gpu"]["recorded"] == [str(rec)]
    h200 = [g for g in doc["gates"] if g["loop"] == "gpu" and g["arch"] == "sm_90"]
    thr = [g for g in h200 if g["metric"] == "Throughput"]
    assert thr[0]["status"] == PASS and "460.0" in thr[0]["measured"]
    assert all("recorded run.jsonl" in g["how"] for g in h200 if g["step"] != "tuned")
    err = [g for g in h200 if g["metric"] == "Numerical error (GPU vs float64)"]
    assert "planned cases present" in err[0]["measured"]
    tuned = [g for g in h200 if g["step"] == "tuned"]
    assert tuned and all(g["status"] == "not run here" for g in tuned)   # no sweep rows
    other = [g for g in doc["gates"] if g["loop"] == "gpu" and g["arch"] == "sm_120"]
    assert all(g["measured"] == "no results recorded for this arch" for g in other)
    assert "not run by this invocation" in (out / "report.md").read_text()


# ------------------------------------------------------------------ kernel families

BWD_STEP = """
[[steps]]
id = "backward"
title = "backward kernel"
kind = "kernel"
family = "fmha_bwd"
kernel = "fused"
shapes = ["1x2x17x32/fp16/causal"]
[steps.gates.cpu]
rel_l2 = { fp16 = 1e-3, bf16 = 8e-3 }
[steps.gates.gpu]
rel_l2 = { fp16 = 1e-3, bf16 = 8e-3 }
"""


def test_steps_belong_to_a_family(real_doc):
    plan = load_plan()
    assert {s.family for s in plan.steps} == {"fmha_fwd"}          # absent: the forward
    assert {sp.family for sp in plan.sweep.values()} == {"fmha_fwd"}
    doc = copy.deepcopy(real_doc)
    doc["steps"][1]["family"] = "fmha_fwd"
    assert parse_plan(doc).step("naive").family == "fmha_fwd"
    doc["steps"][1]["family"] = "fmha_fwdd"
    one_error(doc, "steps[1].family", "unknown kernel family 'fmha_fwdd'", "fmha_bwd")
    doc = copy.deepcopy(real_doc)
    doc["steps"][1]["family"] = "fmha_bwd"           # the backward has no naive kernel
    one_error(doc, "steps[1].kernel", "unknown kernel 'naive'; known kernels: fused")
    doc = copy.deepcopy(real_doc)
    doc["steps"][3]["family"] = "fmha_bwd"           # sweeps need the family's own space
    one_error(doc, "steps[3].family", "[sweep.sm_90] is the fmha_fwd family's space")


def test_a_sweep_space_has_its_family_keys(real_doc):
    doc = copy.deepcopy(real_doc)
    doc["sweep"]["sm_89"]["family"] = "fmha_bwd"
    errs = errors_of(doc)
    assert any(e.startswith("sweep.sm_89.DQ_TILE_M: missing") for e in errs), errs
    assert any(e.startswith("sweep.sm_89.TILE_M: unknown key") for e in errs), errs
    space = {"family": "fmha_bwd", "DKV_TILE_M": [64], "DKV_TILE_N": [32, 64],
             "DQ_TILE_M": [64], "DQ_TILE_N": [48], "occupancy": [1], "num_ctas": [1]}
    doc["sweep"]["sm_89"] = space
    one_error(doc, "sweep.sm_89.DQ_TILE_N[0]", "48 is not a power of two")
    del doc["steps"][3]                              # no forward sweep step left
    doc["sweep"]["sm_89"]["DQ_TILE_N"] = [64]
    sp = parse_plan(doc).sweep_space("sm_89")
    assert sp.family == "fmha_bwd" and sp.DKV_TILE_N == (32, 64)
    assert len(sp.configs()) == 2 and sp.tile_configs()[1] == {
        "DKV_TILE_M": 64, "DKV_TILE_N": 64, "DQ_TILE_M": 64, "DQ_TILE_N": 64}


def test_spak_plan_runs_one_family_through_it(tiny, tmp_path, capsys):
    """--family keeps one family's steps; a backward step simulates dQ, dK, dV through the
    fmha_bwd family (the worst output against its gate), and its GPU gates read only rows
    of its own family."""
    plan_file = tmp_path / "two.toml"
    plan_file.write_text(tiny.read_text().split('[[steps]]\nid = "tuned"')[0] + BWD_STEP)
    out = tmp_path / "rep"
    assert cli.main(["plan", str(plan_file), "--family", "fmha_bwd", "--out", str(out),
                     "--no-gpu"]) == 0, capsys.readouterr().out
    doc = json.loads((out / "report.json").read_text())
    assert {g["step"] for g in doc["gates"]} == {"backward"}
    (case,) = doc["evidence"]["backward"]["cases"]
    assert case["case"] == "1x2x17x32/fp16/causal" and 0 < case["rel_l2"] < 1e-3
    assert "spak sim --family fmha_bwd" in doc["gates"][0]["how"]
    plan = load_plan(plan_file)
    runner = PlanRunner(plan, out_dir=tmp_path, log=lambda m: None,
                        gpu_info={"present": True, "arch": "sm_90", "profile": "h100-sxm"})
    fwd_row = _run_row("1x2x17x32/fp16/causal")                  # no family: the forward
    bwd_row = dict(fwd_row, family="fmha_bwd", rel_l2=5e-3)      # above the gate
    runner.judge_gpu_rows(plan.step("fused"), "sm_90", [fwd_row, bwd_row])
    runner.judge_gpu_rows(plan.step("backward"), "sm_90", [fwd_row, bwd_row])
    err = [g for g in runner.gates if g["metric"] == "Numerical error (GPU vs float64)"]
    assert [(g["step"], g["status"]) for g in err] == [("fused", PASS), ("backward", FAIL)]
    assert cli.main(["plan", str(tiny), "--family", "fmha_bwd", "--out", str(out)]) == 2


def test_recorded_sweep_rows_of_either_schema_are_judged(tiny, tmp_path):
    """Sweep files written before the package split say schema "spak.sweep/1"."""
    case = "1x2x4096x64/fp16/noncausal"
    rows = [{"schema": schema, "kind": "result", "gpu": "NVIDIA H200", "arch": "sm_90",
             "provider": provider, "case": case, "status": "ok", "tflops": tflops,
             "config": {"TILE_M": 64, "TILE_N": 64}}
            for schema in ("spak.sweep/1", "spak.sweep/2")
            for provider, tflops in (("spak-fused-default", 400.0), ("spak-fused", 440.0))]
    for part in (rows[:2], rows[2:]):
        runner = PlanRunner(load_plan(tiny), out_dir=tmp_path, log=lambda m: None,
                            compile=False, recorded=part, recorded_files=["sweep.jsonl"])
        runner.run_gpu()
        tuned = [g for g in runner.gates if g["metric"] == "Tuned >= default tiles"
                 and g["arch"] == "sm_90"]
        assert tuned[0]["status"] == PASS and "1.100" in tuned[0]["measured"]
