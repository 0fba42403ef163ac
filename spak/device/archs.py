"""GPU architecture profiles: the hardware facts reports are measured against.

One `GpuProfile` per GPU the plans target, grouped by the compute architecture cuTile
compiles for:

    sm_90   H100 SXM (and H100 PCIe), H200        Hopper
    sm_120  GeForce RTX 5070                      Blackwell (GeForce)
    sm_89   L4                                    Ada Lovelace

Each profile holds the SM count, the peak dense fp16/bf16 tensor-core TFLOPS with fp32
accumulate (what an FMHA kernel accumulating in fp32 can at best reach), the memory
bandwidth and the shared memory per SM. Every number is a `Figure` that carries its
source and its kind:

    vendor    printed by NVIDIA (datasheet, architecture whitepaper, product page, CUDA
              programming guide)
    derived   computed from vendor figures by a rule stated in the source text (e.g. a
              datasheet's "with sparsity" figure halved for dense)
    measured  measured on this project's hardware (DESIGN.md)

`lookup(name=..., capability=...)` maps a torch device name and/or compute capability to a
profile; `arch_for_capability((9, 0)) == "sm_90"`; `percent_of_peak` and
`percent_of_ceiling` state a TFLOPS result as a share of the GPU's peak and of a matmul
ceiling measured in the same run. Stdlib only: no torch, no cuTile.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional

__all__ = ["Figure", "GpuProfile", "PROFILES", "ARCHS", "ARCH_CAPABILITY", "arch_for_capability",
           "capability_for_arch", "lookup", "profiles_for_arch", "from_torch", "peak_tflops",
           "percent_of_peak", "percent_of_ceiling", "profile_table"]

# ------------------------------------------------------------------------- sources

_H100_WP = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), table 'NVIDIA H100 "
            "compared to A100': H100 SXM5")
_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (2023)"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet / product page (2024), H200 SXM"
_CUDA_CC = ("CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability': "
            "maximum shared memory per SM")
_L4_DS = "NVIDIA L4 Tensor Core GPU datasheet (2023)"
_RTX5070 = "NVIDIA GeForce RTX 5070 product page / specifications (2025)"
_RTX_BW_WP = ("NVIDIA RTX Blackwell GPU Architecture whitepaper (2025): GeForce parts list "
              "fp16 tensor math with fp32 accumulate at half the fp16-accumulate rate")
_DESIGN = "DESIGN.md, 'Numbers measured on this project's hardware'"


@dataclasses.dataclass(frozen=True)
class Figure:
    """One hardware number with where it comes from."""
    value: float
    unit: str
    source: str
    kind: str = "vendor"          # vendor | derived | measured
    note: str = ""

    def __post_init__(self):
        if self.kind not in ("vendor", "derived", "measured"):
            raise ValueError(f"Figure.kind must be vendor, derived or measured, got {self.kind!r}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class GpuProfile:
    key: str                          # short id used by plans, e.g. "h100-sxm"
    name: str                         # marketing name
    arch: str                         # cuTile / tileiras target, e.g. "sm_90"
    capability: tuple[int, int]       # CUDA compute capability
    name_patterns: tuple[str, ...]    # regexes (case-insensitive) matching torch device names
    sm_count: Figure
    fp16_tflops: Figure               # peak dense fp16 tensor TFLOPS, fp32 accumulate
    bf16_tflops: Figure               # peak dense bf16 tensor TFLOPS, fp32 accumulate
    mem_bandwidth_gbs: Figure         # GB/s (10^9 bytes/s)
    smem_per_sm_kib: Figure           # KiB of shared memory an SM can hand to blocks
    matmul_ceiling_tflops: Optional[Figure] = None   # fp16 matmul 8192^3, measured
    fp16_acc16_tflops: Optional[Figure] = None       # fp16 with fp16 accumulate, where it differs
    verified: bool = True             # False: no figure checked against the part by this project
    notes: str = ""

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["capability"] = list(self.capability)
        d["name_patterns"] = list(self.name_patterns)
        return d

    def matches(self, device_name: str) -> bool:
        return any(re.search(p, device_name, re.IGNORECASE) for p in self.name_patterns)


def _f(value, unit, source, kind="vendor", note=""):
    return Figure(float(value), unit, source, kind, note)


_SMEM_90 = _f(228, "KiB", _CUDA_CC + " (9.0: 228 KB); H100 whitepaper: 'configurable up to 228 KB'")
_SMEM_89 = _f(100, "KiB", _CUDA_CC + " (8.9: 100 KB)")
_SMEM_120 = _f(100, "KiB", _CUDA_CC + " (12.0: 100 KB)")

PROFILES: dict[str, GpuProfile] = {p.key: p for p in (
    GpuProfile(
        key="h100-sxm", name="NVIDIA H100 SXM5 80GB", arch="sm_90", capability=(9, 0),
        # torch reports the SXM part as "NVIDIA H100 80GB HBM3"
        name_patterns=(r"\bH100\b(?!.*\b(PCIe|NVL)\b)",),
        sm_count=_f(132, "SMs", _H100_WP),
        fp16_tflops=_f(989.4, "TFLOPS", _H100_WP + ": 'Peak FP16 Tensor TFLOPS with FP32 "
                       "Accumulate 989.4 / 1978.9 (sparse)'; datasheet: 1,979 with sparsity"),
        bf16_tflops=_f(989.4, "TFLOPS", _H100_WP + ": 'Peak BF16 Tensor TFLOPS with FP32 "
                       "Accumulate 989.4 / 1978.9 (sparse)'"),
        mem_bandwidth_gbs=_f(3350, "GB/s", _H100_DS + ": 'GPU memory bandwidth 3.35 TB/s' (SXM)"),
        smem_per_sm_kib=_SMEM_90,
        matmul_ceiling_tflops=_f(762, "TFLOPS", _DESIGN + ": H100 80GB HBM3, fp16 matmul "
                                 "8192^3", "measured"),
    ),
    GpuProfile(
        key="h100-pcie", name="NVIDIA H100 PCIe 80GB", arch="sm_90", capability=(9, 0),
        name_patterns=(r"\bH100\b.*\bPCIe\b",),
        sm_count=_f(114, "SMs", _H100_WP + " (H100 PCIe column)"),
        fp16_tflops=_f(756, "TFLOPS", _H100_DS + ": FP16 Tensor Core 1,513 TFLOPS with "
                       "sparsity (PCIe), halved for dense", "derived"),
        bf16_tflops=_f(756, "TFLOPS", _H100_DS + ": BF16 Tensor Core 1,513 TFLOPS with "
                       "sparsity (PCIe), halved for dense", "derived"),
        mem_bandwidth_gbs=_f(2000, "GB/s", _H100_DS + ": 2 TB/s (PCIe)"),
        smem_per_sm_kib=_SMEM_90,
        verified=False,
        notes="Not a plan target; here so that `spak plan` on an H100 PCIe states the right peak.",
    ),
    GpuProfile(
        key="h200", name="NVIDIA H200 SXM 141GB", arch="sm_90", capability=(9, 0),
        name_patterns=(r"\bH200\b",),
        sm_count=_f(132, "SMs", "H200 is the GH100 of H100 SXM with HBM3e (NVIDIA H200 "
                    "product brief); DESIGN.md: 'same SMs and clocks as H100 SXM'", "derived"),
        fp16_tflops=_f(989, "TFLOPS", _H200_DS + ": FP16 Tensor Core 1,979 TFLOPS with "
                       "sparsity, halved for dense", "derived"),
        bf16_tflops=_f(989, "TFLOPS", _H200_DS + ": BF16 Tensor Core 1,979 TFLOPS with "
                       "sparsity, halved for dense", "derived"),
        mem_bandwidth_gbs=_f(4800, "GB/s", _H200_DS + ": 'GPU memory bandwidth 4.8 TB/s'"),
        smem_per_sm_kib=_SMEM_90,
        matmul_ceiling_tflops=_f(747, "TFLOPS", _DESIGN + ": H200, torch 2.11, fp16 matmul "
                                 "8192^3", "measured"),
    ),
    GpuProfile(
        key="rtx-5070", name="NVIDIA GeForce RTX 5070", arch="sm_120", capability=(12, 0),
        name_patterns=(r"\bRTX 5070\b(?!\s*Ti)(?!.*Laptop)",),
        sm_count=_f(48, "SMs", _RTX5070 + ": 6,144 CUDA cores (GB205), 128 per Blackwell SM",
                    "derived"),
        fp16_tflops=_f(61.7, "TFLOPS", _RTX5070 + ": 988 AI TOPS (FP4, sparse) -> /8 = 123.5 "
                       "dense fp16 with fp16 accumulate (48 SM x 2.51 GHz x 1024 FLOP/clk/SM); "
                       "halved for fp32 accumulate per " + _RTX_BW_WP, "derived",
                       "Third-party cuBLAS measurement on an RTX 5060 Ti (sm_120) agrees with "
                       "the half rate: 47.0 TFLOPS fp16/fp32-acc vs 87.9 fp16/fp16-acc "
                       "(github.com/QuantumDrizzy/BLACKWALL)."),
        bf16_tflops=_f(61.7, "TFLOPS", "as fp16 with fp32 accumulate (bf16 always accumulates "
                       "in fp32)", "derived"),
        fp16_acc16_tflops=_f(123.5, "TFLOPS", _RTX5070 + ": 988 AI TOPS (FP4 sparse) / 8",
                             "derived"),
        mem_bandwidth_gbs=_f(672, "GB/s", _RTX5070 + ": 12 GB GDDR7, 192-bit, 672 GB/s"),
        smem_per_sm_kib=_SMEM_120,
        verified=False,
        notes="No RTX 5070 here; figures unchecked on the part. Seed 001's 113 TFLOPS claim "
              "for the fused kernel exceeds this fp32-accumulate peak: it holds only with "
              "fp16 accumulation or another FLOP count.",
    ),
    GpuProfile(
        key="l4", name="NVIDIA L4", arch="sm_89", capability=(8, 9),
        name_patterns=(r"\bL4\b",),
        sm_count=_f(58, "SMs", "7,424 CUDA cores (AD104 as configured for L4; TechPowerUp "
                    "GPU database), 128 per Ada SM; consistent with the datasheet's 242 "
                    "TFLOPS = 58 SM x 2.04 GHz x 1024 FLOP/clk/SM x 2 (sparsity)", "derived"),
        fp16_tflops=_f(121, "TFLOPS", _L4_DS + ": FP16 Tensor Core 242 TFLOPS with sparsity, "
                       "halved for dense (data-center Ada: full-rate fp32 accumulate)",
                       "derived"),
        bf16_tflops=_f(121, "TFLOPS", _L4_DS + ": BF16 Tensor Core 242 TFLOPS with sparsity, "
                       "halved for dense", "derived"),
        mem_bandwidth_gbs=_f(300, "GB/s", _L4_DS + ": 24 GB GDDR6, 300 GB/s"),
        smem_per_sm_kib=_SMEM_89,
        verified=False,
        notes="No L4 here; figures unchecked on the part.",
    ),
)}

#: The plan targets: arch -> the profiles of that arch, first = the reference part.
ARCHS: dict[str, tuple[str, ...]] = {
    "sm_90": ("h100-sxm", "h200", "h100-pcie"),
    "sm_120": ("rtx-5070",),
    "sm_89": ("l4",),
}
ARCH_CAPABILITY = {"sm_90": (9, 0), "sm_120": (12, 0), "sm_89": (8, 9)}


# ------------------------------------------------------------------------ lookups

def _cap(capability) -> tuple[int, int]:
    if isinstance(capability, str):
        m = re.fullmatch(r"\s*(?:sm_?)?(\d+)(?:\.(\d+))?\s*", capability, re.IGNORECASE)
        if not m:
            raise ValueError(f"capability {capability!r} is not like '9.0', 'sm_90' or (9, 0)")
        if m.group(2) is not None:
            return int(m.group(1)), int(m.group(2))
        digits = m.group(1)
        return int(digits[:-1]), int(digits[-1])
    try:
        major, minor = capability
        return int(major), int(minor)
    except (TypeError, ValueError):
        raise ValueError(f"capability {capability!r} is not like '9.0', 'sm_90' or (9, 0)") from None


def arch_for_capability(capability) -> str:
    """(9, 0), "9.0" or "sm_90" -> "sm_90"; (12, 0) -> "sm_120"; (8, 9) -> "sm_89"."""
    major, minor = _cap(capability)
    return f"sm_{major}{minor}"


def capability_for_arch(arch: str) -> tuple[int, int]:
    return _cap(arch)


def profiles_for_arch(arch: str) -> list[GpuProfile]:
    return [PROFILES[k] for k in ARCHS.get(arch, ())]


def lookup(name: Optional[str] = None, capability=None) -> Optional[GpuProfile]:
    """The profile for a device, or None when it is not one SPAK knows.

    name: torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3", "NVIDIA H200",
    "NVIDIA GeForce RTX 5070", "NVIDIA L4", ...) or a profile key ("h100-sxm").
    capability: (major, minor) from torch.cuda.get_device_capability(), "9.0" or "sm_90".
    With a name, the profile must match it (and the capability, when given); with a
    capability alone, the reference part of that arch is returned only where the arch has
    a single profile (sm_120: RTX 5070 is not every sm_120 GPU, so that returns None).
    """
    arch = arch_for_capability(capability) if capability is not None else None
    if name is not None:
        key = name.strip().lower()
        if key in PROFILES:
            p = PROFILES[key]
            return p if arch is None or p.arch == arch else None
        for p in PROFILES.values():
            if p.matches(name) and (arch is None or p.arch == arch):
                return p
        return None
    if arch is None:
        raise ValueError("lookup needs a device name, a capability, or both")
    cands = profiles_for_arch(arch)
    return cands[0] if len(cands) == 1 and arch != "sm_120" else None


def from_torch(device=None) -> tuple[Optional[str], Optional[GpuProfile], Optional[str]]:
    """(arch, profile, device name) of torch's current CUDA device; (None, None, None) without one."""
    try:
        import torch
    except ImportError:
        return None, None, None
    if not torch.cuda.is_available():
        return None, None, None
    name = torch.cuda.get_device_name(device)
    cap = torch.cuda.get_device_capability(device)
    return arch_for_capability(cap), lookup(name, cap), name


