"""The peers `spak run` checks and times beside SPAK's kernels, as plug-ins.

A plug-in is one `Plugin` in `PLUGINS`: a name (what `--peers` selects), the families it
serves, and ``make(fam, problem, sets) -> {provider name: PeerCall}`` built on ALL the
timing input sets (so a peer can prepare per-set data, e.g. a contiguous copy of a cache
view, before anything is timed; ``PeerCall.run(x)`` is then called with one of ``sets``).
A peer that is not available here (not installed, not fetched, or without a form of the
problem) raises `PeerMissing` with the reason: the run records a skipped row with that
note and goes on. Adding a peer is one function and one `PLUGINS` line in this file.

Built in:
  sdpa           the family's own SDPA peers (fam.peer_calls: flash, cuDNN, efficient;
                 the backward's also time forward + backward)
  sdpa-math      SDPA's math backend, fmha_fwd, only when named (--peers)
  nvidia-sample  NVIDIA's cuTile FMHA sample (samples/AttentionFMHA.py of cutile-python),
                 fetched into the ignored .peers/ by tools/peers_fetch.py; our launcher of its
                 kernel (its host code is not used), fmha_fwd
  tilegym        TileGym's cuTile ops (tile_fmha, fmha_decode), imported from the
                 `tilegym` package: installed, or .peers/tilegym/src, or .peers/
  flashinfer     FlashInfer's single-request prefill/decode, where `flashinfer` imports
  copy           a device-to-device copy of the bytes one call moves (half read, half
                 written): the bandwidth a kernel of this size can reach (GB/s families)

Peers are never copied into this repository. torch is imported inside the functions.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Callable

from spak.device.calls import PeerCall

__all__ = ["Plugin", "PeerMissing", "PLUGINS", "names", "gather", "peers_dir"]


class PeerMissing(Exception):
    """A peer that cannot run here or on this problem; the message is the row's note."""


@dataclasses.dataclass(frozen=True)
class Plugin:
    name: str
    families: tuple            # family names served; () = every family
    make: Callable             # make(fam, problem, sets) -> {provider: PeerCall}
    doc: str = ""
    default: bool = True       # False: only when --peers names it (slow or special)


