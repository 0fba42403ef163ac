"""spak.fmha's eager fast path (CPU-runnable): the validated-call memo and the direct call
of the op's body.

A call whose signature was validated before skips validate() and resolve_tiles(); plain
eager calls (plain tensors, no autograd, no compile/trace/mode/transform/profiler) call
api._impl directly instead of torch.ops.spak.fmha. Neither may change a result or an error.
No GPU here: validate() runs without its CUDA check, the device is reported as an H100, and
_impl / the op / fmha_into / ct.launch are recorders.
"""
from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import spak  # noqa: E402
from spak import api  # noqa: E402
from spak.tune import store as tuned

F16, BF16 = torch.float16, torch.bfloat16
GPU, ARCH = "NVIDIA H100 80GB HBM3", "sm_90"
REAL_VALIDATE = api.validate


def qkv(B=1, Hq=2, Hkv=2, Sq=8, Sk=8, D=16, Dv=None, dtype=F16, device="cpu"):
    # random values although only routing is tested here (the kernel is a recorder)
    g = torch.Generator().manual_seed(B * 1000 + Sq * 10 + D)
    return tuple(torch.randn(shape, generator=g).to(dtype=dtype, device=device)
                 for shape in ((B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, Dv or D)))


def _out(q, v):
    return torch.zeros(q.shape[:3] + v.shape[3:], dtype=q.dtype, device=q.device)


@pytest.fixture
def rec(monkeypatch, tmp_path):
    """Recorders: rec.validate (calls), rec.impl / rec.op (the op arguments after q, k, v)."""
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(tmp_path / "tuned.json"))   # no file yet
    monkeypatch.setattr(api, "STORE_RECHECK_S", 0)     # every call looks (the throttle: below)
    monkeypatch.setattr(api, "_device_info", lambda device: (ARCH, GPU))
    r = SimpleNamespace(validate=0, impl=[], op=[], store=tmp_path / "tuned.json")

    def validate(*a, **kw):
        r.validate += 1
        return REAL_VALIDATE(*a, require_cuda=False, **kw)

    def impl(q, k, v, *args):
        r.impl.append(args)
        return _out(q, v)

    def op(q, k, v, *args):
        r.op.append(args)
        return _out(q, v) + 0 * q.sum()        # batched under vmap, like the real op's output
    monkeypatch.setattr(api, "validate", validate)
    monkeypatch.setattr(api, "_impl", impl)
    monkeypatch.setattr(torch.ops.spak, "fmha", op)
    r.train = []

    def train(q, k, v, *args):
        r.train.append(args)
        return _out(q, v)
    monkeypatch.setattr(api, "_Train", SimpleNamespace(apply=train))
    monkeypatch.setattr(api, "_train_apply", lambda q, k, v, args: train(q, k, v, *args))
    api._VALIDATED.clear()
    api._lookup_cache.clear()
    yield r
    api._VALIDATED.clear()      # filled by validation without the CUDA check: not for others
    api._lookup_cache.clear()


def expected_args(q, k, v, **kw):
    """The op arguments the full path computes (validate + resolve_tiles), memo untouched."""
    kw = {"attn_mask": None, "is_causal": False, "scale": None, "enable_gqa": False,
          "kernel": "fused", "tiles": None, **kw}
    return api._op_args(q, k, v, kw["attn_mask"], kw["is_causal"], kw["scale"],
                        kw["enable_gqa"], kw["kernel"], kw["tiles"])


# ------------------------------------------------------------------------ the memo

def test_a_repeated_signature_skips_validation_with_identical_arguments(rec):
    q, k, v = qkv()
    out = spak.fmha(q, k, v, is_causal=True, scale=0.5)
    assert out.shape == (1, 2, 8, 16) and rec.validate == 1 and len(rec.impl) == 1
    q2, k2, v2 = qkv()                                     # new tensors, same signature
    spak.fmha(q2, k2, v2, is_causal=True, scale=0.5)
    assert rec.validate == 1 and len(rec.impl) == 2 and rec.op == []
    assert rec.impl[0] == rec.impl[1] == expected_args(q, k, v, is_causal=True, scale=0.5)
    assert rec.impl[0][:4] == (None, True, 0.5, "fused")
    assert len(api._VALIDATED) == 1
    (key, args), = api._VALIDATED.items()        # no tensors kept alive by the memo
    assert not any(isinstance(x, torch.Tensor) for x in (*key, *args))


