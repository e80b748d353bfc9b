"""Attention variants on the CPU reference backend: one request's attention as a chain of *steps*, float64.

A step is one variant of a chain as NumPy sees it: optional functions of the variant contract (docs/variants.md,
"NumPy functions": ``logits``, ``mask``, ``key_hi``, ``key_lo``, ``sink``, ``query_transform``, ``key_transform``,
``value_transform``, ``output_transform``), whether it keeps the softmax, and its ``params``. ``attend`` applies a
chain the way the kernels do: q / k / v transforms first, logits in chain order, masks and key bounds intersected,
then either the softmax (with the row's sink, if a step has one, as an extra key of value 0 in the denominator) or,
when a step sets ``softmax=False``, the plain weighted sum ``Σ_j w_j v_j`` with lse ``log2(Σ_j w_j)``; then
``v_scale`` and the output transforms, in order.

The built-ins have their own steps here (``causal``, ``window``, ``custom_mask``, ``alibi``, ``soft_cap``, ``rope``,
``rope_llama31``, ``sinks``, ``sigmoid``), each written from the semantics (docs/api.md, docs/variants.md) rather than
from the variant's CUDA; a user's variant becomes a step through its NumPy functions (``user``).

Shapes (one request of ``L`` query tokens, ``K`` keys, ``Hq`` query heads, ``Hkv`` KV heads): logits ``x`` is
``[L, Hq, K]``; ``qo_idx``, ``qpos`` are ``[L, 1, 1]``, ``qo_head``, ``kv_head`` ``[1, Hq, 1]``, ``kv_idx``
``[1, 1, K]``. Transforms see whole vectors: q ``[L, Hq, D]`` at ``pos = qpos``, k ``[K, Hkv, D]`` at ``pos = kv_idx``
(``[K, 1, 1]``), v ``[K, Hkv, Dv]``, ``dim`` ``[1, 1, D]``; in k / v transforms and key bounds the query names are
-1, as in the kernels. o ``[L, Hq, Dv]`` with ``lse`` ``[L, Hq, 1]`` for output transforms.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from cuinfer.reference.positional import alibi_slopes

LOG2E = 1.0 / math.log(2.0)
_ROW_BLOCK_ELEMS = 1 << 22  # score elements per block of query rows (as core.py)


@dataclass(frozen=True)
class Step:
    """One variant of a chain on the CPU reference backend (see the module docstring)."""

    name: str
    logits: Callable[..., Any] | None = None
    mask: Callable[..., Any] | None = None
    key_hi: Callable[..., Any] | None = None
    key_lo: Callable[..., Any] | None = None
    sink: Callable[..., Any] | None = None
    query_transform: Callable[..., Any] | None = None
    key_transform: Callable[..., Any] | None = None
    value_transform: Callable[..., Any] | None = None
    output_transform: Callable[..., Any] | None = None
    softmax: bool = True
    params: Any = None


@functools.lru_cache(maxsize=256)
def _accepts(fn: Callable[..., Any]) -> tuple[frozenset[str], bool]:
    """The keyword names ``fn`` declares, and whether it takes ``**kwargs``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return frozenset(), True
    names = frozenset(
        n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )  # fmt: skip
    return names, any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def call(fn: Callable[..., Any], names: dict[str, Any]) -> Any:
    """``fn`` called with the keywords of ``names`` it declares (all of them when it takes ``**kwargs``)."""
    accepted, var = _accepts(fn)
    return fn(**(names if var else {k: v for k, v in names.items() if k in accepted}))


# ---- built-in steps, from the semantics ----------------------------------------------------------------------------


def causal() -> Step:
    """Bottom-right causal: the query at ``qpos`` keeps keys ``j <= qpos``."""
    return Step("causal", key_hi=lambda qpos: qpos + 1)


def window(window_left: int) -> Step:
    """Sliding window: keys ``j >= qpos - window_left``."""
    return Step("window", key_lo=lambda qpos: qpos - int(window_left))


