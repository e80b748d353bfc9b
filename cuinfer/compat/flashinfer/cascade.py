"""FlashInfer's attention-state merges over cuinfer's: ``merge_state``, ``merge_state_in_place``, ``merge_states``.

Both libraries keep the lse in base 2, so states pass between them unchanged. As in FlashInfer, the lse inputs of
``merge_state`` / ``merge_states`` may have any float dtype (they are converted to float32) and the merged ``v`` has
the dtype of the input ``v`` (on the CPU reference too, which computes in float64).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer.merge import merge_state as core_merge_state
from cuinfer.merge import merge_state_in_place as core_merge_state_in_place
from cuinfer.merge import merge_states as core_merge_states

__all__ = ["merge_state", "merge_state_in_place", "merge_states"]


def _float32(s: Any) -> Any:
    """``s`` as float32 (FlashInfer's ``s.to(torch.float32)``), unchanged when it already is."""
    if str(getattr(s, "dtype", "")).removeprefix("torch.") == "float32":
        return s
    if hasattr(s, "float") and type(s).__module__.startswith("torch"):
        return s.float()
    return s.astype(np.float32)


def _like(v: Any, s: Any, v_in: Any) -> tuple[Any, Any]:
    """The CPU reference's float64 results in FlashInfer's output dtypes (v's dtype, float32 lse)."""
    if isinstance(v, np.ndarray) and isinstance(v_in, np.ndarray):
        return v.astype(v_in.dtype, copy=False), np.asarray(s).astype(np.float32, copy=False)
    return v, s


def merge_state(v_a: Any, s_a: Any, v_b: Any, s_b: Any) -> tuple[Any, Any]:
    """``[v_a, s_a] ⊕ [v_b, s_b]``: v ``[seq_len, num_heads, head_dim]``, s ``[seq_len, num_heads]`` (base 2)."""
    v, s = core_merge_state(v_a, _float32(s_a), v_b, _float32(s_b))
    return _like(v, s, v_a)


def merge_state_in_place(v: Any, s: Any, v_other: Any, s_other: Any, mask: Any = None) -> None:
    """Merge ``(v_other, s_other)`` into ``(v, s)`` in place; rows where ``mask`` (bool ``[seq_len]``) is False are
    left as they are. ``s`` must be float32 (it is updated in place)."""
    core_merge_state_in_place(v, s, v_other, _float32(s_other), mask=mask)


def merge_states(v: Any, s: Any) -> tuple[Any, Any]:
    """Merge ``num_states`` states per row: v ``[seq_len, num_states, num_heads, head_dim]``, s ``[seq_len,
    num_states, num_heads]`` -> (v ``[seq_len, num_heads, head_dim]``, s ``[seq_len, num_heads]``)."""
    out, lse = core_merge_states(v, _float32(s))
    return _like(out, lse, v)