# Each case: a valid call fills the memo, then a call with the same q/k/v shapes differing in
# one argument must raise exactly what validate() raises. The True == 1 == 1.0 cases are the
# ones a key without argument types would wrongly let through.
BAD_AFTER_VALID = [
    ("scale-bool-after-1", dict(scale=1), dict(scale=True)),
    ("scale-bool-after-none", dict(), dict(scale=False)),
    ("scale-nan", dict(scale=0.5), dict(scale=float("nan"))),
    ("scale-inf", dict(scale=0.5), dict(scale=math.inf)),
    ("scale-huge", dict(scale=0.5), dict(scale=1e39)),
    ("scale-str", dict(scale=0.5), dict(scale="0.5")),
    ("scale-tensor", dict(scale=0.5), dict(scale=torch.tensor(0.5))),
    ("causal-int-after-true", dict(is_causal=True), dict(is_causal=1)),
    ("causal-int-after-false", dict(is_causal=False), dict(is_causal=0)),
    ("causal-none", dict(), dict(is_causal=None)),
    ("gqa-int-after-true", dict(enable_gqa=True), dict(enable_gqa=1)),
    ("kernel-unknown", dict(), dict(kernel="fast")),
    ("kernel-not-str", dict(), dict(kernel=None)),
    ("tiles-bad", dict(), dict(tiles={"TILE_M": 48})),
    ("tiles-float", dict(), dict(tiles={"TILE_M": 64.0})),
    ("mask-bad-shape", dict(), dict(attn_mask=torch.ones(8, 7, dtype=torch.bool))),
    ("mask-int", dict(), dict(attn_mask=torch.ones(8, 8, dtype=torch.int32))),
    ("mask-other-device", dict(), dict(attn_mask=torch.ones(8, 8, dtype=torch.bool,
                                                            device="meta"))),
]


@pytest.mark.parametrize("good,bad", [c[1:] for c in BAD_AFTER_VALID],
                         ids=[c[0] for c in BAD_AFTER_VALID])
def test_a_memoised_signature_still_raises_validate_errors(rec, good, bad):
    q, k, v = qkv()
    spak.fmha(q, k, v, **good)
    spak.fmha(q, k, v, **good)
    assert rec.validate == 1 and len(rec.impl) == 2
    with pytest.raises(Exception) as want:
        REAL_VALIDATE(q, k, v, **bad, require_cuda=False)
    with pytest.raises(want.type) as got:
        spak.fmha(q, k, v, **bad)
    assert str(got.value) == str(want.value)
    assert len(rec.impl) == 2 and rec.op == []


@pytest.mark.parametrize("case", ["k-dtype", "all-float32", "v-device", "k-head-dim",
                                  "k-seq", "q-3d", "gqa-off"])
def test_other_tensors_after_a_valid_call_raise_validate_errors(rec, case):
    q, k, v = qkv(Hq=4, Hkv=2)
    spak.fmha(q, k, v, enable_gqa=True)
    spak.fmha(q, k, v, enable_gqa=True)
    assert rec.validate == 1
    bad = {"k-dtype": lambda: dict(q=q, k=k.to(BF16), v=v, enable_gqa=True),
           "all-float32": lambda: dict(q=q.float(), k=k.float(), v=v.float(), enable_gqa=True),
           "v-device": lambda: dict(q=q, k=k, v=v.to("meta"), enable_gqa=True),
           "k-head-dim": lambda: dict(q=q, k=qkv(Hkv=2, D=32)[1], v=v, enable_gqa=True),
           "k-seq": lambda: dict(q=q, k=qkv(Hkv=2, Sk=9)[1], v=v, enable_gqa=True),
           "q-3d": lambda: dict(q=q[0], k=k, v=v, enable_gqa=True),
           "gqa-off": lambda: dict(q=q, k=k, v=v, enable_gqa=False)}[case]()
    with pytest.raises(Exception) as want:
        REAL_VALIDATE(**bad, require_cuda=False)
    with pytest.raises(want.type) as got:
        spak.fmha(**bad)
    assert str(got.value) == str(want.value)
    assert len(rec.impl) == 2


