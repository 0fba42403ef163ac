"""Problem specs: which attention problems to run, named sets of them, and inputs.

A `ProblemSpec` is one attention problem: shapes, dtype, causal flag, mask
kind. Specs are written as short strings in one grammar, used on the command
line and in the named sets alike:

    CASE  := SHAPE ("/" QUAL)*
    SHAPE := B "x" HEADS "x" SEQ "x" D
    HEADS := H | Hq ":" Hkv      Hq query heads, Hkv key/value heads (GQA); H means Hq = Hkv
    SEQ   := S | Sq ":" Sk       Sq queries, Sk keys; S means Sq = Sk
    QUAL  := fp16 | bf16 | causal | noncausal | mask | boolmask

    1x8x128x64                 B=1, 8 heads, S=128, D=64
    2x8:2x100:300x64           GQA 4:1, 100 queries against 300 keys
    1x4x17x128/causal/bf16     qualifiers fix the dtype and causal flag
    1x4x100x64/mask            with an additive mask (some -inf, one fully masked row)

A qualifier fixes an attribute; an attribute left open is expanded over the
values the caller selects (`spak sim --dtype/--causal`). A named set
(`SHAPE_SETS`) is a list of such strings, so `--dtype bf16` runs the bf16
cases of a set, and runs a set whose dtypes are left open in bf16.

`make_inputs(spec, seed)` draws fresh N(0, 1) inputs, seeded per case so one
case's inputs are the same whether it runs alone or in a set.
"""
from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Iterable, NamedTuple

import numpy as np

from spak.core.errors import ShapeError
from spak.core.metrics import round_to_bf16

__all__ = [
    "DTYPES", "MASK_KINDS", "ProblemSpec", "Inputs", "SHAPE_SETS", "ShapeError",
    "parse_case", "parse_spec", "expand", "select_cases", "make_inputs",
    "GRAMMAR_HELP", "TRAIN_MODELS", "train_model",
]

DTYPES = ("fp16", "bf16")
MASK_KINDS = (None, "additive", "bool")
_QUALS = {"fp16": ("dtype", "fp16"), "bf16": ("dtype", "bf16"),
          "causal": ("causal", True), "noncausal": ("causal", False),
          "mask": ("mask", "additive"), "boolmask": ("mask", "bool")}
_SHAPE_RE = re.compile(r"^(\d+)x(\d+)(?::(\d+))?x(\d+)(?::(\d+))?x(\d+)$")

GRAMMAR_HELP = """\
shape grammar:  B x HEADS x SEQ x D [/QUAL ...]
  HEADS  H or Hq:Hkv  (grouped-query attention; Hq a multiple of Hkv)
  SEQ    S or Sq:Sk   (Sq queries placed at the end of Sk keys for causal)
  QUAL   fp16 | bf16 | causal | noncausal | mask | boolmask
         (fixes that attribute; open attributes follow --dtype/--causal)
  e.g.   1x8x128x64   2x8:2x100:300x64   1x4x17x128/causal/bf16   1x4x100x64/mask
named sets: {sets}"""


#: The largest head dim the kernels take (gpu.plan.MAX_HEAD_DIM).
MAX_HEAD_DIM = 256


def check_sizes(p) -> None:
    """The sizes every attention problem shares: B, Hq, Hkv, Sq, Sk, D positive integers,
    Hq a multiple of Hkv (ProblemSpec and the decode family's DecodeProblem)."""
    for f in ("B", "Hq", "Hkv", "Sq", "Sk", "D"):
        val = getattr(p, f)
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"{f} must be a positive integer, got {val!r}")
    if p.Hq % p.Hkv:
        raise ValueError(f"Hq ({p.Hq}) must be a multiple of Hkv ({p.Hkv})")


