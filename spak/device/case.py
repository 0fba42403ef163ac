"""One shape of `spak run`: a kernel family's kernels checked, compared with the simulator
and timed on the local GPU, beside the family's peers. Everything family-specific (inputs,
references, our kernel's launches, the peers, the simulator slice, FLOPs) comes from the
family (spak.families.base.KernelFamily, "the GPU loop").

For every kernel: first call into NaN-poisoned outputs (its time includes the compile),
the family's check against float64 and the peer reference, a second call's bits against
the first's (the row's "deterministic"), the agreement with the simulator on a slice;
for every peer: its first call (a refusal is "skipped"), NaN/Inf and
its error vs float64. Then all of them are timed in turns (spak.device.timing).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Optional

from spak import families
from spak.device import timing
from spak.device.agreement import agreement, sim_model
from spak.device.calls import first_tensor, shared_alloc
from spak.device.checks import nonfinite, rel_l2
from spak.device.failures import failure_text

__all__ = ["run_case", "guarded_case", "problem_fields", "time_providers", "same_bits"]


def problem_fields(fam, problem) -> dict:
    """The problem's fields on a `spak run` row: family, case, shape, the problem's own
    fields (a dataclass's, in order; else the family's row_fields, dtype and causal) and
    flops."""
    if dataclasses.is_dataclass(problem):
        own = dataclasses.asdict(problem)
    else:
        own = {**fam.row_fields(problem), "dtype": problem.dtype, "causal": problem.causal}
    return {"family": fam.name, "case": problem.case_id, "shape": problem.display, **own,
            "flops": fam.flops(problem)}


def guarded_case(spec, kernels, run, emit, base: dict, fam=None) -> list[dict]:
    """``run(emit)`` -> the rows of one shape. A failure outside the per-kernel guards of
    run_case (making the inputs, the float64 and peer references: a CUDA OOM on a huge
    shape) becomes an error row for each kernel that has none yet, emitted, and the batch
    goes on with the next shape. KeyboardInterrupt and SystemExit still end the run."""
    fam = fam or families.get()
    done: list[dict] = []

    def emit_seen(row):
        done.append(row)
        emit(row)
    try:
        return run(emit_seen)
    except Exception as exc:  # noqa: BLE001 -- one shape's failure is rows, not the end
        err = failure_text(exc)
    rows = list(done)
    have = {r.get("provider") for r in done}
    for kernel in kernels:
        if f"spak-{kernel}" in have:
            continue
        row = {**base, **problem_fields(fam, spec), "provider": f"spak-{kernel}",
               "kernel": kernel, "tiles": None, "error": err, "passed": False,
               "gate": fam.gate(spec, fam.outputs[0])}
        emit(row)
        rows.append(row)
    return rows


def run_case(spec, kernels, args, env, ceiling: Optional[float], emit, fam=None) -> list[dict]:
    """All rows for one shape: our kernels (checked, simulated, timed) and the peers.

    args: no_time, no_sim, no_sdpa, max_sets, seed, naive_max_gb, tiles, model, sim_heads,
    sim_work, dump; env: base (run-wide row fields), arch, l2_bytes, dump, device."""
    import torch
    fam = fam or families.get()
    device = getattr(env, "device", "cuda")
    n_sets = 1 if args.no_time else timing.input_sets_for(fam, spec, env.l2_bytes,
                                                           args.max_sets)
    sets = fam.gpu_input_sets(spec, args.seed, n_sets, device)
    ref = fam.gpu_reference(spec, sets[0])
    peer_ref = fam.peer_reference(spec, sets[0])
    case = {**problem_fields(fam, spec), "ceiling_tflops": ceiling}
    rows: list[dict] = []

    def finish(row):
        row = {**env.base, **case, **row}
        if row.get("ms_median"):
            _add_rates(row, fam, spec, ceiling)
        rows.append(row)
        emit(row)

    # Providers are checked one by one, then timed together in turns (time_turns): timed
    # one after the other, the first one gained a few % (results/ab-h100-2026-11-22).
    done: list[dict] = []          # rows in provider order, finished after the timing
    timers: dict = {}              # provider -> fn(i) over the input sets
    eager: dict = {}               # provider -> fn(i): the public entry, for --timing eager
    contexts: dict = {}            # provider -> context held while it is timed
    for kernel in kernels:
        row, timer = _our_kernel(fam, kernel, spec, sets, ref, peer_ref, args, env, device)
        if row.get("skipped"):
            finish(row)
            continue
        if timer is not None:
            timers[row["provider"]] = timer
            api = [fam.eager_call(kernel, spec, s) for s in sets]
            if all(a is not None for a in api):
                eager[row["provider"]] = functools.partial(_call_on_set, api)
        done.append(row)
    if not args.no_time:
        for name, peer, row in _peer_rows(fam, spec, sets, ref, args):
            if peer is not None and row.get("error") is None and not row.get("skipped"):
                timers[name] = functools.partial(_on_set, peer.run, sets)
                contexts[name] = peer.context
                if peer.eager is not None:
                    eager[name] = functools.partial(_on_set, peer.eager, sets)
            done.append(row)
    for mode in _modes(args):
        time_providers(done, {**timers, **eager} if mode == "eager" else timers, n_sets,
                       seed=args.seed, contexts=contexts, mode=mode,
                       reps=getattr(args, "repeats", 3), primary=mode == _modes(args)[0])
    for row in done:
        if mode_rows := row.get("modes"):
            for m, st in mode_rows.items():
                st["call"] = ("public entry" if m == "eager" and row["provider"] in eager
                              else "planned launches" if row.get("kernel") else "peer call")
    error_ratios(done)
    copy_fraction(done)
    for row in done:
        finish(row)
    del sets, ref, peer_ref, timers
    torch.cuda.empty_cache()
    return rows


def _add_rates(row: dict, fam, spec, ceiling) -> None:
    """TFLOPS (and % of the matmul ceiling) from the median time (a row's own "flops" when
    its provider computes more than the family's problem); GB/s for families measured by
    bandwidth."""
    sec = row["ms_median"] * 1e-3
    row["tflops"] = (row.get("flops") or fam.flops(spec)) / sec / 1e12
    row["pct_ceiling"] = 100.0 * row["tflops"] / ceiling if ceiling else None
    if fam.metric == "GB/s":
        row["gb_per_s"] = fam.bytes_moved(spec) / sec / 1e9


def _modes(args) -> list:
    """--timing's modes, first = the one whose stats are the row's top-level ms_*."""
    modes = getattr(args, "timing", None) or ["kernel"]
    return [modes] if isinstance(modes, str) else list(modes)


def _peer_rows(fam, spec, sets, ref, args):
    """(provider, PeerCall or None, row) of every peer plug-in (spak.device.peers): the
    checked row of each available peer, a skipped row noting why for each missing one."""
    from spak.device import peers
    wanted = getattr(args, "peers", None)
    if args.no_sdpa:
        wanted = [n for n in (wanted or peers.names(fam)) if n != "sdpa"]
    calls, notes = peers.gather(fam, spec, sets, wanted)
    out = [(name, peer, _peer(fam, name, peer, sets, ref)) for name, peer in calls.items()]
    out += [(name, None, {"provider": name, "kernel": None, "error": None,
                          "skipped": note, "note": note}) for name, note in notes.items()]
    return out


def error_ratios(rows: list[dict]) -> None:
    """Each of our rows' error over each checked peer's (rel L2 vs float64), as
    "err_ratio": {peer: ours / peer} (below 1: ours is closer to float64). SPAK's own
    peer rows (fwd+bwd:spak-fused) are not peers of it here."""
    peers = {r["provider"]: r["rel_l2"] for r in rows
             if not r.get("kernel") and r.get("rel_l2") and "spak" not in r["provider"]}
    for r in rows:
        if r.get("kernel") and r.get("rel_l2") is not None and peers:
            r["err_ratio"] = {p: r["rel_l2"] / e for p, e in peers.items()}


def copy_fraction(rows: list[dict]) -> None:
    """Each timed row of ours gets "of_copy": the same-size copy's time over ours, i.e. the
    fraction of the bandwidth a copy of the same bytes reaches (the decode's bound)."""
    copy = next((r for r in rows if r["provider"] == "copy" and r.get("ms_median")), None)
    if copy is None:
        return
    for r in rows:
        if r.get("kernel") and r.get("ms_median"):
            r["of_copy"] = copy["ms_median"] / r["ms_median"]


def _our_kernel(fam, kernel, spec, sets, ref, peer_ref, args, env, device):
    """(row, timer or None) of one of our kernels: first call, checks, simulator."""
    row = {"provider": f"spak-{kernel}", "kernel": kernel, "tiles": None, "error": None,
           "passed": False, "gate": fam.gate(spec, fam.outputs[0])}
    timer = None
    try:
        ws = fam.workspace_bytes(kernel, spec)
        if ws > args.naive_max_gb * 2 ** 30:
            row["skipped"] = (f"{kernel} workspace {ws / 2 ** 30:.1f} GiB > "
                              f"--naive-max-gb {args.naive_max_gb}")
            return row, None
        config = fam.gpu_config(kernel, spec, device, tiles=args.tiles)
        row["tiles"] = config
        call = fam.gpu_call(kernel, spec, sets[0], config)
        row["first_call_s"] = _first_call(call, env)       # includes the compile
        row.update(fam.gpu_check(spec, sets[0], call.outputs, ref, peer_ref))
        row["deterministic"] = _deterministic(fam, kernel, spec, sets[0], config,
                                              call.outputs)
        if not args.no_sim:
            row["sim"] = _agreement(fam, kernel, spec, sets[0], call.outputs, config, args,
                                    env)
        if not args.no_time:
            alloc = shared_alloc(first_tensor(sets[0]))
            calls = [fam.gpu_call(kernel, spec, s, config, alloc=alloc) for s in sets]
            timer = functools.partial(_call_on_set, calls)
        del call
    except Exception as exc:  # noqa: BLE001 -- one failure (OOM too) is a row, not the end
        row["error"] = failure_text(exc)
    return row, timer


def _deterministic(fam, kernel, spec, inputs, config, outputs):
    """A second call on the same inputs, into fresh NaN-filled outputs, gives the first
    call's bits in every output (no atomics, no reduction whose order varies by run);
    None when the second call cannot run (out of memory beside the first: a naive
    kernel's workspace), which is not the row's failure."""
    import torch
    try:
        again = fam.gpu_call(kernel, spec, inputs, config)
        again()
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 -- the first call passed; only this check is lost
        return None
    return all(same_bits(outputs[n], again.outputs[n]) for n in fam.outputs)


def same_bits(a, b) -> bool:
    """Same dtype, shape and bytes (NaN payloads included: torch.equal says NaN != NaN)."""
    import torch
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _call_on_set(calls, i):
    """calls[i](): our kernel's timed call on input set i."""
    calls[i]()


def _first_call(call, env) -> float:
    """Seconds of the first call (compile included); a compile error is explained."""
    import torch
    from spak.device import env as gpu_env
    t0 = time.perf_counter()
    try:
        call()
        torch.cuda.synchronize()
    except Exception as exc:
        if gpu_env.is_compile_error(exc):
            raise gpu_env.explain(exc, arch=env.arch) from exc
        raise
    return time.perf_counter() - t0


def _agreement(fam, kernel, spec, inputs, outputs, config, args, env) -> dict:
    """The row's "sim": agreement with the simulator, or the error that stopped it."""
    dump = getattr(env, "dump", None) if getattr(args, "dump", None) else None
    try:
        return agreement(fam, kernel, spec, inputs, outputs, config,
                         model=args.model or sim_model(env.arch), heads=args.sim_heads,
                         work=args.sim_work, dump=dump)
    except Exception as exc:  # noqa: BLE001 -- recorded, run goes on
        return {"error": f"{type(exc).__name__}: {exc}"}


def _peer(fam, name, peer, sets, ref) -> dict:
    """A peer's row: first call ("skipped" with the reason if it refuses the shape),
    NaN/Inf count and error vs float64, or the error that stopped it."""
    import torch
    row = {"provider": name, "kernel": None, "error": None}
    if getattr(peer, "flops", None) is not None:
        row["flops"] = peer.flops
    try:
        with peer.context():
            try:
                raw = peer.run(sets[0])
                torch.cuda.synchronize()
            except RuntimeError as exc:
                row["skipped"] = str(exc).strip().splitlines()[0][:300]
                return row
            if not peer.checked:
                row["note"] = "not compared: the same bytes moved, not the same function"
                return row
            outs = peer.outputs(raw)
            row["nonfinite"] = sum(nonfinite(t) for t in outs.values())
            conformed = peer.conform(outs)
            row["rel_l2"] = max(rel_l2(conformed[n], ref[n]) for n in fam.outputs)
            del raw, outs, conformed
    except Exception as exc:  # noqa: BLE001 -- OOM too: a row, not the end
        row["error"] = failure_text(exc)
    return row


def _on_set(run, sets, i):
    """run(sets[i]): a provider's timed call on input set i."""
    return run(sets[i])


def time_providers(rows: list[dict], timers: dict, n_sets: int, *, seed: int,
                   contexts=None, mode: str = "kernel", reps: int = 3,
                   primary: bool = True) -> None:
    """Add time_turns' stats (timing ``mode``, ``reps`` turns) to the rows of the timed
    providers (``contexts`` as there): under row["modes"][mode], and at the top level
    (ms_median, ...) when ``primary``. If timing them together fails (out of memory, say),
    each is timed alone and a failure is that row's error."""
    contexts = contexts or {}
    if not timers:
        return
    by_name = {r["provider"]: r for r in rows}
    how = "in turns" if len(timers) > 1 else "alone"
    try:
        spin = next(iter(timers.values()))
        found = timing.time_turns(timers, spin, seed, n_sets=n_sets, contexts=contexts,
                                  mode=mode, reps=reps)
    except Exception:  # noqa: BLE001 -- fall back to one provider at a time
        found, how = {}, "alone"
        for name, fn in timers.items():
            try:
                with contexts.get(name, contextlib.nullcontext)():
                    found[name] = timing.MODES[mode](fn, n_sets)
            except Exception as exc:  # noqa: BLE001
                if primary:
                    by_name[name]["error"] = failure_text(exc)
                else:               # a secondary mode's failure is noted, not a failed row
                    by_name[name].setdefault("modes", {})[mode] = {"error": failure_text(exc)}
    for name, st in found.items():
        row = by_name[name]
        row.setdefault("modes", {})[mode] = {**st, "timing": how}
        if primary:
            row.update(st)
            row["input_sets"] = n_sets
            row["timing"] = how
            row["timing_mode"] = mode