def test_the_cuda_check_is_not_skipped():
    """The real validate (with its CUDA check) fills the memo only for valid calls: a CPU
    call fails on the device every time."""
    api._VALIDATED.clear()
    q, k, v = qkv()
    for _ in range(3):
        with pytest.raises(ValueError, match="CUDA"):
            spak.fmha(q, k, v)
    assert not api._VALIDATED


VARIANTS = [
    dict(), dict(is_causal=True), dict(scale=0.25), dict(scale=2), dict(scale=2.0),
    dict(scale=-0.5), dict(scale=0), dict(scale=0.0), dict(scale=-0.0), dict(kernel="naive"),
    dict(kernel="naive", is_causal=True), dict(enable_gqa=True), dict(tiles={"TILE_M": 32}),
    dict(attn_mask=torch.ones(8, 8, dtype=torch.bool)), dict(dtype=BF16), dict(D=32),
    dict(Sk=300), dict(Sq=1), dict(Hq=4, enable_gqa=True), dict(Hq=4, Hkv=1, enable_gqa=True),
]


def _memoisable(kw) -> bool:
    scale = kw.get("scale")
    return "tiles" not in kw and "attn_mask" not in kw and not (type(scale) is float
                                                                and scale == 0)


def test_every_signature_gets_the_full_paths_arguments(rec):
    """Calls in two rounds, each compared with validate + resolve_tiles computed afresh: the
    key tells is_causal, scale, kernel, enable_gqa, dtypes and shapes apart. A tuned entry
    for fp16 D=16 makes fp16 and bf16 (and D=16 and D=32) resolve to different tiles."""
    tuned.write_store({"version": 1, "configs": [tuned.make_entry(
        GPU, "fused", "fp16", 16, False, 8, {"TILE_M": 32, "TILE_N": 16, "occupancy": 2})]},
        rec.store)
    for second in range(2):
        for kw in VARIANTS:
            kw = dict(kw)
            shape = {n: kw.pop(n) for n in ("dtype", "D", "Sk", "Sq", "Hq", "Hkv") if n in kw}
            if "Hq" in shape:
                shape.setdefault("Hkv", 2)
            q, k, v = qkv(**shape)
            before = rec.validate
            spak.fmha(q, k, v, **kw)
            validated = rec.validate - before
            got, want = rec.impl[-1], expected_args(q, k, v, **kw)
            assert got == want, (kw, shape)
            if kw.get("scale") is not None:   # -0.0 == 0.0: the sign must survive too
                assert math.copysign(1, got[2]) == math.copysign(1, float(kw["scale"]))
            if second:                        # memoised: validated once only
                assert validated == (not _memoisable(kw)), kw
            else:                             # scale 2.0 finds scale 2's entry (same result)
                assert validated == (kw.get("scale") != 2.0 or type(kw["scale"]) is int), kw
    assert len(api._VALIDATED) == sum(map(_memoisable, VARIANTS)) - 1
    assert rec.impl[0][4:6] == (32, 16) and rec.impl[0][8] == 2     # the tuned entry
    assert rec.impl[VARIANTS.index(dict(dtype=BF16))][4:6] == (128, 128)


def test_a_rewritten_store_is_picked_up(rec):
    q, k, v = qkv()
    spak.fmha(q, k, v)
    assert rec.impl[-1][4:6] == (128, 128)             # no store file: default_tiles(16)
    for i, (tm, tn) in enumerate(((64, 32), (32, 16), (16, 16))):
        tuned.write_store({"version": 1, "configs": [tuned.make_entry(
            GPU, "fused", "fp16", 16, False, 8, {"TILE_M": tm, "TILE_N": tn})]}, rec.store)
        ns = 10**18 + i * 10**9                         # distinct mtimes, however fast
        os.utime(rec.store, ns=(ns, ns))
        spak.fmha(q, k, v)
        spak.fmha(q, k, v)
        assert rec.impl[-2][4:6] == rec.impl[-1][4:6] == (tm, tn)
    rec.store.unlink()                                  # gone: default tiles again
    spak.fmha(q, k, v)
    assert rec.impl[-1][4:6] == (128, 128)


