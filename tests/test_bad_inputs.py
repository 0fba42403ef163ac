"""Bad input, table-driven: every case asserts the error type AND that the message names the
argument (or field, or file). Complements tests/test_api_validation.py (spak.fmha's own
validate()) with the other public entry points:

* the simulator: ``sim.launch`` and ``sim.SimArray``;
* the CPU loop: ``spak.cpu.simrun.simulate_fmha`` and ``gpu.plan.plan_fmha``;
* the command line: usage errors exit 2 with a message on stderr naming the argument,
  never a traceback; a malformed plan file exits 2 naming the file;
* files: a truncated or corrupt results JSONL (``spak report``, ``spak sweep --resume``'s
  reader, ``spak store update``), leaderboard, or tuned-config store (``spak store show``
  exits 1 naming the file; ``spak.tune.store.lookup`` warns and falls back to None).

docs/errors.md is the policy table these cases pin down.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import cuda.tile as ct

from spak.results.jsonl import read_results
from spak import sim
from spak.gpu.plan import plan_fmha
from spak import cli
import spak.cli.report as report
from spak.tune import choose as store
from spak.tune import sweep
from spak.tune import store as tuned
from spak.cpu.simrun import simulate_fmha
from tests import sim_kernels as K

ROOT = Path(__file__).resolve().parents[1]
ConstInt = ct.Constant[int]


@ct.kernel
def offset_copy(X, Y, off: int, T: ConstInt):
    """Y[tile i] = X[tile i + off]: a kernel with a plain (int32) integer parameter."""
    i = ct.bid(0)
    ct.store(Y, (i,), ct.load(X, (i + off,), (T,), padding_mode=ct.PaddingMode.ZERO))


def _check(exc, names, fn):
    with pytest.raises(exc) as ei:
        fn()
    msg = str(ei.value)
    for n in names:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


# ====================================================================== the simulator

X16 = np.zeros((64, 64), np.float32)
V32 = np.zeros(32, np.float32)


def _copy(*args, grid=(4, 4), **kw):
    return lambda: sim.launch(K.copy2d, grid, args, **kw)


SIM_CASES = [
    # (id, exception, names in the message, call)
    ("launch-too-few-args", TypeError, ["copy2d", "4 arguments", "X, Y, TM, TN", "got 2"],
     _copy(X16, X16.copy())),
    ("launch-too-many-args", TypeError, ["copy2d", "4 arguments", "got 5"],
     _copy(X16, X16.copy(), 16, 16, 1)),
    ("launch-str-array-arg", TypeError, ["'Y'", "str"], _copy(X16, "Y", 16, 16)),
    ("launch-list-array-arg", TypeError, ["'Y'", "list"], _copy(X16, [0.0] * 16, 16, 16)),
    ("launch-none-array-arg", TypeError, ["'X'", "NoneType"], _copy(None, X16, 16, 16)),
    ("launch-non-contiguous", ValueError, ["X", "C-contiguous"],
     _copy(X16[:, ::2], np.zeros((64, 32), np.float32), 16, 16)),
    ("launch-transposed-view", ValueError, ["X", "C-contiguous"],
     _copy(np.zeros((32, 64), np.float32).T, np.zeros((64, 32), np.float32), 16, 16)),
    ("launch-int-overflows-int32", ValueError, ["'off'", "int32", "ScalarInt64"],
     lambda: sim.launch(offset_copy, (2,), (V32, V32.copy(), 2 ** 40, 16))),
    ("grid-zero", ValueError, ["grid", "positive", "(0, 4)"], _copy(X16, X16.copy(), 16, 16,
                                                                    grid=(0, 4))),
    ("grid-negative", ValueError, ["grid", "(-1,)"], _copy(X16, X16.copy(), 16, 16, grid=-1)),
    ("grid-4d", ValueError, ["grid", "1 to 3"], _copy(X16, X16.copy(), 16, 16,
                                                      grid=(1, 1, 1, 1))),
    ("grid-empty", ValueError, ["grid"], _copy(X16, X16.copy(), 16, 16, grid=())),
    ("model-unknown", ValueError, ["numeric model", "sm_75", "sm_90", "sm_120"],
     _copy(X16, X16.copy(), 16, 16, model="sm_75")),
    ("model-not-a-name", ValueError, ["numeric model", "90"],
     _copy(X16, X16.copy(), 16, 16, model=90)),
    ("kernel-not-a-kernel", TypeError, ["kernel", "@ct.kernel", "int"],
     lambda: sim.launch(42, (1,), ())),
    ("tile-not-power-of-two", sim.SimTypeError, ["tile shape", "(3, 16)", "powers of two"],
     _copy(X16, X16.copy(), 3, 16)),
    ("bf16-held-in-float16", TypeError, ["Q", "bfloat16", "float32", "float16"],
     lambda: sim.SimArray(np.zeros(4, np.float16), ct.bfloat16, name="Q")),
    ("bf16-held-in-float64", TypeError, ["K", "bfloat16", "float32", "float64"],
     lambda: sim.SimArray(np.zeros(4, np.float64), ct.bfloat16, name="K")),
    ("fp16-held-in-float32", TypeError, ["V", "float16", "float32"],
     lambda: sim.SimArray(np.zeros(4, np.float32), ct.float16, name="V")),
    ("simarray-from-list", TypeError, ["SimArray", "numpy array", "list"],
     lambda: sim.SimArray([0.0, 1.0], ct.float16)),
    ("simarray-non-contiguous", ValueError, ["Q", "C-contiguous"],
     lambda: sim.SimArray(np.zeros((4, 8), np.float32)[:, ::2], name="Q")),
    ("array-complex-dtype", sim.SimTypeError, ["complex64", "cuTile"],
     _copy(X16.astype(np.complex64), X16.astype(np.complex64), 16, 16)),
    ("array-object-dtype", sim.SimTypeError, ["object", "cuTile"],
     _copy(np.zeros((16, 16), object), np.zeros((16, 16), object), 16, 16, grid=(1, 1))),
]


@pytest.mark.parametrize("exc,names,call", [c[1:] for c in SIM_CASES], ids=[c[0] for c in SIM_CASES])
def test_simulator_rejects_bad_input_naming_it(exc, names, call):
    _check(exc, names, call)


# sim/launch.py's grid/args checks (gaps found by this suite, fixed in sim/launch.py).
def test_sim_grid_string_is_rejected():
    _check(TypeError, ["grid"], _copy(X16, X16.copy(), 16, 16, grid="4"))


def test_sim_grid_float_is_rejected():
    _check(TypeError, ["grid"], _copy(X16, X16.copy(), 16, 16, grid=(1.5, 4)))


def test_sim_grid_none_names_grid():
    _check(TypeError, ["grid"], _copy(X16, X16.copy(), 16, 16, grid=None))


def test_sim_args_not_a_sequence_names_args():
    _check(TypeError, ["args"], lambda: sim.launch(K.copy2d, (1, 1), 5))


# ====================================================================== simulate_fmha

RNG = np.random.default_rng(8)


def a16(*shape):
    return RNG.standard_normal(shape).astype(np.float16)


Q, KK, VV = a16(1, 2, 8, 16), a16(1, 2, 8, 16), a16(1, 2, 8, 16)


def simf(**kw):
    args = {"kernel_name": "fused", "q": Q, "k": KK, "v": VV, **kw}
    return lambda: simulate_fmha(args.pop("kernel_name"), args.pop("q"), args.pop("k"),
                                 args.pop("v"), **args)


FMHA_CASES = [
    ("q-3d", ValueError, ["q", "4D", "(2, 8, 16)"], simf(q=Q[0])),
    ("k-5d", ValueError, ["k", "4D"], simf(k=KK[None])),
    ("v-2d", ValueError, ["v", "4D"], simf(v=VV[0, 0])),
    ("q-list", TypeError, ["q", "numpy array", "list"], simf(q=Q.tolist())),
    ("k-torch-like-object", TypeError, ["k", "numpy array"], simf(k=object())),
    ("batch-mismatch", ValueError, ["batch", "k 2"], simf(k=a16(2, 2, 8, 16), v=a16(2, 2, 8, 16))),
    ("kv-heads-mismatch", ValueError, ["heads", "2 and 1"], simf(v=a16(1, 1, 8, 16))),
    ("hq-not-multiple-of-hkv", ValueError, ["q heads (3)", "multiple", "(2)"],
     simf(q=a16(1, 3, 8, 16))),
    ("kv-zero-heads", ValueError, ["q heads (2)", "k/v heads (0)"],
     simf(k=a16(1, 0, 8, 16), v=a16(1, 0, 8, 16))),
    ("kv-seq-mismatch", ValueError, ["sequence length", "8 and 9"], simf(v=a16(1, 2, 9, 16))),
    ("head-dim-mismatch", ValueError, ["head dim", "16 and 32"], simf(k=a16(1, 2, 8, 32))),
    ("head-dim-512", ValueError, ["q/k head dim", "[1, 256]", "512"],
     simf(q=a16(1, 2, 8, 512), k=a16(1, 2, 8, 512), v=a16(1, 2, 8, 512))),
    ("head-dim-0", ValueError, ["q/k head dim", "got 0"],
     simf(q=a16(1, 2, 8, 0), k=a16(1, 2, 8, 0), v=a16(1, 2, 8, 0))),
    ("v-head-dim-300", ValueError, ["v head dim", "300"], simf(v=a16(1, 2, 8, 300))),
    ("q-float32-for-fp16", TypeError, ["q dtype", "float16", "float32"],
     simf(q=Q.astype(np.float32))),
    ("k-mixed-dtype", TypeError, ["k dtype", "float16", "float32"],
     simf(k=KK.astype(np.float32))),
    ("v-float64", TypeError, ["v dtype", "float64"], simf(v=VV.astype(np.float64))),
    ("q-int32", TypeError, ["q dtype", "int32"], simf(q=Q.astype(np.int32))),
    ("dtype-fp8", ValueError, ["dtype", "fp16", "bf16", "fp8"], simf(dtype="fp8")),
    ("dtype-float16-spelling", ValueError, ["dtype", "'float16'"], simf(dtype="float16")),
    ("bf16-given-float16-arrays", TypeError, ["q dtype", "float32", "bf16"], simf(dtype="bf16")),
    ("mask-wrong-shape", ValueError, ["mask shape (8, 7)", "broadcast", "[1, 2, 8, 8]"],
     simf(mask=np.zeros((8, 7), np.float32))),
    ("mask-5d", ValueError, ["mask shape", "broadcast"],
     simf(mask=np.zeros((1, 1, 1, 8, 8), np.float32))),
    ("mask-wrong-heads", ValueError, ["mask shape (1, 3, 8, 8)"],
     simf(mask=np.zeros((1, 3, 8, 8), np.float32))),
    ("mask-int-dtype", TypeError, ["mask dtype", "bool", "int32"],
     simf(mask=np.zeros((8, 8), np.int32))),
    ("mask-complex-dtype", TypeError, ["mask dtype", "complex64"],
     simf(mask=np.zeros((8, 8), np.complex64))),
    ("mask-list", TypeError, ["mask", "numpy array", "list"], simf(mask=[[0.0] * 8] * 8)),
    ("mask-str", TypeError, ["mask", "str"], simf(mask="causal")),
    ("scale-nan", ValueError, ["scale", "finite", "nan"], simf(scale=float("nan"))),
    ("scale-inf", ValueError, ["scale", "finite", "inf"], simf(scale=math.inf)),
    ("scale-neg-inf", ValueError, ["scale", "finite"], simf(scale=-math.inf)),
    ("scale-numpy-nan", ValueError, ["scale", "finite"], simf(scale=np.float32("nan"))),
    ("scale-str", TypeError, ["scale", "real number", "'0.1'"], simf(scale="0.1")),
    ("scale-list", TypeError, ["scale", "[0.1]"], simf(scale=[0.1])),
    ("scale-bool", TypeError, ["scale", "True"], simf(scale=True)),
    ("scale-complex", TypeError, ["scale", "1j"], simf(scale=1j)),
    ("scale-overflows-float32", ValueError, ["scale", "float32", "1e+39"], simf(scale=1e39)),
    ("causal-str", TypeError, ["causal", "bool", "'yes'"], simf(causal="yes")),
    ("causal-int", TypeError, ["causal", "bool"], simf(causal=1)),
    ("causal-none", TypeError, ["causal", "None"], simf(causal=None)),
    ("tiles-3x5", ValueError, ["tiles['TILE_M']", "[16, 256]", "3"], simf(tiles=(3, 5))),
    ("tiles-48-not-pow2", ValueError, ["tiles['TILE_M']", "power of two", "48"],
     simf(tiles=(48, 64))),
    ("tiles-512-too-big", ValueError, ["tiles['TILE_M']", "[16, 256]", "512"],
     simf(tiles=(512, 64))),
    ("tiles-n-8-too-small", ValueError, ["tiles['TILE_N']", "8"], simf(tiles=(64, 8))),
    ("tiles-unknown-key", ValueError, ["tiles", "unknown keys", "TILE_K", "TILE_M, TILE_N"],
     simf(tiles={"TILE_K": 64})),
    ("tiles-float", TypeError, ["tiles['TILE_M']", "int", "64.0"], simf(tiles={"TILE_M": 64.0})),
    ("tiles-pair-float", TypeError, ["tiles['TILE_N']", "int"], simf(tiles=(64, 32.0))),
    ("tiles-str", TypeError, ["tiles", "'64x64'"], simf(tiles="64x64")),
    ("tiles-3-tuple", TypeError, ["tiles", "(64, 64, 64)"], simf(tiles=(64, 64, 64))),
    ("tiles-int", TypeError, ["tiles", "64"], simf(tiles=64)),
    ("tiles-lat-k-11", ValueError, ["tiles['LAT_K']", "[0, 10]", "11"], simf(tiles={"LAT_K": 11})),
    ("kernel-unknown", ValueError, ["kernel_name", "fused", "naive", "'flash'"],
     simf(kernel_name="flash")),
    ("model-unknown", ValueError, ["numeric model", "sm_75"], simf(model="sm_75")),
]


@pytest.mark.parametrize("exc,names,call", [c[1:] for c in FMHA_CASES],
                         ids=[c[0] for c in FMHA_CASES])
def test_simulate_fmha_rejects_bad_input_naming_it(exc, names, call):
    _check(exc, names, call)


def test_simulate_fmha_does_not_modify_its_inputs():
    """bf16 inputs are rounded on a copy (they used to be rounded in the caller's array)."""
    q = RNG.standard_normal((1, 1, 8, 16)).astype(np.float32)     # not bf16 values
    before = q.copy()
    simulate_fmha("fused", q, q, q, dtype="bf16")
    np.testing.assert_array_equal(q, before)


# ---------------------------------------------------------------- gpu.plan.plan_fmha itself

def _out(q=Q, v=VV):
    return np.zeros(q.shape[:3] + v.shape[3:], q.dtype)


def planf(q=Q, k=KK, v=VV, out=None, **kw):
    return lambda: plan_fmha(kw.pop("kernel_name", "fused"), q, k, v,
                             _out(q, v) if out is None else out, **kw)


PLAN_CASES = [
    ("out-wrong-shape", ValueError, ["out", "shape", "(1, 2, 8, 16)", "(1, 2, 8, 8)"],
     planf(out=np.zeros((1, 2, 8, 8), np.float16))),
    ("out-dtype-mismatch", TypeError, ["out dtype", "float32", "float16"],
     planf(out=np.zeros((1, 2, 8, 16), np.float32))),
    ("q-no-shape", TypeError, ["q", ".shape", "int"], planf(q=3, out=_out())),
    ("q-non-contiguous", ValueError, ["q", "contiguous"],
     planf(q=a16(1, 2, 8, 32)[..., ::2])),
    ("k-transposed-view", ValueError, ["k", "contiguous"],
     planf(k=a16(1, 2, 16, 8).transpose(0, 1, 3, 2))),
    ("q-float32", TypeError, ["q dtype", "float16", "bfloat16"],
     planf(q=Q.astype(np.float32), out=np.zeros((1, 2, 8, 16), np.float32))),
    ("mask-float16", TypeError, ["mask dtype", "float32", "float16"],
     planf(mask=np.zeros((1, 1, 8, 8), np.float16))),
    ("mask-3d", ValueError, ["mask", "[MB, MH, Sq, Sk]", "(1, 8, 8)"],
     planf(mask=np.zeros((1, 8, 8), np.float32))),
    ("mask-non-contiguous", ValueError, ["mask", "contiguous"],
     planf(mask=np.zeros((1, 1, 8, 16), np.float32)[..., ::2])),
    ("alloc-not-callable", TypeError, ["alloc", "callable"],
     planf(kernel_name="naive", alloc="numpy")),
    ("alloc-missing-for-non-numpy", ValueError, ["alloc", "required", "SimArray"],
     planf(q=sim.SimArray(Q.copy(), ct.float16), k=sim.SimArray(KK.copy(), ct.float16),
           v=sim.SimArray(VV.copy(), ct.float16),
           out=sim.SimArray(np.zeros((1, 2, 8, 16), np.float16), ct.float16))),
    ("tiles-not-dict", TypeError, ["tiles", "dict"], planf(tiles=(64, 64))),
    ("causal-numpy-int", TypeError, ["causal", "bool"], planf(causal=np.int64(1))),
]


@pytest.mark.parametrize("exc,names,call", [c[1:] for c in PLAN_CASES],
                         ids=[c[0] for c in PLAN_CASES])
def test_plan_fmha_rejects_bad_input_naming_it(exc, names, call):
    _check(exc, names, call)


@pytest.mark.parametrize("kernel,B,Hq,ok", [("fused", 65535, 2, True), ("fused", 65536, 1, False),
                                             ("fused", 1, 65536, False),
                                             ("naive", 32768, 2, False), ("naive", 1, 65535, True)])
def test_plan_fmha_checks_the_grid_limit(kernel, B, Hq, ok):
    """Batch and heads that the launch grid cannot hold are a ValueError naming both, for
    shape-only stand-ins (no memory needed); sizes at the limit still plan."""
    from spak.gpu.compile import _ArraySpec
    q = _ArraySpec((B, Hq, 8, 16), "float16")
    kv = _ArraySpec((B, 1, 8, 16), "float16")
    alloc = lambda shape, kind: _ArraySpec(tuple(shape), "float32")  # noqa: E731
    call = lambda: plan_fmha(kernel, q, kv, kv, q, alloc=alloc)  # noqa: E731
    if ok:
        grid = call()[0].grid
        assert max(grid[1:]) <= 65535 and grid[0] * grid[1] * grid[2] >= B * Hq
    else:
        _check(ValueError, ["65535", str(B) if kernel == "fused" else str(B * Hq)], call)


def test_scale_bound_is_the_same_in_spak_fmha_and_the_plan():
    from spak.gpu import plan
    api = pytest.importorskip("spak.api")
    assert api.MAX_SCALE == plan.MAX_SCALE
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 1, 4, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="scale must be within"):
        api.validate(q, q, q, scale=1e39, require_cuda=False)
    api.validate(q, q, q, scale=1e30, require_cuda=False)           # large but representable


