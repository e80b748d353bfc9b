"""``layout.pack`` into reused buffers across mixed sequences of plans, checked word for word against fresh packs.

The wrappers pack every step into the same pinned buffer (one in CUDA-graph mode, two taking turns otherwise) with a
memo that lets ``pack`` skip words the buffer already holds: the shape-only fields of the last item shape, the
single-valued prefixes, the ``FIXED`` arrays it received, and the memoised blocks of a decode plan's cached structure
(``WorkPlan.pack_blocks``). Here sequences mixing decode lane plans (D8 onelong, D9 zipf), decode plans of the other
modes with the same item count (linear, snake / fill, one-wave), ``fixed_split_size`` plans and prefill plans, with and
without a window and with and without in-kernel merge units (``BatchDecode`` sets ``merge_in_kernel``, ``plan_work``
does not), go through one reused buffer, and after every step the words the layout says are used must equal those of
the same plan packed into a fresh zeroed buffer by the plain path (no memo, no blocks).

Regressions: plans of one cached structure (the decode planner's ``LaneStructure`` and its ``("equal", b, h, p)``
blocks) share ``pack_blocks`` whatever their window and merge units, but the blocks hold the KV starts only without a
window (the window's starts are written every step instead) and ``item_merge`` / ``item_pieces`` as the creating plan
had them. A block entry made by one form was reused by the other and left stale starts or merge units (and, through the
memo's item-shape record, stale starts in a later plain plan of the same item shape: a block step had written window
starts over the field that record said held 0).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from cuinfer.planner import PlanLayout, pack, plan_work
from cuinfer.planner import decode_plan as dp
from cuinfer.planner import decode_structure as ds
from cuinfer.planner.layout import HEADER_WORDS, PlanCapacity, capacity_of
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bench.plan_host import lengths
from cuinfer.decode import BatchDecode

H, G = 8, 4  # Llama-3.1-8B: 8 KV heads, 4 query heads each
P = 264  # 132 SMs x 2
DECODE = dict(num_kv_heads=H, group_size=G, tile_rows=16, kv_granule=16)
PREFILL = dict(num_kv_heads=H, group_size=G, tile_rows=64, kv_granule=16, num_ctas=P)
D8 = lengths("onelong", 128, 1024, 8).astype(np.int32)
D9 = lengths("zipf", 128, 2048, 9).astype(np.int32)
QO = np.random.default_rng(301).integers(33, 700, 13).astype(np.int32)  # prefill query lengths (odd batch)
DEFAULT_GROUPS = 128  # item groups of the "same count" plans before any lane plan set them


def _decode(kv, *, units=False, **kw):
    """A decode plan from ``plan_work``; ``units``: as ``BatchDecode`` hands it to the kernel (merge units)."""
    plan = plan_work(None, kv, **{**DECODE, "num_ctas": P, **kw})
    plan.merge_in_kernel = units
    return plan


def _fallback(kv, *, units=False):
    """The lane cut's pieces assigned item by item (mode ``lanes-...``, as when a cut breaks Graham's bound): the
    same item count and item shape as the lane plan of ``kv``, but no memoised blocks."""
    planner = dp.decode_planner(H, G, 16, P, 16)
    slack, worst = planner.slack, dp._worst_load
    planner.slack, dp._worst_load = 1e12, lambda *a: float("inf")  # take the exact test and fail it
    try:
        plan = planner.plan(kv)
    finally:
        planner.slack, dp._worst_load = slack, worst
    plan.merge_in_kernel = units
    return plan


def _uniform(b: int, step: int, lo: int, hi: int) -> np.ndarray:
    return np.random.default_rng(1000 + step).integers(lo, hi, b).astype(np.int32)


def _prefill(qo: np.ndarray, step: int, **kw):
    kv = qo + np.random.default_rng(step).integers(0, 900, qo.shape[0]).astype(np.int32)
    return plan_work(qo, kv, causal=True, **{**PREFILL, **kw})


# name -> plan(step, groups): ``groups`` is the item-group count of the last lane plan, so that the "same count"
# plans have the same item count (and, where the shape key matches, the same memo key) as a lane plan before them.
RECIPES = {
    "d8-lanes": lambda s, b: _decode(D8 + s),
    "d8-lanes-units": lambda s, b: _decode(D8 + s, units=True),
    "d8-lanes-window": lambda s, b: _decode(D8 + s, window_left=4000),  # the long request is clipped: starts > 0
    "d8-lanes-fallback": lambda s, b: _fallback(D8 + s),
    "d9-lanes": lambda s, b: _decode(D9 + s),
    "d9-lanes-fallback-units": lambda s, b: _fallback(D9 + s, units=True),
    "d9-lanes-units": lambda s, b: _decode(D9 + s, units=True),
    # every request inside the window (starts all 0): the structures of the plans without a window
    "d9-lanes-wide-window": lambda s, b: _decode(D9 + s, window_left=1 << 20, units=True),
    "equal": lambda s, b: _decode(np.full(b, 1500 + s, dtype=np.int32)),
    "equal-window": lambda s, b: _decode(np.full(b, 1500 + s, dtype=np.int32), window_left=999, units=True),
    "snake": lambda s, b: _decode(_uniform(b, s, 64, 4000), disable_split=True),
    "one-wave": lambda s, b: _decode(_uniform(b, s, 64, 4000), disable_split=True, num_ctas=H * b),
    "fixed-uncut": lambda s, b: _decode(np.full(b, 300 + s, dtype=np.int32), fixed_split_size=512),
    "fixed-cut": lambda s, b: _decode(_uniform(b, s, 100, 3000), fixed_split_size=256, units=True),
    "prefill": lambda s, b: _prefill(QO, s),  # the same query lengths: cached read-only tile arrays (FIXED)
    "prefill-grow": lambda s, b: _prefill(QO + s, s),
    "prefill-window": lambda s, b: _prefill(QO, s, window_left=200),
    "prefill-decode-shaped": lambda s, b: plan_work(np.ones(128, np.int32), D9 + s, **PREFILL),  # lanes, Br = 64
}


@contextlib.contextmanager
def _fresh_caches():
    """Empty structure / block caches of the decode plan for one sequence (a failing sequence replays alike)."""
    saved = ds._STRUCTURES, dp._BLOCKS
    ds._STRUCTURES, dp._BLOCKS = {}, {}
    dp.decode_planner.cache_clear()
    try:
        yield
    finally:
        ds._STRUCTURES, dp._BLOCKS = saved
        dp.decode_planner.cache_clear()


def _plans(sequence) -> list:
    plans, groups = [], DEFAULT_GROUPS
    for name, step in sequence:
        plan = RECIPES[name](step, groups)
        if plan.assign_mode == "lanes":
            groups = plan.n_groups
        plans.append(plan)
    return plans


def _used(plan, layout: PlanLayout) -> np.ndarray:
    """Indices of the words the layout says ``plan`` uses: the header, ``work_indptr`` (padded to ``max_ctas``), the
    item arrays up to ``n_items`` and the merge arrays up to their counts."""
    n, nm, ns, off = plan.n_items, plan.n_merge, plan.n_merge_src, layout.offsets
    spans = [(0, HEADER_WORDS), (off["work_indptr"], layout.capacity.max_ctas + 1)]
    spans += [(off[name], n) for name in ("item_req", "item_qo_tile", "item_kv_head", "item_kv_start",
                                          "item_kv_end", "item_partial", "item_merge", "item_pieces")]  # fmt: skip
    spans += [(off["merge_indptr"], nm + 1), (off["merge_src"], ns)]
    spans += [(off["merge_dst_token"], nm), (off["merge_dst_head"], nm)]
    return np.concatenate([np.arange(o, o + c) for o, c in spans])


def _reference(plan, layout: PlanLayout, generation: int) -> np.ndarray:
    """``plan`` packed into a fresh zeroed buffer by the plain path (no memo, no memoised blocks)."""
    out = layout.empty()
    blocks, plan.pack_blocks = plan.pack_blocks, None
    try:
        pack(plan, layout, out, generation=generation)
    finally:
        plan.pack_blocks = blocks
    return out


def _check(buf, plan, layout, generation, what):
    want = _reference(plan, layout, generation)
    used = _used(plan, layout)
    bad = used[buf[used] != want[used]]
    if bad.shape[0]:
        names = [a for a, o in layout.offsets.items() if ((bad >= o) & (bad < o + layout.size_of(a))).any()]
        raise AssertionError(
            f"{what}: {bad.shape[0]} stale words after packing a {plan.assign_mode} plan ({plan.n_items} items), "
            f"first at {bad[:5].tolist()} in {names or 'header'}: {buf[bad[:5]].tolist()} != {want[bad[:5]].tolist()}"
        )


def _run_sequence(sequence) -> set:
    """Pack the plans of ``sequence`` in order into: one buffer of a fixed layout that fits them all (CUDA-graph
    mode), two buffers taking turns with each plan's tight layout (a memo per buffer, new when its layout changes,
    as the wrappers keep them), and a fresh zeroed buffer with memoised blocks but no memo. Every pack is compared
    with the plain pack of the same plan. Returns the assignment modes seen."""
    with _fresh_caches():
        plans = _plans(sequence)
        caps = [capacity_of(p) for p in plans]
        fixed = PlanLayout.for_capacity(*(max(getattr(c, f) for c in caps) for f in PlanCapacity.__dataclass_fields__))
        rng = np.random.default_rng(7)
        poison = rng.integers(-(2**31), 2**31 - 1, fixed.total_words + 64, dtype=np.int64).astype(np.int32)
        graph_buf, graph_memo = poison.copy(), {}
        turn_bufs = [poison.copy(), poison.copy()]
        turn_memos: list = [(None, {}), (None, {})]
        for step, plan in enumerate(plans):
            what = f"step {step} of {sequence}"
            pack(plan, fixed, graph_buf, generation=step, memo=graph_memo)
            _check(graph_buf, plan, fixed, step, "graph layout, " + what)
            tight = PlanLayout.for_plan(plan)
            if turn_memos[step % 2][0] is not tight:
                turn_memos[step % 2] = (tight, {})
            pack(plan, tight, turn_bufs[step % 2], generation=step, memo=turn_memos[step % 2][1])
            _check(turn_bufs[step % 2], plan, tight, step, "tight layouts, two buffers, " + what)
            fresh = tight.empty()
            pack(plan, tight, fresh, generation=step)
            _check(fresh, plan, tight, step, "fresh buffer with memoised blocks, " + what)
        return {p.assign_mode for p in plans}


def _seq(text: str) -> list:
    """``"d8-lanes:0 snake:3"`` -> ``[("d8-lanes", 0), ("snake", 3)]`` (recipe, step)."""
    return [(name, int(step)) for name, step in (item.split(":") for item in text.split())]


D8_SERVING = " ".join(f"d8-lanes:{s}" for s in range(6))
D8_SERVING += " snake:0 d8-lanes:6 one-wave:0 d8-lanes:7 fixed-cut:0 d8-lanes:8 prefill:0 d8-lanes:9"


@pytest.mark.parametrize(
    "sequence",
    [
        pytest.param(_seq("equal-window:0 equal:0"), id="equal-window-then-none"),
        pytest.param(_seq("equal:0 equal:1 equal-window:2 equal:3"), id="equal-none-window-none"),
        # the reported path: the block entry of "equal" made last, its window twin writes starts over the field
        # the memo's item shape says holds 0, then a plain plan of that item shape skips it
        pytest.param(_seq("equal:0 equal-window:0 fixed-uncut:0"), id="memo-shape-after-window-block"),
        pytest.param(_seq("d8-lanes:0 d8-lanes-units:0"), id="lanes-plain-then-units"),
        pytest.param(_seq("d9-lanes-units:0 d9-lanes:0 d9-lanes-units:1"), id="lanes-units-plain-units"),
        # (the prefill plan makes the fixed layout larger than the lane plans: their blocks then leave out the starts)
        pytest.param(_seq("prefill:0 d9-lanes-wide-window:0 equal-window:0 d9-lanes-units:0"), id="lanes-window"),
        pytest.param(_seq(D8_SERVING), id="d8-serving-with-others"),
        # a lane plan's blocks, then its item-by-item twin: the same item shape, written by the plain path
        pytest.param(_seq("d8-lanes:0 d8-lanes:0 d8-lanes-fallback:0 d8-lanes:0 d8-lanes-fallback:0"), id="fallback"),
        pytest.param(_seq("d9-lanes-units:0 d9-lanes-fallback-units:0 d9-lanes-units:1"), id="fallback-units"),
        pytest.param(
            _seq("prefill:0 prefill:1 prefill:2 prefill-grow:0 prefill:3 equal:0 prefill:4 prefill-window:0 prefill:5"),
            id="prefill-fixed-arrays",
        ),
    ],
)
def test_pack_sequence_equals_fresh_packs(sequence):
    _run_sequence(sequence)


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed{s}") for s in (11, 29, 83)])
def test_random_serving_mix_equals_fresh_packs(seed):
    """A serving loop (one lane batch, one token longer per step) with other plans dropped in at random."""
    rng = np.random.default_rng(seed)
    names = list(RECIPES)
    lane = ("d8-lanes", "d9-lanes", "d9-lanes-units")[seed % 3]
    sequence, step = [], 0
    for _ in range(40):
        if rng.random() < 0.6:
            sequence.append((lane, step))
            step += 1
        else:
            sequence.append((names[rng.integers(len(names))], int(rng.integers(0, 40))))
    modes = _run_sequence(sequence)
    assert "lanes" in modes and len(modes) >= 3, modes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(sorted(RECIPES)), st.integers(0, 40)), min_size=2, max_size=14))
def test_any_sequence_equals_fresh_packs(sequence):
    for mode in sorted(_run_sequence(sequence)):
        event(f"mode={mode}")


# --- through the public wrapper: plan() / _pack_host() as a serving loop calls them ---------------------------------

WRAPPER = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16, q_dtype="bfloat16")


def _table(lens: np.ndarray):
    pages = (lens + 15) // 16
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = np.random.default_rng(5).permutation(int(indptr[-1])).astype(np.int32)
    return indptr, indices, ((lens - 1) % 16 + 1).astype(np.int32)


def _wrapper_words(w: BatchDecode, host: np.ndarray) -> tuple:
    """The plan words ``w._pack_host`` wrote into ``host`` and those of the plain pack of the same plan, at the words
    the plan uses (the plain pack leaves the wrapper's memos alone)."""
    plan = w._plan
    lay = w._words_layout(plan, w._host_holder)[0]
    used = _used(plan.work, lay)
    return host[used], _reference(plan.work, lay, w._generation + 1)[used]


@pytest.mark.parametrize("graph", [pytest.param(False, id="tight"), pytest.param(True, id="cuda-graph")])
@pytest.mark.parametrize("lens", [pytest.param(np.full(128, 1500), id="equal-128"),
                                  pytest.param(D9, id="D9-zipf")])  # fmt: skip
def test_wrapper_window_and_global_layers(lens, graph):
    """Two wrappers, a sliding-window layer's and a global layer's (Gemma-2 style), plan the same batch every step
    of a serving loop; each packs into its own reused buffer. The window covers the equal batch only in part and
    the zipf batch completely (same lane structures with and without the window). Each wrapper keeps its blocks
    while the structure stays (the memo's entry is the last step's: the two forms do not evict each other)."""
    window = 999 if lens.max() == lens.min() else 1 << 20
    with _fresh_caches():
        kw = dict(use_cuda_graph=True, max_batch_size=160) if graph else {}
        local, glob = BatchDecode(**kw), BatchDecode(**kw)
        bufs: dict = {}
        last: dict = {}  # name -> (pack_blocks, the memo's block entry) after the last step
        kept = 0
        for step in range(24):
            table = _table(np.asarray(lens, dtype=np.int64) + step)
            for name, w, wl in (("window", local, window), ("global", glob, -1)):
                w.plan(*table, window_left=wl, **WRAPPER)
                bufs[name] = w._pack_host(bufs.get(name))
                got, want = _wrapper_words(w, bufs[name])
                np.testing.assert_array_equal(got, want, err_msg=f"{name} layer, step {step}")
                entry = w._pack_memo[id(bufs[name])][2].get("block")
                blocks = w._plan.work.pack_blocks
                before = last.get(name, (None, None))
                kept += entry is not None and before[0] is blocks and before[1] is entry
                last[name] = (blocks, entry)
        assert kept >= 20, f"only {kept} of 46 packs kept the blocks of the step before"


def test_wrapper_replanned_with_and_without_window():
    """One wrapper whose plan() alternates window_left (the same equal batch): the reused buffer follows."""
    w, host = BatchDecode(), None
    table = _table(np.full(128, 1500, dtype=np.int64))
    with _fresh_caches():
        for step, wl in enumerate((999, -1, -1, 999, 999, -1)):
            w.plan(*table, window_left=wl, **WRAPPER)
            host = w._pack_host(host)
            got, want = _wrapper_words(w, host)
            np.testing.assert_array_equal(got, want, err_msg=f"step {step}, window_left={wl}")
