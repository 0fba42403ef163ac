"""A typed, read-only view of one results row: a JSON line written by `spak run` or
`spak sweep`.

Rows are plain dicts on disk and stay so (every committed results file keeps reading).
`ResultRow` wraps one and names its fields, with the defaults old rows need: a row
without a "family" field is the FMHA forward's; a row of `spak sweep` carries the schema
"spak.sweep/1" (files written before kernel families) or "spak.sweep/2";
a field that is absent reads as None. It is also a read-only mapping (``row["tflops"]``)
for code that wants the raw fields.

    from spak.results.rows import ResultRow
    row = ResultRow(d)
    if row.is_spak and row.ok:
        print(row.family, row.case, row.measure("TFLOPS"))
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional

__all__ = ["ResultRow", "SWEEP_SCHEMAS", "RUN_SCHEMAS", "METRIC_FIELDS", "metric_field",
           "tiles_label"]

#: schema prefixes of `spak sweep` rows: before and after the package split
SWEEP_SCHEMAS = ("spak.sweep/",)
RUN_SCHEMAS = ("spak.run/",)
#: a family's metric (KernelFamily.metric) -> the row field that holds it
METRIC_FIELDS = {"TFLOPS": "tflops", "GB/s": "gbps"}
DEFAULT_FAMILY = "fmha_fwd"       # spak.families.DEFAULT, repeated: rows import nothing


def metric_field(metric: str) -> str:
    """The row field holding a family's metric: "TFLOPS" -> "tflops", "GB/s" -> "gbps"."""
    try:
        return METRIC_FIELDS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRIC_FIELDS)}") \
            from None


def tiles_label(tiles) -> str:
    """How rows and reports name tile sizes: {"TILE_M": 64, "TILE_N": 128} -> "64x128"
    (the values in the mapping's order)."""
    return "x".join(str(v) for v in dict(tiles).values())


def _int(v) -> Optional[int]:
    return None if v is None or isinstance(v, bool) else int(v)


class ResultRow(Mapping):
    """One results row, read-only, with named fields (absent fields read as None)."""

    __slots__ = ("data",)

    def __init__(self, data: Mapping):
        self.data = data

    # the mapping: the raw fields
    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"ResultRow({dict(self.data)!r})"

    # where the row comes from
    @property
    def schema(self) -> str:
        return str(self.data.get("schema") or "")

    @property
    def command(self) -> Optional[str]:
        """"sweep" or "run": which command wrote the row (None: neither)."""
        if self.schema.startswith(SWEEP_SCHEMAS):
            return "sweep"
        if self.schema.startswith(RUN_SCHEMAS):
            return "run"
        return None

    @property
    def line_kind(self) -> str:
        """A sweep file's line kind: "start", "result" or "end" (rows without one: "result")."""
        return str(self.data.get("kind", "result"))

    @property
    def family(self) -> str:
        return self.data.get("family") or DEFAULT_FAMILY

    @property
    def gpu(self) -> Optional[str]:
        return self.data.get("gpu")

    @property
    def arch(self) -> Optional[str]:
        return self.data.get("arch")

    @property
    def commit(self) -> Optional[str]:
        return self.data.get("commit")

    @property
    def date(self) -> str:
        return str(self.data.get("date") or "")

    @property
    def sweep_id(self) -> Optional[str]:
        return self.data.get("sweep_id")

    @property
    def source(self) -> Optional[str]:
        """The results file the row was read from (set by readers that record it)."""
        return self.data.get("_source")

    # what was measured
    @property
    def provider(self) -> str:
        return str(self.data.get("provider") or "")

    @property
    def is_spak(self) -> bool:
        """A SPAK kernel (provider "spak-<kernel>" or "spak-<kernel>-default"), not a peer."""
        return self.provider.startswith("spak-")

    @property
    def is_default_config(self) -> bool:
        """The sweep's row for the kernel's default config ("spak-<kernel>-default")."""
        return self.is_spak and self.provider.endswith("-default")

    @property
    def kernel(self) -> Optional[str]:
        return self.data.get("kernel")

    @property
    def case(self) -> Optional[str]:
        return self.data.get("case")

    @property
    def shape(self) -> str:
        """The shape as tables show it (the case when the row has no "shape")."""
        return self.data.get("shape", self.case)

    @property
    def dtype(self) -> Optional[str]:
        return self.data.get("dtype")

    @property
    def causal(self) -> bool:
        return bool(self.data.get("causal"))

    @property
    def D(self) -> Optional[int]:
        return _int(self.data.get("D"))

    @property
    def Sq(self) -> Optional[int]:
        return _int(self.data.get("Sq"))

    @property
    def Sk(self) -> Optional[int]:
        return _int(self.data.get("Sk"))

    @property
    def B(self) -> Optional[int]:
        return _int(self.data.get("B"))

    @property
    def config(self) -> dict:
        """The tile config (TILE_M, TILE_N, hints, knobs; {} when the row has none)."""
        return dict(self.data.get("config") or {})

    @property
    def config_id(self) -> str:
        return str(self.data.get("config_id") or "-")

    @property
    def tiles(self) -> dict:
        """`spak run`'s tiles ({} when the row has none)."""
        return dict(self.data.get("tiles") or {})

    # the verdict
    @property
    def status(self) -> Optional[str]:
        return self.data.get("status")

    @property
    def error(self) -> Optional[str]:
        return self.data.get("error")

    @property
    def skipped(self) -> bool:
        return bool(self.data.get("skipped"))

    @property
    def passed(self) -> bool:
        return bool(self.data.get("passed"))

    @property
    def ok(self) -> bool:
        """Measured without a failure: no error, and status "ok" (a row without a status
        field counts as ok)."""
        return self.data.get("status", "ok") == "ok" and not self.error

    @property
    def rel_l2(self) -> Optional[float]:
        return self.data.get("rel_l2")

    @property
    def nonfinite(self) -> int:
        return self.data.get("nonfinite") or 0

    @property
    def masked_rows_zero(self) -> Optional[bool]:
        return self.data.get("masked_rows_zero")

    @property
    def sim(self) -> dict:
        """`spak run`'s comparison with the simulator ({} when the row has none)."""
        s = self.data.get("sim")
        return s if isinstance(s, dict) else {}

    # throughput
    @property
    def tflops(self) -> Optional[float]:
        return self.data.get("tflops")

    @property
    def ceiling_tflops(self) -> Optional[float]:
        return self.data.get("ceiling_tflops")

    def value(self, metric: str = "TFLOPS") -> Optional[float]:
        """The row's figure in a family's metric (TFLOPS or GB/s); None when absent or 0."""
        v = self.data.get(metric_field(metric))
        return float(v) if v else None

    def measure(self, metric: str = "TFLOPS") -> Optional[float]:
        """The figure when the row counts as a measurement: status "ok" and a figure."""
        return self.value(metric) if self.status == "ok" else None