@dataclasses.dataclass(frozen=True)
class ProblemSpec:
    """One attention problem. Q [B,Hq,Sq,D]; K, V [B,Hkv,Sk,D]; mask broadcast to [B,Hq,Sq,Sk]."""

    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    dtype: str = "fp16"
    causal: bool = False
    mask: str | None = None  # None, "additive" (float, may hold -inf) or "bool" (True = attend)

    def __post_init__(self):
        check_sizes(self)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.mask not in MASK_KINDS:
            raise ValueError(f"mask must be one of {MASK_KINDS}, got {self.mask!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be a bool, got {self.causal!r}")

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 = plain multi-head attention)."""
        return self.Hq // self.Hkv

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.Hq, self.Sq, self.D)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.Hkv, self.Sk, self.D)

    @property
    def label(self) -> str:
        """The shape in the grammar, without qualifiers: e.g. "2x8:2x100:300x64"."""
        h = f"{self.Hq}" if self.Hq == self.Hkv else f"{self.Hq}:{self.Hkv}"
        s = f"{self.Sq}" if self.Sq == self.Sk else f"{self.Sq}:{self.Sk}"
        return f"{self.B}x{h}x{s}x{self.D}"

    @property
    def display(self) -> str:
        """Label for tables: the shape, plus "+mask"/"+boolmask" when masked."""
        return self.label + {None: "", "additive": "+mask", "bool": "+boolmask"}[self.mask]

    @property
    def case_id(self) -> str:
        """The full spec in the grammar; `parse_spec(s.case_id) == s`."""
        quals = [self.dtype, "causal" if self.causal else "noncausal"]
        quals += {None: [], "additive": ["mask"], "bool": ["boolmask"]}[self.mask]
        return "/".join([self.label, *quals])

    @property
    def flops(self) -> float:
        """Forward FLOPs, 4*B*Hq*Sq*Sk*D (two matmuls).

        Causal with Sq == Sk is halved, the convention of FlashAttention and
        issue 3's TFLOPS; causal with Sq != Sk counts the allowed pairs exactly.
        """
        full = 4.0 * self.B * self.Hq * self.Sq * self.Sk * self.D
        if not self.causal:
            return full
        if self.Sq == self.Sk:
            return full / 2
        off = self.Sk - self.Sq  # query i sees keys 0 .. i+off, clipped to [0, Sk]
        i = np.arange(self.Sq)
        pairs = float(np.clip(i + off + 1, 0, self.Sk).sum())
        return 4.0 * self.B * self.Hq * pairs * self.D

    def replace(self, **changes) -> "ProblemSpec":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------- named sets

def _standard() -> list[str]:
    """Issue 3's 24 standard shapes: B*S = 16384 tokens, Hq*D = 2048 hidden."""
    out = []
    for D in (64, 128):
        for S in (512, 1024, 2048, 4096, 8192, 16384):
            for c in ("noncausal", "causal"):
                out.append(f"{16384 // S}x{2048 // D}x{S}x{D}/{c}")
    return out


def _gates() -> list[str]:
    """Issue 2's full gate matrix: every base shape x D 64/128 x causal x dtype."""
    base = ["1x2x1", "1x2x17", "1x2x100", "1x2x1000", "2x4x128",   # S = 1, 17, 100, 1000, 128
            "1x8:2x100",                                           # GQA 4:1
            "1x4:1x17:1000", "1x4:1x1:1000",                       # Sq < Sk, decode
            "1x4x300:100",                                         # Sq > Sk: rows with no key
            "2x4:2x100:300"]                                       # masked, below
    out = []
    for D in (64, 128):
        for i, b in enumerate(base):
            mask = "/mask" if i == len(base) - 1 else ""
            for c in ("noncausal", "causal"):
                for dt in DTYPES:
                    out.append(f"{b}x{D}/{c}/{dt}{mask}")
    return out


#: The attention heads of widely trained models, from their published configs
#: (config.json: num_attention_heads, num_key_value_heads, head_dim or hidden/heads):
#: name -> (Hq, Hkv, D, causal). Mistral 7B has Llama-3 8B's heads (32:8, D 128).
TRAIN_MODELS = {
    "Llama-3 8B": (32, 8, 128, True),      # GQA 4:1
    "Mistral 7B": (32, 8, 128, True),      # GQA 4:1 (sliding window not modelled)
    "Llama-3 70B": (64, 8, 128, True),     # GQA 8:1
    "Qwen2.5 7B": (28, 4, 128, True),      # GQA 7:1
    "Gemma-2 9B": (16, 8, 256, True),      # GQA 2:1, D 256
    "Gemma-2 2B": (8, 4, 256, True),       # GQA 2:1, D 256
    "Phi-3 mini": (32, 32, 96, True),      # MHA, D 96 (tiles of 128 wide)
    "GPT-2": (12, 12, 64, True),           # MHA, D 64 (GPT-2 small)
    "BERT-base": (12, 12, 64, False),      # MHA, D 64, bidirectional
}