@pytest.mark.parametrize("scale", [0.125, 1 / 11.3, 1.0, 0.5 / 1.4426950408889634, 1e30,
                                   3e-38, 1e6])
def test_raw_max_multiplier_is_a_power_of_two_within_2x_of_c(scale):
    """The fused kernel's fast path: c = fl32(fl32(scale) * fl32(log2 e)) as the GPU forms
    it, and the huge-row multiplier 2^k with c/2 < 2^k <= c (gpu/kernels/fused.py)."""
    import math
    import numpy as np
    from spak.gpu.plan import raw_max_args
    raw, c_pow2 = raw_max_args(scale, has_mask=False)
    c = float(np.float32(np.float32(scale) * np.float32(1.4426950408889634)))
    assert raw
    assert c / 2 < c_pow2 <= c
    assert math.frexp(c_pow2)[0] == 0.5                     # a power of two
    assert raw_max_args(scale, has_mask=True) == (False, 1.0)   # masks: the general path


@pytest.mark.parametrize("scale", [0.0, -0.0, -0.125, -1e30, 1e-46, 1e-40, 8e-39])
def test_zero_negative_and_subnormal_scales_take_the_general_path(scale):
    """max(x * c) == max(x) * c needs c > 0, and a c that is subnormal in float32 is 0 on
    the GPU (flush to zero): -inf * 0 = NaN for masked keys."""
    from spak.gpu.plan import raw_max_args
    assert raw_max_args(scale, has_mask=False) == (False, 1.0)