# ---------------------------------------------------------------- percent of peak

def peak_tflops(profile: GpuProfile, dtype: str = "fp16") -> float:
    d = str(dtype).lower().rsplit(".", 1)[-1]
    if d in ("fp16", "float16", "half"):
        return profile.fp16_tflops.value
    if d in ("bf16", "bfloat16"):
        return profile.bf16_tflops.value
    raise ValueError(f"dtype must be fp16 or bf16, got {dtype!r}")


def percent_of_peak(tflops: float, profile: GpuProfile, dtype: str = "fp16") -> float:
    """100 * tflops / the GPU's peak dense tensor TFLOPS (fp32 accumulate) for dtype."""
    return 100.0 * float(tflops) / peak_tflops(profile, dtype)


def percent_of_ceiling(tflops: float, ceiling_tflops: Optional[float]) -> Optional[float]:
    """100 * tflops / a measured matmul ceiling; None when no ceiling was measured."""
    if not ceiling_tflops:
        return None
    return 100.0 * float(tflops) / float(ceiling_tflops)


def profile_table() -> str:
    """Markdown table of every profile, with each number's kind (vendor/derived/measured)."""
    rows = ["| GPU | arch | SMs | fp16/bf16 dense TFLOPS (fp32 acc) | memory GB/s | smem/SM KiB "
            "| matmul ceiling | checked here |", "|---|---|---|---|---|---|---|---|"]
    for p in PROFILES.values():
        ceil = (f"{p.matmul_ceiling_tflops.value:g} ({p.matmul_ceiling_tflops.kind})"
                if p.matmul_ceiling_tflops else "-")
        rows.append(f"| {p.name} | {p.arch} | {p.sm_count.value:g} ({p.sm_count.kind}) | "
                    f"{p.fp16_tflops.value:g} ({p.fp16_tflops.kind}) | "
                    f"{p.mem_bandwidth_gbs.value:g} ({p.mem_bandwidth_gbs.kind}) | "
                    f"{p.smem_per_sm_kib.value:g} | {ceil} | "
                    f"{'yes' if p.verified else 'no (unverified)'} |")
    return "\n".join(rows)
