"""The arithmetic of ``python -m bench.lab.tune_sched dtrace``: per-CTA stamps (CUINFER_DECODE_TRACE) to phase
medians."""

from __future__ import annotations

import numpy as np
import pytest

from bench.lab.tune_sched import DPHASES, decode_phase_medians


def _stamps(ctas: int, ghz: float, phases_us: list, entry_ns: np.ndarray, idle: int = 0) -> np.ndarray:
    """Stamps of CTAs whose phases (range, items, pages, issue, wait0, loop, epi; us) are given, the SM clock at
    ``ghz`` cycles per ns; the last ``idle`` CTAs ran no item (they stop at their first wait)."""
    t = np.zeros((ctas, 16), dtype=np.int64)
    c1 = 1_000_000
    order = [8, 9, 10, 2, 3, 4, 5]  # the stamp each phase ends at
    for c in range(ctas):
        clock = float(c1)
        t[c, 0] = int(entry_ns[c])
        t[c, 1] = c1
        for word, us in zip(order, phases_us, strict=True):
            clock += us * 1e3 * ghz
            t[c, word] = int(round(clock))
        if c >= ctas - idle:
            t[c, 4] = 0  # no last epilogue
        t[c, 6] = int(entry_ns[c] + (clock - c1) / ghz)
    return t


def test_phase_medians_recover_the_phases():
    phases = [0.7, 0.6, 1.1, 0.8, 3.2, 14.8, 2.3]
    entry = np.array([0.0, 100.0, 260.0, 50.0])
    m = decode_phase_medians([_stamps(4, 1.8, phases, entry), _stamps(4, 1.8, phases, entry)])
    assert set(m) == set(DPHASES)
    for name, us in zip(("range", "items", "pages", "issue", "wait0", "loop", "epi"), phases, strict=True):
        assert m[name] == pytest.approx(us, abs=2e-3), name
    assert m["ghz"] == pytest.approx(1.8, rel=1e-3)
    assert m["entry"] == pytest.approx(0.26)  # last entry - first entry, in us
    assert m["span"] == pytest.approx(0.26 + sum(phases), abs=2e-3)
    assert m["loopmax"] == pytest.approx(14.8, abs=2e-3)


def test_ctas_without_items_do_not_count():
    """A CTA with no item has no last epilogue stamp: its (short) phases stay out of the medians."""
    long = _stamps(3, 2.0, [0.5, 0.5, 1.0, 0.8, 3.0, 15.0, 2.0], np.zeros(3))
    short = _stamps(3, 2.0, [0.5, 0.5, 1.0, 0.8, 0.1, 0.1, 0.1], np.zeros(3), idle=3)
    m = decode_phase_medians([np.concatenate([long, short])])
    assert m["loop"] == pytest.approx(15.0, abs=2e-3) and m["wait0"] == pytest.approx(3.0, abs=2e-3)


def test_exit_spread_and_idle_share():
    """_dends: exits after the first entry (us), percentiles over the CTAs that ran an item, and the mean wait for the
    last CTA over the step; a CTA that ran nothing (no first-tile stamp) is left out."""
    from bench.lab.tune_sched import _dends

    t = np.zeros((5, 16), dtype=np.int64)
    t[:, 0] = [1000, 1000, 1000, 1000, 1000]  # entries (ns)
    t[:, 6] = [11000, 21000, 31000, 41000, 2000]  # exits: 10, 20, 30, 40 us after entry; the idle CTA at 1 us
    t[:, 3] = [1, 1, 1, 1, 0]
    text = _dends([t, t])
    assert "min 10.0," in text and "p50 25.0," in text and "max 40.0 us" in text
    # waits 30, 20, 10, 0 us for the last exit at 40: mean 15 / 40
    assert "(idle share 0.375)" in text
