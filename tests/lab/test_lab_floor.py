"""Host-side pieces of the decode floor probe and the decode experiments (bench/lab/stream_floor.py,
bench/lab/tune_sched.py): log parsing, the CTA-cut plan's contract, the configuration variants' sizes."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_cta_cut_plan_reproduces_the_reference(rng, monkeypatch):
    """The ``ctacut`` experiment's plan, run through the NumPy emulation of the kernels' plan contract."""
    import cuinfer.planner.decode_plan as dp
    from test_decode_plan import _emulate

    from bench.lab.tune_sched import cta_cut_plan
    from cuinfer import reference
    from cuinfer.decode import BatchDecode

    monkeypatch.setattr(dp.DecodePlanner, "plan", lambda pl, kv, *a: cta_cut_plan(np.asarray(kv, np.int64), pl.h,
                                                                                  pl.g, pl.p, pl.gr))  # fmt: skip
    lens = np.array([1, 17, 513, 4097, 300, 1000, 999])
    hq, hkv, d, ps = 32, 8, 64, 16
    pages = (lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.where(pages > 0, lens - (pages - 1) * ps, 1).astype(np.int32)
    w = BatchDecode()
    w.plan(indptr, np.arange(indptr[-1], dtype=np.int32), last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
           page_size=ps, q_dtype="float16", num_sms=7)  # fmt: skip
    work = w._plan.work
    assert work.assign_mode == "cta-cut-experiment" and work.n_merge > 0
    q = rng.standard_normal((lens.shape[0], hq, d))
    k = rng.standard_normal((int(lens.sum()), hkv, d))
    v = rng.standard_normal((int(lens.sum()), hkv, d))
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    o, lse = _emulate(w, q, k, v, starts)
    for b in range(lens.shape[0]):
        sl = slice(starts[b], starts[b] + lens[b])
        ro, rl = reference.attention(q[b : b + 1], k[sl], v[sl])
        np.testing.assert_allclose(o[b], ro[0], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(lse[b], rl[0], rtol=1e-9, atol=1e-9)


def test_cta_cut_plan_balances_tiles():
    """D2's lengths: every CTA gets 5 or 6 KV tiles (the lane plan gives some 8)."""
    from bench.cases import DECODE_CASES
    from bench.lab.tune_sched import cta_cut_plan

    case = next(c for c in DECODE_CASES if c.id == "D2")
    kv = case.lengths.draw(case.seed)
    w = cta_cut_plan(kv, 8, 4, 264, 64)
    s, e = np.asarray(w.group_kv_start), np.asarray(w.group_kv_end)
    tiles = np.concatenate([[0], np.cumsum(-(-(e - s) // 64))])
    per_cta = tiles[w.work_indptr[1:]] - tiles[w.work_indptr[:-1]]
    assert per_cta.min() >= 5 and per_cta.max() <= 6


@pytest.mark.parametrize(("spec", "threads", "tile", "per_sm"), [("2,2,3,0,32", 128, 32, 4), ("4,1,2,2", 128, 64, 2)])
def test_decode_variant_sizes(spec, threads, tile, per_sm):
    """``dcfg`` variants: the shared memory counts the item chunk (a 32-item chunk fits 4 CTAs of 32-token tiles on a
    228 KB SM), and the cap bounds the CTAs per SM."""
    from bench.lab.tune_sched import _decode_variant
    from cuinfer.decode.policy import REFERENCE_SMEM_PER_SM, ctas_per_sm

    c = _decode_variant(spec)
    assert (c.threads, c.tile_kv) == (threads, tile)
    assert min(ctas_per_sm(c, smem_per_sm=REFERENCE_SMEM_PER_SM), c.min_blocks) == per_sm
    assert _decode_variant("default") is None
