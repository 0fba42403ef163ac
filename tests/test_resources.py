"""gpu.resources: a cubin's registers, block size, shared memory and stack, and the
resident blocks per SM computed from them.

The ELF reader is checked on a cubin built here byte by byte (so every record format is
exercised without a compiler) and on a real tileiras build; the occupancy arithmetic on
hand-computed cases. tools/occupancy_check.py compares both with the CUDA driver on a GPU.
"""
from __future__ import annotations

import struct
import subprocess

import pytest

from spak.gpu.resources import SM_LIMITS, KernelResources, blocks_per_sm, read_cubin
from tests import tools


# ------------------------------------------------------------------ a synthetic cubin

def _record_sval(attr: int, payload: bytes) -> bytes:
    return struct.pack("<BBH", 0x04, attr, len(payload)) + payload


def _record_hval(attr: int, value: int) -> bytes:
    return struct.pack("<BBH", 0x03, attr, value)


def _record_nval(attr: int) -> bytes:
    return struct.pack("<BBH", 0x01, attr, 0)


def make_cubin(kernels: list[dict], reserved: bool = False) -> bytes:
    """An ELF64 with the sections read_cubin reads: .shstrtab, .strtab, .symtab (one symbol
    per kernel), .nv.info (REGCOUNT, FRAME_SIZE per symbol), and per kernel .text.<k>,
    .nv.info.<k> (REQNTID between other records) and .nv.shared.<k> (NOBITS); reserved:
    also the empty .nv.shared.reserved.0 section tileiras's sm_90 cubins carry."""
    strtab = b"\0"
    syms = [b"\0" * 24]                       # symbol 0 is the null symbol
    for k in kernels:
        syms.append(struct.pack("<IBBHQQ", len(strtab), 0x12, 0, 0, 0, 0))
        strtab += k["name"].encode() + b"\0"
    info = b""
    for i, k in enumerate(kernels, start=1):
        info += _record_sval(0x2F, struct.pack("<II", i, k["registers"]))
        info += _record_sval(0x11, struct.pack("<II", i, k["stack"]))
    sections = [(".strtab", 3, strtab, 0), (".symtab", 2, b"".join(syms), 1),
                (".nv.info", 0x70000000, info, 0)]
    for k in kernels:
        kinfo = (_record_hval(0x1B, 255) + _record_nval(0x54)
                 + _record_sval(0x37, b"\x86\0\0\0")
                 + _record_sval(0x10, struct.pack("<III", *k["ntid"]))
                 + _record_hval(0x19, 752))
        sections += [(".text." + k["name"], 1, k["code"], 0),
                     (".nv.info." + k["name"], 0x70000000, kinfo, 0),
                     (".nv.shared." + k["name"], 8, k["shared"], 0)]
    if reserved:
        sections.append((".nv.shared.reserved.0", 8, 0, 0))
    names = b"\0"
    name_off = []
    for name, *_ in sections + [(".shstrtab",)]:
        name_off.append(len(names))
        names += name.encode() + b"\0"
    sections.append((".shstrtab", 3, names, 0))
    body = b""
    placed = []
    offset = 64
    for (name, typ, data, link) in sections:
        if typ == 8:                          # NOBITS: a size, no bytes in the file
            placed.append((offset, data))
            continue
        placed.append((offset, len(data)))
        body += data
        offset += len(data)
    shoff = 64 + len(body)
    headers = [b"\0" * 64]                    # section 0 is the null section
    for i, ((name, typ, data, _), (off, size)) in enumerate(zip(sections, placed)):
        link_index = 1 if typ == 2 else 0          # .symtab links to .strtab (index 1)
        headers.append(struct.pack("<IIQQQQIIQQ", name_off[i], typ, 0, 0, off, size,
                                   link_index, 0, 1, 24 if typ == 2 else 0))
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    head = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64,
                               len(headers), len(headers) - 1)
    return head + body + b"".join(headers)


