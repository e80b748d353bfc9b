"""Variants on the CPU reference backend (NumPy inputs to run()): a plan's chain as reference steps.

The built-ins map to the reference's own implementations of their semantics (``cuinfer.reference.variants``); a
user's variant runs through its NumPy functions (``Variant.numpy``), and without them NumPy inputs raise
``NotImplementedError`` naming the variant and the functions it lacks. Plans whose chain holds only the built-ins of
the plan options keep the plain reference (``cuinfer.reference.core``); ``needs_steps`` tells them apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cuinfer.reference import variants as ref
from cuinfer.variants.builtins import alibi, causal, custom_mask, rope, rope_llama31, sigmoid, sinks, soft_cap, window
from cuinfer.variants.render import Rendered
from cuinfer.variants.select import user_pieces


def needs_steps(chain: Rendered) -> bool:
    """Whether the chain holds a variant given as ``variant=`` (the plain reference runs the option built-ins)."""
    return bool(user_pieces(chain))


def check_numpy(chain: Rendered) -> None:
    """Raise ``NotImplementedError`` when a user variant of ``chain`` lacks the NumPy functions its snippets need."""
    builtin = (sinks.SINKS, sigmoid.SIGMOID, rope_llama31.ROPE_LLAMA31)
    for p in user_pieces(chain):
        if any(p is b for b in builtin):
            continue
        missing = p.missing_numpy()
        if missing:
            have = sorted(p.numpy or {})
            raise NotImplementedError(
                f"variant {p.name!r}: the CPU reference backend (NumPy inputs) runs a user-defined variant through "
                f"its NumPy functions, and it has none for {missing} (it has {have}); give "
                f"Variant(..., numpy={{{', '.join(repr(m) + ': fn' for m in missing)}}}) (docs/variants.md, "
                "'NumPy functions') or pass GPU arrays (torch, JAX, CuPy)"
            )


def steps(
    chain: Rendered, options: Any, *, num_qo_heads: int, user_values: dict | None, arrays: dict,
    masks: Sequence[np.ndarray] | None = None,
) -> list[ref.Step]:  # fmt: skip
    """The reference steps of ``chain`` in its order: built-ins from the plan ``options`` (and the per-request
    ``masks`` of a custom mask), variants given as ``variant=`` from ``user_values`` (variant_params) and ``arrays``
    (``{(variant, param): np.ndarray}``, variant_arrays)."""
    check_numpy(chain)
    out = []
    for p in chain.pieces:
        values = dict((user_values or {}).get(p.name, {}))
        values.update({q: a for (v, q), a in arrays.items() if v == p.name})
        if p is causal.CAUSAL:
            out.append(ref.causal())
        elif p is window.WINDOW:
            out.append(ref.window(options.window_left))
        elif p is custom_mask.CUSTOM_MASK:
            out.append(ref.custom_mask(masks))
        elif p is alibi.ALIBI:
            out.append(ref.alibi(num_qo_heads))
        elif p is soft_cap.SOFT_CAP:
            out.append(ref.soft_cap(options.logits_soft_cap))
        elif p is rope.ROPE:
            out.append(ref.rope(options.rope_scale, options.rope_theta))
        elif p is sinks.SINKS:
            out.append(ref.sinks(values["sinks"]))
        elif p is sigmoid.SIGMOID:
            out.append(ref.sigmoid(float(values["bias"])))
        elif p is rope_llama31.ROPE_LLAMA31:
            out.append(ref.rope_llama31(**values))
        else:
            out.append(ref.user(p, values))
    return out
