"""What a compiled kernel asks of an SM, and how many of its blocks fit there: on the CPU.

tileiras decides a cuTile kernel's registers, threads and shared memory itself; the
``occupancy`` hint is a request it may not meet. On an sm_90 build of the fused kernel
(tileiras 13.4), for example, 64x128 tiles at D=128 take 256 threads x 128 registers with
occupancy 2, 3 or no hint alike (2 blocks per SM; the three compile to the same machine
code) and 255 registers with occupancy 4 (1 block), while 64x64 tiles at D=64 with
occupancy 4 drop to 64 registers (4 blocks). This module reads
those numbers from the cubin and computes the resident blocks per SM the way the CUDA
occupancy calculator does, so a sweep space can be checked before any GPU time is spent.

    from spak.gpu.resources import read_cubin, blocks_per_sm
    for k in read_cubin(cubin_bytes):
        print(k.name, k.registers, k.threads, k.shared_bytes, blocks_per_sm(k, "sm_90"))

The cubin is an ELF file: per-kernel facts are records in its ``.nv.info`` sections
(register count, stack frame, required block size) and the static shared memory is the
size of its ``.nv.shared.<kernel>`` section (less the 1 KiB system reservation that
section includes when the cubin has a ``.nv.shared.reserved.0`` section), the number the
driver reports. Only the standard library is used (no cuobjdump). ``tools/occupancy_check.py`` compares these numbers with the CUDA driver's own
(cuFuncGetAttribute, cuOccupancyMaxActiveBlocksPerMultiprocessor) on a GPU.
"""
from __future__ import annotations

import dataclasses
import hashlib
import struct
from typing import Optional

__all__ = ["KernelResources", "SMLimits", "SM_LIMITS", "read_cubin", "blocks_per_sm",
           "kernel_facts"]

# .nv.info record attributes (the EIATTR_* codes cuobjdump -elf names).
_EIATTR_REQNTID = 0x10         # required block size (x, y, z), u32 each
_EIATTR_FRAME_SIZE = 0x11      # (symbol index, bytes) of per-thread stack frame
_EIATTR_REGCOUNT = 0x2F        # (symbol index, registers per thread)
_EIATTR_MAX_THREADS = 0x05     # maximum block size (x, y, z), when no REQNTID
_EIFMT_SVAL = 0x04             # record with a u16 length and that many bytes
_SHT_SYMTAB = 2
_RESERVED_WINDOW = 1024        # bytes of .nv.shared.reserved.0's window inside the section


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """One kernel of a cubin. threads: the block size it was compiled for (None if the
    cubin does not fix one); stack_bytes > 0 means local memory per thread: register
    spills in our kernels, which have no local arrays. code_sha1: hash of the machine
    code alone (the cubin's debug sections differ between otherwise identical builds), so
    two configs with equal code_sha1 and resources are the same kernel."""
    name: str
    registers: int
    threads: Optional[int]
    shared_bytes: int
    stack_bytes: int
    code_sha1: str = ""


@dataclasses.dataclass(frozen=True)
class SMLimits:
    """Per-SM limits of one architecture (CUDA C Programming Guide, "Technical
    Specifications per Compute Capability"; allocation rules of the CUDA occupancy
    calculator). shared_bytes is the largest shared-memory carve-out, of which each
    resident block also takes reserved_shared_bytes."""
    registers: int = 65536
    register_unit: int = 256          # registers are allocated per warp in this unit
    max_threads: int = 2048
    max_blocks: int = 32
    shared_bytes: int = 233472        # 228 KiB
    shared_unit: int = 128
    reserved_shared_bytes: int = 1024


#: sm_90 (H100/H200) is checked against the driver (tools/occupancy_check.py); the others
#: come from the Programming Guide's table only.
SM_LIMITS = {
    "sm_80": SMLimits(shared_bytes=167936),                                   # 164 KiB
    "sm_86": SMLimits(max_threads=1536, max_blocks=16, shared_bytes=102400),  # 100 KiB
    "sm_89": SMLimits(max_threads=1536, max_blocks=24, shared_bytes=102400),
    "sm_90": SMLimits(),
    "sm_100": SMLimits(),
    "sm_120": SMLimits(max_threads=1536, max_blocks=32, shared_bytes=102400),
}


