"""`spak calibrate`: compare a numeric model with what a GPU computed (issue 6).

    spak calibrate --check --data DIR       # probe files already recorded (no GPU needed)
    spak calibrate --check                  # record them now on the local GPU, then compare
    spak calibrate --tables OUT             # record the MUFU.EX2 / MUFU.RCP tables (GPU)
    spak calibrate --record DIR             # everything below, on a local RTX 5070 / L4 / ...

The probe files are those of tools/numerics_probe.py (probe_mma_*.npz, probe_elementwise.npz).
For every op and case group it prints the share of outputs bit-identical to the model and
the worst distance in ulp; exit status 1 when an op the model declares exact is not 100%.

`--record DIR` is the one command for the owner of a GPU we have no measurements of
(issue 22: the sm_120 and sm_89 models come from MMA-Sim and the SASS, not from hardware):
it runs the probes (probe_*.npz), the exhaustive MUFU tables (sm90_mufu.npz, named after
the format, holding this GPU's offsets), the FMHA agreement cases (agreement.npz: both
kernels on the `default` shape set in fp16 and bf16, inputs and the GPU's whole output,
the tiles of this arch), issue 19's MUFU.RSQ and MUFU.TANH tables (tools/mufu_probe.py) and
per-op kernels (tools/sim_ops_gpu.py: sums, scans, matmul accumulation, gathers, atomics;
reported per family as "ops:<family>", not gated) and writes calibration.json (GPU, arch,
versions). Bring DIR home;
`spak calibrate --check --data DIR` then runs anywhere: the model of the recorded arch
(calibration.json) against every file, including the ops that model only assumes (sm_120
and sm_89: sm_90's MUFU tables and row-sum order), each reported as "exact" or "assumed";
exit 1 when either is refuted.

`--record DIR --quick` (meant for under 2 minutes; the full record did not finish in
150 s on an H200) keeps every check that can fail but records less: the probes and the
exhaustive exp2/rcp tables as above, MUFU.RSQ's whole table without the tanh survey,
MUFU.TANH's table on two binades ([0.5, 2)), the FMHA cases on two small shapes
(QUICK_SET), no per-op kernels. calibration.json says so. The tools run at once, beside
the FMHA cases (their output in DIR/<step>.log; seconds per step in calibration.json).
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MMA_GROUPS = ("random", "wide", "cancel", "bigacc")
#: ops the sm_90 model claims bit for bit (the others are declared approximate)
EXACT = {"sm_90": {"mma", "rowsum", "cast_f16", "cast_bf16", "mufu_rsq", "mufu_tanh"},
         # from MMA-Sim (bit-accurate, validated on hardware by its authors) and IEEE RNE
         "sm_120": {"mma", "cast_f16", "cast_bf16"},
         "sm_89": {"mma", "cast_f16", "cast_bf16"}}
#: what a model takes over unverified (sm_90's measurements, SASS-read compiler facts):
#: reported as "assumed", and a record that refutes it fails the check too
ASSUMED = {"sm_120": {"rowsum", "exp2", "div", "mufu_exp2", "mufu_rcp", "fmha"},
           "sm_89": {"rowsum", "exp2", "div", "mufu_exp2", "mufu_rcp", "fmha"}}
CALIBRATION = "calibration.json"
AGREEMENT = "agreement.npz"
#: the FMHA cases --record runs on the GPU (spak.attention.problems shape set)
AGREEMENT_SET = "default"
#: --quick's FMHA cases: both kernels, fp16 causal and bf16 masked GQA with Sq != Sk and
#: ragged tiles (the `default` set's replay on a CPU takes minutes)
QUICK_SET = ["1x2x17x64/causal/fp16", "2x4:2x77:130x64/noncausal/bf16/mask"]


def _ulp_stats(got, want):
    import numpy as np
    g = np.ascontiguousarray(got, np.float32).view(np.int32).astype(np.int64)
    w = np.ascontiguousarray(want, np.float32).view(np.int32).astype(np.int64)
    same = g == w
    return float(same.mean() * 100), int(np.abs(g - w).max()) if g.size else 0


def agreement(model_name: str, data: Path) -> list[tuple[str, str, float, int]]:
    """Rows (op, case group, % bit-identical, worst ulp) of the model on recorded probes."""
    import numpy as np
    import cuda.tile as ct
    from spak.sim.numerics import get_model
    m = get_model(model_name)
    rows = []
    for dt in ("fp16", "bf16"):
        for k in (16, 64):
            f = data / f"probe_mma_{dt}_k{k}.npz"
            if not f.exists():
                continue
            z = np.load(f)
            base = f"mma_{dt}_k{k}"
            a, b, c, d = (z[base + s] for s in ("_a", "_b", "_c", "_d"))
            b = b.astype(np.float16) if dt == "fp16" else b
            r = m.mma(a.astype(np.float64), b, c, ct.float32)
            n = len(MMA_GROUPS)
            for g, (rg, dg) in enumerate(zip(np.array_split(r, n), np.array_split(d, n))):
                if dg.size == 0:        # fewer cases than groups: nothing to score
                    continue
                rows.append(("mma", f"{dt} K={k} {MMA_GROUPS[g]}", *_ulp_stats(rg, dg)))
    f = data / "probe_elementwise.npz"
    if f.exists():
        e = np.load(f)
        rows.append(("exp2", "ftz, x in [-160, 2]", *_ulp_stats(m.exp2(e["x"], ct.float32, True), e["y"])))
        q = m.truediv(e["div_x"], e["div_y"], ct.float32, ct.RoundingMode.APPROX, True)
        rows.append(("div", "approx, ftz", *_ulp_stats(q, e["div_q"])))
        with np.errstate(over="ignore"):
            h = m.round_to(e["cast_x"], ct.float16).astype(np.float32)
        rows.append(("cast_f16", "fp32 -> fp16", *_ulp_stats(h, e["cast_f16"].astype(np.float32))))
        rows.append(("cast_bf16", "fp32 -> bf16", *_ulp_stats(m.round_to(e["cast_x"], ct.bfloat16),
                                                             e["cast_bf16"])))
        rows.append(("rowsum", "fp32, rows of 128", *_ulp_stats(m.sum(e["sum_x"], (2,), ct.float32),
                                                                 e["sum_y"])))
    return rows


def mufu_rows(model, data: Path) -> list[tuple[str, str, float, int]]:
    """The recorded MUFU tables (tools/numerics_tables.py's file) against the model's."""
    import numpy as np
    from spak.sim.numerics import load_mufu_tables
    f = data / "sm90_mufu.npz"
    if not f.exists():
        return []
    exp2_off, rcp_off = load_mufu_tables(str(f))
    rows = []
    for op, got, mine in (("mufu_exp2", exp2_off, getattr(model, "exp2_table", None)),
                          ("mufu_rcp", rcp_off, getattr(model, "rcp_table", None))):
        mine = np.zeros_like(got) if mine is None or mine.size == 0 else mine
        same = got == mine
        rows.append((op, "all 2^23 fractions", float(same.mean() * 100),
                     int(np.abs(got.astype(np.int16) - mine.astype(np.int16)).max())))
    return rows


def rsq_tanh_rows(model_name: str, data: Path) -> list[tuple[str, str, float, int]]:
    """tools/mufu_probe.py's records (MUFU.RSQ offsets over [1, 4); MUFU.TANH's table over
    +-[2^-8, 8)) against the tables the sm_90 model reads (sim/mufu.py). Other models do
    not use these tables, so their rows say how far the recorded GPU is from sm_90's."""
    import numpy as np
    from spak.sim import mufu
    rows = []
    f = data / "mufu_probe.npz"
    mine = mufu.rsq_table()
    if f.exists() and mine is not None:
        got = np.load(f)["rsqrt_off"]
        if got.shape == mine.shape:
            rows.append(("mufu_rsq", "all 2^24 in [1, 4)", float((got == mine).mean() * 100),
                         int(np.abs(got.astype(np.int16) - mine.astype(np.int16)).max())))
    f = data / "tanh_table.npz"
    table = mufu.tanh_table()
    if f.exists() and table is not None:
        z = np.load(f)
        x, want = _tanh_runs(z)
        got = mufu.tanh_sm90(x, table).view(np.uint32)
        ulp = np.abs(got.astype(np.int64) - want.astype(np.int64))
        es = sorted(int(k[1:-len("_first")]) for k in z.files if k.endswith("_first"))
        span = f"+-[2^{es[0]}, 2^{es[-1] + 1})" if es else "no binades"
        rows.append(("mufu_tanh", f"{want.size // 4} runs of {span}",
                     float((got == want).mean() * 100), int(ulp.max()) if ulp.size else 0))
    return rows


