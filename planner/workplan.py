"""``WorkPlan``: a schedule of work items over persistent CTAs, and how its item arrays reach the packed buffer.

Its own module (imported by ``work``, ``decode_plan`` and ``layout``) so that the planners can build plans without
importing each other. See docs/internals.md, "Work plans", for the arrays of the contract.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .units import units_of


@dataclass(eq=False)
class WorkPlan:
    """A schedule of work items over ``num_ctas`` persistent CTAs (integer NumPy arrays; the packed form is int32).

    Items: CTA ``c`` runs ``work_indptr[c]:work_indptr[c+1]``, then the CTAs share the last ``n_pool`` items
    (``work_indptr[P]:n_items``, the *pool*, largest first), taking one at a time as they finish (kernels that take a
    pool only: ``assign.POOL_SHARE``); item ``i`` is group ``item_group[i]`` for KV head ``item_head[i]``, or, when
    those are ``None``, group ``i % G`` for head ``i // G`` (natural order).
    """

    num_ctas: int
    num_kv_heads: int
    work_indptr: np.ndarray  # [num_ctas + 1]
    group_req: np.ndarray  # [G] request
    group_tile: np.ndarray | int  # [G] query tile within the request (0 for decode)
    group_kv_start: np.ndarray | int  # [G] KV range [start, end) (start 0 for all: an int)
    group_kv_end: np.ndarray
    group_partial: np.ndarray | None  # [G] partial row of head 0's block, -1 unsplit (None: nothing split)
    group_partial_stride: np.ndarray | None  # [G] rows between consecutive heads' blocks (0 unsplit)
    item_group: np.ndarray | None  # [n] (None: natural order)
    item_head: np.ndarray | None
    merge_indptr: np.ndarray  # [n_merge + 1]
    merge_src: np.ndarray  # [n_merge_src] partial rows, KV order within an output row
    merge_dst_token: np.ndarray  # [n_merge] global query token
    merge_dst_head: np.ndarray  # [n_merge] query head
    num_partial_rows: int
    chunk_size: int  # KV chunk the tiles were split at (0: none); decode lanes: the lane length in KV tokens
    assign_mode: str  # see assign.py; "lanes" for the decode lane cut (decode_plan.py)
    item_values: dict | None = None  # per-item int32 arrays (CTA-major) computed once, by name (read-only)
    # Memo for ``layout.pack``, shared by the plans of one structure: every word but the pieces' KV ranges, the
    # chunk size and the generation depends on the structure alone (None: not cacheable). See ``layout.pack``.
    pack_blocks: dict | None = None
    # Decode lane plans leave group_kv_start / group_kv_end None and keep ``(kv, starts, pos, ranges)`` here instead:
    # the KV lengths, the window starts (0: none), every cut's position and the structure's ``LaneRanges`` (which
    # picks the cuts inside requests); ``pack`` writes the item ranges from them directly and ``kv_ranges()`` builds
    # the group arrays when asked.
    lane_cuts: tuple | None = None
    # The kernel merges split items itself (decode: decode.cuh ``merge_split``): the plan then carries each item's
    # merge unit and piece count (``item_merge``, ``item_pieces``; see ``units.py``), else they are -1 and 0.
    merge_in_kernel: bool = False
    # Items past work_indptr[num_ctas]: the shared tail (see the class docstring); 0 for plans without one.
    n_pool: int = 0

    @property
    def n_groups(self) -> int:
        return int(self.group_req.shape[0])

    @property
    def n_items(self) -> int:
        if self.item_group is not None:
            return int(self.item_group.shape[0])
        return self.n_groups * self.num_kv_heads

    def sizes(self) -> tuple:
        """``(n_items, n_groups, n_merge, n_merge_src)``, computed once (``pack`` and ``PlanLayout.for_plan`` read
        them on every plan; a plan's arrays do not change once it is built)."""
        s = self.__dict__.get("_sizes")
        if s is None:
            g = self.group_req.shape[0]  # (the properties, inlined)
            n = g * self.num_kv_heads if self.item_group is None else self.item_group.shape[0]
            s = self.__dict__["_sizes"] = (n, g, self.merge_dst_token.shape[0], self.merge_src.shape[0])
        return s

    @classmethod
    def from_fields(cls, fields: dict) -> WorkPlan:
        """A plan whose ``fields`` (a dict with every dataclass field, which the plan then owns) are complete: the
        decode planner's per-step path (the generated ``__init__`` with its 22 keyword arguments costs more than the
        rest of a cached step's Python work)."""
        plan = object.__new__(cls)
        plan.__dict__ = fields
        return plan

    @classmethod
    def from_items(cls, num_ctas: int, work_indptr, items: dict, merge: dict, num_partial_rows: int,
                   chunk_size: int = 0, assign_mode: str = "explicit", n_pool: int = 0) -> WorkPlan:  # fmt: skip
        """A plan from explicit per-item arrays (``items[name]`` for the six item arrays, ``merge[name]`` for the
        four merge arrays), e.g. read back from a packed buffer."""
        n = len(items["item_req"])
        heads = np.asarray(items["item_kv_head"], dtype=np.int64)
        return cls(
            num_ctas=num_ctas,
            num_kv_heads=int(heads.max()) + 1 if n else 1,
            work_indptr=np.asarray(work_indptr, dtype=np.int64),
            group_req=np.asarray(items["item_req"], dtype=np.int64),
            group_tile=np.asarray(items["item_qo_tile"], dtype=np.int64),
            group_kv_start=np.asarray(items["item_kv_start"], dtype=np.int64),
            group_kv_end=np.asarray(items["item_kv_end"], dtype=np.int64),
            group_partial=np.asarray(items["item_partial"], dtype=np.int64),
            group_partial_stride=np.zeros(n, dtype=np.int64),
            item_group=np.arange(n),
            item_head=heads,
            merge_indptr=np.asarray(merge["merge_indptr"], dtype=np.int64),
            merge_src=np.asarray(merge["merge_src"], dtype=np.int64),
            merge_dst_token=np.asarray(merge["merge_dst_token"], dtype=np.int64),
            merge_dst_head=np.asarray(merge["merge_dst_head"], dtype=np.int64),
            num_partial_rows=int(num_partial_rows),
            chunk_size=int(chunk_size),
            assign_mode=assign_mode,
            n_pool=int(n_pool),
        )

    @property
    def n_merge(self) -> int:
        return int(self.merge_dst_token.shape[0])

    @property
    def n_merge_src(self) -> int:
        return int(self.merge_src.shape[0])

    # --- per-item arrays of the contract (CTA-major), built on first use -------------------------------------------
    def item_fields(self) -> dict:
        """``{name: (kind, values, index)}`` for the six item arrays, each one NumPy call away from the packed form:
        ``"group"``: ``values`` per group (or a scalar, or ``[H, 1]`` per head), the items in natural order are its
        head-major broadcast ``[H, G]``; ``"item"``: one value per item; ``"take"``: ``values.take(index)``;
        ``"fill"``: the scalar ``values`` for every item."""
        fields = self.__dict__.get("_item_fields")
        if fields is None:
            fields = self._build_fields()
            fields.update(self._unit_fields(fields))
            self.__dict__["_item_fields"] = fields
        return fields

    def pack_fields(self) -> tuple:
        """``(shape_key, dynamic)`` for ``layout.pack``: ``shape_key`` names every item field whose words follow from
        the plan's shape alone (a fill, a scalar per group, the heads of a natural order) with its value, ``dynamic``
        is ``((name, field), ...)`` for the others. Plans with equal keys (and item counts) write the same words in
        the shape-only fields, which a buffer that holds them already need not receive again."""
        spec = self.__dict__.get("_pack_fields")
        if spec is None:
            fields = self.item_fields()
            if self.item_group is None:  # natural order: every field is a "group" one, the heads are shape-only
                shape, dynamic = [("item_kv_head", "heads")], [("item_req", fields["item_req"])]
                for name in ("item_qo_tile", "item_kv_start", "item_kv_end", "item_partial"):
                    field = fields[name]
                    if isinstance(field[1], np.ndarray):
                        dynamic.append((name, field))
                    else:
                        shape.append((name, int(field[1])))
                if fields["item_merge"] is _NO_UNITS["item_merge"]:
                    shape += _NO_UNITS_SHAPE
                else:
                    dynamic += (("item_merge", fields["item_merge"]), ("item_pieces", fields["item_pieces"]))
                spec = self.__dict__["_pack_fields"] = (tuple(shape), tuple(dynamic))
                return spec
            heads = head_column(self.num_kv_heads)
            shape, dynamic = [], []
            for name, field in fields.items():
                kind, values = field[0], field[1]
                if kind == "fill" or (kind == "group" and not isinstance(values, np.ndarray)):
                    shape.append((name, int(values)))
                elif kind == "group" and values is heads:
                    shape.append((name, "heads"))
                else:
                    dynamic.append((name, field))
            spec = self.__dict__["_pack_fields"] = (tuple(shape), tuple(dynamic))
        return spec

    def _unit_fields(self, fields: dict) -> dict:
        """``item_merge`` / ``item_pieces`` (units.py): per item when the kernel merges and something is split."""
        if not self.merge_in_kernel or self.n_merge == 0:
            return _NO_UNITS
        partial = np.empty(self.n_items, dtype=np.int32)
        put_field(partial, fields["item_partial"], self.num_kv_heads, self.n_groups)
        merge, pieces = units_of(partial, self.merge_indptr, self.merge_src, self.num_partial_rows)
        return {"item_merge": ("item", merge, None), "item_pieces": ("item", pieces, None)}

    def kv_ranges(self) -> tuple:
        """``(group_kv_start, group_kv_end)``, built on first use for decode lane plans."""
        if self.group_kv_end is None:
            kv, starts, pos, ranges = self.lane_cuts
            self.group_kv_start, self.group_kv_end = ranges.group_ranges(kv, starts, pos)
        return self.group_kv_start, self.group_kv_end

    def _build_fields(self) -> dict:
        h = self.num_kv_heads
        self.kv_ranges()
        split = self.group_partial is not None
        if self.item_group is None:
            heads = head_column(h)
            part = (self.group_partial + heads * self.group_partial_stride) if split else -1
            return {
                "item_req": ("group", self.group_req, None),
                "item_qo_tile": ("group", self.group_tile, None),
                "item_kv_head": ("group", heads, None),
                "item_kv_start": ("group", self.group_kv_start, None),
                "item_kv_end": ("group", self.group_kv_end, None),
                "item_partial": ("group", part, None),
            }
        idx, head = self.item_group, self.item_head
        fixed = self.item_values or {}

        def by_group(name, values):
            if name in fixed:
                return ("item", fixed[name], None)
            if isinstance(values, np.ndarray):
                return ("take", values, idx)
            return ("fill", values, None)

        fields = {
            "item_req": by_group("item_req", self.group_req),
            "item_qo_tile": by_group("item_qo_tile", self.group_tile),
            "item_kv_head": ("item", fixed.get("item_kv_head", head), None),
            "item_kv_start": by_group("item_kv_start", self.group_kv_start),
            "item_kv_end": by_group("item_kv_end", self.group_kv_end),
        }
        if "item_partial" in fixed:
            fields["item_partial"] = ("item", fixed["item_partial"], None)
        elif split:
            part = self.group_partial.take(idx)
            part += head * self.group_partial_stride.take(idx)
            fields["item_partial"] = ("item", part, None)
        else:
            fields["item_partial"] = ("fill", -1, None)
        return fields

    def item_field(self, name: str) -> tuple:
        """One entry of ``item_fields()`` (the KV ranges of an explicit order without building the others)."""
        fields = self.__dict__.get("_item_fields")
        if fields is not None:
            return fields[name]
        if name in ("item_kv_start", "item_kv_end"):
            values = self.kv_ranges()[name == "item_kv_end"]
            if self.item_group is None:
                return ("group", values, None)
            return ("take", values, self.item_group) if isinstance(values, np.ndarray) else ("fill", values, None)
        return self.item_fields()[name]

    def _item(self, name: str) -> np.ndarray:
        out = np.empty(self.n_items, dtype=np.int32)
        put_field(out, self.item_fields()[name], self.num_kv_heads, self.n_groups)
        return out

    item_req = property(lambda self: self._item("item_req"))
    item_qo_tile = property(lambda self: self._item("item_qo_tile"))
    item_kv_head = property(lambda self: self._item("item_kv_head"))
    item_kv_start = property(lambda self: self._item("item_kv_start"))
    item_kv_end = property(lambda self: self._item("item_kv_end"))
    item_partial = property(lambda self: self._item("item_partial"))
    item_merge = property(lambda self: self._item("item_merge"))
    item_pieces = property(lambda self: self._item("item_pieces"))


_NO_UNITS = {"item_merge": ("fill", -1, None), "item_pieces": ("fill", 0, None)}
_NO_UNITS_SHAPE = (("item_merge", -1), ("item_pieces", 0))


def natural_pack_fields(group_req: np.ndarray, group_tile, group_kv_start, group_kv_end, fixed: bool = False) -> tuple:
    """``pack_fields()`` of a plan in natural order with nothing split and no merge units (``plan_checked``'s usual
    plan), from its group arrays alone (without building ``item_fields()``): the scalar fields, the heads, the
    partials (-1) and the units go to the shape key, the arrays to ``dynamic``, in ``pack_fields()``'s order.

    ``fixed``: ``group_req`` and ``group_tile`` are cached read-only arrays (``tiles._Structure``) that always hold
    the same values; their entries then say so (``FIXED`` in place of the index), and ``layout.pack`` does not
    rewrite them into a buffer that holds them already."""
    mark = FIXED if fixed else None
    nd = np.ndarray
    if type(group_tile) is nd and type(group_kv_start) is int and group_kv_start == 0 and type(group_kv_end) is nd:
        # (prefill without a window: the usual case, spelled out)
        return PREFILL_SHAPE, (
            ("item_req", ("group", group_req, mark)), ("item_qo_tile", ("group", group_tile, mark)),
            ("item_kv_end", ("group", group_kv_end, None)),
        )  # fmt: skip
    scalars = tuple(None if isinstance(v, np.ndarray) else int(v) for v in (group_tile, group_kv_start, group_kv_end))
    shape = _NATURAL_SHAPES.get(scalars)
    if shape is None:
        if len(_NATURAL_SHAPES) >= 64:
            _NATURAL_SHAPES.clear()
        shape = _NATURAL_SHAPES[scalars] = (
            (("item_kv_head", "heads"),)
            + tuple((name, v) for name, v in zip(_RANGE_NAMES, scalars, strict=True) if v is not None)
            + (("item_partial", -1),)
            + _NO_UNITS_SHAPE
        )
    dynamic = [("item_req", ("group", group_req, mark))]
    for name, v, scalar in zip(_RANGE_NAMES, (group_tile, group_kv_start, group_kv_end), scalars, strict=True):
        if scalar is None:
            dynamic.append((name, ("group", v, mark if name == "item_qo_tile" else None)))
    return shape, tuple(dynamic)


#: In a ``("group", values, FIXED)`` field of ``pack_fields()``: ``values`` is a cached read-only array whose
#: object identity stands for its values (a buffer that received this object holds its values).
FIXED = "fixed"
_RANGE_NAMES = ("item_qo_tile", "item_kv_start", "item_kv_end")
_NATURAL_SHAPES: dict = {}  # the shape keys of natural_pack_fields by its scalar fields (one object per key)
PREFILL_SHAPE = (("item_kv_head", "heads"), ("item_kv_start", 0), ("item_partial", -1)) + _NO_UNITS_SHAPE
_NATURAL_SHAPES[(None, 0, None)] = PREFILL_SHAPE


def put_field(out: np.ndarray, field: tuple, num_heads: int, n_groups: int) -> None:
    """Write one item array (a ``WorkPlan.item_fields()`` entry) into ``out`` (int32, ``n_items`` long)."""
    kind, values, index = field
    if kind == "take":
        if values.dtype == out.dtype:
            values.take(index, out=out, mode="wrap")  # indices are in range: no checks, no buffering
        else:
            out[:] = values.take(index)
    elif kind == "group" and isinstance(values, np.ndarray):
        out.reshape(num_heads, n_groups)[:] = values
    else:  # "item", "fill" or a scalar per group
        out[:] = values


@functools.lru_cache(maxsize=16)
def head_column(h: int) -> np.ndarray:
    heads = np.arange(h, dtype=np.int32)[:, None]
    heads.flags.writeable = False
    return heads
