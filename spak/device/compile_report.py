"""What `spak compile` does: compile every kernel variant a plan names, for each target
arch, on the CPU, and read each cubin's resources (the command itself: spak/cli/compile.py).

cuTile's front end plus tileiras (the nvidia-cuda-tileiras wheel) turn each kernel into a
cubin for an ``sm_XX`` without a GPU, through ``gpu.compile.compile_variant``. CI runs
this, so a kernel that would not compile for the RTX 5070 (sm_120) or the L4 (sm_89)
fails CI although nobody here owns one.

    spak compile                                   # the plan's variants, its target archs
    spak compile --arch sm_90,sm_120,sm_89
    spak compile --arch sm_120 --kernel fused --json
    spak compile --sweep --arch sm_90 --jobs 8     # also every sweep config, per arch
    spak compile --out /tmp/a.json                 # before a refactor; after it:
    spak compile --same-code-as /tmp/a.json        # exit 1 if any kernel's code changed

Each row shows what the cubin asks of an SM (gpu.resources, read from the cubin): registers
per thread, threads per block, static shared memory, stack bytes per thread (spills) and the
resident blocks per SM with the resource that limits them. tileiras treats the occupancy
hint as a request: with --sweep, the configs whose hint was not met and the configs that
compiled to the same kernel are listed after the table.

Before compiling, the tileiras that cuTile will run is asked which ``--gpu-name`` values it
accepts (``tileiras --help``). An arch it does not list is reported as "arch not supported
by this tileiras" and counts as a failure: tileiras 13.4 lists sm_80 ... sm_121, including
sm_89, sm_90 and sm_120, so a refusal means the wrong compiler is installed.

Exit status: 0 every variant compiled, 1 any failure or unsupported arch, 2 bad usage or
a malformed plan.
"""
from __future__ import annotations

import os
import re
import subprocess
from typing import Callable, Iterable, Optional

__all__ = ["CompileItem", "plan_items", "sweep_items",
           "supported_archs", "compile_items", "format_rows", "summarize", "hint_findings"]


class CompileItem(dict):
    """One thing to compile: kernel, arch, dtype, head_dim, causal, mask, tiles (None: default),
    hints (optional: occupancy, num_ctas)."""

    @property
    def label(self) -> str:
        s = (f"{self['kernel']} {self['dtype']} D={self['head_dim']} "
             f"{'causal' if self['causal'] else 'noncausal'}{' mask' if self['mask'] else ''}")
        return s


_DT = {"fp16": "float16", "bf16": "bfloat16"}


def _step_family(step) -> str:
    """The kernel family a plan step belongs to (a step without one: the FMHA forward)."""
    from spak import families
    return getattr(step, "family", None) or families.DEFAULT


def plan_items(plan, archs: Iterable[str], kernels: Optional[Iterable[str]] = None,
               family: Optional[str] = None) -> list:
    """Every (kernel, arch, variant) the plan's steps name, restricted to archs/kernels and
    (when given) to one kernel family."""
    archs, kernels = list(archs), (None if kernels is None else set(kernels))
    items = []
    seen = set()
    for s in plan.steps:
        if s.kernel is None or (kernels is not None and s.kernel not in kernels):
            continue
        if family is not None and _step_family(s) != family:
            continue
        for v in s.compile_variants:
            for arch in archs:
                key = (_step_family(s), s.kernel, arch, v)
                if key in seen:
                    continue
                seen.add(key)
                items.append(CompileItem(family=_step_family(s), kernel=s.kernel, arch=arch,
                                         dtype=v.dtype,
                                         head_dim=v.head_dim, causal=v.causal, mask=v.mask,
                                         tiles=dict(v.tiles) if v.tiles else None,
                                         source=f"steps[{s.index}] {s.id}"))
    return items


def sweep_items(plan, archs: Iterable[str], kernels: Optional[Iterable[str]] = None,
                family: Optional[str] = None) -> list:
    """Every config of each arch's sweep space (tiles x occupancy x num_ctas and knobs) for
    each sweep step's kernel: fp16, D=64 and 128, causal and not.

    The hints are compiled in: tileiras sizes registers and shared-memory buffers for the
    occupancy asked, so the resource columns show what each config really gets.
    """
    from spak.gpu.variants import split_config
    items = []
    for s in plan.steps:
        if s.kind != "sweep" or (kernels is not None and s.kernel not in set(kernels)):
            continue
        if family is not None and _step_family(s) != family:
            continue
        for arch in archs:
            if arch not in plan.sweep:
                continue
            for cfg in plan.sweep[arch].configs():
                tiles, hints = split_config(cfg)
                for d in (64, 128):
                    for causal in (False, True):
                        items.append(CompileItem(family=_step_family(s), kernel=s.kernel,
                                                 arch=arch, dtype="fp16",
                                                 head_dim=d, causal=causal, mask=False,
                                                 tiles=tiles, hints=hints,
                                                 source=f"sweep.{arch}"))
    return items


# ------------------------------------------------------------------ tileiras archs