def test_reads_every_kernel_of_a_synthetic_cubin():
    cubin = make_cubin([
        {"name": "k_a", "registers": 128, "stack": 0, "ntid": (256, 1, 1), "shared": 83040,
         "code": b"\x01" * 32},
        {"name": "k_b", "registers": 80, "stack": 264, "ntid": (128, 2, 1), "shared": 0,
         "code": b"\x02" * 48},
    ])
    a, b = read_cubin(cubin)
    assert (a.name, a.registers, a.threads, a.shared_bytes, a.stack_bytes) == \
        ("k_a", 128, 256, 83040, 0)
    assert (b.name, b.registers, b.threads, b.shared_bytes, b.stack_bytes) == \
        ("k_b", 80, 256, 0, 264)
    assert a.code_sha1 != b.code_sha1 and len(a.code_sha1) == 40


def test_the_reserved_kibibyte_is_not_the_kernels():
    """With .nv.shared.reserved.0 present, the kernel's section also spans the 1 KiB system
    window: the driver reports 1024 bytes less (96 of 96 sm_90 builds, H100)."""
    k = {"name": "k", "registers": 128, "stack": 0, "ntid": (256, 1, 1), "shared": 83040,
         "code": b"\x01" * 8}
    assert read_cubin(make_cubin([k], reserved=True))[0].shared_bytes == 82016
    assert read_cubin(make_cubin([k], reserved=False))[0].shared_bytes == 83040


def test_code_hash_ignores_everything_but_the_code():
    base = {"name": "k", "registers": 64, "stack": 0, "ntid": (256, 1, 1), "shared": 1024,
            "code": b"\x05" * 16}
    one = read_cubin(make_cubin([base]))[0]
    other_regs = read_cubin(make_cubin([{**base, "registers": 96}]))[0]
    other_code = read_cubin(make_cubin([{**base, "code": b"\x06" * 16}]))[0]
    assert one.code_sha1 == other_regs.code_sha1 != other_code.code_sha1


def test_refuses_what_is_not_a_cubin():
    with pytest.raises(ValueError, match="ELF"):
        read_cubin(b"\x7fELF\x01\x01" + b"\0" * 58)       # 32-bit
    with pytest.raises(ValueError, match="ELF"):
        read_cubin(b"not an elf file at all" * 4)


def test_a_kernel_without_a_register_count_is_an_error():
    cubin = make_cubin([{"name": "k", "registers": 1, "stack": 0, "ntid": (32, 1, 1),
                         "shared": 0, "code": b"\0" * 8}])
    broken = cubin.replace(struct.pack("<BBHII", 0x04, 0x2F, 8, 1, 1),
                           struct.pack("<BBHII", 0x04, 0x7E, 8, 1, 1))
    with pytest.raises(ValueError, match="register count"):
        read_cubin(broken)


# ------------------------------------------------------------------ occupancy arithmetic

def _k(regs, threads, shared, stack=0):
    return KernelResources("k", regs, threads, shared, stack)


@pytest.mark.parametrize("k, arch, expect", [
    # the fused kernel's sm_90 builds (spak compile --sweep), as the driver counted them
    # (tools/occupancy_check.py, H100): warp-specialised, 256 threads
    (_k(128, 256, 82016), "sm_90", (2, "registers")),       # 64x128, D=128, occupancy 2/3
    (_k(255, 256, 82016), "sm_90", (1, "registers")),       # the same with occupancy 4
    (_k(80, 256, 41056), "sm_90", (3, "registers")),        # 80 x 256 x 3 <= 65536
    (_k(64, 256, 32856), "sm_90", (4, "registers")),        # 64x64, D=64, occupancy 4
    (_k(128, 256, 114848), "sm_90", (2, "registers")),      # 64x64, D=128: 2 x 113.2 KiB
    (_k(128, 256, 116000), "sm_90", (1, "shared memory")),  # 2 x (113.4 + 1) KiB > 228
    (_k(16, 1024, 0), "sm_90", (2, "threads")),             # 2048 threads per SM
    (_k(16, 32, 0), "sm_90", (32, "blocks")),
    (_k(24, 32, 0), "sm_89", (24, "blocks")),
    (_k(128, 256, 82016), "sm_120", (1, "shared memory")),  # 100 KiB on sm_120
])
def test_blocks_per_sm(k, arch, expect):
    assert blocks_per_sm(k, arch) == expect


