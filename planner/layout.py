"""Packing a ``WorkPlan`` into one int32 buffer at fixed offsets, capacities, and the workspace size.

The buffer is what ``plan()`` copies to the GPU in one asynchronous copy. Its layout (``PlanLayout``) depends only on
capacities, never on a particular plan, so with CUDA graphs it is fixed when the wrapper is built: the kernel's
pointers never change and it reads the live counts from the header.

Header (16 int32 words at offset 0):

====  =================  =================================================================================
word  name               meaning
====  =================  =================================================================================
0     n_items            work items in this plan
1     n_merge            merge entries (output rows that combine partial states)
2     num_partial_rows   rows of the workspace's partial_o / partial_lse this plan uses
3     num_ctas           CTAs the plan balances over (CTAs ``num_ctas..max_ctas-1`` get empty lists)
4     n_merge_src        partial rows read by the merge (``merge_indptr[n_merge]``)
5     chunk_size         KV chunk the tiles were split at, 0 when nothing is split (informational)
6     generation         caller's counter (e.g. plan() calls), to check which plan a kernel saw
7     magic              ``PLAN_MAGIC`` (format version 1)
8-11  capacities         max_items, max_ctas, max_merge, max_merge_src of the layout
12-15 reserved           0
====  =================  =================================================================================

Then the arrays, each starting on a 16-byte boundary (4 words), in this order: ``work_indptr[max_ctas+2]`` (the
plan's ``num_ctas + 1`` entries, then ``n_items``: entry ``num_ctas + 1`` ends the pool ``work_indptr[P]:[P+1]`` that
kernels launched on ``P`` CTAs read, and CTAs past ``num_ctas`` get empty lists), ``item_req``, ``item_qo_tile``,
``item_kv_head``, ``item_kv_start``, ``item_kv_end``, ``item_partial``, ``item_merge``, ``item_pieces`` (each
``[max_items]``; the last two are the merge
unit and piece count of kernels that merge split items themselves, -1 and 0 otherwise: ``units.py``),
``merge_indptr[max_merge+1]``, ``merge_src[max_merge_src]``, ``merge_dst_token[max_merge]``,
``merge_dst_head[max_merge]``. Words past a count are left as they were.

Prefill plans in natural order with nothing split may instead be written in the compact form (``compact.py``,
``pack_compact``): only the ``G`` group entries of the item arrays the kernel reads, item ``i`` being group ``i % G``
of KV head ``i // G`` (docs/internals.md, "Compact form").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from .split_kv import MAX_EXTRA_ITEMS_PER_CTA
from .workplan import FIXED, WorkPlan, head_column, put_field

HEADER_WORDS = 16
_I32 = np.dtype(np.int32)
PLAN_MAGIC = 0x504C4E01  # "PLN" + version 1
#: Workspace arrays start on this boundary (bytes).
WORKSPACE_ALIGN = 256

# (array name, capacity it is sized by, extra entries)
_ARRAYS = (
    ("work_indptr", "max_ctas", 2),
    ("item_req", "max_items", 0),
    ("item_qo_tile", "max_items", 0),
    ("item_kv_head", "max_items", 0),
    ("item_kv_start", "max_items", 0),
    ("item_kv_end", "max_items", 0),
    ("item_partial", "max_items", 0),
    ("item_merge", "max_items", 0),
    ("item_pieces", "max_items", 0),
    ("merge_indptr", "max_merge", 1),
    ("merge_src", "max_merge_src", 0),
    ("merge_dst_token", "max_merge", 0),
    ("merge_dst_head", "max_merge", 0),
)
ARRAY_NAMES = tuple(a[0] for a in _ARRAYS)
_CAP_NAMES = ("max_items", "max_ctas", "max_merge", "max_merge_src")
# (array name, index of its capacity in _CAP_NAMES, extra entries): _ARRAYS for PlanLayout._build
_ARRAY_CAPS = tuple((name, _CAP_NAMES.index(by), extra) for name, by, extra in _ARRAYS)
_HEADER = np.zeros(HEADER_WORDS, dtype=np.int32)  # a layout's header before its capacities (words 8-11)
_HEADER[7] = PLAN_MAGIC


@dataclass(frozen=True)
class PlanCapacity:
    """Upper limits a plan must fit: work items, CTAs, merge entries, merge sources (= partial rows)."""

    max_items: int
    max_ctas: int
    max_merge: int
    max_merge_src: int

    def fits(self, other: PlanCapacity) -> bool:
        """True when every limit of ``other`` is within this one."""
        return (
            other.max_items <= self.max_items
            and other.max_ctas <= self.max_ctas
            and other.max_merge <= self.max_merge
            and other.max_merge_src <= self.max_merge_src
        )


def _align4(x: int) -> int:
    return (x + 3) & ~3


@dataclass(frozen=True)
class PlanLayout:
    """Word offsets of the header and of every array in the packed int32 buffer."""

    capacity: PlanCapacity
    offsets: dict  # array name -> word offset
    total_words: int
    # the header words that depend on the layout alone (magic, capacities), read-only
    header: np.ndarray = field(compare=False, repr=False)

    @classmethod
    def for_capacity(cls, max_items: int, max_ctas: int, max_merge: int, max_merge_src: int) -> PlanLayout:
        """The layout of these capacities (cached: a decode batch keeps its sizes over many steps)."""
        return _layout_for(int(max_items), int(max_ctas), int(max_merge), int(max_merge_src))

    @classmethod
    def _build(cls, max_items: int, max_ctas: int, max_merge: int, max_merge_src: int) -> PlanLayout:
        # Plans without CUDA graphs take the tight layout of their item count, so a new batch size is a new layout:
        # built in a few microseconds (the frozen dataclasses' __init__, getattr per array and a header from a list
        # took ten), to the same values.
        caps = (max_items, max_ctas, max_merge, max_merge_src)
        if min(caps) < 0 or max_ctas < 1:
            for name, v in zip(_CAP_NAMES, caps, strict=True):
                if v < 0:
                    raise ValueError(f"PlanLayout.for_capacity: {name} must be >= 0, got {v}")
            raise ValueError(f"PlanLayout.for_capacity: max_ctas must be >= 1, got {max_ctas}")
        offsets = {}
        pos = HEADER_WORDS
        for name, k, extra in _ARRAY_CAPS:
            offsets[name] = pos
            pos = (pos + caps[k] + extra + 3) & ~3  # (_align4)
        header = _HEADER.copy()  # words 7-11: the magic, then the capacities
        header[8] = max_items
        header[9] = max_ctas
        header[10] = max_merge
        header[11] = max_merge_src
        header.setflags(write=False)  # (half the cost of the flags attribute)
        cap = object.__new__(PlanCapacity)
        object.__setattr__(cap, "__dict__", {"max_items": max_items, "max_ctas": max_ctas, "max_merge": max_merge,
                                             "max_merge_src": max_merge_src})  # fmt: skip
        lay = object.__new__(cls)
        object.__setattr__(lay, "__dict__", {"capacity": cap, "offsets": offsets, "total_words": pos, "header": header})
        return lay

    @classmethod
    def for_plan(cls, plan: WorkPlan) -> PlanLayout:
        """The tight layout of one plan (no CUDA graph: the layout may follow each plan)."""
        blocks = plan.pack_blocks  # plans of one structure share it: remember their layout there
        lay = None if blocks is None else blocks.get("tight")
        if lay is None:
            n, _, nm, ns = plan.sizes()
            lay = _layout_for(n, plan.num_ctas, nm, ns)
            if blocks is not None:
                blocks["tight"] = lay
        return lay

    @property
    def nbytes(self) -> int:
        return 4 * self.total_words

    def size_of(self, name: str) -> int:
        """Entries reserved for array ``name``."""
        for n, by, extra in _ARRAYS:
            if n == name:
                return getattr(self.capacity, by) + extra
        raise KeyError(f"unknown plan array {name!r}; the arrays are {', '.join(ARRAY_NAMES)}")

    def empty(self) -> np.ndarray:
        """A zeroed host buffer of this layout (the wrappers pack into pinned buffers of their own, ``Buffers``)."""
        return np.zeros(self.total_words, dtype=np.int32)


@functools.lru_cache(maxsize=128)
def _layout_for(max_items: int, max_ctas: int, max_merge: int, max_merge_src: int) -> PlanLayout:
    return PlanLayout._build(max_items, max_ctas, max_merge, max_merge_src)


def capacity_of(plan: WorkPlan) -> PlanCapacity:
    """The exact capacity one plan needs."""
    return PlanCapacity(plan.n_items, plan.num_ctas, plan.n_merge, plan.n_merge_src)


def capacity_bound(
    max_batch_size: int,
    max_qo_tokens: int,
    num_kv_heads: int,
    group_size: int,
    tile_rows: int,
    num_ctas: int,
    *,
    fixed_split_size: int | None = None,
    max_kv_len: int | None = None,
    disable_split: bool = False,
) -> PlanCapacity:
    """A capacity every plan of at most ``max_batch_size`` requests and ``max_qo_tokens`` query tokens fits.

    For CUDA-graph mode, where the layout is fixed at construction. Decode: ``max_qo_tokens = max_batch_size``.
    ``fixed_split_size`` needs ``max_kv_len`` (the number of chunks grows with the KV length); the automatic policy
    does not (it never adds more than ``MAX_EXTRA_ITEMS_PER_CTA * num_ctas`` items by splitting).

    Why it holds: a request of ``L`` tokens has ``ceil(L*g/Br) <= (L*g + Br - 1)/Br`` tiles and at most
    ``min(B, Q)`` requests have a token, so tiles ``<= (Q*g + min(B,Q)*(Br-1)) // Br``; every tile is ``H`` items
    unsplit. Splitting adds at most ``8 * P`` items (automatic) or cuts each tile into at most
    ``ceil(max_kv_len / C)`` pieces (fixed ``C``). Partial rows are ``sum(H * k_t * r_t)`` over split tiles: at most
    ``Br`` rows per split item, and at most ``k_max`` pieces of each of the ``H*g*Q`` packed rows. Split items are at
    most twice the items splitting added (a tile cut in ``k >= 2`` adds ``k - 1 >= k/2``). Merge entries are packed
    rows of split tiles (``<= H*g*Q``) and each has at least two sources.
    """
    b, q, h, g, br, p = (int(v) for v in (max_batch_size, max_qo_tokens, num_kv_heads, group_size, tile_rows, num_ctas))
    for name, v in (("max_batch_size", b), ("max_qo_tokens", q), ("num_kv_heads", h), ("group_size", g)):
        if v < 0 or (v == 0 and name in ("num_kv_heads", "group_size")):
            raise ValueError(f"capacity_bound: {name} must be >= 1, got {v}")
    if br < 1 or p < 1:
        raise ValueError(f"capacity_bound: tile_rows={br} and num_ctas={p} must be >= 1")
    tiles = (q * g + min(b, q) * (br - 1)) // br
    rows_max = min(br, q * g)  # packed rows of one tile
    all_rows = h * g * q  # packed rows of the whole batch, all heads
    if fixed_split_size is not None:
        if max_kv_len is None:
            raise ValueError(
                "capacity_bound: fixed_split_size needs max_kv_len (the number of chunks grows with the KV length); "
                "pass the longest KV length the wrapper will plan for"
            )
        k_max = max(1, -(-int(max_kv_len) // int(fixed_split_size)))
        items = h * tiles * k_max
        split_items = items if k_max > 1 else 0
    elif disable_split:
        k_max = 1
        items = h * tiles
        split_items = 0
    else:
        extra = MAX_EXTRA_ITEMS_PER_CTA * p
        k_max = 1 + extra  # loose: one tile could take every extra item (per head the bound is extra / H)
        items = h * tiles + extra
        split_items = 2 * extra
    partial = min(rows_max * split_items, all_rows * k_max) if split_items else 0
    merge = min(all_rows, partial // 2)
    return PlanCapacity(items, p, merge, partial)


def _too_small(what: str, need: int, have: int, cap_name: str) -> ValueError:
    return ValueError(
        f"the plan needs {need} {what} but the plan buffer's layout holds {have} ({cap_name}={have}). A plan must fit "
        f"the layout fixed when the wrapper was built (CUDA graphs keep its pointers). Fix: build the wrapper with a "
        f"larger max_batch_size (or workspace), sized by planner.capacity_bound(...), or leave CUDA-graph mode off so "
        f"the buffer can grow with each plan."
    )


def check_fits(plan: WorkPlan, layout: PlanLayout) -> None:
    """Raise a ``ValueError`` naming the first limit the plan exceeds."""
    cap = layout.capacity
    if plan.n_items > cap.max_items:
        raise _too_small("work items", plan.n_items, cap.max_items, "max_items")
    if plan.num_ctas > cap.max_ctas:
        raise _too_small("CTAs", plan.num_ctas, cap.max_ctas, "max_ctas")
    if plan.n_merge > cap.max_merge:
        raise _too_small("merge entries", plan.n_merge, cap.max_merge, "max_merge")
    if plan.n_merge_src > cap.max_merge_src:
        raise _too_small("partial-state rows", plan.n_merge_src, cap.max_merge_src, "max_merge_src")


def pack(
    plan: WorkPlan, layout: PlanLayout, out: np.ndarray, *, generation: int = 0, memo: dict | None = None
) -> np.ndarray:
    """Write ``plan`` into ``out`` (int32, at least ``layout.total_words``), one slice assignment per array.

    ``memo`` (a dict the caller keeps per buffer *and* layout, empty when either changes, and nothing else writes into
    the plan arrays of that buffer) lets fields whose content depends on the plan's shape alone (all partials -1, all
    starts 0, the heads of a natural order) be skipped when the buffer already holds them (a field of one value is
    only written past the prefix that holds it), and so the group arrays marked ``FIXED`` (``workplan``: cached
    read-only arrays, whose identity stands for their values) that the buffer received last.

    Plans that carry ``pack_blocks`` (decode plans of a cached structure) are written as two memoised blocks, the
    words ``[0, item_kv_start)`` (header, ``work_indptr``, ``item_req``, ``item_qo_tile``, ``item_kv_head``; without
    a window also the starts, all 0 but the cut ones) and ``[item_partial, end of the merge list)``, plus the KV-range
    arrays and header words 5-6. When no padding word lies between the blocks and the ranges (tight layouts, whose
    item count is a multiple of 4) the two blocks are one copy of ``[0, end of the merge list)``, which the ranges
    then overwrite: three copies for a lane plan without a window (block, ends, cut positions). With a ``memo`` that
    says the buffer holds the blocks of this structure already (the previous plan packed into it had the same one:
    most steps of a serving loop) the block copies are skipped; the words they hold do not change between such plans.
    Block entries are kept per layout and form (with or without a window, with or without merge units): plans of
    one structure in another form hold other words in the blocks.
    """
    if (out.dtype is not _I32 and out.dtype != _I32) or out.ndim != 1 or out.shape[0] < layout.total_words:
        raise ValueError(
            f"pack needs a 1-D int32 buffer of at least {layout.total_words} words, got dtype {out.dtype} and shape "
            f"{out.shape}; allocate it with layout.empty()"
        )
    blocks = plan.pack_blocks
    if blocks is not None:
        # Plans of one structure come in forms whose blocks differ: with a window the starts are written every step
        # (without one they are 0 but the cuts, and travel in the head block), and with merge units (``BatchDecode``
        # sets merge_in_kernel, plan_work does not) the tail holds item_merge / item_pieces. The structure caches do
        # not tell the forms apart: an entry is used only by plans of its form. The first form packed into a layout
        # keeps its entry at id(layout), any other at (id(layout), form) (e.g. a sliding-window layer's wrapper and
        # a global layer's planning the same batch).
        lane = plan.lane_cuts
        window = isinstance(plan.group_kv_start if lane is None else lane[1], np.ndarray)
        form = (2 if window else 0) + (1 if plan.merge_in_kernel else 0)
        hit = blocks.get(id(layout))
        if hit is not None and hit[8] != form:
            hit = blocks.get((id(layout), form))
        # A plan of the same structure and form was packed into this layout before (so it fits): the block copies,
        # the KV ranges and the header words that change. (The layout is kept in the entry: its id stays unique.)
        # These write no field the memo's item shape ("items") says the buffer holds: that shape is the one of
        # the plan that made the entry, whose form keeps the starts and merge units out of it or in the blocks.
        if hit is not None and hit[0] is layout:
            _, head, o2, tail, patch, o_s, o_e, n, _ = hit
            if memo is None or memo.get("block") is not hit:  # (else the buffer holds these blocks already)
                out[: head.shape[0]] = head
                if tail is not None:
                    out[o2 : o2 + tail.shape[0]] = tail
                if memo is not None:
                    memo.clear()
                    memo["block"] = hit
            out[5] = plan.chunk_size
            out[6] = generation
            if lane is None:  # natural order (equal decode requests): [H, G] broadcasts
                h = plan.num_kv_heads
                if window:
                    out[o_s : o_s + n].reshape(h, -1)[:] = plan.group_kv_start
                out[o_e : o_e + n].reshape(h, -1)[:] = plan.group_kv_end
            else:  # each item's request's range, then the cut positions scattered over the starts and ends
                kv, starts, pos, ranges = lane
                if window:
                    _gather(out[o_s : o_s + n], starts, ranges.item_req)
                if kv.dtype is _I32:  # (_gather, inlined: the common case)
                    kv.take(ranges.item_req, out=out[o_e : o_e + n], mode="wrap")
                else:
                    out[o_e : o_e + n] = kv.take(ranges.item_req)
                out[patch] = pos.take(ranges.patch_pos)
            return out
    n, g, nm, ns = plan.sizes()
    p = plan.num_ctas
    cap = layout.capacity
    if n > cap.max_items or p > cap.max_ctas or nm > cap.max_merge or ns > cap.max_merge_src:
        check_fits(plan, layout)  # (raises, naming the limit)
    h = plan.num_kv_heads
    off = layout.offsets
    if memo is None:
        out[:HEADER_WORDS] = layout.header
    else:
        memo.pop("block", None)  # the buffer is about to hold another plan
        if memo.get("header") is not out:  # (words 7-15 depend on the layout alone)
            out[:HEADER_WORDS] = layout.header
            memo["header"] = out
    out[:7] = (n, nm, plan.num_partial_rows, p, ns, plan.chunk_size, generation)  # (one call for seven words)
    put_work_indptr(out, off["work_indptr"], plan.work_indptr, n, p, cap.max_ctas)
    shape, dynamic = plan.pack_fields()
    key = (n, h, g, shape)
    if memo is None:
        _put_shape(out, off, shape, n, h, g)
        for name, item in dynamic:
            o = off[name]
            put_field(out[o : o + n], item, h, g)
    else:
        # The [H, G] views of the buffer's item arrays, kept per item shape (a serving loop keeps its shape), and the
        # FIXED arrays (workplan.natural_pack_fields) they hold, by name
        views = memo.get("views")
        if views is None or views[0] is not out or views[1] != key[:3]:
            views = memo["views"] = (out, key[:3], {}, {})
        held = views[3]
        # A field that holds one value may be held by the buffer in a prefix already (``filled``: name -> (value,
        # words)): only the words past it are then written (the words past a plan's items are left as they were).
        filled = memo.get("filled")
        if filled is None:
            filled = memo["filled"] = {}
        if memo.get("items") != key:  # the fields the plan's shape fixes: written when the buffer may not hold them
            for name, value in shape:
                held.pop(name, None)
                o = off[name]
                have = filled.get(name)
                if value == "heads":
                    out[o : o + n].reshape(h, g)[:] = head_column(h)
                    if have is not None:
                        del filled[name]
                elif have is None or have[0] != value:
                    out[o : o + n] = value
                    filled[name] = (value, n)
                elif have[1] < n:
                    out[o + have[1] : o + n] = value
                    filled[name] = (value, n)
            memo["items"] = key
        views = views[2]
        for name, item in dynamic:
            values = item[1]
            if item[0] == "group" and type(values) is np.ndarray:
                if item[2] is FIXED:
                    if held.get(name) is values:
                        continue  # the buffer holds these values
                    held[name] = values
                elif held:
                    held.pop(name, None)
                view = views.get(name)
                if view is None:
                    o = off[name]
                    view = views[name] = out[o : o + n].reshape(h, g)
                view[...] = values
            else:
                held.pop(name, None)
                o = off[name]
                put_field(out[o : o + n], item, h, g)
            if filled:
                filled.pop(name, None)
    o = off["merge_indptr"]
    if nm:
        out[o : o + nm + 1] = plan.merge_indptr
        o = off["merge_src"]
        out[o : o + ns] = plan.merge_src
        o = off["merge_dst_token"]
        out[o : o + nm] = plan.merge_dst_token
        o = off["merge_dst_head"]
        out[o : o + nm] = plan.merge_dst_head
    else:
        out[o] = 0
    if blocks is not None:
        o_s, o_e, o2 = off["item_kv_start"], off["item_kv_end"], off["item_partial"]
        used = used_words(plan, layout)
        patch = None
        if lane is not None:  # word positions of the cut starts and ends (in out)
            patch = lane[3].patch.copy()
            patch[patch >= n] += o_e - o_s - n
            patch += o_s
            patch.flags.writeable = False
        # Without a window every start but the cut ones is 0: the starts travel with the head block.
        # The head block ends where the first range array the step writes begins, the tail starts after the ends.
        # When no word between them is left unwritten (no padding after the ranges: tight layout, n a multiple
        # of 4), one block [0, used) does: the ranges written after it overwrite its stale copies of them.
        if o_e + n == o2 and (not window or o_s + n == o_e):
            head, tail = out[:used].copy(), None
        else:
            head, tail = out[: o_s if window else o_e].copy(), out[o2:used].copy()
            tail.flags.writeable = False
        head.flags.writeable = False
        if len(blocks) >= 8:
            blocks.clear()
        key = id(layout)
        other = blocks.get(key)
        if other is not None and other[0] is layout and other[8] != form:
            key = (key, form)
        entry = blocks[key] = (layout, head, o2, tail, patch, o_s, o_e, n, form)
        if memo is not None:
            memo["block"] = entry  # the buffer holds exactly these blocks now
            # (the next plans of this structure write KV ranges and cut positions without telling the memo: what it
            # knows of single-valued prefixes and FIXED arrays goes)
            memo.pop("filled", None)
            memo.pop("views", None)
    return out


def put_work_indptr(out: np.ndarray, o: int, work_indptr: np.ndarray, n: int, p: int, max_ctas: int) -> None:
    """``work_indptr`` at word ``o``, then ``n`` up to ``max_ctas + 2`` entries: entry ``p + 1`` ends the pool that
    starts at ``work_indptr[p]`` (empty without one), CTAs past ``p`` get empty lists."""
    out[o : o + p + 1] = work_indptr
    if max_ctas == p:  # (a tight layout: one word, written as a scalar)
        out[o + p + 1] = n
    else:
        out[o + p + 1 : o + max_ctas + 2] = n


def _put_shape(out: np.ndarray, off: dict, shape: tuple, n: int, h: int, g: int) -> None:
    """Write the item fields ``pack_fields()`` says the plan's shape fixes (a value for every item, or the heads)."""
    heads = head_column(h)
    for name, value in shape:
        o = off[name]
        if value == "heads":
            out[o : o + n].reshape(h, g)[:] = heads
        else:
            out[o : o + n] = value


