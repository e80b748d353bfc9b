"""The compact form of a packed plan: prefill plans in natural order with nothing split (most of them) hold only the
``G`` group entries of the item arrays the kernel reads, item ``i`` being group ``i % G`` of KV head ``i // G``
(docs/internals.md, "Compact form"), instead of ``G * H`` items; the header and ``work_indptr`` are ``pack``'s.
"""

from __future__ import annotations

import numpy as np

from .layout import HEADER_WORDS, PlanLayout, check_fits, put_work_indptr
from .workplan import PREFILL_SHAPE, WorkPlan

#: Item fields a compact pack writes (G words each); the kernel derives the KV head (item // G) and the partial (-1).
COMPACT_FIELDS = ("item_req", "item_qo_tile", "item_kv_start", "item_kv_end")


def compact_groups(plan: WorkPlan) -> int:
    """``G`` when ``plan`` can be packed compactly (``pack_compact``), else 0: natural order (item ``i`` is group
    ``i % G`` of KV head ``i // G``), nothing split and no merge units, so every item field is a function of the
    item's group or its head."""
    if plan.item_group is not None or plan.num_partial_rows:
        return 0
    shape, _ = plan.pack_fields()
    if shape is PREFILL_SHAPE:  # (plan_checked's usual prefill plan: no window, nothing split)
        return plan.sizes()[1]
    if plan.sizes()[2]:  # merge entries
        return 0
    fixed = dict(shape)
    if fixed.get("item_kv_head") != "heads" or fixed.get("item_partial") != -1:
        return 0
    if fixed.get("item_merge", -1) != -1 or fixed.get("item_pieces", 0) != 0:
        return 0
    return plan.sizes()[1]


def pack_compact(
    plan: WorkPlan, layout: PlanLayout, out: np.ndarray, *, generation: int = 0, groups: int | None = None
) -> int:
    """Write ``plan`` into ``out`` in the compact form of a natural-order plan with nothing split
    (``compact_groups(plan) = G > 0``): the header, ``work_indptr``, and for each of ``COMPACT_FIELDS`` the ``G``
    group values at the start of its item array, instead of ``G * H`` item values (prefill plans of long batches hold
    ~20,000 items: the item arrays were most of ``pack``'s time). ``item_kv_head`` and ``item_partial`` are not
    written: a kernel told ``G`` reads item ``i``'s facts at entry ``i % G``, its KV head is ``i // G`` and its
    partial -1. Returns ``G``. A caller that also ``pack``s into ``out`` with a memo must clear that memo first (the
    compact words are not what it records). ``groups``: ``compact_groups(plan)`` when the caller has it already."""
    g = compact_groups(plan) if groups is None else groups
    if g == 0:
        raise ValueError("pack_compact needs a natural-order plan with nothing split (compact_groups(plan) > 0)")
    n, _, _, _ = plan.sizes()
    p = plan.num_ctas
    cap = layout.capacity
    if n > cap.max_items or p > cap.max_ctas:
        check_fits(plan, layout)  # (raises, naming the limit)
    off = layout.offsets
    out[:HEADER_WORDS] = layout.header
    # words 0-6 are (n, 0, 0, p, 0, chunk size, generation), the header's 0 in words 1, 2 and 4: four scalar writes
    # cost less than one from a tuple (which NumPy converts to an array first)
    out[0] = n
    out[3] = p
    out[5] = plan.chunk_size
    out[6] = generation
    put_work_indptr(out, off["work_indptr"], plan.work_indptr, n, p, cap.max_ctas)
    shape, dynamic = plan.pack_fields()
    if shape is PREFILL_SHAPE:  # (natural_pack_fields' prefill plan: starts 0, dynamic req, tile and end)
        o = off["item_kv_start"]
        out[o : o + g] = 0
        for name, item in dynamic:
            o = off[name]
            out[o : o + g] = item[1]
        out[off["merge_indptr"]] = 0
        return g
    for name, value in shape:
        if name in COMPACT_FIELDS:
            o = off[name]
            out[o : o + g] = value
    for name, item in dynamic:
        if name not in COMPACT_FIELDS:  # (compact_groups rules this out)
            raise AssertionError(f"pack_compact: unexpected dynamic field {name}")
        o = off[name]
        out[o : o + g] = item[1]  # ("group", values[G], mark): every dynamic field of a natural plan
    out[off["merge_indptr"]] = 0
    return g
