"""The rules of docs/numerics-sm90.md 13-15 on other tile shapes, against an H100
(tools/sim_ops_gpu.py --shapes, results/samples-h100-2026-11-24c: the GPU's outputs; the
inputs are rebuilt from the recorded seed). Section 16 of the doc says what held:

* fp32 ct.matmul / ct.mma chains, the contraction rules, converted-fp16 sums: 100% as they
  were, on every new shape;
* mma results and gather results summed as they are (Tile.raw) reduce in their own order:
  a pairwise tree a lane (rows), neighbouring m64 blocks (axis 0), the 1-D load's blocked
  order (gathers of 256 and more), lanes then warps (a 64-element gather);
* computed mma tiles (exp2 of the accumulator) at 256 rows and along axis 0 are NOT
  modelled yet (the fractions below are pinned so that a change shows).
"""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import sim_ops_gpu as S  # noqa: E402

from spak.sim.numerics import Sm90  # noqa: E402

DATA = ROOT / "results" / "samples-h100-2026-11-24c"

# computed (exp2) mma tiles whose sums the model does not have yet: identical fractions
UNMODELLED = {"mma row sum exp2 256x128 d64": 0.4922, "mma row sum exp2 256x64 d64": 0.5352,
              "mma row sum exp2 256x128 d128": 0.5039, "mma col sum exp2 128x8 d64": 0.875,
              "mma col sum exp2 256x16 d64": 0.625, "mma col sum exp2 128x32 d128": 0.8125,
              "mma col sum exp2 256x64 d64": 0.75}


class _Sm90NoRaw(Sm90):
    """sm_90 before this run: raw mma/gather results summed as computed ones."""
    raw_sums = False


@pytest.fixture(scope="module")
def recorded():
    meta, cases, gpu = S.load_recorded(DATA)
    assert meta["gpu"].startswith("NVIDIA H100") and meta["inputs_dropped"]
    assert not any(c["error"] for c in meta["cases"].values())
    return {c.name: c for c in cases}, gpu


def _identical(case, gpu_out, model="sm_90"):
    got = S.run_sim(case, model)
    n = same = 0
    for key, g in gpu_out.items():
        a, b, _, _ = S.compare(g, got[key])
        n, same = n + a, same + b
    return same / n


def _names(family_part):
    return [c.name for c in S.build_cases(2026, 3072, False, True)
            if family_part in c.family and c.name not in UNMODELLED]


@pytest.mark.parametrize("name", _names("(shapes)"))
def test_modelled_rules_hold_on_other_shapes(recorded, name):
    cases, gpu = recorded
    assert _identical(cases[name], gpu[name]) == 1.0


@pytest.mark.parametrize("name,frac", sorted(UNMODELLED.items()))
def test_unmodelled_computed_mma_sums_are_where_the_doc_says(recorded, name, frac):
    cases, gpu = recorded
    assert abs(_identical(cases[name], gpu[name]) - frac) < 0.002


@pytest.mark.parametrize("name", ["mma row sum plain 128x128 d64", "mma row sum plain 256x64 d64",
                                  "gather sum 256"])
def test_the_raw_order_is_needed(recorded, name):
    """Without the raw-result rule these were 22-38% (the check can fail)."""
    cases, gpu = recorded
    assert _identical(cases[name], gpu[name], _Sm90NoRaw()) < 0.6