def _tileiras_path() -> Optional[str]:
    try:
        from spak.device import env as gpu_env
        path, _ = gpu_env.find_tileiras(gpu_env.wheel_versions(), os.environ,
                                        gpu_env._wheel_tileiras())
        return path
    except Exception:  # noqa: BLE001 -- no diagnosis module: no path
        return None


def supported_archs(tileiras: Optional[str] = "auto") -> tuple[Optional[list[str]], str]:
    """(the --gpu-name values the tileiras cuTile runs accepts, how that was found).

    None when no tileiras can be asked (then every compile fails and says why itself).
    """
    path = _tileiras_path() if tileiras == "auto" else tileiras
    if not path:
        return None, "no tileiras found (see `python -m spak.device.env`)"
    try:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"`{path} --help` failed: {e}"
    archs = re.findall(r"=\s*(sm_\d+[a-z]?)\b", out.stdout + out.stderr)
    if not archs:
        return None, f"`{path} --help` lists no --gpu-name values"
    return sorted(set(archs), key=lambda a: int(re.sub(r"\D", "", a))), path


# ------------------------------------------------------------------------ compile

def _compile_one(item: dict) -> dict:
    """Compile one item through its kernel family (absent: the FMHA forward)."""
    from spak import families
    r = families.get(item.get("family")).compile_variant(item)
    return {**item, "tiles": dict(r["tiles"]), "status": "ok" if r["ok"] else "FAIL",
            "ok": bool(r["ok"]), "seconds": r["seconds"], "cubin_bytes": r["cubin_bytes"],
            "error": r["error"], "kernels": r.get("kernels", [])}


def compile_items(items: list, *, jobs: int = 1, supported: Optional[list[str]] = None,
                  progress: Optional[Callable[[dict, int, int], None]] = None,
                  compile_one: Optional[Callable[[dict], dict]] = None) -> list[dict]:
    """Compile each item (in `jobs` processes); items for an arch outside `supported` are
    not compiled but reported with status "unsupported". Rows come back in item order.
    compile_one(item) -> row: default `_compile_one` (gpu.compile.compile_variant)."""
    compile_one = compile_one or _compile_one
    rows: list[Optional[dict]] = [None] * len(items)
    todo = []
    n = len(items)
    done = 0
    for i, it in enumerate(items):
        if supported is not None and it["arch"] not in supported:
            rows[i] = {**it, "status": "unsupported", "ok": False, "seconds": 0.0,
                       "cubin_bytes": 0, "kernels": [],
                       "error": f"arch not supported by this tileiras ({it['arch']} is not "
                                f"among its --gpu-name values)"}
            done += 1
            if progress:
                progress(rows[i], done, n)
        else:
            todo.append(i)
    if jobs <= 1 or len(todo) <= 1:
        for i in todo:
            rows[i] = _safe(compile_one, items[i])
            done += 1
            if progress:
                progress(rows[i], done, n)
    else:
        import concurrent.futures as cf
        import multiprocessing as mp
        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
            futs = {ex.submit(_safe, compile_one, items[i]): i for i in todo}
            for f in cf.as_completed(futs):
                i = futs[f]
                try:
                    rows[i] = f.result()
                except Exception as e:  # noqa: BLE001 -- a dead worker is a failed row
                    rows[i] = {**items[i], "status": "FAIL", "ok": False, "seconds": 0.0,
                               "cubin_bytes": 0, "kernels": [],
                               "error": f"{type(e).__name__}: {e}"}
                done += 1
                if progress:
                    progress(rows[i], done, n)
    return rows  # type: ignore[return-value]


def _safe(fn, item):
    try:
        return fn(item)
    except Exception as e:  # noqa: BLE001 -- compile_variant should not raise; never crash
        return {**item, "status": "FAIL", "ok": False, "seconds": 0.0, "cubin_bytes": 0,
                "kernels": [], "error": f"{type(e).__name__}: {e}"}


# ------------------------------------------------------------------------- output

HEADER = (f"{'variant':<38} {'arch':<7} {'config':<15} {'result':<11} {'seconds':>8} "
          f"{'cubin':>10}  {'regs':>4} {'threads':>7} {'smem KiB':>8} {'stack':>5} "
          f"{'blocks/SM':<20}")


def config_text(r: dict) -> str:
    """64x128, plus /o3 and /c2 for the occupancy and num_ctas hints compiled in and
    /NAME=value for each sweep knob."""
    t = r.get("tiles")
    if t and "TILE_M" in t and "TILE_N" in t:
        text = f"{t['TILE_M']}x{t['TILE_N']}"
    else:   # no tiles, or another family's tile keys (each shown as /NAME=value below)
        text = "default" if not t else ""
    h = r.get("hints") or {}
    text += (f"/o{h['occupancy']}" if h.get("occupancy") else "")
    text += (f"/c{h['num_ctas']}" if h.get("num_ctas") else "")
    text += "".join(f"/{k}={v}" for k, v in (t or {}).items() if k not in ("TILE_M", "TILE_N"))
    return text


