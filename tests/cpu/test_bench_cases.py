"""bench/cases.py: docs/benchmarks.md's cases, length distributions, page tables, byte and FLOP counts (no GPU)."""

import sys
from pathlib import Path

import numpy as np
import pytest

# bench/ is a top-level folder run as `python -m bench`, not an installed package: import it from the checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.cases import (  # noqa: E402
    ALL_CASES,
    DECODE_CASES,
    LLAMA31_8B,
    MERGE_CASES,
    PLAN_CASES,
    PREFILL_CASES,
    Lengths,
    MergeCase,
    Shape,
    Target,
    attended_pairs,
    decode_bytes,
    indptr,
    known_ids,
    merge_bytes,
    page_table,
    prefill_flops,
    select,
)

# ----------------------------------------------------------------------------------------------- distributions


@pytest.mark.parametrize(
    "lengths",
    [
        pytest.param(Lengths("const", 7, 113), id="const"),
        pytest.param(Lengths("uniform", 33, lo=512, hi=1024), id="uniform"),
        pytest.param(Lengths("zipf", 129, 2048), id="zipf"),
        pytest.param(Lengths("onelong", 17, 1023), id="onelong"),
    ],
)
def test_same_seed_same_lengths(lengths):
    a, b = lengths.draw(1234), lengths.draw(1234)
    assert a.dtype == np.int64 and a.shape == (lengths.batch,)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dist", ["uniform", "zipf"])
def test_different_seeds_differ(dist):
    lengths = Lengths(dist, 64, mean=1024, lo=512, hi=1024)
    assert not np.array_equal(lengths.draw(1), lengths.draw(2))


def test_const_is_mean():
    np.testing.assert_array_equal(Lengths("const", 5, 4097).draw(3), [4097] * 5)


def test_uniform_includes_both_ends():
    x = Lengths("uniform", 4000, lo=5, hi=7).draw(11)
    assert set(x.tolist()) == {5, 6, 7}


def test_onelong_has_one_request_of_32x_mean():
    mean = 1023
    x = Lengths("onelong", 128, mean).draw(8)
    assert x[0] == 32 * mean
    assert (x[1:] == mean).all()
    assert (x == 32 * mean).sum() == 1


def test_zipf_follows_perf_definition():
    """docs/benchmarks.md: rng.zipf(1.5, B) scaled to the mean, clipped to [16, 64·mean], default_rng(case_seed)."""
    mean, batch, seed = 2048, 128, 9
    raw = np.random.default_rng(seed).zipf(1.5, size=batch).astype(np.float64)
    expect = np.clip((raw / raw.mean() * mean).astype(np.int64), 16, 64 * mean)
    got = Lengths("zipf", batch, mean).draw(seed)
    np.testing.assert_array_equal(got, expect)
    assert got.min() >= 16 and got.max() <= 64 * mean
    assert got.max() > 4 * mean  # heavy tail: that is what makes the case hard
    assert got.sum() <= batch * mean + 16 * batch  # scaling then truncation/clipping keeps the total near B·mean


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param(dict(dist="poisson", batch=4, mean=8), id="unknown-dist"),
        pytest.param(dict(dist="const", batch=0, mean=8), id="empty-batch"),
        pytest.param(dict(dist="uniform", batch=4, lo=9, hi=3), id="uniform-lo-gt-hi"),
        pytest.param(dict(dist="zipf", batch=4, mean=0), id="zipf-no-mean"),
    ],
)
def test_bad_lengths_raise(kwargs):
    with pytest.raises(ValueError):
        Lengths(**kwargs)


# ----------------------------------------------------------------------------------------------- the case table


