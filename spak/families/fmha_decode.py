"""Decode attention over a KV cache as a kernel family: split-KV with GQA packing, a
contiguous or paged cache and per-sequence lengths (gpu/kernels/decode.py,
gpu/plan_decode.py; PyTorch entry point spak.fmha_kvcache).

Problems are written in the FMHA grammar with the sequence part read as Sq:Sk, Sk being
the cache capacity, plus qualifiers for the cache:

    B x HEADS x SEQ x D [/QUAL ...]
    HEADS  H or Hq:Hkv
    SEQ    Sk (one query per sequence) or Sq:Sk
    QUAL   fp16 | bf16 | causal | noncausal | pageN (paged cache, N keys per page) |
           lens=L1:L2:... (keys per sequence, B of them, each <= Sk; default all Sk) |
           splits=N (key splits; default: chosen from the shape and the SM count) |
           qlens=Q1:Q2:... (a packed variable-length batch, prefill: sequence b has Qb
           queries, each <= Sq, against its lens[b] keys; the varlen kernel,
           spak.fmha_varlen; no cache, page or split qualifier) |
           ragged (lengths from Sk down to Sk/4, decode_models.ragged_lens) |
           model=NAME (the served model the row stands for; a label, no effect)

    1x32:8x1:4096x128             B=1, GQA 4:1, one query against 4096 cached keys
    2x8:1x4:77x64/causal/page16/lens=77:5    MQA, 4 queries, paged, ragged lengths
    3x8:2x40:60x64/causal/qlens=5:0:40/lens=7:3:60    varlen prefill, packed

Memory-bound: the metric is GB/s of bytes_moved (K and V read for every sequence's
length, plus Q and O).
"""
from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Optional

import numpy as np

from spak.attention.problems import check_sizes
from spak.core.errors import ShapeError
from spak.core.metrics import gate_for, round_to_bf16
from spak.families.base import KernelFamily
from spak.families.decode_models import (models_gate, models_pages, models_set,
                                         models_small, models_sweep)

__all__ = ["DecodeProblem", "FmhaDecode", "FAMILY", "parse_problem", "SHAPE_SETS",
           "GRAMMAR_HELP", "decode_attention_f64"]

DTYPES = ("fp16", "bf16")
MAX_HEAD_DIM = 256
_SHAPE_RE = re.compile(r"^(\d+)x(\d+)(?::(\d+))?x(\d+)(?::(\d+))?x(\d+)$")
_FIXED = {"fp16": ("dtype", "fp16"), "bf16": ("dtype", "bf16"),
          "causal": ("causal", True), "noncausal": ("causal", False)}

GRAMMAR_HELP = """\
shape grammar (fmha_decode):  B x HEADS x SEQ x D [/QUAL ...]
  HEADS  H or Hq:Hkv  (grouped-query attention; Hq a multiple of Hkv)
  SEQ    Sk or Sq:Sk  (Sq new queries per sequence, Sk the cache capacity; Sk alone: Sq=1)
  QUAL   fp16 | bf16 | causal | noncausal  (open ones follow --dtype/--causal; causal
         changes nothing at Sq = 1, so those cases run non-causal only)
         pageN           paged cache of N-key pages (N a power of two >= 16), shuffled table
         lens=L1:L2:...  keys per sequence (B values in [0, Sk]; default every one Sk)
         splits=N        key splits (default: from the shape and the SM count)
         qlens=Q1:Q2:... a packed varlen batch (prefill): Qb queries of sequence b
                         (B values in [0, Sq]) against lens keys; the varlen kernel
         ragged          lengths from Sk down to Sk/4 (sequence 0 full), without listing them
         model=NAME      the served model the shape stands for (a label in the rows)
  e.g.   1x32:8x4096x128   2x8:1x4:77x64/causal/page16/lens=77:5
         3x8:2x40:60x64/causal/qlens=5:0:40/lens=7:3:60
named sets: {sets}"""