def _resource_cols(k: Optional[dict]) -> str:
    """regs, threads, shared KiB, stack bytes, blocks per SM (limiter) of one kernel."""
    if not k or "registers" not in k:
        return ""
    blocks = ("-" if k.get("blocks_per_sm") is None
              else f"{k['blocks_per_sm']} ({k['limited_by']})")
    return (f"  {k['registers']:>4} {k['threads'] or '-':>7} {k['shared_bytes'] / 1024:>8.1f} "
            f"{k['stack_bytes']:>5} {blocks:<20}")


def format_row(r: dict) -> str:
    label = CompileItem(r).label
    kernels = r.get("kernels") or []
    line = (f"{label:<38} {r['arch']:<7} {config_text(r):<15} {r['status']:<11} "
            f"{r['seconds']:>8.2f} {r['cubin_bytes']:>10,}"
            + (_resource_cols(kernels[0]) if len(kernels) == 1 else ""))
    if len(kernels) > 1:          # naive: three kernels, one line each
        line += "".join(f"\n    {k['name']:<{38 + 7 + 15 + 11 + 8 + 10 + 3}}{_resource_cols(k)}"
                        for k in kernels if "registers" in k)
    if r.get("error"):
        line += "\n    " + str(r["error"]).strip().splitlines()[0][:300]
    return line


def format_rows(rows: list[dict]) -> str:
    return "\n".join([HEADER, *(format_row(r) for r in rows)])


def summarize(rows: list[dict]) -> dict:
    per = {}
    for r in rows:
        a = per.setdefault(r["arch"], {"variants": 0, "ok": 0, "failed": 0, "unsupported": 0,
                                       "seconds": 0.0, "cubin_bytes": 0})
        a["variants"] += 1
        a["ok"] += r["status"] == "ok"
        a["failed"] += r["status"] == "FAIL"
        a["unsupported"] += r["status"] == "unsupported"
        a["seconds"] += r["seconds"]
        a["cubin_bytes"] += r["cubin_bytes"]
    return {"variants": len(rows), "ok": sum(r["ok"] for r in rows),
            "failed": sum(r["status"] == "FAIL" for r in rows),
            "unsupported": sum(r["status"] == "unsupported" for r in rows),
            "seconds": sum(r["seconds"] for r in rows), "per_arch": per}


def hint_findings(rows: list[dict]) -> list[str]:
    """What the resource columns say about the hints, for a sweep space: configs whose
    occupancy hint tileiras did not meet, and groups of configs that compiled to the same
    machine code and resources (a sweep would time one kernel several times)."""
    lines, same = [], {}
    for r in rows:
        ks = r.get("kernels") or []
        if r.get("status") != "ok" or len(ks) != 1 or "registers" not in ks[0]:
            continue
        k, want = ks[0], (r.get("hints") or {}).get("occupancy")
        if want and k.get("blocks_per_sm") is not None and k["blocks_per_sm"] < want:
            lines.append(f"  occupancy {want} not met: {CompileItem(r).label} "
                         f"{config_text(r)} on {r['arch']} fits {k['blocks_per_sm']} per SM "
                         f"({k['registers']} registers x {k['threads']} threads, "
                         f"{k['shared_bytes'] / 1024:.1f} KiB shared)")
        key = (r["arch"], CompileItem(r).label, k["code_sha1"], k["registers"],
               k["shared_bytes"])
        same.setdefault(key, []).append(config_text(r))
    for (arch, label, *_), configs in same.items():
        if len(configs) > 1:
            lines.append(f"  same kernel: {label} on {arch}: {', '.join(configs)}")
    if lines:
        lines.insert(0, "hints (from the resources above):")
    return lines


def _code_keys(rows) -> dict:
    """(arch, variant label, config, kernel name) -> code_sha1 of every compiled kernel."""
    out = {}
    for r in rows:
        for k in r.get("kernels") or []:
            if k.get("code_sha1"):
                out[(r["arch"], CompileItem(r).label, config_text(r), k["name"])] = k["code_sha1"]
    return out


def code_changes(before_rows, after_rows) -> list:
    """Lines naming each kernel whose machine code differs from an earlier `spak compile
    --out` (or that one of the two lacks). Empty: a refactor left every cubin's code
    byte-identical, so the GPU runs exactly what it ran before (no GPU re-check needed)."""
    old, new = _code_keys(before_rows), _code_keys(after_rows)
    lines = []
    for key in sorted(set(old) | set(new)):
        arch, label, cfg, name = key
        what = f"{label} {cfg} {name} on {arch}"
        if key not in old:
            lines.append(f"  new: {what}")
        elif key not in new:
            lines.append(f"  not compiled now: {what}")
        elif old[key] != new[key]:
            lines.append(f"  code changed: {what} ({old[key][:10]} -> {new[key][:10]})")
    return lines


def summary_line(s: dict, wall: float) -> str:
    per = ", ".join(f"{a} {v['ok']}/{v['variants']} ({v['seconds']:.1f} s)"
                    + (" UNSUPPORTED" if v["unsupported"] else "")
                    for a, v in s["per_arch"].items())
    bad = s["failed"] + s["unsupported"]
    return (f"{s['ok']}/{s['variants']} variants compiled ({per})"
            + (f", {bad} FAILED" if bad else "") + f"; {wall:.1f} s wall")


# ------------------------------------------------------------------------ command
