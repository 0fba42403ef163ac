"""Time several decode configs of one problem in ONE process (GPU): the family's planned call
(spak.device.decode_gpu.decode_call) per config, each checked against float64, beside a
same-size device copy; kernel mode (back-to-back calls, input sets rotated). For configs
`spak run --tiles MxN` cannot name (KT_FORM, TN_FIT, num_splits, MAX_ROWS 256, ...).

    python tools/decode_tiles_probe.py --out probe.jsonl \
        128x71:1x4:16384x64/causal/page64 '{"TN_FIT": 0}' '{}' '{"MAX_ROWS": 128}' \
        32x48:8x4:4096x128/causal/page16 '{"TN_FIT": 0}' '{}'

(an item starting with "{" is a JSON config, tiles and num_splits, of the case before it;
a case alone runs the plan's config).

One JSON line per (case, config): ms (median), of_copy (the copy's ms over ours), rel_l2
against float64, passed (within the family's gate, no NaN), the split kernel's resolved
TILE_N / grid, or the error. A config that fails (compile, launch, check) does not stop
the others.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def probe(case: str, configs: list[dict], n_sets: int = 2, device: str = "cuda",
          out: str | None = None) -> list[dict]:
    """The rows of one case (appended to ``out`` as each config finishes, so a job cut by
    its time bound keeps what it measured)."""
    import torch
    from spak.device.decode_gpu import decode_call, decode_gpu_inputs
    from spak.device.timing import time_events
    from spak.families.fmha_decode import FAMILY as fam
    p = fam.parse(case)
    sets = [decode_gpu_inputs(p, seed=0, set_index=i, device=device) for i in range(n_sets)]
    ref = fam.gpu_reference(p, sets[0])["out"].double()
    half = max(int(fam.bytes_moved(p)) // 2, 1)
    bufs = [(torch.empty(half, dtype=torch.uint8, device=device).random_(0, 256),
             torch.empty(half, dtype=torch.uint8, device=device)) for _ in range(n_sets)]
    copy_ms = time_events(lambda i: bufs[i][1].copy_(bufs[i][0]), n_sets)["ms_median"]
    rows = []
    for cfg in configs:
        row = {"case": p.case_id, "config": cfg, "copy_ms": copy_ms}
        t0 = time.perf_counter()
        try:
            calls = [decode_call(p, x, cfg) for x in sets]
            calls[0]()
            if device != "cpu":
                torch.cuda.synchronize()
            got = calls[0].outputs["out"].double()
            err = float((got - ref).norm() / ref.norm())
            ok = bool(torch.isfinite(got).all()) and err <= fam.gate(p)
            split = calls[0].launches[0]
            ms = time_events(lambda i: calls[i](), n_sets)["ms_median"]
            row.update(ms=ms, of_copy=copy_ms / ms, rel_l2=err, passed=ok,
                       launches=[L.name for L in calls[0].launches],
                       grid=list(split.grid),
                       tile_n=split.args[11 if split.name == "decode" else 14],
                       first_s=round(time.perf_counter() - t0, 2))
        except Exception as e:                     # noqa: BLE001 - the next config runs
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


def jobs(items: list[str]) -> list[tuple[str, list[dict]]]:
    """[case, config, config, case, config, ...] -> [(case, [configs])]: an item starting
    with "{" is a JSON config of the case before it; a case without one runs the plan's."""
    out: list = []
    for item in items:
        if item.lstrip().startswith("{"):
            if not out:
                raise ValueError(f"config {item!r} before any case")
            out[-1][1].append(json.loads(item))
        else:
            out.append((item, []))
    return [(case, cfgs or [{}]) for case, cfgs in out]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("items", nargs="+", help="CASE [CONFIG_JSON ...] [CASE ...]")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rows = []
    for case, configs in jobs(a.items):
        try:
            rows += probe(case, configs, out=a.out)
        except Exception as e:                     # noqa: BLE001 - the next case runs
            rows.append({"case": case, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(json.dumps(rows[-1]), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    return 1 if any("error" in r or not r.get("passed") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