def test_decode_cases_match_perf_table():
    want = {
        "D1": ("const", 16, 1024), "D2": ("uniform", 16, None), "D3": ("zipf", 16, 1024),
        "D4": ("const", 1, 32768), "D5": ("const", 64, 4096), "D6": ("const", 128, 2048),
        "D7": ("const", 256, 1024), "D8": ("onelong", 128, 1024), "D9": ("zipf", 128, 2048),
        "D10": ("const", 128, 2048), "D5-e4m3": ("const", 64, 4096), "D9-e4m3": ("zipf", 128, 2048),
    }  # fmt: skip
    assert [c.id for c in DECODE_CASES] == list(want)
    for c in DECODE_CASES:
        dist, batch, mean = want[c.id]
        assert (c.lengths.dist, c.lengths.batch) == (dist, batch)
        if mean is not None:
            assert c.lengths.mean == mean
        assert c.shape == Shape(32, 8, 128, 16, "bfloat16", "NHD")
    d2 = next(c for c in DECODE_CASES if c.id == "D2").lengths
    assert (d2.lo, d2.hi) == (512, 1024)
    for cid, base in (("D10", "D6"), ("D5-e4m3", "D5"), ("D9-e4m3", "D9")):
        c = next(c for c in DECODE_CASES if c.id == cid)
        assert (c.kv_dtype, c.compare_to) == ("float8_e4m3fn", base)
    d10 = next(c for c in DECODE_CASES if c.id == "D10").target
    assert d10.text == "≥ 3.6 TB/s (≤ 150 µs); ≥ 1.8× D6 (bf16 KV); ≥ 1.5× FlashInfer fp8"
    assert d10.check({"gbps": 3700, "ratio": 1.85, "vs_peer": 1.6}) is True
    assert d10.check({"gbps": 3700, "ratio": 1.7, "vs_peer": 1.6}) is False
    assert d10.check({"gbps": 3700, "ratio": 1.85}) is None  # (no peer in the run)


def test_prefill_cases_match_perf_table():
    got = {c.id: (c.layout, c.lengths.describe(), c.causal, c.target_fa2.value, c.target_hopper.value)
           for c in PREFILL_CASES if not c.compare_to}  # fmt: skip
    fp8 = {
        c.id: (c.compare_to, c.kv_dtype, c.target_fa2.metric, c.target_fa2.value) for c in PREFILL_CASES if c.compare_to
    }
    assert fp8 == {f"P{i}-e4m3": (f"P{i}", "float8_e4m3fn", "ratio", 1.0) for i in (4, 5, 6)}
    assert got == {
        "P1": ("ragged", "1 × 8192", True, 375, 680),
        "P2": ("ragged", "4 × 4096", True, 390, 660),
        "P3": ("ragged", "16 × uniform[512,2048]", True, 350, 500),
        "P4": ("paged", "1 × 8192", True, 340, 620),
        "P5": ("paged", "4 × 4096", True, 345, 560),
        "P6": ("paged", "16 × uniform[512,2048]", True, 300, 440),
    }


def test_merge_and_plan_cases():
    (m,) = MERGE_CASES
    assert (m.rows, m.num_states, m.num_heads, m.head_dim, m.dtype) == (16384, 8, 32, 128, "bfloat16")
    assert (m.target.metric, m.target.value) == ("pct_copy", 80.0)
    decode_plans = [c for c in PLAN_CASES if c.kind == "decode"]
    assert decode_plans and all(c.lengths.batch == 128 and c.target.value == 50 for c in decode_plans)
    (prefill_plan,) = [c for c in PLAN_CASES if c.kind == "prefill"]
    assert prefill_plan.lengths.batch == 64 and prefill_plan.target.value == 80


def test_ids_and_seeds_unique():
    ids = known_ids()
    assert len(ids) == len(set(ids))
    for suite, cases in ALL_CASES.items():
        if suite != "plan":  # plan cases reuse D6/D8/D9 seeds on purpose: the same lengths
            own = [c for c in cases if not getattr(c, "compare_to", "")]  # (fp8 twins: their base's lengths)
            assert len({c.seed for c in own}) == len(own)


def test_select_is_case_insensitive_and_ordered():
    assert [c.id for c in select("decode", ["d5", "D1"])] == ["D1", "D5"]
    assert [c.id for c in select("plan", ["PLAN-d6"])] == ["plan-D6"]
    assert select("merge", ["D1"]) == ()
    assert select("prefill", None) == PREFILL_CASES