def test_every_single_field_mutation_of_the_plan_is_a_plan_error():
    """plans/fmha.toml with any one value replaced by a wrong type or value, or deleted:
    parse_plan either accepts it or raises PlanError listing the problem; never another
    exception (which `spak plan`/`spak compile` would show as a traceback)."""
    import copy
    from spak.recipe.schema import DEFAULT_PLAN, PlanError, _toml, parse_plan
    doc = _toml().loads(DEFAULT_PLAN.read_text())
    paths = []

    def walk(x, path):
        if path:
            paths.append(path)
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        for key, val in items:
            walk(val, path + (key,))
    walk(doc, ())
    bad_values = [None, "x", -1, 0, 1.5, [], {}, [1], {"a": 1}, True, 10 ** 30, math.nan,
                  math.inf, "DELETE"]
    rejected = 0
    for path in paths:
        for bad in bad_values:
            d = copy.deepcopy(doc)
            parent = d
            for key in path[:-1]:
                parent = parent[key]
            if bad == "DELETE":
                del parent[path[-1]]
            else:
                parent[path[-1]] = bad
            try:
                parse_plan(d)
            except PlanError as e:
                assert e.errors and all(isinstance(m, str) for m in e.errors)
                rejected += 1
    assert len(paths) > 200 and rejected > 1000


