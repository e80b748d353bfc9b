"""Which variants a plan runs: the built-ins its options select, then the user's (``variant=``), as one chain, and
the values of their parameters.

The order is fixed: causal, sliding window, custom mask, ALiBi, soft cap, RoPE, then the user's variants in the
order given (so ALiBi's bias is added before the soft cap, as FlashInfer does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cuinfer.variants.builtins import alibi, causal, custom_mask, rope, rope_llama31, soft_cap, window
from cuinfer.variants.registry import lookup
from cuinfer.variants.render import Rendered, logits_scale_value, render
from cuinfer.variants.spec import Variant


def user_variants(variant: Any) -> tuple[Variant, ...]:
    """``variant=`` of plan(): None, a ``Variant``, a registered name, or a sequence of those -> the variants."""
    if variant is None:
        return ()
    items = variant if isinstance(variant, Sequence) and not isinstance(variant, str) else (variant,)
    out = []
    for v in items:
        if isinstance(v, str):
            v = lookup(v)
        if not isinstance(v, Variant):
            raise TypeError(
                f"variant must be a cuinfer.Variant, a registered variant's name or a sequence of them but got "
                f"{type(v).__name__}"
            )
        out.append(v)
    return tuple(out)


def chain_for(
    options: Any, *, decode: bool, custom_mask_given: bool = False, user: tuple[Variant, ...] = ()
) -> Rendered:
    """The rendered chain of a plan with these ``AttentionOptions`` (``decode``: a decode query is the request's last
    token, so causal changes nothing and is left out)."""
    pieces: list[Variant] = []
    if options.causal and not decode:
        pieces.append(causal.CAUSAL)
    if options.window_left >= 0:
        pieces.append(window.WINDOW)
    if custom_mask_given:
        pieces.append(custom_mask.CUSTOM_MASK)
    if options.pos_encoding == "alibi":
        pieces.append(alibi.ALIBI)
    if options.logits_soft_cap > 0:
        pieces.append(soft_cap.SOFT_CAP)
    if options.pos_encoding == "rope_llama":
        pieces.append(rope.ROPE)
    names = {p.name for p in pieces}
    for v in user:
        if v.name in names:
            raise ValueError(f"variant {v.name!r} is already part of this plan (through its options); pass it once")
        names.add(v.name)
        pieces.append(v)
    return render(tuple(pieces))


# The built-ins plan() options select (their parameters come from the options); the variants given as variant=
# (registered built-ins such as sinks or sigmoid included) take theirs from variant_params / variant_arrays.
BUILTINS = (causal.CAUSAL, window.WINDOW, custom_mask.CUSTOM_MASK, alibi.ALIBI, soft_cap.SOFT_CAP, rope.ROPE)
# Checks of a named built-in's values beyond their kinds (at plan()).
_VALUE_CHECKS = {rope_llama31.ROPE_LLAMA31: rope_llama31.check}


def user_pieces(chain: Rendered) -> tuple[Variant, ...]:
    """The variants of ``chain`` that are not built-ins of the plan options (the ones given as ``variant=``)."""
    return tuple(p for p in chain.pieces if not any(p is b for b in BUILTINS))


def check_user_values(chain: Rendered, user_values: Any) -> dict[str, dict[str, Any]] | None:
    """``variant_params=`` of plan(), checked against the user variants of ``chain``: exactly their scalar parameters,
    as numbers (raises ValueError / TypeError before any launch; array parameters come at run())."""
    users = [p for p in user_pieces(chain) if any(not q.is_array for q in p.params)]
    if user_values is None and not users:
        return None
    if user_values is not None and not isinstance(user_values, dict):
        raise TypeError(f"variant_params must be a dict {{variant name: {{param: value}}}} but is {user_values!r}")
    user_values = dict(user_values or {})
    known = {p.name for p in users}
    extra = sorted(set(user_values) - known)
    if extra:
        raise ValueError(
            f"variant_params names {extra}, which are not parameterised variants of this plan {sorted(known)}"
        )
    out = {}
    for p in users:
        got = user_values.get(p.name)
        want = {q.name: q.kind for q in p.params if not q.is_array}
        if not isinstance(got, dict) or set(got) != set(want):
            raise ValueError(
                f"variant {p.name!r} takes parameters {sorted(want)}; pass variant_params={{{p.name!r}: {{...}}}} with "
                f"exactly those (got {sorted(got) if isinstance(got, dict) else got!r})"
            )
        vals = {}
        for name, kind in want.items():
            v = got[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind != "f32" and kind != "f64" and
                                                                          int(v) != v):  # fmt: skip
                raise TypeError(f"variant_params[{p.name!r}][{name!r}] must be a number ({kind}) but is {v!r}")
            vals[name] = v
        check = next((c for b, c in _VALUE_CHECKS.items() if b is p), None)
        if check is not None:
            check(vals)
        if p.logits_scale:  # (c > 0 and finite: the kernels divide by it, the max-free softmax is bounded by it)
            logits_scale_value(p, vals)
        out[p.name] = vals
    return out


def chain_values(chain: Rendered, options: Any, *, num_qo_heads: int, mask_ptrs: tuple[int, int] | None = None,
                 user_values: dict[str, dict[str, Any]] | None = None, raw: bool = False) -> object:  # fmt: skip
    """The packed ``VariantParams`` of ``chain`` for a plan: built-in values from the options (and the custom mask's
    device pointers), user variants' from ``user_values`` ({variant name: {param: value}}); array parameters are
    null until run() gives them (``Rendered.pack``'s ``arrays``). ``raw``: the values dict instead, for a caller that
    packs again with each run()'s arrays."""
    values: dict[str, dict[str, Any]] = {}
    for p in chain.pieces:
        if p is window.WINDOW:
            values[p.name] = window.values(options.window_left)
        elif p is alibi.ALIBI:
            values[p.name] = alibi.values(num_qo_heads)
        elif p is soft_cap.SOFT_CAP:
            values[p.name] = soft_cap.values(options.logits_soft_cap)
        elif p is rope.ROPE:
            values[p.name] = rope.values(options.rope_scale, options.rope_theta)
        elif p is custom_mask.CUSTOM_MASK:
            if mask_ptrs is None:
                raise ValueError("the custom_mask variant needs the mask's device pointers")
            values[p.name] = custom_mask.values(*mask_ptrs)
        elif any(not q.is_array for q in p.params):
            got = (user_values or {}).get(p.name)
            want = {q.name for q in p.params if not q.is_array}
            if got is None or set(got) != want:
                raise ValueError(
                    f"variant {p.name!r} takes parameters {sorted(want)}; pass variant_params={{{p.name!r}: "
                    f"{{...}}}} with exactly those (got {sorted(got) if got else None})"
                )
            values[p.name] = got
    return values if raw else chain.pack(values)