@pytest.mark.parametrize(
    "target, values, expect",
    [
        pytest.param(Target("us", 25, ""), {"us": 24.9}, True, id="us-under"),
        pytest.param(Target("us", 25, ""), {"us": 25.1}, False, id="us-over"),
        pytest.param(Target("gbps", 4100, ""), {"gbps": 4100.0}, True, id="gbps-equal"),
        pytest.param(Target("tflops", 680, ""), {"tflops": 679.9}, False, id="tflops-under"),
        pytest.param(Target("pct_copy", 80, ""), {}, None, id="missing"),
    ],
)
def test_target_check(target, values, expect):
    assert target.check(values) is expect


# ----------------------------------------------------------------------------------------------- counting


def test_decode_bytes_hand_computed():
    s = Shape(num_qo_heads=4, num_kv_heads=2, head_dim=8)
    # K+V: (3+5) tokens · 2 heads · 8 · 2 (K and V) · 2 B = 512; q+o: 2 · 2 requests · 4 heads · 8 · 2 B = 256
    assert decode_bytes([3, 5], s) == 768
    assert decode_bytes([3, 5], s, "float8_e4m3fn") == 256 + 256  # fp8 halves K/V, q/o stay bf16


@pytest.mark.parametrize(
    "case_id, perf_us, perf_tbps",
    [
        pytest.param("D1", 34.8, 1.93, id="D1"),
        pytest.param("D5", 256.6, 4.19, id="D5"),
        pytest.param("D8", 174.6, 3.83, id="D8-onelong"),
        pytest.param("D10", 229.7, 2.35, id="D10-fp8"),
    ],
)
def test_decode_bytes_reproduce_perf_rates(case_id, perf_us, perf_tbps):
    """docs/benchmarks.md's µs × TB/s of FlashInfer is the byte count it used: ours must agree (within its rounding)."""
    case = next(c for c in DECODE_CASES if c.id == case_id)
    nbytes = decode_bytes(case.lengths.draw(case.seed), case.shape, case.kv_dtype)
    assert nbytes == pytest.approx(perf_us * 1e-6 * perf_tbps * 1e12, rel=0.01)


@pytest.mark.parametrize(
    "qo, kv, causal, pairs",
    [
        pytest.param(3, 5, True, 3 + 4 + 5, id="qo3-kv5"),  # bottom-right: row i sees i + 2 + 1 keys
        pytest.param(4, 4, True, 1 + 2 + 3 + 4, id="square"),
        pytest.param(5, 3, True, 0 + 0 + 1 + 2 + 3, id="qo-longer-empty-rows"),
        pytest.param(1, 7, True, 7, id="decode-row"),
        pytest.param(3, 5, False, 15, id="full"),
    ],
)
def test_attended_pairs(qo, kv, causal, pairs):
    assert attended_pairs(qo, kv, causal) == pairs


def test_prefill_flops_hand_computed():
    s = Shape(num_qo_heads=2, num_kv_heads=1, head_dim=4)
    # requests of 3 and 2 tokens, causal: 6 + 3 pairs; 4 · 2 heads · 4 · 9 = 288
    assert prefill_flops([3, 2], shape=s) == 288
    assert prefill_flops([3, 2], shape=s, causal=False) == 4 * 2 * 4 * (9 + 4)
    # P1: 4 · 32 · 128 · 8192·8193/2
    assert prefill_flops([8192], shape=LLAMA31_8B) == 4 * 32 * 128 * 8192 * 8193 // 2


def test_merge_bytes_hand_computed():
    case = MergeCase("m", rows=3, num_states=2, seed=0, target=Target("pct_copy", 80, ""), num_heads=2, head_dim=4)
    # one state row: 2 heads · (4 · 2 B + 4 B lse) = 24 B; 3 rows; 2 states read + 1 written
    assert merge_bytes(case) == 24 * 3 * 3