# ====================================================================== the command line

def run_cli(argv, capsys):
    """spak's main in-process: (exit code, stdout, stderr). An exception escaping main is
    a crash (the console script would print a traceback): the test fails on it."""
    try:
        code = cli.main(argv)
    except SystemExit as e:           # argparse usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad-files")
    f = {"dir": d}
    f["toml_syntax"] = d / "syntax.toml"
    f["toml_syntax"].write_text("this is [not toml\n")
    f["toml_binary"] = d / "binary.toml"
    f["toml_binary"].write_bytes(b"\xff\xfe\x00garbage\x80\n")
    f["toml_schema"] = d / "schema.toml"
    f["toml_schema"].write_text('schema = 1\nname = 3\ntitle = "t"\n')
    f["toml_steps"] = d / "steps.toml"
    f["toml_steps"].write_text('schema = 1\nname = "x"\ntitle = "t"\nsteps = "all"\n'
                               '[targets.sm_90]\ngpus = ["h200"]\n')
    f["store"] = d / "store.json"
    f["store"].write_text('{"version": 1, "configs": [{"gpu": "G", "kernel": "fu')
    f["store_types"] = d / "store-types.json"
    f["store_types"].write_text(json.dumps({"version": 1, "configs": [
        {"gpu": "G", "kernel": "fused", "dtype": "fp16", "head_dim": "sixty-four",
         "causal": False, "seq_bucket": 4096, "tiles": {"TILE_M": 64, "TILE_N": 64}}]}))
    f["leaderboard"] = d / "lb.json"
    f["leaderboard"].write_text('{"version": 1, "entr')
    f["leaderboard_entries"] = d / "lb-entries.json"
    f["leaderboard_entries"].write_text('{"version": 1, "entries": [1]}')
    f["results"] = d / "results.jsonl"
    f["results"].write_text(json.dumps(_result_row("64x64", 300.0)) + "\n")
    return f


