"""GPU architecture profiles: lookups by device name and compute capability, percentages."""
from __future__ import annotations

import math

import pytest

from spak.device.archs import (ARCHS, PROFILES, arch_for_capability, capability_for_arch, from_torch,
                        lookup, peak_tflops, percent_of_ceiling, percent_of_peak, profile_table)
from spak.recipe.schema import load_plan


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),      # what torch calls the SXM part
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA GeForce RTX 5070", "rtx-5070"),
    ("NVIDIA L4", "l4"),
    ("l4", "l4"),                               # a profile key works too
])
def test_lookup_by_device_name(name, key):
    assert lookup(name).key == key


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 5070 Ti", "NVIDIA L40S", "NVIDIA H100 NVL",
                                  "NVIDIA GeForce RTX 5070 Laptop GPU", "NVIDIA A100-SXM4-80GB"])
def test_lookup_refuses_lookalikes(name):
    assert lookup(name) is None


def test_capability_mapping():
    assert arch_for_capability((9, 0)) == "sm_90"
    assert arch_for_capability((12, 0)) == "sm_120"
    assert arch_for_capability("8.9") == "sm_89"
    assert arch_for_capability("sm_120") == "sm_120"
    assert capability_for_arch("sm_120") == (12, 0)
    with pytest.raises(ValueError):
        arch_for_capability("nine")
    # name and capability must agree
    assert lookup("NVIDIA H200", (9, 0)).key == "h200"
    assert lookup("NVIDIA H200", (12, 0)) is None
    # capability alone: only where one profile is the arch (sm_120 is many GPUs)
    assert lookup(capability=(8, 9)).key == "l4"
    assert lookup(capability=(9, 0)) is None
    assert lookup(capability=(12, 0)) is None
    with pytest.raises(ValueError):
        lookup()


def test_profiles_are_complete_and_sourced():
    assert set(ARCHS) == {"sm_90", "sm_120", "sm_89"}
    for arch, keys in ARCHS.items():
        for k in keys:
            p = PROFILES[k]
            assert p.arch == arch and arch_for_capability(p.capability) == arch
            for f in (p.sm_count, p.fp16_tflops, p.bf16_tflops, p.mem_bandwidth_gbs,
                      p.smem_per_sm_kib):
                assert f.value > 0 and f.source and f.kind in ("vendor", "derived", "measured")
    # every GPU a plan target names exists, with the target's arch
    for arch, t in load_plan().targets.items():
        assert all(PROFILES[g].arch == arch for g in t.gpus)
    assert "| NVIDIA L4 |" in profile_table()


def test_figures_are_consistent():
    h100, h200, l4, rtx = (PROFILES[k] for k in ("h100-sxm", "h200", "l4", "rtx-5070"))
    assert h100.sm_count.value == h200.sm_count.value == 132
    assert h100.fp16_tflops.value == pytest.approx(989.4)
    assert h200.mem_bandwidth_gbs.value > h100.mem_bandwidth_gbs.value
    # the measured matmul ceilings (DESIGN.md) sit below the vendor peaks
    for p in (h100, h200):
        assert p.matmul_ceiling_tflops.kind == "measured"
        assert p.matmul_ceiling_tflops.value < p.fp16_tflops.value
    # L4: 58 SMs x 2.04 GHz x 1024 dense FLOP/clk/SM = the datasheet's 242 sparse / 2
    assert 58 * 2.04e9 * 1024 / 1e12 == pytest.approx(l4.fp16_tflops.value, rel=0.01)
    # RTX 5070: 48 SMs x 2.51 GHz x 1024 = fp16-accumulate rate; fp32 accumulate is half
    assert 48 * 2.51e9 * 1024 / 1e12 == pytest.approx(rtx.fp16_acc16_tflops.value, rel=0.01)
    assert rtx.fp16_tflops.value == pytest.approx(rtx.fp16_acc16_tflops.value / 2, rel=0.01)
    assert not rtx.verified and not l4.verified
    assert l4.smem_per_sm_kib.value == rtx.smem_per_sm_kib.value == 100
    assert h100.smem_per_sm_kib.value == 228


def test_percent_helpers():
    h100 = PROFILES["h100-sxm"]
    assert percent_of_peak(494.7, h100) == pytest.approx(50.0)
    assert percent_of_peak(494.7, h100, "bf16") == pytest.approx(50.0)
    assert peak_tflops(h100, "torch.bfloat16") == h100.bf16_tflops.value
    with pytest.raises(ValueError):
        percent_of_peak(1.0, h100, "fp8")
    assert percent_of_ceiling(381.0, 762.0) == pytest.approx(50.0)
    assert percent_of_ceiling(381.0, None) is None
    assert math.isclose(percent_of_peak(61.7, PROFILES["rtx-5070"]), 100.0)


def test_from_torch_without_a_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        arch, prof, name = from_torch()
        assert arch and name
    else:
        assert from_torch() == (None, None, None)
