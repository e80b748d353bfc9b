"""Lab tool: compare bench results of two builds measured in alternating rounds on one machine (an A/B of a change).

    python -m bench.lab.ab_compare A_DIR B_DIR [--impl cuinfer] [--tolerance 1.0]

A_DIR and B_DIR each hold rounds as ``<suite>-r<N>.json`` (``python -m bench <suite> --out`` results renamed per
round, see bench/lab/gpu_ab.sh). For every (suite, case, variant) of ``impl`` it prints the median over rounds of
each side's time, the ratio B / A and whether it is within ``tolerance`` percent; exit 1 when any row is outside.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def rounds(d: Path, impl: str) -> dict[tuple[str, str, str], list[float]]:
    out: dict[tuple[str, str, str], list[float]] = {}
    for f in sorted(d.glob("*-r*.json")):
        data = json.loads(f.read_text())
        for m in data["measurements"]:
            if m["impl"] == impl and m["status"] == "ok" and m.get("us"):
                out.setdefault((m["suite"], m["case"], m["variant"]), []).append(float(m["us"]))
    return out


def compare(a: dict, b: dict, tolerance: float) -> tuple[list[str], bool]:
    lines = [f"{'suite':8s} {'case':6s} {'variant':14s} {'A us':>10s} {'B us':>10s} {'B/A':>7s} rounds"]
    ok = True
    for key in sorted(set(a) & set(b)):
        ma, mb = statistics.median(a[key]), statistics.median(b[key])
        ratio = mb / ma
        inside = abs(ratio - 1.0) * 100.0 <= tolerance
        ok &= inside
        flag = "" if inside else "  <-- outside"
        lines.append(f"{key[0]:8s} {key[1]:6s} {key[2]:14s} {ma:10.2f} {mb:10.2f} {ratio:7.3f} "
                     f"{len(a[key])}/{len(b[key])}{flag}")  # fmt: skip
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lab.ab_compare", description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--impl", default="cuinfer")
    p.add_argument("--tolerance", type=float, default=1.0, help="percent")
    args = p.parse_args(argv)
    lines, ok = compare(rounds(args.a, args.impl), rounds(args.b, args.impl), args.tolerance)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