CLI_CASES = [
    # (id, argv (strings; {name} = a file of the fixture), exit code, names on stderr)
    ("sim-shape-too-short", ["sim", "--shapes", "1x2"], 2, ["argument --shapes", "'1x2'",
                                                            "B x H x S x D"]),
    ("sim-tiles-not-pow2", ["sim", "--tiles", "3x5"], 2, ["argument --tiles", "TILE_M",
                                                          "power of two"]),
    ("sim-tiles-too-small", ["sim", "--tiles", "8x8"], 2, ["argument --tiles", "TILE_M",
                                                           "[16, 256]"]),
    ("sim-tiles-too-big", ["sim", "--tiles", "64x512"], 2, ["argument --tiles", "TILE_N",
                                                            "512"]),
    ("sim-tiles-garbage", ["sim", "--tiles", "big"], 2, ["argument --tiles", "TILE_MxTILE_N"]),
    ("sim-dtype-fp8", ["sim", "--dtype", "fp8"], 2, ["argument --dtype", "'fp8'", "fp16"]),
    ("sim-model-unknown", ["sim", "--model", "sm_75", "--shapes", "1x1x16x16/fp16/causal"], 2,
     ["argument --model", "'sm_75'", "sm_90"]),
    ("sim-head-dim-512", ["sim", "--shapes", "1x2x16x512"], 2, ["argument --shapes", "D must be",
                                                                "256", "512"]),
    ("sim-head-dim-0", ["sim", "--shapes", "1x2x16x0"], 2, ["argument --shapes", "D must be"]),
    ("sim-batch-0", ["sim", "--shapes", "0x2x16x64"], 2, ["argument --shapes", "B must be"]),
    ("sim-seq-0", ["sim", "--shapes", "1x2x0x64"], 2, ["argument --shapes", "Sq must be"]),
    ("sim-kv-seq-0", ["sim", "--shapes", "1x2x16:0x64"], 2, ["argument --shapes", "Sk must be"]),
    ("sim-gqa-not-multiple", ["sim", "--shapes", "1x3:2x16x64"], 2, ["argument --shapes",
                                                                     "multiple"]),
    ("sim-conflicting-quals", ["sim", "--shapes", "1x2x16x64/fp16/bf16"], 2,
     ["argument --shapes", "conflicting"]),
    ("sim-causal-maybe", ["sim", "--causal", "maybe"], 2, ["argument --causal", "'maybe'"]),
    ("unknown-subcommand", ["bogus"], 2, ["invalid choice", "'bogus'", "sim"]),
    ("run-tiles-not-pow2", ["run", "--tiles", "3x5"], 2, ["argument --tiles", "TILE_M"]),
    ("run-shape-too-short", ["run", "--shapes", "1x2"], 2, ["argument --shapes", "'1x2'"]),
    ("run-sim-work-not-int", ["run", "--sim-work", "lots"], 2, ["argument --sim-work"]),
    ("store-unknown-action", ["store", "bogus"], 2, ["argument ACTION", "'bogus'", "show"]),
    ("store-lookup-head-dim-str", ["store", "lookup", "G", "fused", "fp16", "sixty", "no",
                                   "4096"], 2, ["argument head_dim", "'sixty'"]),
    ("report-no-files", ["report"], 2, ["results"]),
    ("report-missing-file", ["report", "{dir}/nope.jsonl"], 2, ["no such results file",
                                                                "nope.jsonl"]),
    ("report-corrupt-leaderboard", ["report", "{results}", "--no-plots", "--out-dir", "{dir}/r1",
                                    "--leaderboard", "{leaderboard}"], 2,
     ["lb.json", "cannot read the leaderboard"]),
    ("report-leaderboard-bad-entries", ["report", "{results}", "--no-plots", "--check",
                                        "--leaderboard", "{leaderboard_entries}"], 2,
     ["lb-entries.json", "entries[0]"]),
    ("sweep-shape-too-short", ["sweep", "--shapes", "1x2"], 2, ["argument --shapes"]),
    ("sweep-space-not-pow2", ["sweep", "--list", "--shapes", "1x1x128x64", "--space",
                              "TILE_M=96"], 2, ["argument --space", "power of two"]),
    ("plan-missing-file", ["plan", "{dir}/missing.toml"], 2, ["missing.toml", "cannot read"]),
    ("plan-toml-syntax", ["plan", "{toml_syntax}"], 2, ["syntax.toml", "not valid TOML",
                                                        "line 1"]),
    ("plan-not-utf8", ["plan", "{toml_binary}"], 2, ["binary.toml", "UTF-8"]),
    ("plan-schema-fields", ["plan", "{toml_schema}"], 2, ["schema.toml", "name: expected a string",
                                                          "steps: missing"]),
    ("plan-steps-not-tables", ["plan", "{toml_steps}"], 2, ["steps.toml", "steps"]),
    ("plan-directory", ["plan", "{dir}"], 2, ["cannot read the plan"]),
    ("compile-toml-syntax", ["compile", "--plan", "{toml_syntax}", "--list"], 2,
     ["syntax.toml", "not valid TOML"]),
    ("compile-not-utf8", ["compile", "--plan", "{toml_binary}", "--list"], 2,
     ["binary.toml", "UTF-8"]),
    ("compile-schema-fields", ["compile", "--plan", "{toml_schema}", "--list"], 2,
     ["schema.toml", "name: expected a string", "targets: missing"]),
    ("compile-arch-bogus", ["compile", "--arch", "h100", "--list"], 2, ["argument --arch"]),
    ("store-show-truncated", ["store", "--store", "{store}", "show"], 1,
     ["store.json", "cannot read the tuned-config store"]),
    ("store-show-wrong-types", ["store", "--store", "{store_types}", "show"], 1,
     ["store-types.json", "configs[0].head_dim"]),
    ("store-lookup-truncated", ["store", "--store", "{store}", "lookup", "G", "fused", "fp16",
                                "64", "no", "4096"], 1, ["store.json", "cannot read"]),
]