def _sections(data: bytes):
    """{name: (type, offset, size, link)} of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file (a cubin)")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize)
               for i in range(count)]
    names_off = headers[names_index][4]

    def name(off):
        end = data.index(b"\0", names_off + off)
        return data[names_off + off:end].decode()

    out = {}
    for i, h in enumerate(headers):
        out[name(h[0])] = {"index": i, "type": h[1], "offset": h[4], "size": h[5],
                           "link": h[6], "entsize": h[9]}
    return out


def _records(blob: bytes):
    """(attribute, value bytes) of a .nv.info section: 4-byte records, or a 4-byte head
    plus a u16-counted payload for the SVAL format."""
    i = 0
    while i + 4 <= len(blob):
        fmt, attr, half = blob[i], blob[i + 1], struct.unpack_from("<H", blob, i + 2)[0]
        if fmt == _EIFMT_SVAL:
            yield attr, blob[i + 4:i + 4 + half]
            i += 4 + half
        else:
            yield attr, struct.pack("<H", half)
            i += 4


def _symbol_names(data: bytes, secs: dict) -> dict:
    """{symbol index: name} from .symtab."""
    sym = next((s for s in secs.values() if s["type"] == _SHT_SYMTAB), None)
    if sym is None:
        return {}
    strtab = next(s for s in secs.values() if s["index"] == sym["link"])
    out = {}
    for i in range(sym["size"] // 24):
        name_off = struct.unpack_from("<I", data, sym["offset"] + i * 24)[0]
        start = strtab["offset"] + name_off
        out[i] = data[start:data.index(b"\0", start)].decode()
    return out


def read_cubin(data: bytes) -> list[KernelResources]:
    """Every kernel of a cubin (one per ``.text.<kernel>`` section), in file order."""
    secs = _sections(data)
    symbols = _symbol_names(data, secs)
    per_symbol: dict = {}
    if ".nv.info" in secs:
        s = secs[".nv.info"]
        for attr, val in _records(data[s["offset"]:s["offset"] + s["size"]]):
            if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and len(val) == 8:
                index, value = struct.unpack("<II", val)
                per_symbol.setdefault(symbols.get(index), {})[attr] = value
    kernels = []
    for sec_name, s in secs.items():
        if not sec_name.startswith(".text."):
            continue
        name = sec_name[len(".text."):]
        threads = None
        info = secs.get(".nv.info." + name)
        if info is not None:
            for attr, val in _records(data[info["offset"]:info["offset"] + info["size"]]):
                if attr in (_EIATTR_REQNTID, _EIATTR_MAX_THREADS) and len(val) == 12:
                    x, y, z = struct.unpack("<III", val)
                    if attr == _EIATTR_REQNTID or threads is None:
                        threads = x * y * z
        facts = per_symbol.get(name, {})
        if _EIATTR_REGCOUNT not in facts:
            raise ValueError(f"cubin has no register count for kernel {name!r}")
        shared = secs.get(".nv.shared." + name, {}).get("size", 0)
        if ".nv.shared.reserved.0" in secs:
            # The kernel's section then also spans the 1 KiB per-block system reservation:
            # on all 96 sm_90 sweep builds the driver's static size (cuFuncGetAttribute)
            # was exactly 1024 bytes less (H100, tools/occupancy_check.py, 2026-11-22).
            shared = max(shared - _RESERVED_WINDOW, 0)
        code = hashlib.sha1(data[s["offset"]:s["offset"] + s["size"]]).hexdigest()
        kernels.append(KernelResources(name=name, registers=facts[_EIATTR_REGCOUNT],
                                       threads=threads, shared_bytes=shared,
                                       stack_bytes=facts.get(_EIATTR_FRAME_SIZE, 0),
                                       code_sha1=code))
    return kernels


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def blocks_per_sm(k: KernelResources, arch: str, threads: Optional[int] = None) -> tuple[int, str]:
    """(resident blocks per SM, the limiting resource: "registers", "shared memory",
    "threads" or "blocks") for kernel ``k`` on ``arch``; ``threads`` overrides the block
    size when the cubin does not fix one. Static shared memory only (cuTile's kernels
    use no dynamic shared memory)."""
    lim = SM_LIMITS.get(arch)
    if lim is None:
        raise ValueError(f"no SM limits for {arch!r}; known: {', '.join(SM_LIMITS)}")
    threads = threads or k.threads
    if not threads:
        raise ValueError(f"kernel {k.name!r} does not fix its block size; pass threads=")
    warps = -(-threads // 32)
    per_warp = _round_up(k.registers * 32, lim.register_unit)
    by = {
        "registers": (lim.registers // per_warp) // warps if per_warp else lim.max_blocks,
        "shared memory": lim.shared_bytes // (_round_up(k.shared_bytes, lim.shared_unit)
                                              + lim.reserved_shared_bytes),
        "threads": lim.max_threads // (warps * 32),
        "blocks": lim.max_blocks,
    }
    limiter = min(by, key=lambda r: (by[r], list(by).index(r)))
    return by[limiter], limiter


def kernel_facts(cubin: bytes, arch: str) -> dict:
    """The JSON-friendly facts of a one-kernel cubin on ``arch``: registers, threads,
    shared_bytes, stack_bytes, code_sha1, blocks_per_sm and limited_by (the last two None
    for an arch without known limits or a kernel without a fixed block size)."""
    (k,) = read_cubin(cubin)
    out = {"registers": k.registers, "threads": k.threads, "shared_bytes": k.shared_bytes,
           "stack_bytes": k.stack_bytes, "code_sha1": k.code_sha1,
           "blocks_per_sm": None, "limited_by": None}
    if arch in SM_LIMITS and k.threads:
        out["blocks_per_sm"], out["limited_by"] = blocks_per_sm(k, arch)
    return out
