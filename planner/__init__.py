"""Pure-NumPy work planner (imports nothing but numpy).

``plan_work`` turns sequence lengths into a ``WorkPlan``: work items (query tile x KV head x KV chunk) balanced over a
fixed number of persistent CTAs, where split items put their partial states, and the merge list (decode batches: the
lane cut of ``decode_plan``, one ``DecodePlanner`` per configuration). ``pack`` writes it into one int32 buffer at the
fixed offsets of a ``PlanLayout`` (docs/internals.md, "Work plans").
"""

from .assign import Assignment, assign_items, cta_loads
from .cost import DEFAULT_COST, FP8_COST, CostModel, kv_itemsize_cost
from .decode_plan import DecodePlanner, decode_planner
from .lanes import Lanes, lanes_of
from .layout import (
    HEADER_WORDS,
    PLAN_MAGIC,
    PlanCapacity,
    PlanLayout,
    capacity_bound,
    capacity_of,
    check_fits,
    pack,
    unpack,
    used_words,
    workspace_bytes,
    workspace_offsets,
)
from .split_kv import DEFAULT_MIN_CHUNK, choose_chunk_size, split_ranges
from .tiles import Tiles, kv_lens_from_pages, qo_lens_from_indptr, query_tiles
from .work import WorkPlan, plan_work

__all__ = [
    "Assignment",
    "CostModel",
    "DEFAULT_COST",
    "DEFAULT_MIN_CHUNK",
    "DecodePlanner",
    "FP8_COST",
    "HEADER_WORDS",
    "Lanes",
    "PLAN_MAGIC",
    "PlanCapacity",
    "PlanLayout",
    "Tiles",
    "WorkPlan",
    "assign_items",
    "capacity_bound",
    "capacity_of",
    "check_fits",
    "choose_chunk_size",
    "cta_loads",
    "decode_planner",
    "kv_itemsize_cost",
    "kv_lens_from_pages",
    "lanes_of",
    "pack",
    "plan_work",
    "qo_lens_from_indptr",
    "query_tiles",
    "split_ranges",
    "unpack",
    "used_words",
    "workspace_bytes",
    "workspace_offsets",
]