@pytest.mark.parametrize("argv,code,names", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_usage_is_an_exit_code_and_a_message(argv, code, names, files, capsys):
    argv = [a.format(**files) for a in argv]
    got, _, err = run_cli(argv, capsys)
    assert got == code, err
    assert "Traceback" not in err
    for n in names:
        assert n in err, f"{n!r} not in {err!r}"


@pytest.mark.parametrize("argv", [["sim", "--shapes", "1x2x16x512"], ["plan", "{toml_binary}"],
                                  ["report", "{results}", "--no-plots", "--leaderboard",
                                   "{leaderboard_entries}"]])
def test_console_entry_point_never_prints_a_traceback(argv, files):
    """The same through `python -m spak` (what the `spak` script runs)."""
    r = subprocess.run([sys.executable, "-m", "spak", *[a.format(**files) for a in argv]],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() and "Traceback" not in r.stderr, r.stderr


# ====================================================================== files

GPU = "NVIDIA H100 80GB HBM3"


def _result_row(cid, tflops, *, S=2048, provider="spak-fused", **extra):
    B, H, D = 16384 // S, 32, 64
    cfg = None if provider.startswith("sdpa") else {
        "TILE_M": int(cid.split("x")[0]), "TILE_N": int(cid.split("x")[1].split("/")[0]),
        "occupancy": None, "num_ctas": None}
    return {"schema": "spak.sweep/1", "kind": "result", "sweep_id": "s", "gpu": GPU,
            "arch": "sm_90", "commit": "c0ffee", "date": "2026-11-22T03:00:00Z",
            "kernel": "fused", "case": f"{B}x{H}x{S}x{D}/fp16/noncausal",
            "shape": f"{B}x{H}x{S}x{D}", "B": B, "Hq": H, "Hkv": H, "Sq": S, "Sk": S, "D": D,
            "dtype": "fp16", "causal": False, "flops": 4.0 * B * H * S * S * D,
            "provider": provider, "config_id": cid, "config": cfg, "status": "ok",
            "tflops": tflops, "error": None, **extra}


GOOD_ROWS = [_result_row("64x64", 300.0), _result_row("128x64", 350.0),
             _result_row("-", 400.0, provider="sdpa-cudnn")]

# (id, the text appended after the good rows, what the readers must report)
CORRUPT_TAILS = [
    ("torn-last-line", '{"schema": "spak.sweep/1", "kind": "res', "corrupt line"),
    ("nul-padding", "\x00" * 64, "corrupt line"),
    ("invalid-utf8", "\udcff\udcfe garbage\n", "corrupt line"),
    ("schema-not-a-string", '{"schema": 5, "kind": "result"}\n', "'schema' must be a string"),
    ("tflops-not-a-number", json.dumps(_result_row("32x64", "fast")) + "\n",
     "'tflops' must be a number"),
    ("head-dim-not-a-number", json.dumps(_result_row("32x32", 9.0, D="sixty")) + "\n",
     "'D' must be a number"),
    ("config-not-an-object", json.dumps({**_result_row("16x64", 9.0), "config": "64x64"}) + "\n",
     "'config' must be an object"),
    ("config-tile-a-string", json.dumps({**_result_row("16x16", 9.0),
                                         "config": {"TILE_M": "64", "TILE_N": 64}}) + "\n",
     "config.TILE_M must be an integer"),
    ("run-tiles-a-string", json.dumps({"schema": "spak.run/1", "provider": "spak-fused",
                                       "case": "1x1x128x64/fp16/causal", "gpu": GPU,
                                       "tiles": "64x64", "passed": True}) + "\n",
     "'tiles' must be an object"),
    ("not-an-object", "[1, 2]\n3\nnull\n", "not a JSON object"),
]


def _corrupt_file(tmp_path, tail) -> Path:
    p = tmp_path / "results.jsonl"
    text = "".join(json.dumps(r) + "\n" for r in GOOD_ROWS) + tail
    p.write_bytes(text.encode("utf-8", "surrogateescape"))
    return p


@pytest.mark.parametrize("tail,warns", [c[1:] for c in CORRUPT_TAILS], ids=[c[0] for c in CORRUPT_TAILS])
def test_report_reads_a_corrupt_results_file(tail, warns, tmp_path, capsys):
    p = _corrupt_file(tmp_path, tail)
    code, out, err = run_cli(["report", str(p), "--no-plots", "--out-dir", str(tmp_path / "r"),
                              "--leaderboard", str(tmp_path / "lb.json")], capsys)
    assert code == 0, err
    if warns:
        assert "warning" in err and p.name in err and warns in err, err
    md = (tmp_path / "r" / "report.md").read_text()
    assert "128x64" in md and "350.0" in md                # the good rows are all there


@pytest.mark.parametrize("tail,warns", [c[1:] for c in CORRUPT_TAILS], ids=[c[0] for c in CORRUPT_TAILS])
def test_sweep_resume_and_store_update_read_a_corrupt_results_file(tail, warns, tmp_path):
    p = _corrupt_file(tmp_path, tail)
    rows = read_results(p, warn=lambda m: None)
    done = sweep.done_keys(rows, GPU, "fused", retry_failed=False)
    assert {k[2] for k in done} == {"64x64", "128x64", "-"}   # corrupt rows are not "done"
    lines = store.update_store([p], tmp_path / "store.json")
    assert any("128x64" in ln for ln in lines), lines        # the best good row wins
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 2048,
                        path=tmp_path / "store.json") == {"TILE_M": 128, "TILE_N": 64}


def test_sweep_resume_skips_a_result_row_without_its_keys():
    rows = [{**GOOD_ROWS[0]}, {k: v for k, v in GOOD_ROWS[1].items() if k != "case"},
            {**GOOD_ROWS[2], "config_id": None}]
    assert sweep.done_keys(rows, GPU, "fused", retry_failed=False) == {
        (GOOD_ROWS[0]["case"], "spak-fused", "64x64")}


def test_plan_gpu_results_reader_survives_a_corrupt_file(tmp_path):
    from spak.recipe.machine import read_result_files as read_jsonl
    p = tmp_path / "gpu.jsonl"
    p.write_bytes(json.dumps(GOOD_ROWS[0]).encode() + b"\n\xff\xfe\x80 torn\n{\"a\": ")
    assert read_jsonl([p]) == [GOOD_ROWS[0]]


ENTRY = {"gpu": "G", "kernel": "fused", "dtype": "fp16", "head_dim": 64, "causal": False,
         "seq_bucket": 4096, "tiles": {"TILE_M": 64, "TILE_N": 64}}


def _store_doc(**change):
    return json.dumps({"version": 1, "configs": [{**ENTRY, **change}]})


STORE_CASES = [
    # (id, file text (None: invalid UTF-8 bytes), what the warning names)
    ("truncated", _store_doc()[:-9], "cannot read"),
    ("empty", "", "cannot read"),
    ("nul-bytes", "\x00" * 32, "cannot read"),
    ("invalid-utf8", None, "UnicodeDecodeError"),
    ("nested-too-deep", "[" * 100000 + "]" * 100000, "RecursionError"),
    ("version-a-string", '{"version": "1", "configs": []}', "version"),
    ("configs-not-a-list", '{"version": 1, "configs": {}}', "'configs' must be a list"),
    ("entry-not-an-object", '{"version": 1, "configs": [7]}', "configs[0]"),
    ("entry-lacks-tiles", json.dumps({"version": 1, "configs": [
        {k: v for k, v in ENTRY.items() if k != "tiles"}]}), "lacks ['tiles']"),
    ("head-dim-a-string", _store_doc(head_dim="64"), "configs[0].head_dim"),
    ("seq-bucket-null", _store_doc(seq_bucket=None), "configs[0].seq_bucket"),
    ("gpu-a-list", _store_doc(gpu=["G"]), "configs[0].gpu"),
    ("dtype-unknown", _store_doc(dtype="fp8"), "configs[0].dtype"),
    ("causal-a-string", _store_doc(causal="no"), "configs[0].causal"),
    ("tile-a-bool", _store_doc(tiles={"TILE_M": True, "TILE_N": 64}), "tiles.TILE_M"),
    ("tile-not-pow2", _store_doc(tiles={"TILE_M": 96, "TILE_N": 64}), "tiles.TILE_M"),
    ("tile-too-big", _store_doc(tiles={"TILE_M": 1024, "TILE_N": 64}), "tiles.TILE_M"),
    ("hint-a-string", _store_doc(tiles={"TILE_M": 64, "TILE_N": 64, "occupancy": "two"}),
     "tiles.occupancy"),
    ("tflops-a-string", _store_doc(tflops="fast"), "configs[0].tflops"),
]


@pytest.mark.parametrize("text,names", [c[1:] for c in STORE_CASES], ids=[c[0] for c in STORE_CASES])
def test_corrupt_tuned_store_warns_and_falls_back(text, names, tmp_path, capsys):
    p = tmp_path / "tuned.json"
    if text is None:
        p.write_bytes(b"\xff\xfe\x00\x80garbage")
    else:
        p.write_text(text)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert tuned.lookup("G", "fused", "fp16", 64, False, 4096, path=p) is None
    msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
    assert len(msgs) == 1 and "tuned-config" in msgs[0] and p.name in msgs[0] \
        and names in msgs[0], msgs
    with pytest.raises(tuned.TunedStoreError, match="tuned.json"):
        tuned.lookup("G", "fused", "fp16", 64, False, 4096, path=p, strict=True)
    code, out, err = run_cli(["store", "--store", str(p), "show"], capsys)
    assert code == 1 and p.name in err and names in err and "Traceback" not in err, err


def test_a_valid_store_still_loads_after_the_stricter_checks(tmp_path):
    p = tmp_path / "tuned.json"
    p.write_text(_store_doc(tiles={"TILE_M": 128, "TILE_N": 64, "occupancy": 2, "num_ctas": 1,
                                   "LAT_K": 0}, tflops=300, date="2026-11-22", commit=None))
    assert tuned.lookup("G", "fused", "fp16", 64, False, 4096, path=p) == {
        "TILE_M": 128, "TILE_N": 64, "occupancy": 2, "num_ctas": 1, "LAT_K": 0}
    tuned.load_store(tuned.DEFAULT_PATH)          # the shipped store passes too


# ====================================================================== the count

def test_at_least_thirty_new_cases():
    n = (len(SIM_CASES) + len(FMHA_CASES) + len(PLAN_CASES) + len(CLI_CASES)
         + len(CORRUPT_TAILS) + len(STORE_CASES))
    assert n >= 30, n


def test_results_read_through_gzip_match_the_plain_file(tmp_path):
    # committed results are kept as .jsonl.gz; report and store update must read them
    import gzip
    plain = tmp_path / "r.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in GOOD_ROWS))
    packed = tmp_path / "r.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_results(packed) == read_results(plain) == GOOD_ROWS
    assert store.update_store([packed], tmp_path / "store.json")
    assert tuned.lookup(GPU, "fused", "fp16", 64, False, 2048,
                        path=tmp_path / "store.json") == {"TILE_M": 128, "TILE_N": 64}
