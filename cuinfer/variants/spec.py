"""``Variant``: an attention variant as a few CUDA snippets and typed parameters (the paper's JIT-compiled variants).

A variant changes attention at fixed points of the decode and prefill kernels (kernel_src/variants/contract.cuh);
each point is an optional snippet of CUDA C++ that cuinfer renders into a device functor and compiles with NVRTC.
Built-in variants (causal, sliding window, soft cap, ALiBi, custom mask, RoPE; ``cuinfer/variants/builtins/``) are
written exactly like this, so a user's variant gets the same kernels and the same speed.

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
  ``logits``            ``x`` (float: the natural logit q·k·sm_scale), ``kv_idx`` (int) -> the new natural logit
  ``mask``              ``kv_idx`` -> bool (False drops the key); applied on every tile
  ``key_hi``            -> an exclusive upper bound on the keys of the row (e.g. causal: ``qpos + 1``); tiles past
                        every row's bound are skipped, boundary tiles masked
  ``key_lo``            -> an inclusive lower bound (e.g. a sliding window: ``qpos - params.window_left``)
  ``dim_state``         ``dim`` (in [0, head_dim / 2)) -> fills ``state`` (fields declared by ``state_fields``), once
                        per kernel thread: per-dimension constants of the transforms
  ``query_transform``   ``state``, ``dim``, ``x`` = q[dim], ``partner`` = q[dim ± head_dim/2], ``pos`` (= qpos)
                        -> q'[dim] (rotate-half RoPE is one)
  ``key_transform``     as query_transform for k of key ``pos`` (= kv_idx)
A snippet is either an expression (``"params.cap * fmath::tanh(x * params.inv_cap)"``) or statements with a
``return`` (``dim_state``: statements that fill ``state``). ``mask`` applies on every tile and ``key_hi`` /
``key_lo`` only on the tiles their bounds cross: which one a variant uses is its explicit choice, never inferred.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PARAM_KINDS = ("i32", "u32", "i64", "f32", "f64", "ptr")
SNIPPETS = ("logits", "mask", "key_hi", "key_lo", "dim_state", "query_transform", "key_transform")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Param:
    """A typed parameter of a variant: ``kind`` is one of i32, u32, i64, f32, f64 (scalars) or ptr (a device
    address)."""

    name: str
    kind: str = "f32"

    def __post_init__(self) -> None:
        if not _IDENT.match(self.name):
            raise ValueError(f"parameter name {self.name!r} is not a C identifier")
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"parameter {self.name!r} has kind {self.kind!r}; kinds are {', '.join(PARAM_KINDS)}")


@dataclass(frozen=True)
class Variant:
    """An attention variant: CUDA snippets for the functors of the contract, typed parameters, and optionally NumPy
    functions that let the CPU reference backend run it (see the module docstring for every name a snippet may use).

    Frozen and hashable: equal specs share one compiled kernel (the kernel cache key covers the snippets).
    """

    name: str
    logits: str | None = None
    mask: str | None = None
    key_hi: str | None = None
    key_lo: str | None = None
    dim_state: str | None = None
    state_fields: str = ""
    query_transform: str | None = None
    key_transform: str | None = None
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

    @property
    def transforms(self) -> bool:
        return bool(self.query_transform or self.key_transform)

    def snippet_items(self) -> list[tuple[str, str]]:
        return [(s, getattr(self, s)) for s in SNIPPETS if getattr(self, s)]
