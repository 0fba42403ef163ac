"""spak.fmha validates every input before launching: CPU-runnable (CPU and meta tensors).

Each case asserts the exception type and that the message names the argument. The
device check comes last, so shape/dtype/mask/scale errors are reported for CPU tensors too,
and a fully valid call with CPU tensors fails on the device, naming q/k/v and CUDA.
Also here: the tuned-config store and the compiler diagnosis (spak.tune.store, spak.device.env),
and `spak run`'s CPU-side helpers (slicing for the simulator, stats, results file).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spak  # noqa: E402
from spak.device import env as gpu_env  # noqa: E402
from spak.tune import store as tuned
from spak.api import validate  # noqa: E402

F16, BF16 = torch.float16, torch.bfloat16


def t(*shape, dtype=F16, device="cpu"):
    return torch.randn(shape, dtype=torch.float32).to(dtype) if device == "cpu" else \
        torch.empty(shape, dtype=dtype, device=device)


def qkv(B=1, Hq=2, Hkv=2, Sq=8, Sk=8, D=16, Dv=None, dtype=F16, device="cpu"):
    return (t(B, Hq, Sq, D, dtype=dtype, device=device),
            t(B, Hkv, Sk, D, dtype=dtype, device=device),
            t(B, Hkv, Sk, Dv or D, dtype=dtype, device=device))


def raises(exc, *names, call=None, **kw):
    """spak.fmha(**kw) raises exc and the message names every one of `names`."""
    with pytest.raises(exc) as ei:
        (call or spak.fmha)(**kw)
    msg = str(ei.value)
    for n in names:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


Q, K, V = qkv()

CASES = [
    # (id, exception, names in the message, kwargs)
    ("q-not-tensor", TypeError, ["q", "torch.Tensor"], dict(q=np.zeros((1, 2, 8, 16)), k=K, v=V)),
    ("k-not-tensor", TypeError, ["k"], dict(q=Q, k=[1, 2], v=V)),
    ("v-none", TypeError, ["v"], dict(q=Q, k=K, v=None)),
    ("q-3d", ValueError, ["q", "4D"], dict(q=Q[0], k=K, v=V)),
    ("k-5d", ValueError, ["k", "4D"], dict(q=Q, k=K[None], v=V)),
    ("v-2d", ValueError, ["v", "4D"], dict(q=Q, k=K, v=V[0, 0])),
    ("q-float32", TypeError, ["q", "float16", "bfloat16"], dict(q=Q.float(), k=K, v=V)),
    ("q-int", TypeError, ["q dtype"], dict(q=Q.to(torch.int32), k=K, v=V)),
    ("k-dtype-mixed", TypeError, ["k", "q dtype"], dict(q=Q, k=K.to(BF16), v=V)),
    ("v-dtype-mixed", TypeError, ["v", "q dtype"], dict(q=Q, k=K, v=V.float())),
    ("batch-mismatch", ValueError, ["batch", "k 2"],
     dict(q=Q, k=t(2, 2, 8, 16), v=t(2, 2, 8, 16))),
    ("kv-heads-mismatch", ValueError, ["heads", "v 1"], dict(q=Q, k=K, v=t(1, 1, 8, 16))),
    ("kv-seq-mismatch", ValueError, ["sequence length", "v 9"], dict(q=Q, k=K, v=t(1, 2, 9, 16))),
    ("head-dim-mismatch", ValueError, ["head_dim", "k 32"],
     dict(q=Q, k=t(1, 2, 8, 32), v=V)),
    ("head-dim-too-big", ValueError, ["head_dim", "256"], dict(zip("qkv", qkv(D=512)))),
    ("head-dim-zero", ValueError, ["head_dim"], dict(zip("qkv", qkv(D=0)))),
    ("v-head-dim-too-big", ValueError, ["v head_dim"], dict(zip("qkv", qkv(Dv=300)))),
    ("gqa-not-divisible", ValueError, ["multiple", "3"], dict(zip("qkv", qkv(Hq=4, Hkv=3)))),
    ("gqa-needs-flag", ValueError, ["enable_gqa"], dict(zip("qkv", qkv(Hq=8, Hkv=2)))),
    ("gqa-flag-not-bool", TypeError, ["enable_gqa"], dict(q=Q, k=K, v=V, enable_gqa="yes")),
    ("kv-zero-heads", ValueError, ["k/v heads"], dict(zip("qkv", qkv(Hq=2, Hkv=0)))),
    ("mask-not-tensor", TypeError, ["attn_mask"], dict(q=Q, k=K, v=V, attn_mask=np.ones((8, 8)))),
    ("mask-int-dtype", TypeError, ["attn_mask", "bool"],
     dict(q=Q, k=K, v=V, attn_mask=torch.ones(8, 8, dtype=torch.int64))),
    ("mask-bad-shape", ValueError, ["attn_mask", "broadcast"],
     dict(q=Q, k=K, v=V, attn_mask=torch.ones(8, 7, dtype=torch.bool))),
    ("mask-5d", ValueError, ["attn_mask", "4 dims"],
     dict(q=Q, k=K, v=V, attn_mask=torch.ones(1, 1, 1, 8, 8, dtype=torch.bool))),
    ("mask-wrong-heads", ValueError, ["attn_mask"],
     dict(q=Q, k=K, v=V, attn_mask=torch.zeros(1, 3, 8, 8))),
    ("causal-not-bool", TypeError, ["is_causal"], dict(q=Q, k=K, v=V, is_causal=1)),
    ("scale-nan", ValueError, ["scale", "finite"], dict(q=Q, k=K, v=V, scale=float("nan"))),
    ("scale-inf", ValueError, ["scale", "finite"], dict(q=Q, k=K, v=V, scale=math.inf)),
    ("scale-neg-inf", ValueError, ["scale"], dict(q=Q, k=K, v=V, scale=-math.inf)),
    ("scale-str", TypeError, ["scale", "real number"], dict(q=Q, k=K, v=V, scale="0.1")),
    ("scale-bool", TypeError, ["scale"], dict(q=Q, k=K, v=V, scale=True)),
    ("scale-tensor", TypeError, ["scale"], dict(q=Q, k=K, v=V, scale=torch.tensor(0.1))),
    ("scale-complex", TypeError, ["scale"], dict(q=Q, k=K, v=V, scale=1j)),
    ("kernel-unknown", ValueError, ["kernel", "fused", "naive"], dict(q=Q, k=K, v=V, kernel="x")),
    ("tiles-not-dict", TypeError, ["tiles"], dict(q=Q, k=K, v=V, tiles=(64, 64))),
    ("tiles-unknown-key", ValueError, ["tiles", "TILE_K"], dict(q=Q, k=K, v=V, tiles={"TILE_K": 64})),
    ("tiles-not-pow2", ValueError, ["TILE_M", "power of two"],
     dict(q=Q, k=K, v=V, tiles={"TILE_M": 48})),
    ("tiles-too-small", ValueError, ["TILE_N"], dict(q=Q, k=K, v=V, tiles={"TILE_N": 8})),
    ("tiles-float", TypeError, ["TILE_N"], dict(q=Q, k=K, v=V, tiles={"TILE_N": 64.0})),
    ("cpu-tensors", ValueError, ["CUDA", "cpu"], dict(q=Q, k=K, v=V)),
    ("meta-tensors", ValueError, ["CUDA", "meta"], dict(zip("qkv", qkv(device="meta")))),
    ("mixed-devices", ValueError, ["one device", "meta"],
     dict(q=Q, k=t(1, 2, 8, 16, device="meta"), v=V)),
    ("mask-other-device", ValueError, ["attn_mask", "meta"],
     dict(q=Q, k=K, v=V, attn_mask=torch.empty(8, 8, dtype=torch.bool, device="meta"))),
]


@pytest.mark.parametrize("exc,names,kw", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_naming_the_argument(exc, names, kw):
    raises(exc, *names, **kw)


def test_at_least_thirty_cases():
    assert len(CASES) >= 30


def test_shape_errors_come_before_the_device_error():
    # CPU tensors with a bad head dim: the head dim is reported, not the device.
    msg = raises(ValueError, "head_dim", q=Q, k=t(1, 2, 8, 32), v=V)
    assert "CUDA" not in msg


@pytest.mark.parametrize("scale", [0, 0.0, -0.5, -3, 2, np.float32(0.25), np.float64(-1.0)])
def test_zero_negative_and_numpy_scales_are_valid(scale):
    c = validate(Q, K, V, scale=scale, require_cuda=False)
    assert c.scale == float(scale)


def test_valid_inputs_pass_without_cuda_check():
    q, k, v = qkv(Hq=8, Hkv=1, Sq=5, Sk=17, D=64, Dv=32, dtype=BF16)
    c = validate(q.transpose(2, 3).transpose(2, 3), k, v, enable_gqa=True, is_causal=True,
                 attn_mask=torch.ones(5, 17, dtype=torch.bool), tiles={"TILE_M": 64},
                 require_cuda=False)
    assert (c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, c.Dv) == (1, 8, 1, 5, 17, 64, 32)
    assert c.scale is None and c.causal and c.tiles == {"TILE_M": 64}
    # additive float masks of any float dtype, broadcast from 2D to 4D
    for dt in (F16, BF16, torch.float32, torch.float64):
        validate(q, k, v, enable_gqa=True, attn_mask=torch.zeros(1, 1, 5, 17, dtype=dt),
                 require_cuda=False)


@pytest.mark.parametrize("kw,sizes,filled", [
    (dict(B=0), (0, 2, 2, 8, 8), None), (dict(Sq=0), (1, 2, 2, 0, 8), None),
    (dict(Sk=0), (1, 2, 2, 8, 0), 0.0), (dict(Hq=0, Hkv=0), (1, 0, 0, 8, 8), None)])
def test_zero_size_dims_give_the_documented_output(monkeypatch, kw, sizes, filled):
    """docs/errors.md: B, Hq or Sq = 0 give an empty output, Sk = 0 gives zeros; nothing is
    launched. Through spak.fmha (CPU tensors: only the CUDA check and the launch are
    replaced, and the launch fails the test if it is reached)."""
    import spak.api as api
    import spak.gpu.launch as gl
    c = validate(*qkv(**kw, Dv=32), require_cuda=False)
    assert (c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, c.Dv) == sizes + (16, 32)

    def launched(*a, **k):
        raise AssertionError("a zero-size problem launched a kernel")
    monkeypatch.setattr(api, "validate", lambda *a, **k: validate(*a, require_cuda=False, **k))
    monkeypatch.setattr(api, "_device_info", lambda device: ("sm_90", "H100"))
    monkeypatch.setattr(gl, "fmha_into", launched)
    monkeypatch.setattr(gl, "current_raw_stream", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    api._VALIDATED.clear()
    try:
        q, k, v = qkv(**kw, Dv=32)
        out = spak.fmha(q, k, v)
    finally:
        api._VALIDATED.clear()             # filled without the CUDA check
    B, Hq, _, Sq, _ = sizes
    assert out.shape == (B, Hq, Sq, 32) and out.dtype == F16
    if filled is None:
        assert out.numel() == 0
    else:
        assert out.numel() > 0 and (out == filled).all()


def test_import_spak_does_not_import_torch():
    import subprocess
    import sys
    code = ("import sys, spak, spak.cli, spak.device.gpurun, spak.tune.store, spak.device.env; "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_custom_op_is_registered_with_a_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode
    assert hasattr(torch.ops.spak, "fmha")
    with FakeTensorMode():
        q = torch.empty(2, 8, 100, 64, dtype=F16)
        k = torch.empty(2, 2, 300, 64, dtype=F16)
        v = torch.empty(2, 2, 300, 32, dtype=F16)
        out = torch.ops.spak.fmha(q, k, v, None, True, 0.125, "fused", 64, 64)
    assert out.shape == (2, 8, 100, 32) and out.dtype == F16


# ------------------------------------------------------------------ tuned-config store

def test_tuned_store_lookup_roundtrip(tmp_path):
    p = tmp_path / "tuned.json"
    assert tuned.lookup("GPU", "fused", "fp16", 64, False, 4096, path=p) is None  # no file
    store = {"version": tuned.FORMAT_VERSION, "configs": []}
    for seq, tn in ((1024, 32), (4096, 64), (16384, 128)):
        tuned.upsert(store, tuned.make_entry("GPU", "fused", torch.float16, 64, False, seq,
                                             {"TILE_M": 64, "TILE_N": tn}, tflops=1.0))
    tuned.upsert(store, tuned.make_entry("GPU", "fused", "fp16", 64, False, 4000,
                                         {"TILE_M": 128, "TILE_N": 64}))   # replaces 4096
    tuned.write_store(store, p)
    assert len(json.loads(p.read_text())["configs"]) == 3
    look = lambda *a: tuned.lookup(*a, path=p)  # noqa: E731
    assert look("GPU", "fused", "float16", 64, False, 4096) == {"TILE_M": 128, "TILE_N": 64}
    assert look("GPU", "fused", "fp16", 64, False, 900) == {"TILE_M": 64, "TILE_N": 32}
    assert look("GPU", "fused", "fp16", 64, False, 10 ** 6) == {"TILE_M": 64, "TILE_N": 128}
    assert look("GPU", "fused", "fp16", 64, True, 4096) is None       # other causal
    assert look("GPU", "fused", "bf16", 64, False, 4096) is None
    assert look("Other GPU", "fused", "fp16", 64, False, 4096) is None
    assert tuned.seq_bucket(1) == 128 and tuned.seq_bucket(1000) == 1024


@pytest.mark.parametrize("text", ["{", "[]", '{"version": 99, "configs": []}',
                                  '{"version": 1, "configs": [{"gpu": "x"}]}',
                                  '{"version": 1}'])
def test_corrupt_tuned_store_warns_or_raises(tmp_path, text):
    p = tmp_path / "tuned.json"
    p.write_text(text)
    with pytest.warns(RuntimeWarning, match="tuned-config"):
        assert tuned.lookup("GPU", "fused", "fp16", 64, False, 4096, path=p) is None
    with pytest.raises(tuned.TunedStoreError, match=str(p.name)):
        tuned.lookup("GPU", "fused", "fp16", 64, False, 4096, path=p, strict=True)


def test_shipped_store_is_valid():
    doc = tuned.load_store(tuned.DEFAULT_PATH)
    assert doc["version"] == tuned.FORMAT_VERSION and isinstance(doc["configs"], list)


# ------------------------------------------------------------------ compiler diagnosis

GOOD = {"cuda-tile": "1.7.0", "nvidia-cuda-tileiras": "13.4.92",
        "nvidia-cuda-nvcc": "13.4.92", "nvidia-nvvm": "13.4.92"}
NONE = {k: None for k in GOOD}


def fake_which(tools):
    """which(name, path=...) over {dir: {tool, ...}}."""
    def which(name, path=""):
        for d in str(path).split(":"):
            if name in tools.get(d, ()):
                return f"{d}/{name}"
        return None
    return which


def diag(versions=GOOD, env=None, wheel="/w/bin/tileiras", tools=None, ver=None, kit=None,
         arch="sm_90"):
    return gpu_env.diagnose(arch=arch, versions=versions, env=env or {"PATH": "/usr/bin"},
                            wheel_tileiras=wheel, which=fake_which(tools or {}),
                            version_of=lambda p: (ver or {}).get(p, "13.4.92") if p else None,
                            toolkit_version_of=lambda h: (kit or {}).get(h))


def codes(problems):
    return [p.code for p in problems]


def test_diagnosis_ok():
    assert diag() == []
    # the .carry set-up of the GPU machine: no wheels, tileiras + ptxas on PATH
    assert diag(NONE, env={"PATH": "/tc/bin"}, wheel=None,
                tools={"/tc/bin": {"tileiras", "ptxas"}}) == []


def test_diagnosis_tileiras_missing():
    ps = diag(NONE, wheel=None)
    assert codes(ps) == ["tileiras-missing"] and 'pip install -e ".[gpu]"' in ps[0].fix


def test_diagnosis_wheel_mismatch_falls_back_to_old_path_tileiras():
    v = dict(GOOD, **{"nvidia-nvvm": "13.2.51"})
    ps = diag(v, tools={"/usr/bin": {"tileiras"}}, ver={"/usr/bin/tileiras": "13.1.80"})
    assert codes(ps) == ["wheel-mismatch", "tileiras-version"]
    assert "nvidia-nvvm 13.2.51" in ps[0].message and "nvidia-nvvm==13.4.92" in ps[0].fix
    assert "13.1.80" in ps[1].message
    # a missing wheel is a mismatch too; nothing else on PATH -> tileiras missing
    ps = diag(dict(GOOD, **{"nvidia-cuda-nvcc": None}))
    assert codes(ps) == ["wheel-mismatch", "tileiras-missing"]


def test_diagnosis_old_cuda_home():
    env = {"PATH": "/usr/bin", "CUDA_HOME": "/usr/local/cuda-12.4"}
    ps = diag(NONE, env=env, wheel=None, tools={"/usr/local/cuda-12.4/bin": {"tileiras"}},
              kit={"/usr/local/cuda-12.4": "12.4"})
    assert "cuda-home-old" in codes(ps)
    p = ps[codes(ps).index("cuda-home-old")]
    assert "CUDA_HOME=/usr/local/cuda-12.4" in p.message and "unset CUDA_HOME" in p.fix
    assert "failed to compile Tile IR program" in p.message
    # with the wheel's tileiras, cuTile strips CUDA_HOME: not a problem
    assert diag(env=env, kit={"/usr/local/cuda-12.4": "12.4"}) == []
    # CUDA_PATH too
    env = {"PATH": "/tc", "CUDA_PATH": "/opt/cuda12"}
    ps = diag(NONE, env=env, wheel=None, tools={"/tc": {"tileiras"}}, kit={"/opt/cuda12": "12.8"})
    assert codes(ps) == ["cuda-home-old"] and "CUDA_PATH" in ps[0].message


def test_diagnosis_old_ptxas_and_arch():
    ps = diag(NONE, env={"PATH": "/a:/b"}, wheel=None,
              tools={"/a": {"tileiras"}, "/b": {"ptxas"}}, ver={"/b/ptxas": "12.6.20"})
    assert codes(ps) == ["ptxas-old"] and "12.6.20" in ps[0].message
    ps = diag(arch="sm_75")
    assert codes(ps) == ["arch-unsupported"] and "sm_75" in ps[0].message


def test_explain_wraps_compile_errors():
    err = RuntimeError("failed to compile Tile IR program")
    assert gpu_env.is_compile_error(err)
    assert not gpu_env.is_compile_error(ValueError("bad shape"))
    wrapped = gpu_env.explain(err, arch="sm_90", versions=NONE, env={"PATH": ""},
                              wheel_tileiras=None, which=fake_which({}))
    assert isinstance(wrapped, gpu_env.CompilerSetupError)
    assert "failed to compile Tile IR program" in str(wrapped)
    assert "tileiras-missing" in str(wrapped) and wrapped.original is err


# ------------------------------------------------------------------ spak run helpers (CPU)

def test_sim_slice_is_tile_aligned_and_bounded():
    from spak.device.attention import attention_slice as sim_slice
    s = sim_slice(1, 32, 32, 16384, 16384, 64, 64, heads=1, work=1 << 29)
    assert s["r0"] % 64 == 0 and s["rows"] * 16384 * 64 <= (1 << 29) + 64 * 16384 * 64
    assert s["hq"] == 1 and s["hkv"] == 1 and not s["full"]
    s = sim_slice(1, 2, 2, 100, 100, 64, 64, heads=2)
    assert s["full"] and s["r0"] == 0
    s = sim_slice(2, 16, 2, 512, 512, 64, 64, heads=2)          # GQA 8:1: both on kv head 0
    assert (s["hq"], s["hkv"]) == (2, 1)
    s = sim_slice(1, 8, 4, 512, 512, 64, 64, heads=5)            # group 2: whole groups only
    assert (s["hq"], s["hkv"]) == (4, 2)


@pytest.mark.parametrize("case", ["1x4:2x300:500x64/causal", "1x2x200x64/noncausal",
                                  "2x2x130x64/causal/mask", "1x2x300:100x64/causal/bf16"])
def test_sim_slice_reproduces_the_full_problem_bit_for_bit(case):
    """The simulator on spak run's slice gives the same bits as on the whole problem: so
    comparing the GPU's slice with the simulated slice is a fair test."""
    from types import SimpleNamespace
    from spak.device.agreement import agreement
    from spak.families.fmha_fwd import FAMILY
    from spak.attention.problems import make_inputs, parse_spec
    from spak.cpu.simrun import kernel_mask, simulate_fmha
    spec = parse_spec(case)
    inp = make_inputs(spec, 0)
    full, _ = simulate_fmha("fused", inp.q, inp.k, inp.v, mask=inp.mask, causal=spec.causal,
                            dtype=spec.dtype, tiles=(64, 64))   # the slice's tiles below
    tt = (lambda a: torch.from_numpy(np.ascontiguousarray(a))) if spec.dtype == "fp16" else \
        (lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(BF16))
    km = None if inp.mask is None else torch.from_numpy(
        kernel_mask(inp.mask, spec.B, spec.Hq, spec.Sq, spec.Sk).copy())
    res = agreement(FAMILY, "fused", spec, {"q": tt(inp.q), "k": tt(inp.k), "v": tt(inp.v),
                                            "kmask": km}, {"out": tt(full)},
                    {"TILE_M": 64, "TILE_N": 64}, model="sm_90", heads=1,
                    work=64 * spec.Sk * spec.D)      # force a partial slice
    assert res["fraction_bit_identical"] == 1.0 and res["max_ulp"] == 0, res


def test_stats_and_results_file(tmp_path):
    from spak.core.stats import stats
    from spak.results.jsonl import append_jsonl
    s = stats([3.0, 1.0, 2.0, 4.0, 100.0])
    assert s["ms_median"] == 3.0 and s["ms_min"] == 1.0 and s["runs"] == 5
    p = tmp_path / "r.jsonl"
    append_jsonl(p, {"a": 1, "x": float("nan")})
    append_jsonl(p, {"a": 2})
    rows = [json.loads(ln) for ln in p.read_text().splitlines()]
    assert rows == [{"a": 1, "x": None}, {"a": 2}]


def test_spak_run_without_gpu_says_so(capsys):
    from spak.cli import main
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert main(["run", "--shapes", "1x1x64x64", "--out", "-"]) == 1
    assert "no CUDA GPU" in capsys.readouterr().err
    assert main(["run", "--list"]) == 0
    assert len(capsys.readouterr().out.split()) == 32        # 24 standard + 8 seed (fp16)