def test_another_store_path_is_picked_up(rec, monkeypatch, tmp_path):
    q, k, v = qkv()
    spak.fmha(q, k, v)
    other = tmp_path / "other.json"
    tuned.write_store({"version": 1, "configs": [tuned.make_entry(
        GPU, "fused", "fp16", 16, False, 8, {"TILE_M": 64, "TILE_N": 64})]}, other)
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(other))
    spak.fmha(q, k, v)
    assert [a[4:6] for a in rec.impl] == [(128, 128), (64, 64)]
    monkeypatch.setattr(tuned, "store_path", lambda path=None: rec.store)   # no file
    spak.fmha(q, k, v)
    assert rec.impl[-1][4:6] == (128, 128)


def test_the_memo_is_bounded(rec):
    for sk in range(1, 600):
        spak.fmha(*qkv(Sk=sk))
        assert len(api._VALIDATED) <= 512
    assert rec.validate == 599 and len(api._VALIDATED) == 599 - 512


def test_tensor_subclasses_are_validated_every_call_through_the_op(rec):
    q, k, v = qkv()
    p = torch.nn.Parameter(q, requires_grad=False)
    for _ in range(3):
        spak.fmha(p, k, v)
    assert rec.validate == 3 and len(rec.op) == 3 and rec.impl == [] and not api._VALIDATED


# ------------------------------------------------------------------------ the direct call

def test_plain_eager_calls_the_body_directly(rec):
    q, k, v = qkv()
    spak.fmha(q, k, v)
    spak.fmha(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool))  # masks too
    assert len(rec.impl) == 2 and rec.op == []


@pytest.mark.parametrize("which", ["q", "k", "v", "mask"])
def test_requires_grad_with_grad_enabled_takes_the_op(rec, which):
    q, k, v = qkv()
    mask = torch.zeros(8, 8)
    {"q": q, "k": k, "v": v, "mask": mask}[which].requires_grad_()
    spak.fmha(q, k, v, attn_mask=mask)
    # plain eager training: the autograd.Function (api._Train); a mask that asks for a
    # gradient: the op, whose composite refuses it
    taken = rec.op if which == "mask" else rec.train
    assert len(taken) == 1 and rec.impl == [] and len(rec.op) + len(rec.train) == 1
    with torch.no_grad():
        spak.fmha(q, k, v, attn_mask=mask)
    with torch.inference_mode():
        spak.fmha(q, k, v, attn_mask=mask)
    assert len(taken) == 1 and len(rec.impl) == 2
    assert taken[0][1:] == rec.impl[0][1:] == rec.impl[1][1:]


def _real_op_on_cpu(monkeypatch, tmp_path):
    """The real _impl and op, with fmha_into and the CUDA device/stream queries stubbed."""
    import spak.gpu.launch as gl
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(tmp_path / "none.json"))
    monkeypatch.setattr(api, "_device_info", lambda device: (ARCH, GPU))
    monkeypatch.setattr(api, "validate",
                        lambda *a, **kw: REAL_VALIDATE(*a, require_cuda=False, **kw))
    calls, streams = [], []
    monkeypatch.setattr(gl, "fmha_into", lambda *a, **kw: calls.append((a[0], kw)))
    monkeypatch.setattr(gl, "current_raw_stream", lambda device=None: streams.append(device)
                        or "stream")
    return calls, streams