def test_register_rounding_follows_the_allocation_unit():
    # 33 registers x 32 lanes = 1056 -> 1280 per warp; 65536 // 1280 = 51 warps, 6 blocks
    # of 8 warps. Without the rounding it would be 7.
    assert blocks_per_sm(_k(33, 256, 0), "sm_90") == (6, "registers")


def test_unknown_arch_and_unknown_block_size_are_errors():
    with pytest.raises(ValueError, match="sm_75"):
        blocks_per_sm(_k(32, 128, 0), "sm_75")
    with pytest.raises(ValueError, match="threads="):
        blocks_per_sm(_k(32, None, 0), "sm_90")
    assert blocks_per_sm(_k(24, None, 0), "sm_90", threads=128) == (16, "threads")
    assert set(SM_LIMITS) >= {"sm_80", "sm_89", "sm_90", "sm_120"}


# ------------------------------------------------------------------ a real build

@pytest.mark.slow
def test_a_real_fused_build():
    pytest.importorskip("cuda.tile")
    from spak.gpu.compile import compile_variant
    r = compile_variant("fused", arch="sm_90", dtype="float16", head_dim=64, causal=False,
                        has_mask=False, tiles={"TILE_M": 64, "TILE_N": 64},
                        hints={"occupancy": 4})
    assert r["ok"], r["error"]
    (k,) = r["kernels"]
    # tileiras 13.4 (pinned): warp-specialised, 2 warpgroups; occupancy 4 is met at 64x64
    assert k["threads"] == 256 and k["registers"] <= 64 and k["stack_bytes"] == 0
    assert k["blocks_per_sm"] == 4 and k["limited_by"] == "registers"
    assert 16 * 1024 < k["shared_bytes"] < 56 * 1024
    again = compile_variant("fused", arch="sm_90", dtype="float16", head_dim=64,
                            causal=False, has_mask=False, tiles={"TILE_M": 64, "TILE_N": 64},
                            hints={"occupancy": 4})["kernels"][0]
    assert again["code_sha1"] == k["code_sha1"]


@pytest.mark.slow
def test_cuobjdump_reads_the_same_numbers(tmp_path):
    """NVIDIA's cuobjdump (nvidia-cuda-cuobjdump, in the `test` extra) reads the same
    resource usage as ours (shared memory: see the assert)."""
    pytest.importorskip("cuda.tile")
    import io
    import re
    from cuda.tile.compilation import export_kernel
    from spak.gpu.compile import _signature, variant_launches
    from spak.gpu.variants import with_hints
    tool = tools.require("cuobjdump")      # a skip here, a failure in CI (tests/tools.py)
    (launch,) = variant_launches("fused", dtype="float16", head_dim=128, causal=True,
                                 has_mask=False, tiles={"TILE_M": 128, "TILE_N": 64})
    kernel = with_hints(launch.kernel, occupancy=3)
    buf = io.BytesIO()
    export_kernel(kernel, [_signature(kernel, launch.args, "launch")], buf, gpu_code="sm_90",
                  output_format="cubin")
    path = tmp_path / "k.cubin"
    path.write_bytes(buf.getvalue())
    out = subprocess.run([tool, "--dump-resource-usage", str(path)], capture_output=True,
                         text=True, check=True).stdout
    regs, stack, shared = map(int, re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)",
                                             out).groups())
    (k,) = read_cubin(buf.getvalue())
    # cuobjdump counts the section, the 1 KiB system window included; we (and the
    # driver's cuFuncGetAttribute) count the kernel's own bytes
    assert (k.registers, k.stack_bytes, k.shared_bytes + 1024) == (regs, stack, shared)