# ----------------------------------------------------------------------------------------------- page tables


@pytest.mark.parametrize("page_size", [pytest.param(16, id="p16"), pytest.param(1, id="p1"), pytest.param(7, id="p7")])
def test_page_table_roundtrip_and_scattered(page_size):
    lens = np.array([1, 16, 17, 113, 4097, 3])
    t = page_table(lens, page_size, seed=5)
    np.testing.assert_array_equal(t.kv_lens(page_size), lens)
    assert t.kv_indptr.dtype == np.int32 and t.kv_indices.dtype == np.int32
    assert ((t.kv_last_page_len >= 1) & (t.kv_last_page_len <= page_size)).all()
    assert sorted(t.kv_indices.tolist()) == list(range(t.num_pages))  # a permutation of the whole pool
    assert not np.array_equal(t.kv_indices, np.arange(t.num_pages))  # pages scattered, not in order
    np.testing.assert_array_equal(page_table(lens, page_size, seed=5).kv_indices, t.kv_indices)


def test_page_table_rejects_empty_request():
    with pytest.raises(ValueError, match="kv length must be >= 1"):
        page_table([4, 0], 16, seed=1)


def test_indptr():
    np.testing.assert_array_equal(indptr([3, 1, 4]), [0, 3, 4, 8])
    assert indptr([3]).dtype == np.int32


def test_decode_targets():
    """D1-D4: the page-order floor of their bytes (python -m bench.lab.stream_floor) + 3 µs, as docs/benchmarks.md
    states them; D5-D9 a bandwidth."""
    got = {c.id: (c.target.metric, c.target.value) for c in DECODE_CASES if not c.compare_to}
    assert {k: got[k] for k in ("D1", "D2", "D3", "D4")} == {
        "D1": ("us", 26.3), "D2": ("us", 22.0), "D3": ("us", 26.2), "D4": ("us", 43.2),
    }  # fmt: skip
    assert {k: got[k] for k in ("D5", "D6", "D7", "D8", "D9")} == {
        "D5": ("gbps", 4100.0), "D6": ("gbps", 4100.0), "D7": ("gbps", 4100.0), "D8": ("gbps", 3900.0),
        "D9": ("gbps", 3900.0),
    }  # fmt: skip
    d1 = next(c for c in DECODE_CASES if c.id == "D1").target
    assert d1.text == "≤ 26.3 µs (floor 23.3 + 3)" and d1.check({"us": 26.3}) and not d1.check({"us": 26.4})


def test_fp8_rows_are_judged_against_their_16_bit_case_and_the_peer():
    """D10's row: its speed-up over D6 (same variant, same run) and over the best FlashInfer row, beside TB/s."""
    from bench.decode import SPEC
    from bench.report import format_table, summarize
    from bench.suite import Measurement

    def m(case, impl, variant, us, nbytes):
        return Measurement("decode", case, impl, variant, us=us, bytes=nbytes, gbps=nbytes / us / 1e3)

    ms = [
        m("D6", "cuinfer", "default", 262.0, 1.07e9), m("D10", "cuinfer", "default", 140.0, 5.4e8),
        m("D10", "flashinfer", "tensor-cores", 229.7, 5.4e8),
    ]  # fmt: skip
    rows = {r["case"]: r for r in summarize(SPEC, ["D6", "D10"], {}, ms)}
    d10 = rows["D10"]
    assert d10["ratio"] == pytest.approx(262.0 / 140.0) and d10["ratio_to"] == "D6"
    assert d10["vs_peer"] == pytest.approx(229.7 / 140.0) and d10["pass"] is True
    assert "1.87× D6" in format_table(SPEC, list(rows.values()))
    slow = summarize(SPEC, ["D6", "D10"], {}, [ms[0], m("D10", "cuinfer", "default", 150.0, 5.4e8), ms[2]])
    assert [r["pass"] for r in slow if r["case"] == "D10"] == [False]  # 1.75x D6 < 1.8x