def _tanh_runs(z):
    """The inputs and result bits of tools/mufu_probe.py --tanh-table's record: per binade 2^e
    the run starts' bits (t{e}_first + cumulative t{e}_diff); each run checked at its first
    and last input, for both signs (the probe found tanh odd on every input)."""
    import numpy as np
    xs, ys = [], []
    for key in sorted(k for k in z.files if k.endswith("_first")):
        e = int(key[1:-len("_first")])
        bits = np.cumsum(np.concatenate([z[key].astype(np.int64),
                                         z[f"t{e}_diff"].astype(np.int64)])).astype(np.uint32)
        run = 23 - (int(bits.size).bit_length() - 1)          # 2^(23 - run) runs a binade
        start = np.uint32((127 + e) << 23) + (np.arange(bits.size, dtype=np.uint32) << run)
        for last in (np.uint32(0), np.uint32((1 << run) - 1)):
            for sign in (np.uint32(0), np.uint32(1 << 31)):
                xs.append((start + last) | sign)
                ys.append(bits | sign)
    return np.concatenate(xs).view(np.float32), np.concatenate(ys)


def ops_rows(model_name: str, data: Path) -> list[tuple[str, str, float, int]]:
    """tools/sim_ops_gpu.py's per-op kernels re-run on the simulator under the model, per
    family (op "ops:<family>"; reported, not gated: docs/sim-coverage.md says per op which
    cases are verified, and tests/test_sim_shapes_h100.py pins the known gaps)."""
    import importlib.util
    from contextlib import redirect_stdout
    import io
    if not (data / "sim_ops_gpu.npz").exists():
        return []
    spec = importlib.util.spec_from_file_location("sim_ops_gpu", ROOT / "tools" / "sim_ops_gpu.py")
    ops = sys.modules.get("sim_ops_gpu") or importlib.util.module_from_spec(spec)
    if "sim_ops_gpu" not in sys.modules:
        sys.modules["sim_ops_gpu"] = ops          # its dataclasses look their module up
        spec.loader.exec_module(ops)
    with redirect_stdout(io.StringIO()):
        _, _, fam = ops.measure(data, model_name)
    return [(f"ops:{name}", f"{n} outputs", 100.0 * same / n if n else 100.0, worst)
            for name, (n, same, worst) in fam.items()]