def test_requires_grad_through_the_real_op_is_recorded_by_autograd(monkeypatch, tmp_path):
    import spak.gpu.launch as gl
    calls, _ = _real_op_on_cpu(monkeypatch, tmp_path)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)   # CPU: index None
    monkeypatch.setattr(api, "_BWD_AVAILABLE", True)
    bwd = []
    monkeypatch.setattr(gl, "fmha_bwd_into", lambda *a, **kw: bwd.append(a))
    api._VALIDATED.clear()
    try:
        q, k, v = qkv()
        q.requires_grad_()
        out = spak.fmha(q, k, v)
        assert out.grad_fn is not None     # the op's autograd node (issue 16: a backward)
        assert "lse" in calls[-1][1]       # the forward wrote the LSE for it
        out.float().sum().backward()
        assert len(bwd) == 1 and q.grad.shape == q.shape
        assert bwd[0][6] is calls[-1][1]["lse"]     # ... and the backward got it back
        with torch.no_grad():
            assert spak.fmha(q, k, v).grad_fn is None
    finally:
        api._VALIDATED.clear()


def test_a_dispatch_mode_sees_the_op(rec):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    q, k, v = qkv()
    spak.fmha(q, k, v)
    with Mode():
        spak.fmha(q, k, v)
        spak.fmha(q, k, v)
    assert len(rec.impl) == 1 and len(rec.op) == 2
    assert rec.validate == 3                # under a mode every call is validated


def test_a_torch_function_mode_sees_the_op(rec):
    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    q, k, v = qkv()
    with Mode():
        spak.fmha(q, k, v)
    with torch.device("cpu"):               # a torch function mode too
        spak.fmha(q, k, v)
    assert rec.impl == [] and len(rec.op) == 2
    spak.fmha(q, k, v)
    assert len(rec.impl) == 1


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore:.*jit.trace.*:DeprecationWarning")
def test_compiling_tracing_vmap_and_profiler_take_the_op(rec, monkeypatch):
    q, k, v = qkv()
    torch.jit.trace(lambda q, k, v: spak.fmha(q, k, v), (q, k, v), check_trace=False)
    assert len(rec.op) == 1
    torch.vmap(lambda q, k, v: spak.fmha(q, k, v))(q[None], k[None], v[None])
    assert len(rec.op) == 2
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        spak.fmha(q, k, v)
    assert len(rec.op) == 3
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    spak.fmha(q, k, v)
    assert len(rec.op) == 4 and rec.impl == []
    assert rec.validate == 4 and not api._VALIDATED


def test_fake_cuda_tensors_go_through_the_real_op_and_its_fake(monkeypatch):
    """What torch.compile traces with: FakeTensors (a subclass, under FakeTensorMode) get the
    full validation, CUDA check included, and the op's fake; nothing is memoised."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    monkeypatch.setattr(api, "_device_info", lambda device: (ARCH, GPU))
    api._VALIDATED.clear()
    with FakeTensorMode():
        q = torch.empty(2, 8, 100, 64, dtype=F16, device="cuda")
        k, v = (torch.empty(2, 2, 300, d, dtype=F16, device="cuda") for d in (64, 32))
        for _ in range(2):
            out = spak.fmha(q, k, v, is_causal=True, enable_gqa=True)
            assert out.shape == (2, 8, 100, 32) and out.device.type == "cuda"
        with pytest.raises(ValueError, match="enable_gqa"):
            spak.fmha(q, k, v, is_causal=True)
    assert type(out).__name__ == "FakeTensor" and not api._VALIDATED


def test_missing_private_probes_fall_back_to_the_op(rec, monkeypatch):
    monkeypatch.setattr(api, "_CAN_SKIP_OP", False)
    q, k, v = qkv()
    spak.fmha(q, k, v)
    assert len(rec.op) == 1 and rec.impl == []


def test_fast_path_and_op_path_launch_the_same(monkeypatch, tmp_path):
    """The real _impl, reached directly and through torch.ops.spak.fmha, hands fmha_into the
    same config and stream; the device guard only when q's GPU is not the current one."""
    calls, streams = _real_op_on_cpu(monkeypatch, tmp_path)
    guards = []
    current = [None]                                    # CPU tensors: device.index is None
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", lambda dev: guards.append(dev)
                        or api._SAME_DEVICE)
    api._VALIDATED.clear()
    try:
        q, k, v = qkv()
        direct = spak.fmha(q, k, v, is_causal=True)
        via_op = torch.ops.spak.fmha(q, k, v, *expected_args(q, k, v, is_causal=True))
        assert direct.shape == via_op.shape == (1, 2, 8, 16)
        assert len(calls) == 2 and calls[0] == calls[1] and guards == []
        kernel, kw = calls[0]
        assert kernel == "fused" and kw["stream"] == "stream" and streams == [None, None]
        assert kw["tiles"] == {"TILE_M": 128, "TILE_N": 64, "LAT_K": 0, "LAT_V": 0}
        assert kw["hints"] == {"occupancy": None, "num_ctas": None} and kw["causal"] is True
        assert kw["scale"] == 0.25 and kw["mask"] is None
        current[0] = 3                                  # another GPU is current: the guard
        spak.fmha(q, k, v, is_causal=True)
        assert guards == [None] and calls[2] == calls[0]
    finally:
        api._VALIDATED.clear()


