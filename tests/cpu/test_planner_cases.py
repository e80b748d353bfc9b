"""The planner on docs/benchmarks.md's standard decode cases D1-D9 (lengths and seeds from ``bench/cases.py``).

Llama-3.1-8B decode: 8 KV heads, group 4, page 16. Two CTA counts: 132 (one CTA per SM on an H200) and 264 (two).
Each case checks the split decision the policy is documented to make and the balance it reaches under the cost
model (``balance`` = mean / max CTA load; ``efficiency`` = the unsplit work spread evenly / (max load + the merge's
fixed cost)). D1-D4 (no more requests than lanes) take equal pieces, one per lane (264 CTAs) or the chunk policy of
``split_kv`` (132 CTAs: a partial lane), whose floors are what exact LPT (a heap, largest first) reaches on the same
items, less a small margin. D8 and D9 take the decode lane cut
(``decode_plan.py``), which balances to within the rounding of its cuts (132 CTAs: 16 lanes of 8 and a partial lane
of 4 CTAs running 2 heads each); LPT over the chunks of the long requests reached 0.95 / 0.98 there.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from cuinfer.planner import CostModel, plan_work
from test_planner import check_plan

from bench.cases import DECODE_CASES
from bench.plan_host import plan_balance

CFG = dict(num_kv_heads=8, group_size=4, tile_rows=16, kv_granule=16)
CASES = {c.id: c for c in DECODE_CASES}

# (case, CTAs, split expected, balance floor, efficiency floor)
EXPECT = [
    ("D1", 132, False, 0.96, 0.96),  # 128 items on 132 CTAs: one wave already
    ("D1", 264, True, 0.96, 0.73),  # 2 x 512 per request fills 256 of 264 CTAs
    ("D2", 132, False, 0.70, 0.70),
    ("D2", 264, True, 0.60, 0.48),  # short requests, min_chunk 256: nothing balances well
    ("D3", 132, True, 0.88, 0.76),
    ("D3", 264, True, 0.90, 0.70),
    ("D4", 132, True, 0.98, 0.86),  # 33 pieces per head: 264 items in two exact waves
    ("D4", 264, True, 0.98, 0.81),
    ("D5", 132, False, 0.96, 0.96),  # balanced without splitting (docs/benchmarks.md: do not split D5-D7)
    ("D5", 264, False, 0.96, 0.96),
    ("D6", 132, False, 0.96, 0.96),
    ("D6", 264, False, 0.96, 0.96),
    ("D7", 132, False, 0.96, 0.96),
    ("D7", 264, False, 0.96, 0.96),
    ("D8", 132, True, 0.98, 0.96),  # lanes: the long request fills whole lanes, cuts split the 1024s around it
    ("D8", 264, True, 0.96, 0.92),
    ("D9", 132, True, 0.99, 0.98),
    ("D9", 264, True, 0.99, 0.96),
]


def _lpt_makespan(costs: np.ndarray, p: int) -> float:
    heap = [(0.0, c) for c in range(p)]
    worst = 0.0
    for x in np.sort(costs)[::-1]:
        load, c = heapq.heappop(heap)
        load += x
        worst = max(worst, load)
        heapq.heappush(heap, (load, c))
    return worst


@pytest.mark.parametrize(
    "case_id, ctas, split, balance_floor, efficiency_floor",
    [pytest.param(*e, id=f"{e[0]}-{e[1]}ctas") for e in EXPECT],
)
def test_decode_case(case_id, ctas, split, balance_floor, efficiency_floor):
    lens = CASES[case_id].lengths.draw(CASES[case_id].seed)
    plan = plan_work(None, lens, num_ctas=ctas, **CFG)
    if case_id in ("D8", "D9"):
        assert plan.assign_mode == "lanes"
    stats = check_plan(plan, None, lens, num_ctas=ctas, **CFG)
    assert (stats["split_units"] > 0) == split, (plan.chunk_size, plan.assign_mode)
    balance, efficiency = plan_balance(plan, None, CFG["group_size"], CFG["tile_rows"])
    assert balance >= balance_floor, (balance, plan.assign_mode, plan.chunk_size)
    assert efficiency >= efficiency_floor, (efficiency, plan.assign_mode, plan.chunk_size)


@pytest.mark.parametrize("ctas", [pytest.param(132, id="132ctas"), pytest.param(264, id="264ctas")])
@pytest.mark.parametrize("case_id", ["D3", "D8", "D9"])
def test_assignment_matches_lpt(case_id, ctas):
    """On the same items, the vectorised assignment is within 2 % of the paper's heap LPT."""
    lens = CASES[case_id].lengths.draw(CASES[case_id].seed)
    plan = plan_work(None, lens, num_ctas=ctas, **CFG)
    cost = CostModel()
    kv = plan.item_kv_end - plan.item_kv_start
    costs = cost.alpha * 4 + cost.beta * kv + cost.gamma + cost.partial_row * 4 * (plan.item_partial >= 0)
    cta = np.repeat(np.arange(ctas), np.diff(plan.work_indptr))
    ours = np.bincount(cta, weights=costs, minlength=ctas).max()
    assert ours <= 1.02 * _lpt_makespan(costs, ctas), (ours, plan.assign_mode)


def test_fixed_split_and_disable_split_on_d8():
    lens = CASES["D8"].lengths.draw(CASES["D8"].seed)
    fixed = plan_work(None, lens, num_ctas=264, fixed_split_size=2048, **CFG)
    check_plan(fixed, None, lens, num_ctas=264, fixed_split_size=2048, **CFG)
    assert fixed.chunk_size == 2048 and fixed.n_items == 8 * (127 + 16)  # 32768 = 16 x 2048; the rest whole
    off = plan_work(None, lens, num_ctas=264, disable_split=True, **CFG)
    check_plan(off, None, lens, num_ctas=264, disable_split=True, **CFG)
    assert off.n_items == 8 * 128 and off.n_merge == 0 and off.num_partial_rows == 0
