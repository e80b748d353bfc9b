"""Lab: the prefill suite with the sm90 backend's paged kernel let in (``cuinfer.prefill.sm90.PAGED``, which the
product keeps off until the kernel's GPU tests pass): same arguments as ``python -m bench``.

    python -m bench.lab.sm90_paged_suite prefill --cases P4,P5,P6 [--no-peers]      (GPU machine)
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from bench.__main__ import main as bench_main
    from cuinfer.prefill import sm90

    sm90.PAGED = True
    return bench_main(argv)


if __name__ == "__main__":
    sys.exit(main())