def peers_dir() -> Path:
    """Where fetched peers live: $SPAK_PEERS, else .peers/ at the repository root."""
    env = os.environ.get("SPAK_PEERS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / ".peers"


# ----------------------------------------------------------------------- the plug-ins

def _sdpa(fam, problem, sets) -> dict:
    calls = fam.peer_calls(problem, sets[0])
    if not calls:
        raise PeerMissing("SDPA has no form of this problem (paged cache, per-sequence "
                          "lengths, or causal with Sq > 1)")
    return calls


def _sdpa_math(fam, problem, sets) -> dict:
    """SDPA's math backend (materialises S x S: slow, memory-bound; asked for by name)."""
    from spak.device.sdpa import sdpa_peers
    if fam.name != "fmha_fwd":
        raise PeerMissing("sdpa-math: forward only")
    return sdpa_peers(problem, sets[0], ["sdpa-math"])


def _dense_fwd(problem, what: str, top_left: bool = True) -> None:
    """PeerMissing unless ``problem`` is a plain forward the peer computes: no mask, and
    (``top_left``: its causal is top-left, as the sample's) causal only with Sq == Sk."""
    if getattr(problem, "mask", None):
        raise PeerMissing(f"{what}: no attention mask")
    if top_left and problem.causal and problem.Sq != problem.Sk:
        raise PeerMissing(f"{what}: causal is top-left there; Sq != Sk differs from ours")


_SAMPLES: dict = {}            # path -> the imported sample (one kernel object: one compile)


def _load_sample(path: Path):
    if path not in _SAMPLES:
        sys.path.insert(0, str(path.parent))      # the sample imports its utils/ package
        try:
            spec = importlib.util.spec_from_file_location("nvidia_attention_fmha", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except Exception as exc:  # noqa: BLE001 -- not importable here: a note
            raise PeerMissing(f"nvidia-sample: import failed ({type(exc).__name__}: {exc})")
        finally:
            sys.path.remove(str(path.parent))
        _SAMPLES[path] = mod
    return _SAMPLES[path]


def _sample(fam, problem, sets) -> dict:
    import torch
    import cuda.tile as ct
    _dense_fwd(problem, "nvidia-sample")
    path = peers_dir() / "samples" / "AttentionFMHA.py"
    if not path.is_file():
        raise PeerMissing(f"nvidia-sample: {path} missing (python tools/peers_fetch.py)")
    mod = _load_sample(path)
    p = problem
    tm, tn = (64, 64) if p.D <= 64 else (128, 64)       # its own configs for these D
    outs = {id(x): torch.empty_like(x["q"]) for x in sets}
    grid = (math.ceil(p.Sq / tm), p.B * p.Hq, 1)

    def run(x):
        out = outs[id(x)]
        ct.launch(torch.cuda.current_stream(), grid, mod.fmha_kernel,
                  (x["q"], x["k"], x["v"], out, 1.0 / math.sqrt(p.D), 0, p.D, p.Hq, tm, tn,
                   p.Hq // p.Hkv, p.causal, p.Sk % tn == 0))
        return out
    return {"nvidia-sample": PeerCall(run=run)}


def _import_tilegym(module: str):
    """A TileGym module: installed, or from $TILEGYM_DIR/src, .peers/tilegym/src, .peers/
    (fetched) or the checkout's sibling ../shared/peers/tilegym/src (the copy this
    workplace's CI and benchmarks share; never copied into the repository)."""
    shared = peers_dir().parent.parent / "shared" / "peers" / "tilegym" / "src"
    env = os.environ.get("TILEGYM_DIR")
    for extra in (None, Path(env) / "src" if env else None, peers_dir() / "tilegym" / "src",
                  peers_dir(), shared):
        if extra is not None and str(extra) not in sys.path and extra.is_dir():
            sys.path.append(str(extra))
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            err = exc
        except Exception as exc:  # noqa: BLE001 -- a broken import is a note too
            raise PeerMissing(f"tilegym: import failed ({type(exc).__name__}: {exc})")
    raise PeerMissing(f"tilegym not importable ({err}); PYTHONPATH=.peers/tilegym/src")


def _tilegym(fam, problem, sets) -> dict:
    p = problem
    if fam.name == "fmha_fwd":
        _dense_fwd(p, "tilegym", top_left=False)      # its input_pos = Sk - Sq: bottom-right
        att = _import_tilegym("tilegym.ops.cutile.attention")
        return {"tilegym": PeerCall(run=lambda x: att.tile_fmha(
            x["q"], x["k"], x["v"], scaling=1.0 / math.sqrt(p.D), is_causal=p.causal))}
    if getattr(p, "varlen", False) or p.page or p.Sq != 1 or \
            tuple(p.seq_lens) != (p.Sk,) * p.B:           # ragged: lens None, shorter
        raise PeerMissing("tilegym: fmha_decode takes one query per sequence on a "
                          "contiguous full-length cache only")
    dec = _import_tilegym("tilegym.ops.cutile.flash_decode")
    # its layout is [B, H, S, D]: copies per set made here, never inside the timed call
    lay = {id(x): tuple(x[n].transpose(1, 2).contiguous() for n in ("q", "k_cache", "v_cache"))
           for x in sets}

    def run(x):
        q, k, v = lay[id(x)]
        return dec.fmha_decode(q, k, v, 1.0 / math.sqrt(p.D)).transpose(1, 2)
    return {"tilegym": PeerCall(run=run)}


def _flashinfer(fam, problem, sets) -> dict:
    try:
        fi = importlib.import_module("flashinfer")
    except ImportError as exc:
        raise PeerMissing(f"flashinfer not installed ({exc})")
    p = problem
    if p.B != 1 or getattr(p, "page", 0) or getattr(p, "mask", None):
        raise PeerMissing("flashinfer: single-request calls only (B 1, no page, no mask)")
    if fam.name == "fmha_fwd":                      # ours [B, H, S, D]; its [S, H, D]
        def run(x):
            return fi.single_prefill_with_kv_cache(
                x["q"][0].transpose(0, 1), x["k"][0].transpose(0, 1),
                x["v"][0].transpose(0, 1), causal=p.causal).transpose(0, 1)[None]
    elif p.Sq == 1:                                 # decode: ours [B, S, H, D]
        def run(x):
            return fi.single_decode_with_kv_cache(x["q"][0, 0], x["k_cache"][0],
                                                  x["v_cache"][0])[None, None]
    else:
        raise PeerMissing("flashinfer: decode with Sq > 1 not wired")
    return {"flashinfer": PeerCall(run=run)}


def _copy(fam, problem, sets) -> dict:
    import torch
    try:
        nbytes = int(fam.bytes_moved(problem))
    except NotImplementedError:
        raise PeerMissing(f"copy: family {fam.name} does not say its bytes moved")
    half = max(nbytes // 2, 1)
    dev = next(t for t in sets[0].values() if t is not None).device
    bufs = {id(x): (torch.empty(half, dtype=torch.uint8, device=dev),
                    torch.empty(half, dtype=torch.uint8, device=dev)) for x in sets}
    for src, _ in bufs.values():
        src.random_(0, 256)

    def run(x):
        src, dst = bufs[id(x)]
        return dst.copy_(src)
    return {"copy": PeerCall(run=run, checked=False)}


#: every peer plug-in, in the order rows list them
PLUGINS = [
    Plugin("sdpa", (), _sdpa, "PyTorch SDPA's backends (the family's peer_calls)"),
    Plugin("sdpa-math", ("fmha_fwd",), _sdpa_math, "SDPA's math backend", default=False),
    Plugin("nvidia-sample", ("fmha_fwd",), _sample, "NVIDIA's cuTile FMHA sample (.peers/)"),
    Plugin("tilegym", ("fmha_fwd", "fmha_decode"), _tilegym, "TileGym's cuTile ops"),
    Plugin("flashinfer", ("fmha_fwd", "fmha_decode"), _flashinfer, "FlashInfer, if installed"),
    Plugin("copy", ("fmha_decode",), _copy, "same-size device copy (bandwidth bound)"),
]


def names(fam=None) -> list[str]:
    """The plug-ins' names (those serving ``fam`` when given)."""
    return [p.name for p in PLUGINS if fam is None or not p.families or fam.name in p.families]


def gather(fam, problem, sets, wanted=None) -> tuple[dict, dict]:
    """({provider: PeerCall}, {plug-in name: why it is missing}) for one problem: every
    default plug-in serving the family (or those in ``wanted``). Nothing raised: a plug-in's
    PeerMissing, or any other failure building it, is a note."""
    calls, notes = {}, {}
    for plug in PLUGINS:
        if plug.name not in names(fam) or (plug.name not in wanted if wanted is not None
                                           else not plug.default):
            continue
        try:
            calls.update(plug.make(fam, problem, sets))
        except PeerMissing as exc:
            notes[plug.name] = str(exc)
        except Exception as exc:  # noqa: BLE001 -- a peer never ends the run
            notes[plug.name] = f"{plug.name}: {type(exc).__name__}: {str(exc)[:200]}"
    return calls, notes
