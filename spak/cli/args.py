"""Argument types and options shared by the commands: tiles, numeric models, the kernel
family, and --shapes checked against the family's grammar.

Cheap to import (no torch, cuTile or simulator), so `spak --help` works anywhere.
"""
from __future__ import annotations

import argparse
import re

from spak import families
from spak.core.errors import ShapeError

__all__ = ["TILE_RANGE", "parse_tiles", "model_arg", "shape_arg", "add_family_argument",
           "family_of", "check_shapes", "describe_sets", "shapes_epilog"]

#: gpu.plan's tile bounds (MIN_TILE, MAX_TILE), repeated so the CLI imports cheaply.
TILE_RANGE = (16, 256)


def parse_tiles(text: str) -> tuple[int, int]:
    """"64x128" -> (64, 128): TILE_M x TILE_N, each a power of two in [16, 256]."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not TILE_MxTILE_N, e.g. 64x64")
    tm, tn = int(m.group(1)), int(m.group(2))
    lo, hi = TILE_RANGE
    for name, t in (("TILE_M", tm), ("TILE_N", tn)):
        if t < 1 or t & (t - 1):
            raise argparse.ArgumentTypeError(f"{name} must be a power of two, got {t}")
        if not lo <= t <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be in [{lo}, {hi}], got {t}")
    return tm, tn


def model_arg(text: str) -> str:
    if not re.fullmatch(r"sm_\d+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a numeric model name such as sm_90")
    return text


def _check_items(fam, text: str) -> None:
    """Raise ShapeError for the first item of a --shapes value (comma lists allowed) that
    is neither one of the family's named sets nor a shape in its grammar."""
    for item in filter(None, (s.strip() for s in text.split(","))):
        fam.check_shape_item(item)


def shape_arg(text: str) -> str:
    """argparse type: one --shapes item checked against the default family at parse time
    (commands with --family check again against the chosen family: `check_shapes`)."""
    try:
        _check_items(families.get(), text)
    except ShapeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_family_argument(p: argparse.ArgumentParser) -> None:
    """--family NAME (default: the FMHA forward); the parser is kept for usage errors."""
    p.add_argument("--family", choices=families.names(), default=families.DEFAULT,
                   help=f"kernel family (default: {families.DEFAULT})")
    p.set_defaults(_parser=p)


def family_of(args: argparse.Namespace):
    return families.get(getattr(args, "family", None))


def check_shapes(args: argparse.Namespace) -> None:
    """After parsing: every --shapes item against the chosen family's grammar; a bad one is
    a usage error (exit 2) in argparse's own words. Called by `spak.cli.main`."""
    if getattr(args, "shapes", None) is None or getattr(args, "_parser", None) is None:
        return
    fam = family_of(args)
    for text in args.shapes:
        try:
            _check_items(fam, text)
        except ShapeError as e:
            args._parser.error(f"argument --shapes: {e}")


def describe_sets(fam=None) -> str:
    """E.g. "default (13), seed (4, dtype and causal open)" for --help."""
    fam = fam or families.get()
    parts = []
    for name, items in fam.shape_sets.items():
        fixed = [_fixed(t) for t in items]
        open_ = [a for a in ("dtype", "causal") if not all(a in f for f in fixed)]
        parts.append(f"{name} ({len(items)}" + (f", {' and '.join(open_)} open)" if open_ else ")"))
    return ", ".join(parts)


def _fixed(text: str) -> set:
    """Which of dtype / causal a shape string fixes with a qualifier."""
    quals = {q.strip().lower() for q in text.split("/")[1:]}
    out = set()
    if quals & {"fp16", "bf16"}:
        out.add("dtype")
    if quals & {"causal", "noncausal"}:
        out.add("causal")
    return out


def shapes_epilog(fam=None) -> str:
    """The grammar with the named sets, for a command's --help epilog: of `fam`, or (None)
    of every family, families that share a grammar and sets listed together."""
    if fam is not None:
        return fam.grammar_help().format(sets=describe_sets(fam))
    texts: dict[str, list[str]] = {}
    for name in families.names():
        f = families.get(name)
        texts.setdefault(f.grammar_help().format(sets=describe_sets(f)), []).append(name)
    if len(texts) == 1:
        return next(iter(texts))
    return "\n\n".join(f"--family {' / '.join(names)}:\n{text}" for text, names in texts.items())
