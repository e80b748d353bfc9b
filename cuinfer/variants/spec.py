"""``Variant``: an attention variant as a few CUDA snippets and typed parameters (the paper's JIT-compiled variants).

A variant changes attention at fixed points of the decode and prefill kernels (kernel_src/variants/contract.cuh);
each point is an optional snippet of CUDA C++ that cuinfer renders into a device functor and compiles with NVRTC.
Built-in variants (causal, sliding window, soft cap, ALiBi, custom mask, RoPE, Llama-3.1 RoPE, attention sinks,
sigmoid attention; ``cuinfer/variants/builtins/``) are written exactly like this, so a user's variant gets the same
kernels and the same speed.

Names a snippet may use (every snippet):
  ``params``            the variant's parameters (``params.<name>`` for each ``Param``)
  ``batch``             the request (int)
  ``qo_idx``            the query token within the request (int)
  ``qpos``              its kv position ``qo_idx + kv_len - qo_len`` (int; bottom-right aligned)
  ``qo_head``, ``kv_head``   the query head and its KV head (int; -1 in ``key_hi`` / ``key_lo``: a bound may not
                        depend on the head)
  ``qo_len``, ``kv_len``     query tokens and keys of the request (int)
  ``head_dim``          the head dimension (int)
  and the helpers of kernel_src/common/math.cuh (``fmath::tanh``, ``fmath::ex2``, ``fmath::alibi_slope``, ...).
Per snippet:
  ``logits``            ``x`` (float: the natural logit q·k·sm_scale), ``kv_idx`` (int), ``kv_dist`` (float: the
                        key's distance ``kv_idx - qpos``, exact below 2^24; the prefill kernel derives it with one FADD
                        per logit from a per-tile base, where ``static_cast<float>(kv_idx - qpos)`` costs an integer
                        add and a conversion, a quarter-rate op), ``row`` (the row's state, when the variant has a
                        ``row_state``) -> the new natural logit (with ``softmax=False``: the key's weight)
  ``slope``             -> the row's slope ``a`` of a linear key bias (``row``, the index names; not ``x``, ``kv_idx``):
                        the variant's logit is ``x + a * kv_dist`` (ALiBi: ``row.slope``). Written as a slope (and not
                        as that ``logits``) the bias is the same, but prefill folds it into the Q·K^T accumulators'
                        initial values, one FFMA per logit, when every piece before it in the chain has no logits
                        (elsewhere, and in decode, it is applied as that ``logits``). A variant has ``slope`` or
                        ``logits``, not both
  ``row_state``         -> fills ``row`` (fields declared by ``row_fields``), once per query row (token and query head)
                        before the KV loop, not per key: per-row constants of ``logits`` / ``slope`` (ALiBi's slope of
                        ``qo_head``: ``row.slope = fmath::alibi_slope(qo_head, params.num_qo_heads);``)
  ``mask``              ``kv_idx`` -> bool (False drops the key); applied on every tile
  ``key_hi``            -> an exclusive upper bound on the keys of the row (e.g. causal: ``qpos + 1``); tiles past
                        every row's bound are skipped, boundary tiles masked
  ``key_lo``            -> an inclusive lower bound (e.g. a sliding window: ``qpos - params.window_left``)
  ``sink``              -> the row's sink logit (natural, like ``x``): a key of value 0 that joins the softmax
                        denominator once per row (gpt-oss attention sinks); ``neg_inf()`` for none
  ``dim_state``         ``dim`` (in [0, head_dim / 2)) -> fills ``state`` (fields declared by ``state_fields``), once
                        per kernel thread: per-dimension constants of the transforms
  ``query_transform``   ``state``, ``dim``, ``x`` = q[dim], ``partner`` = q[dim ± head_dim/2], ``pos`` (= qpos)
                        -> q'[dim] (rotate-half RoPE is one)
  ``key_transform``     as query_transform for k of key ``pos`` (= kv_idx), and ``kpos``: the key's ``pos_state``
                        (with one)
  ``pos_state``         ``state``, ``dim`` (< head_dim / 2), ``pos`` (a key position) -> fills ``kpos`` (fields
                        declared by ``pos_fields``): what key_transform needs of (pos, dim) alone, e.g. RoPE's sin and
                        cos, computed once per key and dimension pair (not per head, nor per element of the pair)
  ``pos_advance``       ``state``, ``dim``, ``kpos`` (the pos_state of some pos, updated in place), ``step`` (the
                        pos_state of a distance n) -> turns ``kpos`` into the pos_state of pos + n (RoPE: the angle
                        addition, a complex multiply). Decode computes each thread's first key of a K tile exactly and
                        advances it to the thread's further keys of the tile (n = its row stride, at most
                        tile / stride - 1 advances, re-seeded every tile; the tensor-core kernel at head dim <= 128:
                        n = 8, one advance, keys rotated on their MMA fragments, and at 128 the first key carried
                        from tile to tile, n = 64, exact every 16th tile); prefill computes every key exactly
  ``value_transform``   ``kv_idx``, ``dim`` (< head_dim_vo), ``x`` = v[dim] -> v'[dim]; ``qo_idx``, ``qpos`` and
                        ``qo_head`` are -1 (a value serves every query row and head of its KV head)
  ``output_transform``  ``dim``, ``x`` = o[dim] (final: normalised, v_scale applied), ``lse`` (the row's base-2 lse)
                        -> o'[dim], once per output element
A snippet is either an expression (``"params.cap * fmath::tanh(x * params.inv_cap)"``) or statements with a
``return`` (``dim_state`` / ``row_state``: statements that fill ``state`` / ``row``). ``mask`` applies on every tile
and ``key_hi`` / ``key_lo`` only on the tiles their bounds cross: which one a variant uses is its explicit choice,
never inferred.

``softmax=False`` (sigmoid attention): the output is ``Σ_j w_j v_j`` with ``w_j`` the chain's logits output for key j
(masked keys 0), no max, no normalisation; lse is ``log2(Σ_j w_j)`` (-inf for a row without keys). Prefill never
splits the KV of such a plan, nor of one with an output transform (the merge kernel of split pieces knows neither);
decode merges split pieces inside its kernel (by adding, without softmax).

``rising_logits=True`` says the ``logits`` snippet makes a row's logits climb along the keys by much more than the
raw scores vary (ALiBi's bias toward the diagonal: up to ~54 natural units per 64 keys). The prefill kernel's
max-free softmax (a tile's exponentials taken against the reference max of earlier tiles, the tile computed again
on the exact path when they climb too far) would fail on almost every tile, so with the flag prefill runs an item's
KV tiles in descending key order (the largest logits first) and a warp that still fails keeps the exact path for the
rest of the item. Explicit, never inferred; results are the same either way.

``logits_scale="c"`` names a scalar f32 parameter ``c > 0`` of a variant whose logits saturate at ``±c`` (the soft
cap): its ``logits`` snippet gets ``x / c`` and returns ``r`` with ``|r| <= 1``, and the logit is ``c * r``
(``logits="fmath::tanh_approx(x)", logits_scale="cap"`` is ``cap * tanh(x / cap)``). Written so, the kernels fold
``c`` and ``1 / c`` into the scales they already apply (the Hopper prefill kernel: one multiply per logit before the
snippet, none after it), and where a chain's only logits piece is such a variant, the bound ``|logit| <= c`` lets
that kernel take its softmax against a fixed reference instead of a running max (bfloat16, ``c <= 54``: every
exponential stays within float's range; no per-tile max, no rescaling of the output). ``|r| <= 1`` is the snippet's
promise, never checked: a snippet that breaks it may overflow. The NumPy ``logits`` function of such a variant takes
``x / c`` and returns ``r`` too.

Parameters (``Param``) are scalars given at plan() (``variant_params={variant: {param: value}}``) or, with ``per=``,
arrays given at run() (``variant_arrays={param: array}``): one element per query head (``"qo_head"``), KV head
(``"kv_head"``) or request (``"request"``), any framework's array on the call's device (NumPy on the CPU path),
read in a snippet as ``params.<name>[qo_head]``.

``numpy``: NumPy functions of the same names (all but ``dim_state``) let the CPU reference backend run the variant on
NumPy inputs; each is called with the keywords its signature names (see ``NUMPY_NAMES``), on whole blocks:
``x`` of logits is ``[qo_len, num_qo_heads, kv_len]``, index names broadcast against it (``qo_idx``, ``qpos``:
``[qo_len, 1, 1]``; ``qo_head``, ``kv_head``: ``[1, num_qo_heads, 1]``; ``kv_idx``: ``[1, 1, kv_len]``), ``params`` a
namespace of the values (arrays whole, so ``params.sinks[qo_head]`` works as in CUDA). See docs/variants.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PARAM_KINDS = ("i32", "u32", "i64", "f32", "f64", "ptr")
ARRAY_KINDS = ("i32", "i64", "f32", "f64")  # element kinds of an array parameter (per=...)
PER = ("qo_head", "kv_head", "request")  # what an array parameter has one element of
SNIPPETS = (
    "logits", "slope", "mask", "key_hi", "key_lo", "sink", "dim_state", "row_state", "query_transform", "key_transform",
    "pos_state", "pos_advance", "value_transform", "output_transform",
)  # fmt: skip
# The NumPy functions of a variant (``Variant.numpy``): one per snippet but dim_state and row_state (NumPy transforms
# take whole vectors; NumPy logits compute what they need), with the keyword names each may declare
# (docs/variants.md, "NumPy functions").
_INDEX = ("batch", "qo_idx", "qpos", "qo_head", "kv_head", "qo_len", "kv_len", "head_dim", "params")
NUMPY_NAMES: dict[str, tuple[str, ...]] = {
    "logits": ("x", "kv_idx", "kv_dist", *_INDEX),
    "slope": _INDEX,
    "mask": ("kv_idx", *_INDEX),
    "key_hi": _INDEX,
    "key_lo": _INDEX,
    "sink": _INDEX,
    "query_transform": ("x", "pos", "dim", *_INDEX),
    "key_transform": ("x", "pos", "kv_idx", "dim", *_INDEX),
    "value_transform": ("x", "kv_idx", "dim", *_INDEX),
    "output_transform": ("x", "lse", "dim", *_INDEX),
}
# The parameter the renderer adds to a variant with logits_scale: 1 / c, computed when the parameters are packed.
LOGITS_INV_SCALE = "logits_inv_scale_"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Param:
    """A typed parameter of a variant: ``kind`` is one of i32, u32, i64, f32, f64 (scalars) or ptr (a device
    address), given at plan(). With ``per`` ("qo_head", "kv_head" or "request") it is an array of ``kind`` elements
    (not ptr), one per query head / KV head / request, given at run() (``variant_arrays=``); a snippet reads it as
    ``params.<name>[qo_head]`` (a ``const float*`` for f32)."""

    name: str
    kind: str = "f32"
    per: str | None = None

    def __post_init__(self) -> None:
        if not _IDENT.match(self.name):
            raise ValueError(f"parameter name {self.name!r} is not a C identifier")
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"parameter {self.name!r} has kind {self.kind!r}; kinds are {', '.join(PARAM_KINDS)}")
        if self.per is not None:
            if self.per not in PER:
                raise ValueError(
                    f"parameter {self.name!r} has per={self.per!r}; an array parameter has one element per "
                    f"{' / '.join(PER)} (or per=None for a scalar)"
                )
            if self.kind not in ARRAY_KINDS:
                raise ValueError(
                    f"array parameter {self.name!r} has kind {self.kind!r}; its elements are one of "
                    f"{', '.join(ARRAY_KINDS)}"
                )

    @property
    def is_array(self) -> bool:
        return self.per is not None


@dataclass(frozen=True)
class Variant:
    """An attention variant: CUDA snippets for the functors of the contract, typed parameters, and optionally NumPy
    functions that let the CPU reference backend run it (see the module docstring for every name a snippet may use).

    Frozen and hashable: equal specs share one compiled kernel (the kernel cache key covers the snippets).
    """

    name: str
    logits: str | None = None
    slope: str | None = None  # a linear key bias: logits x + slope * kv_dist, which prefill may fold into Q·K^T
    mask: str | None = None
    key_hi: str | None = None
    key_lo: str | None = None
    dim_state: str | None = None
    state_fields: str = ""
    row_state: str | None = None
    row_fields: str = ""
    query_transform: str | None = None
    key_transform: str | None = None
    pos_state: str | None = None
    pos_fields: str = ""
    pos_advance: str | None = None
    sink: str | None = None
    value_transform: str | None = None
    output_transform: str | None = None
    softmax: bool = True  # False: weights from `logits`, summed without normalisation (sigmoid attention)
    rising_logits: bool = False  # True: `logits` climb along the keys (ALiBi): prefill runs the KV tiles backwards
    logits_scale: str | None = None  # a scalar f32 parameter c: logits gets x / c, returns r (|r| <= 1); logit c * r
    params: tuple[Param, ...] = ()
    # NumPy functions for the CPU reference backend (name -> callable; see cuinfer.reference); not part of identity
    numpy: dict[str, Callable[..., Any]] | None = field(default=None, compare=False, hash=False)
    doc: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not _IDENT.match(self.name):
            raise ValueError(f"variant name {self.name!r} is not a C identifier (letters, digits, _)")
        if not any(getattr(self, s) for s in SNIPPETS):
            raise ValueError(f"variant {self.name!r} has no snippet: give at least one of {', '.join(SNIPPETS)}")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"variant {self.name!r} declares a parameter twice: {names}")
        transforms = self.query_transform or self.key_transform
        if self.dim_state and not transforms:
            raise ValueError(f"variant {self.name!r}: dim_state is only used by query_transform / key_transform")
        if self.state_fields and not self.dim_state:
            raise ValueError(f"variant {self.name!r}: state_fields without a dim_state snippet that fills them")
        if self.slope and self.logits:
            raise ValueError(
                f"variant {self.name!r} has both slope and logits: a slope's logits are x + slope * kv_dist; write "
                "the other transform as a variant of its own, after this one in the chain"
            )
        if self.row_state and not (self.logits or self.slope):
            raise ValueError(f"variant {self.name!r}: row_state is only read by logits / slope (as row.<field>)")
        if self.row_state and not self.row_fields:
            raise ValueError(f"variant {self.name!r}: row_state without row_fields that declare what it fills")
        if self.row_fields and not self.row_state:
            raise ValueError(f"variant {self.name!r}: row_fields without a row_state snippet that fills them")
        if self.pos_state and not self.key_transform:
            raise ValueError(f"variant {self.name!r}: pos_state is only used by key_transform (as kpos)")
        if self.pos_fields and not self.pos_state:
            raise ValueError(f"variant {self.name!r}: pos_fields without a pos_state snippet that fills them")
        if self.pos_advance and not self.pos_state:
            raise ValueError(f"variant {self.name!r}: pos_advance moves a pos_state on, but there is no pos_state")
        if not self.softmax and not self.logits:
            raise ValueError(
                f"variant {self.name!r} has softmax=False but no logits snippet: without softmax a key's weight is "
                "what logits returns (e.g. sigmoid attention: logits='fmath::sigmoid(x + params.bias)')"
            )
        if self.rising_logits and not (self.logits or self.slope):
            raise ValueError(
                f"variant {self.name!r} has rising_logits=True but no logits or slope snippet: the flag describes "
                "what they do to x along the keys"
            )
        if self.logits_scale is not None:
            scalar_f32 = [p.name for p in self.params if p.kind == "f32" and not p.is_array]
            if self.logits_scale not in scalar_f32:
                raise ValueError(
                    f"variant {self.name!r}: logits_scale={self.logits_scale!r} must name one of its scalar f32 "
                    f"parameters (it has {scalar_f32}); e.g. params=(Param('cap', 'f32'),), logits_scale='cap'"
                )
            if not self.logits:
                raise ValueError(
                    f"variant {self.name!r} has logits_scale but no logits snippet: the scale is of what logits "
                    "returns (logit = c * logits(x / c))"
                )
        if any(p.name == LOGITS_INV_SCALE for p in self.params):
            raise ValueError(
                f"variant {self.name!r}: the parameter name {LOGITS_INV_SCALE!r} is reserved (1 / c of logits_scale)"
            )
        if not self.softmax and self.sink:
            raise ValueError(f"variant {self.name!r}: a sink joins a softmax denominator; softmax=False has none")
        if self.numpy is not None:
            if not isinstance(self.numpy, dict):
                raise TypeError(f"variant {self.name!r}: numpy must be a dict {{snippet name: function}}")
            unknown = sorted(set(self.numpy) - set(NUMPY_NAMES))
            if unknown:
                raise ValueError(
                    f"variant {self.name!r}: numpy names {unknown}, which are not NumPy functions of a variant "
                    f"({', '.join(NUMPY_NAMES)})"
                )
            for key, fn in self.numpy.items():
                if not callable(fn):
                    raise TypeError(f"variant {self.name!r}: numpy[{key!r}] must be a function but is {fn!r}")

    @property
    def transforms(self) -> bool:
        return bool(self.query_transform or self.key_transform)

    @property
    def has_logits(self) -> bool:
        """Whether the variant changes the logits (a ``logits`` or a ``slope`` snippet)."""
        return bool(self.logits or self.slope)

    def snippet_items(self) -> list[tuple[str, str]]:
        return [(s, getattr(self, s)) for s in SNIPPETS if getattr(self, s)]

    def missing_numpy(self) -> list[str]:
        """The NumPy functions the CPU reference needs to run this variant and ``numpy`` lacks."""
        have = self.numpy or {}
        return [s for s, _ in self.snippet_items() if s in NUMPY_NAMES and s not in have]
