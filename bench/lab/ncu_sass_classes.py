"""Lab: stall samples and executed instructions per SASS opcode class from Nsight Compute's source page
(`ncu -i REP --page source --print-source sass --csv > FILE`, as bench/lab/ncu_one.sh writes it; any machine).

    python -m bench.lab.ncu_sass_classes FILE.csv [FILE.csv ...]

Per file: the classes with the most samples (MUFU ops by function, the rest by their first opcode word), each with
its executed warp instructions and its four largest stall reasons."""

from __future__ import annotations

import collections
import csv
import re
import sys


def classes(path: str) -> tuple[collections.Counter, collections.Counter, dict]:
    rows = list(csv.reader(open(path)))
    head, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(head)}
    reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    samples: collections.Counter = collections.Counter()
    executed: collections.Counter = collections.Counter()
    by_reason: dict = collections.defaultdict(collections.Counter)
    for r in data:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[ix["Source"]].strip()).split(" ")[0]
        cls = op if op.startswith("MUFU") else op.split(".")[0]
        samples[cls] += int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
        executed[cls] += int(r[ix["Instructions Executed"]] or 0)
        for c in reasons:
            by_reason[cls][c] += int(r[ix[c]] or 0)
    return samples, executed, by_reason


def main(argv: list[str]) -> None:
    for path in argv:
        samples, executed, by_reason = classes(path)
        print("==", path)
        for cls, s in samples.most_common(14):
            top = ", ".join(f"{k[6:]}={v}" for k, v in by_reason[cls].most_common(4) if v)
            print(f"{cls:22s} {s:7d}  exec {executed[cls]:>10d}   {top}")


if __name__ == "__main__":
    main(sys.argv[1:])
