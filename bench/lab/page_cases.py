"""Lab: ``python -m bench`` with the paged prefill cases at other page sizes: ``P4-p1``, ``P4-e4m3-p1``, ... for
page sizes 1, 8 and 24 (the standard cases use 16; the fp8 Hopper kernel's TMA boxes are as tall as the largest
power of two dividing the page size, at most 16). Same arguments as ``python -m bench``; gpu_abn.sh runs it with
``AB_BENCH=bench.lab.page_cases``.

python -m bench.lab.page_cases prefill --cases P4-p1,P4-e4m3-p1 --no-peers
"""

from __future__ import annotations

from dataclasses import replace

from bench import cases

PAGE_SIZES = (1, 8, 24)


def _with_page(c: cases.PrefillCase, page_size: int) -> cases.PrefillCase:
    compare = f"{c.compare_to}-p{page_size}" if c.compare_to else ""
    return replace(c, id=f"{c.id}-p{page_size}", shape=replace(c.shape, page_size=page_size), compare_to=compare)


def extra_cases() -> tuple[cases.PrefillCase, ...]:
    paged = [c for c in cases.PREFILL_CASES if c.layout == "paged" and "-p" not in c.id]
    return tuple(_with_page(c, ps) for ps in PAGE_SIZES for c in paged)


def main(argv: list[str] | None = None) -> int:
    cases.PREFILL_CASES += extra_cases()
    cases.ALL_CASES["prefill"] = cases.PREFILL_CASES
    from bench.__main__ import main as bench_main

    return bench_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