#: (model, B, S) rows of the `train` set. Tokens per batch (B * S) per GPU are what
#: training runs fit beside the model's weights and activations on one 80 GB GPU:
#: 16k for the 7-9B models and the small ones, 8k for Llama-3 70B's full 64 heads
#: (per tensor-parallel rank it has fewer), 8k for Gemma-2 9B's D 256. Lengths off the
#: tile grid (1000, 4000, 8191) sit beside aligned ones.
_TRAIN_ROWS = (
    ("Llama-3 8B", 16, 1024), ("Llama-3 8B", 16, 1000), ("Llama-3 8B", 8, 2048),
    ("Llama-3 8B", 4, 4096), ("Llama-3 8B", 2, 8192), ("Llama-3 8B", 2, 8191),
    ("Llama-3 8B", 1, 16384), ("Llama-3 8B", 1, 32768),
    ("Mistral 7B", 4, 4000),
    ("Llama-3 70B", 2, 4096), ("Llama-3 70B", 1, 8192),
    ("Qwen2.5 7B", 4, 4096), ("Qwen2.5 7B", 1, 32768),
    ("Gemma-2 9B", 2, 4096), ("Gemma-2 9B", 8, 1000),
    ("Gemma-2 2B", 4, 4096),
    ("Phi-3 mini", 4, 4096), ("Phi-3 mini", 8, 2048), ("Phi-3 mini", 4, 4000),
    ("GPT-2", 16, 1024), ("GPT-2", 16, 1000),
    ("BERT-base", 32, 512),
)


def _train() -> list[str]:
    """Issue 35's training shapes: `_TRAIN_ROWS` with the models' heads (`TRAIN_MODELS`);
    the dtype is left open (fp16 and bf16)."""
    out = []
    for model, b, s in _TRAIN_ROWS:
        hq, hkv, d, causal = TRAIN_MODELS[model]
        heads = f"{hq}" if hq == hkv else f"{hq}:{hkv}"
        out.append(f"{b}x{heads}x{s}x{d}/{'causal' if causal else 'noncausal'}")
    return out


def train_model(spec) -> str:
    """The model(s) of the `train` set a problem's heads belong to ("" if none), e.g.
    "Llama-3 8B / Mistral 7B" for 32:8 at D 128: what the train set's rows are named by."""
    return " / ".join(m for m, (hq, hkv, d, c) in TRAIN_MODELS.items()
                      if (spec.Hq, spec.Hkv, spec.D, spec.causal) == (hq, hkv, d, c))


SHAPE_SETS: dict[str, list[str]] = {
    # Small enough for `spak sim` in well under a minute on 2 cores, yet it
    # touches every feature the gates cover (tests/test_cli.py checks that).
    "default": [
        "1x2x1x64/noncausal/fp16",          # S = 1
        "1x4:1x1:300x128/causal/bf16",      # decode: one query, GQA 4:1
        "2x2x17x64/causal/bf16",            # S = 17
        "1x2x17x128/noncausal/fp16",
        "1x4x100x128/noncausal/bf16",       # S = 100
        "1x4:1x100:300x64/causal/fp16",     # GQA 4:1, Sq < Sk
        "1x4x300:100x64/causal/fp16",       # Sq > Sk: the first 200 rows see no key
        "1x2x1000x64/noncausal/fp16",       # S = 1000
        "1x2x1000x128/causal/bf16",
        "1x8:2x256x128/noncausal/fp16",     # GQA 4:1, tile multiple
        "1x2x128x64/causal/fp16",           # tile multiple
        "2x4:2x77:130x64/noncausal/fp16/mask",  # additive mask with -inf, a dead row
        "1x2x200x128/causal/bf16/mask",
    ],
    "gates": _gates(),
    "standard": _standard(),
    "seed": ["16x16x2048x64", "2x8x512x64", "1x8x512x64", "4x16x2048x128"],
    "train": _train(),
}


# ------------------------------------------------------------------ grammar

def parse_case(text: str) -> tuple[dict, dict]:
    """Parse one CASE string into (shape fields, fixed qualifiers).

    Raises ShapeError saying what is wrong and what was expected.
    """
    t = text.strip().lower()
    shape, *quals = t.split("/")
    mt = _SHAPE_RE.match(shape)
    if not mt:
        raise ShapeError(f"{text!r} is not a shape: expected B x H x S x D such as "
                         f"1x8x128x64 or 2x8:2x100:300x64")
    B, hq, hkv, sq, sk, D = mt.groups()
    dims = dict(B=int(B), Hq=int(hq), Hkv=int(hkv or hq), Sq=int(sq), Sk=int(sk or sq), D=int(D))
    for f, val in dims.items():
        if val < 1:
            raise ShapeError(f"{text!r}: {f} must be >= 1, got {val}")
    if dims["D"] > MAX_HEAD_DIM:
        raise ShapeError(f"{text!r}: D must be <= {MAX_HEAD_DIM} (the kernels' largest "
                         f"head dim), got {dims['D']}")
    if dims["Hq"] % dims["Hkv"]:
        raise ShapeError(f"{text!r}: query heads {dims['Hq']} must be a multiple of "
                         f"key/value heads {dims['Hkv']}")
    fixed: dict = {}
    for q in quals:
        if q not in _QUALS:
            raise ShapeError(f"{text!r}: unknown qualifier {q!r}; expected one of "
                             f"{', '.join(_QUALS)}")
        attr, val = _QUALS[q]
        if attr in fixed and fixed[attr] != val:
            raise ShapeError(f"{text!r}: conflicting qualifiers for {attr}")
        fixed[attr] = val
    return dims, fixed