# ------------------------------------------------------------------ gpu.launch's cached path

def test_fmha_into_cached_path_launches_with_the_given_or_current_stream(monkeypatch):
    import cuda.tile as ct
    import spak.gpu.launch as gl
    launches = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args:
                        launches.append((stream, grid, kernel, args)))
    monkeypatch.setattr(gl, "current_raw_stream", lambda device=None: "current")
    gl._FUSED_PLANS.clear()
    t = [torch.randn(1, 2, 100, 64, dtype=F16) for _ in range(4)]
    plan = gl.plan_torch("fused", *t, causal=True, scale=0.125,
                         tiles={"TILE_M": 64, "TILE_N": 32})
    for tiles in ({"TILE_M": 64, "TILE_N": 32}, {"TILE_N": 32, "TILE_M": 64}):  # same, reordered
        gl.fmha_into("fused", *t, causal=True, scale=0.125, tiles=tiles, stream="given")
        gl.fmha_into("fused", *t, causal=True, scale=0.125, tiles=tiles)
    assert [s for s, *_ in launches] == ["given", "current"] * 2
    for _, grid, kernel, args in launches:
        assert grid == plan[0].grid and kernel is plan[0].kernel
        assert all(a is b for a, b in zip(args[:4], t)) and args[5:] == plan[0].args[5:]
    gl.fmha_into("fused", *t, causal=True, scale=0.125, tiles={"TILE_M": 64, "TILE_N": 64})
    assert launches[-1][3][5:] != plan[0].args[5:]      # other tiles: another plan


def test_current_raw_stream_asks_the_device_once(monkeypatch):
    import spak.gpu.launch as gl
    asked = []
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: ("raw", dev),
                        raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: asked.append(1) or 5)
    assert gl.current_raw_stream(2) == ("raw", 2) and asked == []
    assert gl.current_raw_stream() == ("raw", 5) and asked == [1]


def test_the_store_is_looked_at_once_a_second_or_at_once_after_a_write(rec, monkeypatch):
    """The store's version is memoised for STORE_RECHECK_S (a stat per call costs a third
    of the call's host time): another process's rewrite is seen after the window, one made
    through spak.tune.store.write_store at once."""
    clock = [100.0]
    monkeypatch.setattr(api, "_monotonic", lambda: clock[0])
    monkeypatch.setattr(api, "STORE_RECHECK_S", 1.0)
    q, k, v = qkv()
    spak.fmha(q, k, v)
    assert rec.impl[-1][4:6] == (128, 128)             # no store file: default_tiles(16)

    def entry(tm, tn):
        return {"version": 1, "configs": [tuned.make_entry(
            GPU, "fused", "fp16", 16, False, 8, {"TILE_M": tm, "TILE_N": tn})]}
    tuned.write_store(entry(64, 32), rec.store)        # this process: seen at once
    spak.fmha(q, k, v)
    assert rec.impl[-1][4:6] == (64, 32)
    rec.store.write_text(__import__("json").dumps(entry(32, 64)))    # "another process"
    os.utime(rec.store, ns=(10**18, 10**18))
    clock[0] += 0.5
    spak.fmha(q, k, v)
    assert rec.impl[-1][4:6] == (64, 32)               # inside the window: not looked at
    clock[0] += 0.6
    spak.fmha(q, k, v)
    assert rec.impl[-1][4:6] == (32, 64)               # after it: read again