def fmha_rows(model_name: str, data: Path) -> list[tuple[str, str, float, int]]:
    """The recorded FMHA outputs (agreement.npz) re-simulated under the model, per kernel
    and dtype: share of output elements bit-identical, worst ulp."""
    import importlib.util
    f = data / AGREEMENT
    if not f.exists():
        return []
    spec = importlib.util.spec_from_file_location("agree_replay", ROOT / "tools" / "agree_replay.py")
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    groups: dict[str, list] = {}
    for item in replay.load(f):
        r = replay.replay(item, model_name)
        g = groups.setdefault(f"{r['kernel']} {item['dtype']}", [0, 0, 0])
        g[0] += r["elements"]
        g[1] += round(r["bit"] * r["elements"])
        g[2] = max(g[2], r["ulp"])
    shapes = _recorded(data).get("agreement_set", AGREEMENT_SET)
    return [("fmha", f"{name}, {shapes} set", 100.0 * s / n if n else 100.0, worst)
            for name, (n, s, worst) in groups.items()]


def _recorded(data: Path) -> dict:
    import json
    f = data / CALIBRATION
    return json.loads(f.read_text()) if f.exists() else {}


def record_agreement(data: Path, arch: str, run=None, shapes=None) -> int:
    """Run both kernels on the `default` shape set (fp16 and bf16, the arch's default tiles)
    and keep every case's inputs and output in agreement.npz (tools/agree_replay.py's format).
    run(kernel, q, k, v, mask, causal, dtype, tiles) -> output as numpy; default: the
    local GPU through spak.fmha. `shapes`: shape strings instead of the set. Returns the
    number of cases (~10 MB for the default set)."""
    import json
    import numpy as np
    from spak.attention.problems import SHAPE_SETS, expand, make_inputs
    from spak.gpu.plan import default_tiles
    run = run or _run_on_gpu
    dump: dict = {}
    n = 0
    for spec in expand(shapes or SHAPE_SETS[AGREEMENT_SET]):
        inp = make_inputs(spec)
        tiles = default_tiles(spec.D, arch, spec.causal)
        for kernel in ("fused", "naive"):
            out = run(kernel, inp.q, inp.k, inp.v, inp.mask, spec.causal, spec.dtype, tiles)
            arrays = {"q": inp.q, "k": inp.k, "v": inp.v, "gpu": np.asarray(out)}
            if inp.mask is not None:
                arrays["mask"] = inp.mask
            for name, arr in arrays.items():
                dump[f"{n:03d}/{name}"] = arr
            meta = {"case": f"{kernel}|{spec.case_id}", "scale": None,
                    "causal": spec.causal, "dtype": spec.dtype, "tiles": dict(tiles)}
            dump[f"{n:03d}/meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
            n += 1
    np.savez_compressed(data / AGREEMENT, **dump)     # tools/agree_replay.py's format
    return n


def _run_on_gpu(kernel, q, k, v, mask, causal, dtype, tiles):
    import torch
    import spak
    tdt = torch.float16 if dtype == "fp16" else torch.bfloat16
    Q, K, V = (torch.from_numpy(x).to("cuda").to(tdt) for x in (q, k, v))
    M = None if mask is None else torch.from_numpy(mask).to("cuda")
    out = spak.fmha(Q, K, V, is_causal=causal, attn_mask=M, kernel=kernel, tiles=tiles,
                    enable_gqa=Q.shape[1] != K.shape[1])
    torch.cuda.synchronize()
    return out.cpu().numpy() if dtype == "fp16" else out.float().cpu().numpy()


def record(out: Path, quick: bool = False) -> int:
    """Probes, MUFU tables and FMHA agreement cases on the local GPU, into `out`
    (`quick`: QUICK_STEPS and QUICK_SET, see the module's doc)."""
    import datetime
    import json
    import platform
    import time
    from spak.device.archs import from_torch
    arch, _, name = from_torch()
    if arch is None:
        print("spak calibrate --record: no CUDA GPU here (torch with CUDA and a GPU are "
              "needed; --check --data DIR runs anywhere)", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    plan = QUICK_STEPS if quick else RECORD_STEPS
    procs = _start_tools(plan, out)     # they run beside the FMHA cases below
    shapes = "quick" if quick else AGREEMENT_SET
    print(f"== agreement: both kernels, the {shapes} shape set", flush=True)
    t0 = time.perf_counter()
    agreed = {}
    try:
        agreed["agreement_cases"] = record_agreement(out, arch,
                                                     shapes=QUICK_SET if quick else None)
    except Exception as exc:          # the other records are still worth bringing home
        agreed["agreement_error"] = f"{type(exc).__name__}: {exc}"
    agreement_s = round(time.perf_counter() - t0, 1)
    steps, seconds = _wait_tools(procs, out)
    steps.update(agreed)
    seconds["agreement"] = agreement_s
    meta = {"gpu": name, "arch": arch, "date": datetime.date.today().isoformat(),
            "host": platform.node(), "quick": quick, "agreement_set": shapes,
            "steps": steps, "seconds": seconds, "versions": _versions(), "commit": _commit()}
    (out / CALIBRATION).write_text(json.dumps(meta, indent=1) + "\n")
    print(f"seconds per step: {seconds}\n"
          f"wrote {out}: {sorted(p.name for p in out.iterdir())}\n"
          f"then, on any machine: spak calibrate --check --data {out}")
    failed = any(steps[st[0]] for st in plan) or "agreement_error" in steps
    return 1 if failed else 0


#: what --record runs (all at once, beside the FMHA cases): (step, tools/ script, flags). The probes and MUFU tables
#: of issue 6, then issue 19's: MUFU.RSQ's table and tanh samples (mufu_probe.npz),
#: MUFU.TANH's whole table (tanh_table.npz) and the per-op kernels (sim_ops_gpu.npz: sums,
#: scans, matmul accumulation, gathers, atomics, the shape rules).
RECORD_STEPS = (("probes", "numerics_probe.py"), ("tables", "numerics_tables.py"),
                ("mufu_rsq", "mufu_probe.py"), ("mufu_tanh", "mufu_probe.py", "--tanh-table"),
                ("ops", "sim_ops_gpu.py", "--extra", "--shapes"))
#: --quick: the same files minus the per-op kernels and the tanh survey (mufu_probe.npz
#: holds MUFU.RSQ's whole table only; tanh_table.npz two binades); the probes do not print
#: their own summary against the models (--check does, and its numba compile costs ~10 s)
QUICK_STEPS = (("probes", "numerics_probe.py", "--no-summary"),
               ("tables", "numerics_tables.py"),
               ("mufu_rsq", "mufu_probe.py", "--rsqrt-only"),
               ("mufu_tanh", "mufu_probe.py", "--tanh-table", "--binades=-1,0"))


def _start_tools(plan, out: Path) -> dict:
    """Start every tool of the plan at once (independent files; on one GPU their start-up,
    compiles and launches overlap): {step: (Popen, start time)}, output in DIR/<step>.log."""
    import time
    procs = {}
    for step, script, *extra in plan:
        print(f"== {step}: tools/{script} {' '.join(extra)} > {step}.log", flush=True)
        with open(out / f"{step}.log", "w") as log:
            cmd = [sys.executable, str(ROOT / "tools" / script), *_out_flag(script, out), *extra]
            procs[step] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT),
                           time.perf_counter())
    return procs