@dataclasses.dataclass(frozen=True)
class DecodeProblem:
    """q [B, Sq, Hq, D]; cache capacity Sk keys of Hkv heads; lens keys per sequence."""
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    dtype: str = "fp16"
    causal: bool = False
    page: int = 0                              # 0: contiguous [B, Sk, Hkv, D]
    lens: Optional[tuple[int, ...]] = None     # None: every sequence holds Sk keys
    splits: Optional[int] = None               # None: gpu.plan_decode.choose_num_splits
    qlens: Optional[tuple[int, ...]] = None    # a packed varlen batch: queries per sequence
    ragged: bool = False                       # lens None: decode_models.ragged_lens
    model: Optional[str] = None                # the served model it stands for (a label)

    def __post_init__(self):
        check_sizes(self)
        if self.D > MAX_HEAD_DIM:
            raise ValueError(f"D must be <= {MAX_HEAD_DIM}, got {self.D}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be a bool, got {self.causal!r}")
        if self.page and (self.page < 16 or self.page & (self.page - 1)):
            raise ValueError(f"page must be 0 or a power of two >= 16, got {self.page}")
        if self.lens is not None and (len(self.lens) != self.B
                                      or not all(0 <= n <= self.Sk for n in self.lens)):
            raise ValueError(f"lens must hold B={self.B} values in [0, Sk={self.Sk}], "
                             f"got {self.lens}")
        if self.splits is not None and not 1 <= self.splits <= 256:
            raise ValueError(f"splits must be in [1, 256], got {self.splits}")
        if self.qlens is not None:
            if len(self.qlens) != self.B or not all(0 <= n <= self.Sq for n in self.qlens):
                raise ValueError(f"qlens must hold B={self.B} values in [0, Sq={self.Sq}], "
                                 f"got {self.qlens}")
            if self.page or self.splits is not None:
                raise ValueError("qlens (a packed varlen batch) takes no page or splits "
                                 "qualifier")

    @property
    def varlen(self) -> bool:
        return self.qlens is not None

    @property
    def seq_lens(self) -> tuple[int, ...]:
        if self.lens is not None:
            return self.lens
        if self.ragged:
            from spak.families.decode_models import ragged_lens
            return ragged_lens(self.B, self.Sk)
        return (self.Sk,) * self.B

    @property
    def label(self) -> str:
        h = f"{self.Hq}" if self.Hq == self.Hkv else f"{self.Hq}:{self.Hkv}"
        s = f"{self.Sk}" if self.Sq == 1 else f"{self.Sq}:{self.Sk}"
        return f"{self.B}x{h}x{s}x{self.D}"

    def _cache_quals(self) -> list[str]:
        q = [f"page{self.page}"] if self.page else []
        if self.qlens is not None:
            q.append("qlens=" + ":".join(map(str, self.qlens)))
        if self.lens is not None:
            q.append("lens=" + ":".join(map(str, self.lens)))
        elif self.ragged:
            q.append("ragged")
        if self.splits is not None:
            q.append(f"splits={self.splits}")
        if self.model:
            q.append(f"model={self.model}")
        return q

    @property
    def display(self) -> str:
        return "/".join([self.label, *self._cache_quals()])

    @property
    def case_id(self) -> str:
        return "/".join([self.label, self.dtype, "causal" if self.causal else "noncausal",
                         *self._cache_quals()])

    @property
    def mask(self):                 # the FMHA rows' field; decode problems have none
        return None


# ------------------------------------------------------------------------- grammar

def _parse(text: str) -> tuple[dict, dict]:
    """(fields, fixed dtype/causal) of one shape string; ShapeError says what is wrong."""
    shape, *quals = text.strip().lower().split("/")
    mt = _SHAPE_RE.match(shape)
    if not mt:
        raise ShapeError(f"{text!r} is not a decode shape: expected B x H x SEQ x D such as "
                         f"1x32:8x4096x128 or 2x8:1x4:77x64")
    B, hq, hkv, a, b, D = mt.groups()
    sq, sk = (int(a), int(b)) if b else (1, int(a))
    f = dict(B=int(B), Hq=int(hq), Hkv=int(hkv or hq), Sq=sq, Sk=sk, D=int(D))
    fixed: dict = {}
    for q in quals:
        _qualifier(text, q, f, fixed)
    try:
        DecodeProblem(**f)
    except ValueError as e:
        raise ShapeError(f"{text!r}: {e}") from None
    return f, fixed


