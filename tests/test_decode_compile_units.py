"""The decode family's sweep compile units (issue 33/36): the CPU helpers' stand-ins give
the same launch signatures as the planned call on the real inputs (shapes, dtypes, strides
as decode_gpu_inputs allocates them), so a CPU-built cubin is the one the worker's launch
finds; and one unit really builds on the CPU."""
import pytest
import torch

from spak import families
from spak.device.decode_gpu import decode_gpu_inputs, decode_launches
from spak.gpu.launch import torch_alloc
from spak.gpu.launch_sig import LaunchArray, launch_signature

FAM = families.get("fmha_decode")
_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
          torch.int32: "int32"}
CASES = ["4x28:4x4096x128/fp16/model=qwen2.5-7b",            # group 7, padded tiles
         "2x12x4:1024x64/bf16/causal",                       # MHA, Sq 4
         "3x40:8x1000x128/fp16/page64/lens=1000:17:500",     # paged, ragged
         "2x71:1x2048x64/fp16/page16"]                       # Falcon MQA, 16-key pages


def _as_stand_in(a):
    if isinstance(a, torch.Tensor):
        return LaunchArray(tuple(a.shape), _NAMES[a.dtype], strides=tuple(a.stride()))
    return a


def _real_signatures(p, kernel, config):
    """The launches decode_call plans on the real (CPU) inputs, mapped arg by arg."""
    from spak.families.fmha_decode import _form_tiles
    x = decode_gpu_inputs(p, device="cpu")
    out = torch.empty((p.B, p.Sq, p.Hq, x["v_cache"].shape[3]), dtype=x["q"].dtype)
    launches = decode_launches(p, dict(x, out=out), _form_tiles(kernel, dict(config)), 132,
                               torch_alloc(x["q"]))
    return [launch_signature(L.kernel, [_as_stand_in(a) for a in L.args]).symbol
            for L in launches]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kernel", ["splitkv", "splitkv_keys_vt"])
def test_stand_ins_sign_as_the_real_inputs(case, kernel):
    p = FAM.parse(case)
    configs = [FAM.default_config(p, "sm_90"),
               {"TILE_N": 64, "MAX_ROWS": 128, "num_splits": 0, "occupancy": 1, "KT_FORM": 0}]
    for cfg in configs:
        unit = FAM.compile_unit(kernel, p, cfg, "c")
        assert unit["unit_id"].endswith(p.case_id)
        stand = [launch_signature(L.kernel, L.args).symbol
                 for L in FAM.stand_in_launches(unit, "sm_90")]
        assert stand == _real_signatures(p, kernel, cfg), (case, cfg)


def test_varlen_problems_have_no_unit():
    p = FAM.parse("3x8:2x40:60x64/causal/qlens=5:0:40/lens=7:3:60")
    assert FAM.compile_unit("splitkv", p, FAM.default_config(p, "sm_90"), "d") is None


def test_a_decode_unit_builds_on_the_cpu(tmp_path, monkeypatch):
    """The compile-cpu helper's path (spak.tune.cpu_compile) builds a decode unit's cubins
    (split + combine) into cuTile's disk cache."""
    from cuda.tile._cext import default_tile_context as ctx
    from spak.tune.cpu_compile import CpuCompiler
    monkeypatch.setattr(ctx.config, "cache_dir", str(tmp_path))
    p = FAM.parse("2x28:4x4096x128/fp16")
    unit = {**FAM.compile_unit("splitkv", p, FAM.default_config(p, "sm_90"), "d"),
            "family": "fmha_decode", "arch": "sm_90"}
    r = CpuCompiler(block_torch=False).compile(unit)
    assert r["status"] == "ok", r
    assert len(r["kernels"]) >= 1 and all(k.startswith("decode") or "kernel" in k
                                          for k in r["kernels"]), r["kernels"]
    assert (tmp_path / "cache.db").exists()
