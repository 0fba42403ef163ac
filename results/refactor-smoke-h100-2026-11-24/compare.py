"""Compare two `spak run` JSONL files row by row: the same shapes and kernels must give the
same GPU outputs (rel L2 / max abs vs float64 and vs SDPA, to the last bit of the float)
and the same agreement with the simulator (bit-identical fraction, worst ulp).

    python compare.py OLD.jsonl NEW.jsonl
Exit status 0 when every row of OLD has an identical row in NEW."""
import json
import sys

KEYS = ("tiles", "passed", "error", "nonfinite", "rel_l2", "max_abs", "rel_l2_vs_sdpa",
        "dead_rows", "masked_rows_zero")
SIM = ("fraction_bit_identical", "max_ulp", "elements", "slice", "model")


def rows(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("provider", "").startswith("spak-"):
            out[(r["case"], r["provider"])] = r
    return out


def main(old_path, new_path):
    old, new = rows(old_path), rows(new_path)
    same, diffs = 0, []
    for key, a in old.items():
        b = new.get(key)
        if b is None:
            diffs.append(f"{key}: missing in new")
            continue
        bad = [k for k in KEYS if a.get(k) != b.get(k)]
        bad += [f"sim.{k}" for k in SIM if (a.get("sim") or {}).get(k) != (b.get("sim") or {}).get(k)]
        if bad:
            diffs.append(f"{key}: " + ", ".join(f"{k}: {_get(a, k)!r} -> {_get(b, k)!r}"
                                                 for k in bad))
        else:
            same += 1
    extra = sorted(set(new) - set(old))
    fr = [r["sim"]["fraction_bit_identical"] for r in new.values()
          if isinstance(r.get("sim"), dict) and "fraction_bit_identical" in r["sim"]]
    print(f"{same}/{len(old)} (case, kernel) rows identical old vs new in "
          f"{', '.join(KEYS)}, sim.{', sim.'.join(SIM)}")
    print(f"new: {sum(bool(r.get('passed')) for r in new.values())}/{len(new)} passed; "
          f"simulator bit-identical fraction min {min(fr) if fr else None} over {len(fr)} rows; "
          f"family fields {sorted({str(r.get('family')) for r in new.values()})}")
    for d in diffs + [f"{k}: only in new" for k in extra]:
        print("DIFF", d)
    print(f"{'case':40} {'provider':11} {'tiles':9} {'rel_l2':>22} {'vs_sdpa':>22} {'bit%':>7} ulp")
    for key, b in new.items():
        s = b.get("sim") or {}
        t = b.get("tiles") or {}
        print(f"{key[0]:40} {key[1]:11} {str(t.get('TILE_M'))+'x'+str(t.get('TILE_N')):9} "
              f"{b.get('rel_l2')!r:>22} {b.get('rel_l2_vs_sdpa')!r:>22} "
              f"{100 * s.get('fraction_bit_identical', float('nan')):7.2f} {s.get('max_ulp')}")
    return 0 if not diffs and not extra else 1


def _get(r, k):
    return (r.get("sim") or {}).get(k[4:]) if k.startswith("sim.") else r.get(k)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