def _qualifier(text, q, fields, fixed):
    if q in _FIXED:
        attr, val = _FIXED[q]
        if fixed.get(attr, val) != val:
            raise ShapeError(f"{text!r}: conflicting qualifiers for {attr}")
        fixed[attr] = val
    elif re.fullmatch(r"page\d+", q):
        fields["page"] = int(q[4:])
    elif re.fullmatch(r"lens=\d+(:\d+)*", q):
        fields["lens"] = tuple(int(n) for n in q[5:].split(":"))
    elif re.fullmatch(r"splits=\d+", q):
        fields["splits"] = int(q[7:])
    elif re.fullmatch(r"qlens=\d+(:\d+)*", q):
        fields["qlens"] = tuple(int(n) for n in q[6:].split(":"))
    elif q == "ragged":
        fields["ragged"] = True
    elif re.fullmatch(r"model=[a-z0-9][a-z0-9._-]*", q):
        fields["model"] = q[6:]
    else:
        raise ShapeError(f"{text!r}: unknown qualifier {q!r}; expected fp16, bf16, causal, "
                         f"noncausal, pageN, lens=L1:L2:..., splits=N, qlens=Q1:Q2:..., "
                         f"ragged, model=NAME")


def parse_problem(text: str) -> DecodeProblem:
    """One shape string -> DecodeProblem; open dtype/causal default to fp16, non-causal."""
    f, fixed = _parse(text)
    return DecodeProblem(**f, **fixed)


def _bench() -> list[str]:
    """Issue 18's grid on a GPU: B 1/8/64, Hq 32, Hkv 32/8/1, D 128, Sq 1/4, caches 1k-128k,
    contiguous and paged (16, 256); cases whose K+V exceed 8 GiB are left out."""
    out = []
    for b in (1, 8, 64):
        for hkv in (32, 8, 1):
            for sq in (1, 4):
                for sk in (1024, 8192, 32768, 131072):
                    if b * sk * hkv * 128 * 2 * 2 > 8 * 2**30:
                        continue
                    seq = f"{sk}" if sq == 1 else f"{sq}:{sk}"
                    for page in ("", "/page16", "/page256"):
                        out.append(f"{b}x32:{hkv}x{seq}x128/causal{page}")
    return out


SHAPE_SETS: dict[str, list[str]] = {
    # CI: every layout and odd case, tiny (each well under a second on the simulator)
    "default": [
        "2x8:2x100x64/lens=37:100/splits=2",                 # GQA 4:1, ragged, contiguous
        "2x8:1x4:77x64/causal/page16/lens=77:5/splits=3",    # MQA, Sq=4, 16-key pages
        "3x4x50x128/page64/lens=1:50:0/splits=2",            # MHA, lengths 1 and 0, mid-page
        "1x16:2x3:130x64/causal/splits=3",                   # GQA 8:1, Sq=3
        "2x12:2x90x64/page16/lens=90:33",                    # group of 6 (a padded tile)
        "2x14:2x3:70x64/causal/page16/lens=70:0/splits=3",   # group 7, Sq 3 (padded)
        "2x71:1x40x32/page16/lens=40:17/splits=2",           # Falcon-7B's 71: 2 tiles of 64
        # varlen prefill: runs of 0 and 1, more queries than keys, a run without keys
        "4x8:2x40:60x64/causal/qlens=5:0:1:40/lens=7:3:0:60",
    ],
    "gates": [
        "2x32:8x1000x128/lens=1000:517",
        "2x32:8x4:1000x128/causal/page16/lens=999:64",
        "1x32:4x600x128/page64/splits=5",
        "4x8:1x300x64/page16/lens=0:1:17:300",
        "2x16:16x2:257x64/causal/lens=2:257",
        "1x8:2x16:200x128/causal/splits=4",
        "1x28:4x333x80/lens=333",                             # group 7, D=80
        # pages of a key tile or more: the page ids looked up a tile ahead (PAGE_AHEAD
        # auto), a split ending mid-page, lengths 0 and 1, MQA in the rows form
        "3x32:8x700x64/page256/lens=700:1:0/splits=3",
        "2x32:1x600x64/page128/lens=600:257/splits=4",
    ],
    # the keys-in-M split kernel (KT_FORM 1, 2): MQA Sq 1 and 4 (32, 64 rows; 8 queries:
    # 2 query tiles), 16-key pages in one gathered tile, ragged lengths with 0 and 1
    "forms": [
        "2x32:1x300x64/page16/lens=300:1/splits=3",
        "3x32:1x4:200x64/causal/page16/lens=0:200:77/splits=2",
        "1x32:1x8:150x64/causal/splits=2",
        "2x16:2x4:140x128/causal/lens=140:9",
    ],
    # GQA groups no power of two divides (issue 33: padded head tiles, masked rows):
    # 5, 7, 12 and Falcon-7B's 71 (two tiles of 64), contiguous and paged, Sq 1 and 3,
    # ragged lengths with 0 and 1
    "groups": [
        "2x10:2x90x64/lens=90:1/splits=2",                  # group 5
        "2x14:2x3:70x64/causal/page16/lens=70:0/splits=3",  # group 7, Sq 3, pages
        "2x24:2x80x32/page64/lens=3:80",                    # group 12
        "1x12:1x3:50x32/causal/lens=50",                    # group 12, Sq 3: 64 rows
        "2x71:1x40x32/page16/lens=40:17/splits=2",          # 71: two tiles of 64 heads
        "1x71:1x3:30x32/causal/lens=30",                    # 71, Sq 3
        # issue 33h: the rows form's fitted TILE_N (gpu.plan_decode.fit_tile_n): Mixtral-
        # 8x22B's group 6 at Sq 4 over 16-key pages (32 rows, 64-key tiles of 4 pages, a
        # cache of FIT_MIN_KEYS or more); Falcon-7B's 71 at Sq 4, D 64, 64-key pages (64
        # rows, 128-key tiles: the fit lost on an H200)
        "2x12:2x4:2100x128/causal/page16/lens=2100:37/splits=2",
        "1x71:1x4:150x64/causal/page64/lens=150",
    ],
    "bench": _bench(),
    # served models' head configurations (spak/families/decode_models.py: the configs, how
    # the sample was chosen); "models-small" a quick subset of 14; "models-gate" one shape
    # of "models" per model (the gate's one-GPU slice); "models-pages" paged vs contiguous
    "models": models_set(),
    "models-small": models_small(),
    "models-sweep": models_sweep(),
    "models-gate": models_gate(),
    "models-pages": models_pages(),
    "varlen": [
        "4x8:2x40:60x64/causal/qlens=5:0:1:40/lens=7:3:0:60",
        "4x8:2x40:60x64/qlens=5:0:1:40/lens=7:3:0:60",
        "2x16:16x130:130x128/causal/qlens=130:17/lens=130:17",
        "3x4:1x20:9x80/causal/qlens=20:3:9/lens=9:3:9",        # Sq > Sk: dead rows
    ],
}