def _gather(out: np.ndarray, values: np.ndarray, index: np.ndarray) -> None:
    """``out[:] = values[index]`` in one call when the dtypes match."""
    if values.dtype == out.dtype:
        values.take(index, out=out, mode="wrap")  # indices are in range: no checks, no buffering
    else:
        out[:] = values.take(index)


def used_words(plan: WorkPlan, layout: PlanLayout) -> int:
    """Words from the start of the buffer to the end of the last array the plan uses (what must reach the GPU)."""
    off = layout.offsets
    if plan.n_merge:
        return off["merge_dst_head"] + plan.n_merge
    # merge_indptr[0] is always written; it lies past the item arrays
    return off["merge_indptr"] + 1


def unpack(buf: np.ndarray, layout: PlanLayout) -> WorkPlan:
    """Read a packed plan back (tests, debugging): the inverse of ``pack``."""
    hdr = buf[:HEADER_WORDS]
    if int(hdr[7]) != PLAN_MAGIC:
        raise ValueError(f"not a packed plan: header word 7 is {int(hdr[7]):#x}, expected PLAN_MAGIC {PLAN_MAGIC:#x}")
    n, nm, partial, p, ns, chunk = (int(v) for v in hdr[:6])
    off = layout.offsets

    def arr(name: str, count: int) -> np.ndarray:
        return buf[off[name] : off[name] + count].copy()

    items = {name: arr(name, n) for name in ARRAY_NAMES[1:7]}
    merge = {
        "merge_indptr": arr("merge_indptr", nm + 1),
        "merge_src": arr("merge_src", ns),
        "merge_dst_token": arr("merge_dst_token", nm),
        "merge_dst_head": arr("merge_dst_head", nm),
    }
    wi = arr("work_indptr", p + 1)
    return WorkPlan.from_items(p, wi, items, merge, partial, chunk, "unpacked", n_pool=n - int(wi[p]))


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


def workspace_offsets(num_partial_rows: int, head_dim_vo: int) -> tuple[int, int]:
    """``(lse_offset, total_bytes)``: partial_o float32 ``[rows, head_dim_vo]`` at byte 0, partial_lse float32
    ``[rows]`` at ``lse_offset``; both start on ``WORKSPACE_ALIGN`` bytes and the total is a multiple of it."""
    o_bytes = _round_up(4 * int(num_partial_rows) * int(head_dim_vo), WORKSPACE_ALIGN)
    lse_bytes = _round_up(4 * int(num_partial_rows), WORKSPACE_ALIGN)
    return o_bytes, o_bytes + lse_bytes


def workspace_bytes(plan_or_capacity: WorkPlan | PlanCapacity, head_dim_vo: int) -> int:
    """Workspace bytes for the partial states of a plan (or of any plan within a capacity)."""
    if isinstance(plan_or_capacity, PlanCapacity):
        rows = plan_or_capacity.max_merge_src
    else:
        rows = plan_or_capacity.num_partial_rows
    return workspace_offsets(rows, head_dim_vo)[1]