def _wait_tools(procs: dict, out: Path) -> tuple[dict, dict]:
    """({step: exit status}, {step: seconds to its end}); each log's last lines printed."""
    import time
    steps, seconds = {}, {}
    while len(steps) < len(procs):
        for step, (proc, t0) in procs.items():
            if step not in steps and proc.poll() is not None:
                steps[step], seconds[step] = proc.returncode, round(time.perf_counter() - t0, 1)
        time.sleep(0.1)
    for step in procs:
        tail = (out / f"{step}.log").read_text(errors="replace").splitlines()[-3:]
        print(f"-- {step}: exit {steps[step]} after {seconds[step]} s", *tail, sep="\n   ")
    return steps, seconds


def _out_flag(script: str, out: Path) -> list:
    return ["--record", str(out)] if script == "sim_ops_gpu.py" else ["--out", str(out)]


def _versions() -> dict:
    from spak.results.provenance import package_version
    return {pkg: package_version(pkg)
            for pkg in ("spak", "cuda-tile", "nvidia-cuda-tileiras", "torch", "numpy", "numba")}


def _commit():
    from spak.results.provenance import git_commit
    return git_commit()[0]


def recorded_arch(data: Path):
    return _recorded(data).get("arch")


def probe_now() -> Path | None:
    """Run the numeric probes on the local GPU into a fresh folder; None if they did not run."""
    data = Path(tempfile.mkdtemp(prefix="spak-probes-"))
    rc = subprocess.call([sys.executable, str(ROOT / "tools" / "numerics_probe.py"),
                          "--out", str(data)])
    return None if rc else data