def _expand(items, dtypes, causals) -> list[DecodeProblem]:
    seen: dict = {}
    for text in items:
        for item in filter(None, (s.strip() for s in text.split(","))):
            if item.lower() in SHAPE_SETS:
                seen.update(dict.fromkeys(_expand(SHAPE_SETS[item.lower()], dtypes, causals)))
                continue
            f, fixed = _parse(item)
            # causal changes nothing with one query: an open flag runs non-causal only
            open_c = (False,) if f["Sq"] == 1 else causals
            for dt in ([fixed["dtype"]] if "dtype" in fixed else dtypes):
                for c in ([fixed["causal"]] if "causal" in fixed else open_c):
                    if dt in dtypes and c in causals:
                        seen[DecodeProblem(**f, dtype=dt, causal=c)] = None
    return list(seen)


# ------------------------------------------------------------------------- inputs

def make_inputs(p: DecodeProblem, seed: int = 0) -> dict:
    """N(0, 1) q and caches, reproducible from (seed, case_id). Cache rows past a
    sequence's length are NaN and block-table entries past its pages are -1: a kernel
    that reads either fails the NaN gate or the simulator's bounds check. A paged cache
    has one spare page and a shuffled table."""
    rng = np.random.default_rng([seed, zlib.crc32(p.case_id.encode())])

    def draw(shape):
        x = rng.standard_normal(shape, dtype=np.float32)
        return x.astype(np.float16) if p.dtype == "fp16" else round_to_bf16(x)

    lens = np.array(p.seq_lens, dtype=np.int32)
    if p.varlen:                   # packed [total, heads, D] and the runs' offsets
        cq = np.concatenate([[0], np.cumsum(p.qlens)]).astype(np.int32)
        ck = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        return {"q": draw((cq[-1], p.Hq, p.D)), "k": draw((ck[-1], p.Hkv, p.D)),
                "v": draw((ck[-1], p.Hkv, p.D)), "cu_seqlens_q": cq, "cu_seqlens_k": ck}
    q = draw((p.B, p.Sq, p.Hq, p.D))
    if not p.page:
        k, v = draw((p.B, p.Sk, p.Hkv, p.D)), draw((p.B, p.Sk, p.Hkv, p.D))
        for b, n in enumerate(lens):
            k[b, n:] = v[b, n:] = np.nan
        return {"q": q, "k_cache": k, "v_cache": v, "cache_seqlens": lens, "block_table": None}
    per_seq = -(-p.Sk // p.page)
    num_pages = p.B * per_seq + 1
    k, v = draw((num_pages, p.page, p.Hkv, p.D)), draw((num_pages, p.page, p.Hkv, p.D))
    table = rng.permutation(num_pages)[:p.B * per_seq].reshape(p.B, per_seq).astype(np.int32)
    used = np.zeros((num_pages, p.page), dtype=bool)
    for b, n in enumerate(lens):
        rows = np.arange(per_seq * p.page) < n
        used[table[b]] = rows.reshape(per_seq, p.page)
        table[b, -(-int(n) // p.page):] = -1
    k[~used] = v[~used] = np.nan
    return {"q": q, "k_cache": k, "v_cache": v, "cache_seqlens": lens, "block_table": table}


def decode_attention_f64(inputs: dict, causal: bool, scale=None) -> np.ndarray:
    if "cu_seqlens_q" in inputs:
        from spak.attention.kvcache_ref import varlen_attention_f64
        return varlen_attention_f64(inputs["q"], inputs["k"], inputs["v"],
                                    inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
                                    causal=causal, scale=scale)
    from spak.attention.kvcache_ref import decode_attention_f64 as ref
    return ref(inputs["q"], inputs["k_cache"], inputs["v_cache"], inputs["cache_seqlens"],
               inputs["block_table"], causal=causal, scale=scale)


# ------------------------------------------------------------------------- the family

class FmhaDecode(KernelFamily):
    name = "fmha_decode"
    title = "decode attention over a KV cache (split-KV, GQA packing, paged or contiguous)"
    #: the split kernel in its three forms (gpu.plan_decode.KT_FORMS): "splitkv" the plan's
    #: choice (tiles["KT_FORM"] or choose_kt_form), the others one form pinned;
    #: "splitkv_pow2" the plan's choice with the former GQA row tiling (tiles["GROUP_PAD"]
    #: 0: blocks of the largest power of two dividing the group), the baseline issue 33's
    #: padded tiles are timed against in one run (`spak run --kernel all`); "splitkv_prev"
    #: the plan's choice without issue 33h's two plan rules (tiles["INDEX32"] 0: a cache
    #: past 2^31 elements in one int64-indexed launch; tiles["TN_FIT"] 0: TILE_N as given,
    #: no fit_tile_n), the baseline those are timed against
    kernels = ("splitkv", "splitkv_keys", "splitkv_keys_vt", "splitkv_pow2", "splitkv_prev")
    outputs = ("out",)
    metric = "GB/s"
    space_keys = ("TILE_N", "MAX_ROWS", "num_splits", "occupancy")
    store_fields = ("dtype", "head_dim", "group", "seq_q", "paged")
    # every peer plug-in serving decode (spak.device.peers): `spak report` keeps their rows;
    # `spak run`'s table has a column for each of run_peers (FlashInfer, which would share
    # sdpa-flash's "flash" title, is on its provider line below each case)
    peers = ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "tilegym", "flashinfer", "copy")
    run_peers = ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "tilegym", "copy")
    entry_point = "spak.fmha_kvcache"
    shape_sets = SHAPE_SETS
    # the GPU sweep: tiles per (dtype, D, group, Sq, paged); the split count stays the
    # planner's rule (num_splits 0), since the store's key has no cache length
    sweep_plan = "plans/fmha_decode.toml"
    sweep_peers = ("sdpa-cudnn", "sdpa-flash")
    sweep_shapes = ("bench",)
    run_shapes = ("models-small",)

    def knob_keys(self) -> tuple[str, ...]:
        """KT_FORM (gpu.plan_decode.KT_FORMS: 0 rows, 1 keys, 2 keys_vt in the tensor
        cores' M), GROUP_PAD (1 padded GQA tiles, 0 the former power-of-two ones) and
        TN_FIT (1 the plan may lower TILE_N where sm_90 spills, 0 TILE_N as given),
        swept beside the tiles ([sweep.sm_90] knobs)."""
        return ("KT_FORM", "GROUP_PAD", "TN_FIT")

    def grammar_help(self) -> str:
        return GRAMMAR_HELP

    def parse(self, text: str) -> DecodeProblem:
        return parse_problem(text)

    def select(self, items, *, dtype="all", causal="both") -> list[DecodeProblem]:
        dts = {"all": DTYPES, "fp16": ("fp16",), "bf16": ("bf16",)}[dtype]
        cs = {"both": (False, True), "yes": (True,), "no": (False,)}[causal]
        return _expand(items, dts, cs)

    def make_inputs(self, problem, seed: int = 0) -> dict:
        return make_inputs(problem, seed)

    def reference(self, problem, inputs) -> dict:
        return {"out": decode_attention_f64(inputs, problem.causal)}

    def gate(self, problem, output: str = "out") -> float:
        return gate_for(problem.dtype)

    def plan(self, kernel, arrays, *, tiles=None, alloc=None, causal=False, scale=None,
             num_splits=None, num_sms=None):
        from spak.gpu.plan_decode import DEFAULT_SMS, plan_decode
        a = arrays
        return plan_decode(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["out"],
                           block_table=a.get("block_table"), causal=causal, scale=scale,
                           num_splits=num_splits, tiles=_tiles(tiles), alloc=alloc,
                           num_sms=num_sms or DEFAULT_SMS)

    def simulate(self, kernel, problem, inputs, *, tiles=None, model="sm_90"):
        if problem.varlen:
            from spak.cpu.simrun_decode import simulate_varlen
            t = None if tiles is None else (
                tiles if isinstance(tiles, dict) else {"TILE_M": tiles[0], "TILE_N": tiles[1]})
            out, reports = simulate_varlen(inputs, dtype=problem.dtype, causal=problem.causal,
                                           tiles=t, model=model)
            return {"out": out}, reports
        from spak.cpu.simrun_decode import simulate_decode
        out, reports = simulate_decode(inputs, dtype=problem.dtype, causal=problem.causal,
                                       num_splits=problem.splits,
                                       tiles=_form_tiles(kernel, _tiles(tiles)), model=model)
        return {"out": out}, reports

    def flops(self, problem) -> float:
        p = problem
        if p.varlen:
            return 4.0 * p.Hq * p.D * sum(a * b for a, b in zip(p.qlens, p.seq_lens))
        return 2.0 * p.Hq * p.Sq * 2 * p.D * sum(p.seq_lens)

    def bytes_moved(self, problem) -> float:
        p = problem
        esize = 2
        kv = sum(p.seq_lens) * p.Hkv * 2 * p.D * esize
        rows = sum(p.qlens) if p.varlen else p.B * p.Sq
        return float(kv + 2 * rows * p.Hq * p.D * esize)

    def default_config(self, problem, arch: str = "sm_90") -> dict:
        from spak.gpu.plan_decode import default_decode_tiles
        return default_decode_tiles(problem.D, arch)

    def store_key(self, problem) -> dict:
        p = problem
        return {"dtype": p.dtype, "head_dim": p.D, "group": p.Hq // p.Hkv, "seq_q": p.Sq,
                "paged": bool(p.page)}

    # the GPU loop (spak/device/decode_gpu.py)
    # varlen problems (qlens=) run spak.fmha_varlen's kernel under every kernel name of
    # the family (it has one form): packed inputs, the CPU float64 reference, the whole
    # problem simulated
    def gpu_inputs(self, problem, seed=0, set_index=0, device="cuda") -> dict:
        from spak.device import decode_gpu as g
        if problem.varlen:
            return g.varlen_gpu_inputs(problem, make_inputs(problem, seed * 1000 + set_index),
                                       device)
        return g.decode_gpu_inputs(problem, seed, set_index, device)

    def gpu_reference(self, problem, inputs) -> dict:
        from spak.device import decode_gpu as g
        if problem.varlen:              # float64 on the CPU, returned on the inputs' device
            import torch
            ref = decode_attention_f64(g.host_arrays(inputs), problem.causal)
            return {"out": torch.from_numpy(ref).to(inputs["q"].device)}
        return g.decode_reference(problem, inputs)

    def eager_call(self, kernel, problem, inputs):
        """spak.fmha_kvcache (spak.fmha_varlen for varlen problems) on one input set, as a
        user calls it (its own split and tile choice), for `spak run --timing eager`; the
        other kernel names keep timing their planned launches."""
        if kernel != self.kernels[0]:
            return None
        if problem.varlen:
            from spak.varlen import fmha_varlen
            cq, ck = inputs["cu_seqlens_q"], inputs["cu_seqlens_k"]
            mq, mk = (int((c[1:] - c[:-1]).max()) for c in (cq, ck))   # once, not timed
            return lambda: fmha_varlen(inputs["q"], inputs["k"], inputs["v"], cq, ck, mq, mk,
                                       is_causal=problem.causal)
        from spak.kvcache import fmha_kvcache
        return lambda: fmha_kvcache(inputs["q"], inputs["k_cache"], inputs["v_cache"],
                                    inputs["cache_seqlens"], block_table=inputs["block_table"],
                                    is_causal=problem.causal)

    def peer_reference(self, problem, inputs) -> dict:
        """The float64 reference on the inputs' device: what `spak sweep` checks every
        config against (SDPA has no paged or causal-with-Sq>1 form of this function,
        decode_peers). Without it the sweep worker had no reference and failed every
        job (H100, results/decode-h100-2026-11-24c, sweep)."""
        return self.gpu_reference(problem, inputs)

    def gpu_config(self, kernel, problem, device, tiles=None) -> dict:
        """The config with the kernel's pinned knobs (_KERNEL_FORMS) in it, so the row's
        tiles, the GPU call and the simulator's slice all see the same GROUP_PAD/KT_FORM."""
        if tiles is not None:                     # --tiles MxN: MAX_ROWS x TILE_N
            return _form_tiles(kernel, _tiles(tiles))
        return _form_tiles(kernel, super().gpu_config(kernel, problem, device))

    def workspace_bytes(self, kernel, problem) -> int:
        p = problem                               # partial (acc, m, l) per split, bound
        from spak.gpu.plan_decode import MAX_SPLITS
        return MAX_SPLITS * p.B * p.Sq * p.Hq * (p.D + 2) * 4

    def gpu_call(self, kernel, problem, inputs, config, *, alloc=None):
        from spak.device.decode_gpu import decode_call, varlen_call
        if problem.varlen:
            return varlen_call(problem, inputs, config)
        return decode_call(problem, inputs, _form_tiles(kernel, dict(config)), alloc=alloc)

    def peer_calls(self, problem, inputs, names=None) -> dict:
        from spak.device.decode_gpu import decode_peers
        return decode_peers(problem, names)

    def sim_slice(self, kernel, problem, inputs, outputs, config, *, heads=1, work=1 << 29):
        from spak.device.decode_gpu import decode_sim_slice, split_count, varlen_sim_slice
        if problem.varlen:
            return varlen_sim_slice(problem, inputs, outputs["out"])
        # the kernel's pinned knobs, as gpu_call applies them: without them the slice of
        # splitkv_pow2 counted splits and head tiles with GROUP_PAD 1 while the GPU ran
        # GROUP_PAD 0 (H200 2026-11-28: 1 split on the GPU, 8 in the slice for a group
        # of 7; 50-68% bit-identical)
        config = _form_tiles(kernel, dict(config))
        return decode_sim_slice(problem, inputs, outputs["out"], config,
                                splits=split_count(problem, inputs, config), work=work)

    # ------------------------------------------------- the sweep's compile units
    def compile_unit(self, kernel, problem, config, config_id):
        """One unit per (kernel, config, case): the split kernel specialises on the group,
        head dim, Sq, page size, split count and tiles, so few jobs could share a cubin.
        Built on the CPU from stand-ins (stand_in_launches) or, handed back, by a GPU helper
        launching the real problem once (compile_call). None for varlen problems (the varlen
        kernel has one form: its worker compiles it)."""
        if problem.varlen:
            return None
        return {"unit_id": f"decode|{kernel}|{config_id}|{problem.case_id}", "kernel": kernel,
                "config_id": config_id, "config": dict(config), "case": problem.case_id,
                "dtype": problem.dtype}

    def stand_in_launches(self, unit, arch):
        """decode_call's launches for the unit's problem on stand-ins shaped as
        spak.device.decode_gpu.decode_gpu_inputs allocates (q [B, Sq, Hq, D]; caches
        [B, Sk, Hkv, D], or [B * pages + 1, page, Hkv, D] with an int32 [B, pages] table;
        int32 lengths; the output [B, Sq, Hq, D]); the split count's SM count is the arch's
        usual part (132 on sm_90, 48 on sm_120): another part only costs the worker a compile."""
        from spak.device.decode_gpu import decode_launches
        from spak.gpu.launch_sig import LaunchArray as A
        p = self.parse(unit["case"])
        if p.varlen:
            return None
        dt = {"fp16": "float16", "bf16": "bfloat16"}[p.dtype]
        if p.page:
            per = -(-p.Sk // p.page)
            k, v = (A((p.B * per + 1, p.page, p.Hkv, p.D), dt) for _ in range(2))
            table = A((p.B, per), "int32")
        else:
            k, v = (A((p.B, p.Sk, p.Hkv, p.D), dt) for _ in range(2))
            table = None
        arrays = {"q": A((p.B, p.Sq, p.Hq, p.D), dt), "k_cache": k, "v_cache": v,
                  "cache_seqlens": A((p.B,), "int32"), "block_table": table,
                  "out": A((p.B, p.Sq, p.Hq, p.D), dt)}
        config = _form_tiles(unit["kernel"], dict(unit["config"] or {}))
        return decode_launches(p, arrays, config, _ARCH_SMS.get(arch, 132),
                               lambda shape, kind: A(tuple(shape), "float32"
                                                     if kind == "float32" else dt))

    def compile_call(self, unit, device="cuda"):
        """The unit's real problem launched once (a GPU compile helper: what the CPU helper
        handed back): its cubins land in cuTile's disk cache."""
        from spak.device.decode_gpu import decode_call, decode_gpu_inputs
        p = self.parse(unit["case"])
        return decode_call(p, decode_gpu_inputs(p, device=device),
                           _form_tiles(unit["kernel"], dict(unit["config"] or {})))

    def compile_variant(self, item) -> dict:
        """Every kernel of the family for (arch, dtype, head_dim, causal): split and combine
        on a contiguous cache (GQA 4:1, decode: whole head tiles) and on a 16-key paged one
        (a group of 7 over one kv head, 4 queries: a padded head tile of 8, several pages a
        tile), the varlen kernel, and the one-split kernel (a short cache's plan). One
        result, its kernels listed."""
        from spak.gpu.compile_decode import compile_decode_variant
        common = dict(arch=item["arch"], dtype=item["dtype"], head_dim=item["head_dim"],
                      causal=item["causal"],
                      tiles=_form_tiles(item.get("kernel"), _tiles(item.get("tiles"))),
                      hints=item.get("hints"))
        parts = [compile_decode_variant(**common),
                 compile_decode_variant(**common, page=16, seq_q=4, heads=(7, 1)),
                 compile_decode_variant(**{**common, "tiles": None}, kernel="varlen"),
                 compile_decode_variant(**common, splits=1)]      # the one-split kernel
        bad = [r["error"] for r in parts if not r["ok"]]
        return {"ok": not bad, "error": bad[0] if bad else None,
                "seconds": sum(r["seconds"] for r in parts),
                "cubin_bytes": sum(r["cubin_bytes"] for r in parts),
                "kernels": [dict(k, name=f"{k['name']}{sfx}") for r, sfx in
                            zip(parts, ("", "/page16", "", "/one")) for k in r["kernels"]],
                "tiles": parts[0]["tiles"] or {}}


#: SMs of the usual part of an arch (H100 SXM / H200: 132; RTX 5070: 48), for the split
#: count a CPU compile helper plans with (gpu.plan_decode.auto_splits reads it)
_ARCH_SMS = {"sm_90": 132, "sm_120": 48}

#: kernel name -> the tiles knobs it pins (gpu.plan_decode: KT_FORMS, GROUP_PAD)
_KERNEL_FORMS = {"splitkv_keys": {"KT_FORM": 1}, "splitkv_keys_vt": {"KT_FORM": 2},
                 "splitkv_pow2": {"GROUP_PAD": 0},
                 "splitkv_prev": {"INDEX32": 0, "TN_FIT": 0}}


def _form_tiles(kernel, tiles):
    """tiles with the kernel's pinned knobs (none for "splitkv": the plan's choice)."""
    if kernel not in _KERNEL_FORMS:
        return tiles
    return {**(tiles or {}), **_KERNEL_FORMS[kernel]}


def _tiles(tiles):
    """A decode tiles dict; `spak sim --tiles MxN` gives (M, N): M the most rows per
    block (MAX_ROWS), N the keys per step (TILE_N)."""
    if tiles is None or isinstance(tiles, dict):
        return tiles
    m, n = tiles
    return {"MAX_ROWS": m, "TILE_N": n}


FAMILY = FmhaDecode()
