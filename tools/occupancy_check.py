"""gpu.resources against the CUDA driver, on a GPU: registers, shared memory, stack, block
size and resident blocks per SM of every sweep config of the fused kernel.

    source .carry/setup.sh && python tools/occupancy_check.py --out $OUT/occupancy.jsonl

Each config of plans/fmha.toml's sweep space for the GPU's arch (the items of
`spak compile --sweep`: tiles x occupancy x num_ctas; fp16, D 64 and 128, causal and not)
is compiled to a cubin (tileiras), read by gpu.resources, then loaded by the driver
(cuModuleLoadData), which reports its own cuFuncGetAttribute values and
cuOccupancyMaxActiveBlocksPerMultiprocessor. Rows that disagree are printed as MISMATCH
and make the exit status 1. Cluster kernels (num_ctas > 1) may be refused by the
per-block occupancy call; such rows say so and are not counted as mismatches.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# CUfunction_attribute values (cuda.h)
_ATTRS = {"max_threads": 0, "shared_bytes": 1, "stack_bytes": 3, "registers": 4}


def _build(item: dict) -> dict:
    """Compile one sweep item (spak.device.compile_report.sweep_items; in a worker process) and read
    its cubin."""
    from spak.gpu.compile import export_cubin, variant_launches
    from spak.gpu.resources import kernel_facts, read_cubin
    (launch,) = variant_launches("fused", dtype="float16", head_dim=item["head_dim"],
                                 causal=item["causal"], has_mask=False, tiles=item["tiles"])
    cubin = export_cubin(launch, item["arch"], hints=item["hints"])
    return {**item, "cubin": cubin.hex(), "name": read_cubin(cubin)[0].name,
            "ours": kernel_facts(cubin, item["arch"])}


class Driver:
    """The few driver calls needed, through ctypes, in torch's current context."""

    def __init__(self):
        import torch
        torch.zeros(1, device="cuda")                   # primary context made current
        self.cu = ctypes.CDLL("libcuda.so.1")

    def _check(self, rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            self.cu.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")

    def facts(self, cubin: bytes, name: str, threads: int) -> dict:
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.cu.cuModuleLoadData(ctypes.byref(mod), cubin), "cuModuleLoadData")
        try:
            self._check(self.cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()),
                        "cuModuleGetFunction")
            out = {}
            for key, attr in _ATTRS.items():
                v = ctypes.c_int()
                self._check(self.cu.cuFuncGetAttribute(ctypes.byref(v), attr, fn),
                            f"cuFuncGetAttribute({key})")
                out[key] = v.value
            n = ctypes.c_int()
            try:
                self._check(self.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    ctypes.byref(n), fn, threads, ctypes.c_size_t(0)),
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor")
                out["blocks_per_sm"] = n.value
            except RuntimeError as e:
                out["blocks_per_sm_error"] = str(e)
            return out
        finally:
            self.cu.cuModuleUnload(mod)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="occupancy.jsonl")
    ap.add_argument("--jobs", type=int, default=8, help="compile processes (default 8)")
    args = ap.parse_args(argv)

    import torch
    from spak.device.compile_report import config_text, sweep_items
    from spak.recipe.schema import load_plan
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    gpu = torch.cuda.get_device_name()
    items = [dict(i) for i in sweep_items(load_plan(), [arch], ["fused"])]
    print(f"{gpu} ({arch}) {time.strftime('%Y-%m-%d %H:%M')}: {len(items)} builds", flush=True)
    t0 = time.time()
    with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as ex:
        built = list(ex.map(_build, items))
    print(f"compiled in {time.time() - t0:.0f} s", flush=True)
    driver = Driver()
    bad = 0
    with open(args.out, "w") as f:
        for b in built:
            cubin = bytes.fromhex(b.pop("cubin"))
            ours = b["ours"]
            theirs = driver.facts(cubin, b["name"], ours["threads"])
            keys = ["registers", "shared_bytes", "stack_bytes", "blocks_per_sm"]
            differ = [k for k in keys if k in theirs and theirs[k] != ours[k]]
            bad += bool(differ)
            cfg = (f"D={b['head_dim']} {'causal' if b['causal'] else 'noncausal':9} "
                   f"{config_text(b)}")
            print(f"{'MISMATCH ' + ','.join(differ) if differ else 'ok':<24} {cfg:<34} "
                  f"ours {ours['registers']:>3} regs {ours['shared_bytes']:>6} B "
                  f"{ours['blocks_per_sm']}/SM ({ours['limited_by']}); driver "
                  f"{theirs['registers']:>3} regs {theirs['shared_bytes']:>6} B "
                  f"{theirs.get('blocks_per_sm', theirs.get('blocks_per_sm_error'))}",
                  flush=True)
            f.write(json.dumps({"gpu": gpu, "date": time.strftime("%Y-%m-%d"), **b,
                                "driver": theirs, "differ": differ}) + "\n")
    print(f"{len(built) - bad}/{len(built)} builds agree with the driver", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