def record_tables(out: str) -> int:
    """The exhaustive MUFU tables of the local GPU into `out` (tools/numerics_tables.py)."""
    return subprocess.call([sys.executable, str(ROOT / "tools" / "numerics_tables.py"),
                            "--out", out])


def model_for(data: Path, model: str | None, recorded: bool) -> str:
    """The model to check: `model`, else the recorded (or this) GPU's arch, else sm_90."""
    from spak.sim.numerics import MODELS
    if model is not None:
        return model
    rec = recorded_arch(data)
    if rec is None and not recorded:
        from spak.device.archs import from_torch
        rec = from_torch()[0]
    return rec if rec in MODELS else "sm_90"


def check(model: str, data: Path) -> tuple[list[str], int]:
    """Per op: bit-identical fraction of the model against the probes in `data`, and the
    claim (exact, assumed, approx) it is held to. Returns (table lines, failures); no
    lines when `data` holds no probe files."""
    from spak.sim.numerics import get_model
    rows = agreement(model, data)
    rows += mufu_rows(get_model(model), data) + fmha_rows(model, data)
    rows += rsq_tanh_rows(model, data) + ops_rows(model, data)
    if not rows:
        return [], 0
    exact, assumed = EXACT.get(model, set()), ASSUMED.get(model, set())
    w = max(10, *(len(r[0]) for r in rows))
    lines = [f"model {model} vs {data}",
             f"{'op':{w}s} {'cases':26s} {'bit-identical':>14s} {'worst ulp':>10s}  claim"]
    bad = 0
    for op, group, pct, worst in rows:
        claim = ("exact" if op in exact else "assumed" if op in assumed
                 else "reported" if op.startswith("ops:") else "approx")
        flag = ""
        if claim == "exact" and pct < 100.0:
            bad += 1
            flag = "  << FAIL"
        elif claim == "assumed" and pct < 100.0:
            bad += 1
            flag = (f"  << ASSUMPTION REFUTED (docs/numerics-{model.replace('_', '')}"
                    ".md, 'closing the loop')")
        lines.append(f"{op:{w}s} {group:26s} {pct:13.4f}% {worst:10d}  {claim}{flag}")
    return lines, bad