def custom_mask(masks: Sequence[np.ndarray]) -> Step:
    """Per request a ``[qo_len, kv_len]`` bool mask (True keeps)."""

    def mask(batch, qo_idx, kv_idx):
        return np.asarray(masks[batch], dtype=bool)[qo_idx[:, 0, 0]][:, None, :]

    return Step("custom_mask", mask=mask)


def alibi(num_qo_heads: int) -> Step:
    slopes = alibi_slopes(num_qo_heads)
    return Step("alibi", logits=lambda x, kv_idx, qpos, qo_head: x + slopes[qo_head] * (kv_idx - qpos))


def soft_cap(cap: float) -> Step:
    return Step("soft_cap", logits=lambda x: cap * np.tanh(x / cap))


def rotate_half(x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE of ``x [..., D]`` at positions ``pos`` (broadcast against ``x[..., :1]``): pair
    ``(i, i + D/2)`` turns by ``pos · inv_freq[i]``."""
    half = x.shape[-1] // 2
    angle = np.asarray(pos, dtype=np.float64) * inv_freq
    cos, sin = np.cos(angle), np.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_inv_freq(head_dim: int, rope_scale: float, rope_theta: float) -> np.ndarray:
    """``rope_theta^(-2i/D) / rope_scale`` for pairs i < D/2 (``rope_llama``)."""
    return float(rope_theta) ** (-2.0 * np.arange(head_dim // 2) / head_dim) / float(rope_scale)


def llama31_inv_freq(
    head_dim: int, rope_theta: float, rope_scale: float, low_freq_factor: float, high_freq_factor: float,
    original_max_position: int,
) -> np.ndarray:  # fmt: skip
    """Llama 3.1's RoPE frequencies (its ``apply_scaling``), pair by pair: with wavelength ``λ = 2π / f`` and
    ``L = original_max_position``, keep ``f`` when ``λ < L / high_freq_factor``, use ``f / rope_scale`` when
    ``λ > L / low_freq_factor``, and in between interpolate with ``t = (L / λ - low) / (high - low)``."""
    out = []
    for i in range(head_dim // 2):
        f = float(rope_theta) ** (-2.0 * i / head_dim)
        wavelen = 2 * math.pi / f
        if wavelen < original_max_position / high_freq_factor:
            out.append(f)
        elif wavelen > original_max_position / low_freq_factor:
            out.append(f / rope_scale)
        else:
            t = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - t) * f / rope_scale + t * f)
    return np.array(out)


def _rope_step(name: str, inv_freq_of: Callable[[int], np.ndarray]) -> Step:
    def q_rot(x, pos):
        return rotate_half(x, pos, inv_freq_of(x.shape[-1]))

    return Step(name, query_transform=q_rot, key_transform=q_rot)


def rope(rope_scale: float, rope_theta: float) -> Step:
    """``rope_llama``: q at ``qpos``, k at its index, angle ``pos / rope_scale · rope_theta^(-2i/D)``."""
    return _rope_step("rope", lambda d: rope_inv_freq(d, rope_scale, rope_theta))


def rope_llama31(**values: float) -> Step:
    """RoPE with Llama 3.1 frequencies (``llama31_inv_freq``'s keywords)."""
    return _rope_step("rope_llama31", lambda d: llama31_inv_freq(d, **values))


def sinks(logits: np.ndarray) -> Step:
    """Attention sinks: query head h's row gets an extra key of natural logit ``logits[h]`` and value 0."""
    s = np.asarray(logits, dtype=np.float64)
    return Step("sinks", sink=lambda qo_head: s[qo_head])


def sigmoid(bias: float) -> Step:
    """Sigmoid attention: weight ``1 / (1 + e^-(x + bias))``, no softmax."""
    return Step("sigmoid", logits=lambda x: 1.0 / (1.0 + np.exp(-(x + bias))), softmax=False)


def user(variant: Any, params: dict[str, Any]) -> Step:
    """A user's ``cuinfer.Variant`` through its NumPy functions (``variant.numpy``); ``params`` its values (arrays
    as NumPy arrays)."""
    fns = dict(variant.numpy or {})
    if "slope" in fns:  # a linear key bias: logits x + slope * kv_dist
        fns["logits"] = _slope_logits(fns.pop("slope"))
    if variant.logits_scale and "logits" in fns:  # logit = c * logits(x / c)
        fns["logits"] = _scaled_logits(fns["logits"], float(params[variant.logits_scale]))
    return Step(variant.name, softmax=variant.softmax, params=SimpleNamespace(**params), **fns)


def _scaled_logits(logits: Callable[..., Any], c: float) -> Callable[..., Any]:
    """The logits of a variant with ``logits_scale``: ``c * logits(x / c, ...)`` (the other names passed through)."""

    def scaled(**names):
        return c * call(logits, dict(names, x=names["x"] / c))

    return scaled


def _slope_logits(slope: Callable[..., Any]) -> Callable[..., Any]:
    """The logits of a ``slope`` NumPy function: ``x + slope(...) * kv_dist`` (``slope`` called with the index names
    its signature declares)."""

    def logits(x, kv_dist, batch, qo_idx, qpos, qo_head, kv_head, qo_len, kv_len, head_dim, params):
        names = dict(batch=batch, qo_idx=qo_idx, qpos=qpos, qo_head=qo_head, kv_head=kv_head, qo_len=qo_len,
                     kv_len=kv_len, head_dim=head_dim, params=params)  # fmt: skip
        return x + call(slope, names) * kv_dist

    return logits


# ---- one request ---------------------------------------------------------------------------------------------------


def _head_scale(name: str, x: Any, hkv: int, g: int) -> Any:
    """A scale (None: 1, a number, or one value per KV head: fp8 caches) as a float or float64 ``[1, Hq, 1]``."""
    if x is None:
        return 1.0
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        return float(a)
    if a.ndim != 1 or a.shape[0] not in (1, hkv):
        raise ValueError(f"{name} must be a number or hold one value per KV head ({hkv}) but has shape {a.shape}")
    return np.repeat(np.broadcast_to(a, (hkv,)), g)[None, :, None]


def attend(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, steps: Sequence[Step], *, batch: int = 0,
    sm_scale: float | None = None, k_scale: Any = None, v_scale: Any = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """One request through a chain of steps: q ``[L, Hq, D]``, k ``[K, Hkv, D]``, v ``[K, Hkv, Dv]`` (any float
    dtype, fp8 included) -> float64 ``(o [L, Hq, Dv], lse [L, Hq])``, lse base 2. ``batch`` is the request's index
    (what a step's functions see as ``batch``). ``k_scale`` / ``v_scale``: numbers or one value per KV head (the
    dequantisation scales of an fp8 cache): the logits q·k·sm_scale·k_scale, before the steps' logits, and o·v_scale,
    before their output transforms."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    lq, hq, d = q.shape
    lkv, hkv, dv = v.shape
    if k.shape[:2] != (lkv, hkv) or k.shape[2] != d or hq % max(hkv, 1):
        raise ValueError(f"attend: q {q.shape}, k {k.shape}, v {v.shape} are not one request's [tokens, heads, dim]")
    g = hq // hkv
    scale = (1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)) * _head_scale("k_scale", k_scale, hkv, g)
    base = dict(batch=int(batch), qo_len=lq, kv_len=lkv, head_dim=d)
    qo_head = np.arange(hq)[None, :, None]
    kv_head_q = qo_head // g
    kv_pos = np.arange(lkv)[:, None, None]
    none = dict(qo_idx=-1, qpos=-1, qo_head=-1)
    for st in steps:
        names = dict(base, params=st.params)
        if st.query_transform is not None:
            qo_idx = np.arange(lq)[:, None, None]
            qpos = qo_idx + lkv - lq
            q = np.broadcast_to(call(st.query_transform, dict(
                names, x=q, pos=qpos, dim=np.arange(d)[None, None, :], qo_idx=qo_idx, qpos=qpos, qo_head=qo_head,
                kv_head=kv_head_q)), q.shape).astype(np.float64)  # fmt: skip
        if st.key_transform is not None:
            k = np.broadcast_to(call(st.key_transform, dict(
                names, **none, x=k, pos=kv_pos, kv_idx=kv_pos, dim=np.arange(d)[None, None, :],
                kv_head=np.arange(hkv)[None, :, None])), k.shape).astype(np.float64)  # fmt: skip
        if st.value_transform is not None:
            v = np.broadcast_to(call(st.value_transform, dict(
                names, **none, x=v, kv_idx=kv_pos, dim=np.arange(dv)[None, None, :],
                kv_head=np.arange(hkv)[None, :, None])), v.shape).astype(np.float64)  # fmt: skip
    softmax = all(st.softmax for st in steps)
    o = np.zeros((lq, hq, dv))
    lse = np.full((lq, hq), -np.inf)
    kv_idx = np.arange(lkv)[None, None, :]
    rows = max(1, _ROW_BLOCK_ELEMS // max(1, hq * lkv))
    qg = q.reshape(lq, hkv, g, d)
    for r0 in range(0, lq, rows):
        r1 = min(lq, r0 + rows)
        qo_idx = np.arange(r0, r1)[:, None, None]
        qpos = qo_idx + lkv - lq
        ix = dict(base, qo_idx=qo_idx, qpos=qpos, qo_head=qo_head, kv_head=kv_head_q)
        s = np.einsum("lhgd,khd->lhgk", qg[r0:r1], k).reshape(r1 - r0, hq, lkv) * scale
        keep = np.ones(s.shape, dtype=bool)
        sink = None
        for st in steps:
            names = dict(ix, params=st.params)
            if st.logits is not None:
                args = dict(names, x=s, kv_idx=kv_idx, kv_dist=kv_idx - qpos)
                s = np.broadcast_to(call(st.logits, args), s.shape).astype(np.float64)
            if st.mask is not None:
                keep &= np.broadcast_to(np.asarray(call(st.mask, dict(names, kv_idx=kv_idx)), dtype=bool), s.shape)
            bound = dict(names, qo_head=-1)
            if st.key_hi is not None:
                keep &= kv_idx < np.asarray(call(st.key_hi, bound))
            if st.key_lo is not None:
                keep &= kv_idx >= np.asarray(call(st.key_lo, bound))
            if st.sink is not None:
                sink = np.broadcast_to(np.asarray(call(st.sink, names), dtype=np.float64), (r1 - r0, hq, 1))[..., 0]
        if softmax:
            s = np.where(keep, s, -np.inf)
            m = s.max(axis=-1, initial=-np.inf)
            if sink is not None:
                m = np.maximum(m, sink)
            empty = m == -np.inf
            ref = np.where(empty, 0.0, m)
            p = np.exp(s - ref[..., None])
            den = p.sum(axis=-1) + (0.0 if sink is None else np.exp(sink - ref))
            safe = np.where(den > 0, den, 1.0)
            out = np.einsum("lhgk,khd->lhgd", p.reshape(r1 - r0, hkv, g, lkv), v).reshape(r1 - r0, hq, dv)
            o[r0:r1] = out / safe[..., None]
            lse[r0:r1] = np.where(den > 0, (ref + np.log(safe)) * LOG2E, -np.inf)
        else:
            p = np.where(keep, s, 0.0)
            den = p.sum(axis=-1)
            o[r0:r1] = np.einsum("lhgk,khd->lhgd", p.reshape(r1 - r0, hkv, g, lkv), v).reshape(r1 - r0, hq, dv)
            lse[r0:r1] = np.where(den > 0, np.log2(np.where(den > 0, den, 1.0)), -np.inf)
    o *= _head_scale("v_scale", v_scale, hkv, g)
    if any(st.output_transform is not None for st in steps):
        qo_idx = np.arange(lq)[:, None, None]
        ix = dict(base, qo_idx=qo_idx, qpos=qo_idx + lkv - lq, qo_head=qo_head, kv_head=kv_head_q)
        for st in steps:
            if st.output_transform is not None:
                o = np.broadcast_to(call(st.output_transform, dict(
                    ix, params=st.params, x=o, lse=lse[..., None], dim=np.arange(dv)[None, None, :])),
                    o.shape).astype(np.float64)  # fmt: skip
    return o, lse