def parse_spec(text: str) -> ProblemSpec:
    """One CASE string -> ProblemSpec; open attributes default to fp16, non-causal, no mask."""
    dims, fixed = parse_case(text)
    return ProblemSpec(**dims, **fixed)


def expand(texts: Iterable[str], dtypes: Iterable[str] = DTYPES,
           causals: Iterable[bool] = (False, True)) -> list[ProblemSpec]:
    """CASE strings and set names -> specs, in order, without duplicates.

    An open dtype/causal is expanded over `dtypes`/`causals`; a fixed one is
    kept only if it is among them. A text may hold several items split by
    commas. Raises ShapeError for an unknown set name or a malformed shape.
    """
    dtypes, causals = tuple(dtypes), tuple(causals)
    seen: dict[ProblemSpec, None] = {}
    for text in texts:
        for item in filter(None, (s.strip() for s in text.split(","))):
            if item.lower() in SHAPE_SETS:
                seen.update(dict.fromkeys(expand(SHAPE_SETS[item.lower()], dtypes, causals)))
                continue
            if not _SHAPE_RE.match(item.lower().split("/")[0]) and "x" not in item.lower():
                raise ShapeError(f"{item!r} is neither a shape set ({', '.join(SHAPE_SETS)}) "
                                 f"nor a shape such as 1x8x128x64")
            dims, fixed = parse_case(item)
            for dt in ([fixed["dtype"]] if "dtype" in fixed else dtypes):
                for c in ([fixed["causal"]] if "causal" in fixed else causals):
                    if dt in dtypes and c in causals:
                        seen[ProblemSpec(**dims, dtype=dt, causal=c, mask=fixed.get("mask"))] = None
    return list(seen)


def select_cases(items: Iterable[str], *, dtype: str = "all", causal: str = "both") -> list[ProblemSpec]:
    """The CLI's selection: `dtype` in fp16/bf16/all, `causal` in yes/no/both."""
    dts = {"all": DTYPES, "fp16": ("fp16",), "bf16": ("bf16",)}[dtype]
    cs = {"both": (False, True), "yes": (True,), "no": (False,)}[causal]
    return expand(items, dts, cs)


# ------------------------------------------------------------------- inputs

class Inputs(NamedTuple):
    """q, k, v (float16, or float32 holding bf16 values) and the mask (or None)."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray | None


def _rng(spec: ProblemSpec, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(spec.case_id.encode())])


def make_inputs(spec: ProblemSpec, seed: int = 0, *, fully_masked_row: bool = True,
                mask_shape: tuple[int, ...] | None = None) -> Inputs:
    """Fresh N(0, 1) inputs for `spec`, reproducible from (seed, spec).

    fp16 inputs are numpy float16; bf16 inputs are float32 arrays holding bf16
    values (rounded to nearest even), since numpy has no bf16. A mask, when the
    spec has one, defaults to shape [B, 1, Sq, Sk] (broadcast over heads):
    additive masks are float32 N(0, 1) biases with ~20% -inf entries, bool
    masks are True (attend) with ~20% False; with `fully_masked_row`, query
    row Sq // 2 of batch 0 is masked entirely, whose output must be zero.
    """
    rng = _rng(spec, seed)

    def draw(shape):
        x = rng.standard_normal(shape, dtype=np.float32)
        return x.astype(np.float16) if spec.dtype == "fp16" else round_to_bf16(x)

    q, k, v = draw(spec.q_shape), draw(spec.kv_shape), draw(spec.kv_shape)
    mask = None
    if spec.mask is not None:
        shape = mask_shape or (spec.B, 1, spec.Sq, spec.Sk)
        np.broadcast_shapes(shape, (spec.B, spec.Hq, spec.Sq, spec.Sk))  # raises if it can't
        keep = rng.random(shape) >= 0.2
        if fully_masked_row:
            keep[(0,) * (len(shape) - 2) + (min(spec.Sq // 2, shape[-2] - 1),)] = False
        if spec.mask == "bool":
            mask = keep
        else:
            mask = np.where(keep, rng.standard_normal(shape, dtype=np.float32),
                            np.float32(-np.inf)).astype(np.float32)
    return Inputs(q, k, v, mask)
