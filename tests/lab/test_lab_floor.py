"""Host-side pieces of the decode floor probe (``python -m bench.lab.stream_floor``): its log parsing, its read
kernels' build options, its command line."""

from __future__ import annotations

from bench.lab.stream_floor import parse_floors

LOG_A = """near-empty kernel 2.91 us (132 SMs)
D1 67 MB: torch.sum 29.9 us
D1  dirty   21.4 us  3.14 TB/s | clean   18.8 us | first  grid  8 CTA/SM x unroll 2 =   64 KB in flight per SM
D1  dirty   22.0 us  3.06 TB/s | clean   19.5 us | first  grid  8 CTA/SM x unroll 1 =   32 KB in flight per SM
D1  worst dirty 68.2 us (normal block 1x1)
D1  pages dirty   23.3 us  2.90 TB/s | first  head slices 4 CTA/SM x unroll 8
D1  pages best: head slices 23.5 us, whole pages 23.3 us
"""
LOG_B = """D1  dirty   21.9 us  3.07 TB/s | clean   19.3 us | first  grid  8 CTA/SM x unroll 1 =   32 KB in flight
D4  dirty   37.7 us  3.56 TB/s | clean   33.4 us | first  grid  8 CTA/SM x unroll 2 =   64 KB in flight
D4  pages best: head slices 40.3 us, whole pages 40.2 us
"""


def test_parse_floors_keeps_the_best_rows(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(LOG_A, encoding="utf-8")
    b.write_text(LOG_B, encoding="utf-8")
    f = parse_floors([str(a), str(b)])
    assert f == {"D1": {"contiguous": 21.4, "pages": 23.3}, "D4": {"contiguous": 37.7, "pages": 40.2}}
