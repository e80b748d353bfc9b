"""Rotary position embedding of q and k outside the attention kernels: FlashInfer's ``apply_rope`` family (ragged
``indptr`` / ``offsets`` or explicit ``pos_ids``; plain or Llama 3.1 frequencies; new arrays or in place) and
``apply_rope_with_cos_sin_cache`` as vLLM and SGLang call it.

Pair i of the first ``rotary_dim`` dims is ``(i, i + rotary_dim/2)`` (rotate-half, "neox", ``interleave=False``) or
``(2i, 2i+1)`` (interleaved, GPT-J); it turns by ``pos * freq_i``; dims ``>= rotary_dim`` are unchanged. The kernel
(``kernel_src/utility/rope.cu``) computes the frequencies in double and range-reduces each angle, does the rotation
in fp32 and rounds each output once to the input dtype. NumPy inputs run the float64 reference
(``cuinfer.reference``), rounded to the input dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cuinfer import reference
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor, as_tensor
from cuinfer.interop.dtypes import DType
from cuinfer.reference import utilities as ref_utils
from cuinfer.runtime.calls import Call, begin
from cuinfer.utils import specs as S
from cuinfer.utils.launch import HALF_DTYPES, Launch, alignment, as_int32, blocks, check_index, sm_count

_POS_DTYPES = (DType.INT32, DType.INT64)


@dataclass(frozen=True)
class Angles:
    """Where a token's angles come from: ``kind`` "pos_ids" (``pos``), "ragged" (``indptr``, ``offsets``) or "table"
    (``pos`` and ``table``, a cos_sin_cache); ``freqs`` = (rope_scale, rope_theta, llama31 factors or None)."""

    kind: str
    pos: Tensor | None = None
    indptr: Tensor | None = None
    offsets: Tensor | None = None
    table: Tensor | None = None
    freqs: tuple[float, float, tuple[float, float, float] | None] = (1.0, 1e4, None)


@dataclass(frozen=True)
class RopeArgs:
    """Checked arguments: q / k as [nnz, heads, head_dim] views."""

    q: Tensor
    k: Tensor
    rotary_dim: int
    interleave: bool
    angles: Angles

    @property
    def nnz(self) -> int:
        return self.q.shape[0]


def _positive(name: str, value: Any) -> float:
    v = float(value)
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a finite number > 0 but is {value!r}")
    return v


def check_freqs(rope_scale: Any, rope_theta: Any, llama31: tuple | None) -> tuple:
    scale, theta = _positive("rope_scale", rope_scale), _positive("rope_theta", rope_theta)
    if llama31 is None:
        return scale, theta, None
    names = ("low_freq_factor", "high_freq_factor", "old_context_len")
    low, high, old = (_positive(n, v) for n, v in zip(names, llama31, strict=True))
    if high <= low:
        raise ValueError(
            f"high_freq_factor must be greater than low_freq_factor but they are {high} and {low}; Llama 3.1 uses 4 "
            "and 1 (the band between old_context_len / high_freq_factor and old_context_len / low_freq_factor)"
        )
    return scale, theta, (low, high, old)


def _rotary_dim(rotary_dim: Any, head_dim: int, name: str = "rotary_dim") -> int:
    r = head_dim if rotary_dim is None else rotary_dim
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 2 or r % 2 or r > head_dim:
        raise ValueError(
            f"{name} must be an even integer in [2, head_dim = {head_dim}] but is {rotary_dim!r}; "
            + ("pass None for the full head dim" if name == "rotary_dim" else "its columns are cos then sin halves")
        )
    return int(r)


def _check_qk(tq: Tensor, tk: Tensor, ndim: int) -> None:
    for name, t in (("q", tq), ("k", tk)):
        validate.check_ndim(name, t, ndim, hint="it is [nnz, num_heads, head_dim]" if ndim == 3 else None)
        validate.check_dtype(name, t, HALF_DTYPES)
        validate.check_last_dim_contiguous(name, t)
    if tk.shape[0] != tq.shape[0] or (ndim == 3 and tk.shape[2] != tq.shape[2]):
        raise ValueError(
            f"q and k must have the same nnz (dim 0) and head_dim (last dim) but have shapes {tq.shape} and "
            f"{tk.shape}; they are the queries and keys of the same tokens"
        )
    validate.check_same_dtype(("q", "k"), (tq, tk))


def check_rope(q: Any, k: Any, angles: dict, *, rotary_dim: Any, interleave: bool, freqs: tuple, tensor) -> RopeArgs:
    """The checks of the apply_rope family (both routes). ``angles``: ``{"pos_ids": x}`` or ``{"indptr": x,
    "offsets": y}``."""
    tq, tk = tensor(q, "q"), tensor(k, "k")
    _check_qk(tq, tk, 3)
    nnz = tq.shape[0]
    r = _rotary_dim(rotary_dim, tq.shape[2])
    if "pos_ids" in angles:
        tp = tensor(angles["pos_ids"], "pos_ids")
        check_index("pos_ids", tp, nnz, dtypes=_POS_DTYPES, hint="one position per row of q")
        validate.check_same_device(("q", "k", "pos_ids"), (tq, tk, tp))
        return RopeArgs(tq, tk, r, bool(interleave), Angles("pos_ids", pos=tp, freqs=freqs))
    ti, to = tensor(angles["indptr"], "indptr"), tensor(angles["offsets"], "offsets")
    check_index("indptr", ti, hint="it is [batch_size + 1]")
    if ti.shape[0] < 1 or (ti.shape[0] == 1 and nnz):
        raise ValueError(
            f"indptr must have batch_size + 1 >= 2 entries for q's {nnz} rows but has {ti.shape[0]}; rows "
            "indptr[b]:indptr[b+1] of q and k are request b's"
        )
    check_index("offsets", to, ti.shape[0] - 1, hint="one position offset per request (len(indptr) - 1)")
    validate.check_same_device(("q", "k", "indptr", "offsets"), (tq, tk, ti, to))
    return RopeArgs(tq, tk, r, bool(interleave), Angles("ragged", indptr=ti, offsets=to, freqs=freqs))


def _heads_view(t: Tensor, head_size: int) -> Tensor:
    """[nnz, H * head_size] (last dim contiguous) seen as [nnz, H, head_size]; a 3-D array as it is."""
    if t.ndim == 3:
        return t
    return replace(t, shape=(t.shape[0], t.shape[1] // head_size, head_size), strides=(t.strides[0], head_size, 1))


def check_rope_table(positions: Any, query: Any, key: Any, head_size: Any, cos_sin_cache: Any, is_neox: bool, tensor):
    """The checks of apply_rope_with_cos_sin_cache (both routes); q / k may be [nnz, H * head_size] or 3-D."""
    tq, tk = tensor(query, "query"), tensor(key, "key")
    if isinstance(head_size, bool) or not isinstance(head_size, (int, np.integer)) or head_size < 2:
        raise ValueError(f"head_size must be an integer >= 2 but is {head_size!r}")
    for name, t in (("query", tq), ("key", tk)):
        validate.check_ndim(name, t, (2, 3), hint="it is [nnz, num_heads * head_size]")
        validate.check_dtype(name, t, HALF_DTYPES)
        validate.check_last_dim_contiguous(name, t)
        if (t.shape[-1] if t.ndim == 2 else t.shape[2]) % head_size or (t.ndim == 3 and t.shape[2] != head_size):
            raise ValueError(
                f"{name} must have num_heads * head_size columns (head_size = {head_size}) but has shape {t.shape}"
            )
    if tq.shape[0] != tk.shape[0]:
        raise ValueError(f"query and key must have the same nnz (dim 0) but have shapes {tq.shape} and {tk.shape}")
    validate.check_same_dtype(("query", "key"), (tq, tk))
    tc = tensor(cos_sin_cache, "cos_sin_cache")
    validate.check_ndim("cos_sin_cache", tc, 2, hint="it is [max_position, rotary_dim]: cos then sin halves")
    validate.check_dtype("cos_sin_cache", tc, (DType.FLOAT32,))
    validate.check_last_dim_contiguous("cos_sin_cache", tc)
    r = _rotary_dim(tc.shape[1], int(head_size), "cos_sin_cache.shape[1] (the rotary dim)")
    tp = tensor(positions, "positions")
    check_index("positions", tp, tq.shape[0], dtypes=_POS_DTYPES, hint="one position per row of query")
    validate.check_same_device(("query", "key", "cos_sin_cache", "positions"), (tq, tk, tc, tp))
    qv, kv = _heads_view(tq, int(head_size)), _heads_view(tk, int(head_size))
    return RopeArgs(qv, kv, r, not bool(is_neox), Angles("table", pos=tp, table=tc)), tq, tk


# ---- GPU launch ----------------------------------------------------------------------------------------------------


def rope_vec(a: RopeArgs, outs: tuple[Tensor, Tensor]) -> int:
    """Elements per chunk: the widest that splits the rotary and pass-through parts and reaches every row."""
    d, r, itemsize = a.q.shape[2], a.rotary_dim, a.q.dtype.itemsize
    reach = min(alignment(t) for t in (a.q, a.k, *outs)) // itemsize
    for v in S.ROPE_VECS[a.q.dtype.value]:
        split = r % v == 0 if a.interleave else (r // 2) % v == 0
        if v <= reach and split and (d - r) % v == 0 and (v >= 2 or not a.interleave):
            return v
    raise ValueError(
        f"q / k must have even head_dim and rows on 4-byte boundaries for interleaved RoPE but head_dim is {d} and "
        f"element 0 or a row stride is not 4-byte aligned; pass contiguous copies of q and k"
    )


def rope_launch(a: RopeArgs, outs: tuple[Tensor, Tensor], inplace: bool, sms: int) -> Launch | None:
    d, r = a.q.shape[2], a.rotary_dim
    heads = a.q.shape[1] + a.k.shape[1]
    if a.nnz == 0 or heads == 0:
        return None
    vec = rope_vec(a, outs)
    rot_units = r // vec if a.interleave else r // 2 // vec
    units = rot_units + (0 if inplace else (d - r) // vec)
    if units > S.ROPE_THREADS:
        raise ValueError(
            f"head_dim {d} with rotary_dim {r} needs {units} threads per row at chunks of {vec} elements (at most "
            f"{S.ROPE_THREADS}); pass q and k with rows on 16-byte boundaries"
        )
    rows = max(1, S.ROPE_THREADS // units)
    needed = -(-a.nnz // rows)
    target = sms * S.ROPE_BLOCKS_PER_SM
    gx = blocks(needed, sms, S.ROPE_BLOCKS_PER_SM)
    groups = 1 if needed >= target else min(heads, -(-target // needed))
    per_group = -(-heads // groups)
    scale, theta, llama31 = a.angles.freqs
    smooth_a = smooth_b = 0.0
    if llama31 is not None:
        low, high, old = llama31
        smooth_a, smooth_b = old / (2 * math.pi * (high - low)), -low / (high - low)
    g = a.angles
    pos_kind = S.POS_RAGGED if g.kind == "ragged" else S.POS_INT64 if g.pos.dtype is DType.INT64 else S.POS_INT32
    qo, ko = outs
    params = S.RopeParams.pack(
        q=a.q.ptr, k=a.k.ptr, q_out=qo.ptr, k_out=ko.ptr,
        q_s0=a.q.strides[0], q_s1=a.q.strides[1], k_s0=a.k.strides[0], k_s1=a.k.strides[1],
        qo_s0=qo.strides[0], qo_s1=qo.strides[1], ko_s0=ko.strides[0], ko_s1=ko.strides[1],
        nnz=a.nnz, num_q_heads=a.q.shape[1], num_k_heads=a.k.shape[1], rotary_dim=r, rot_units=rot_units,
        heads_per_group=per_group, pos_kind=pos_kind,
        pos=0 if g.pos is None else g.pos.ptr, indptr=0 if g.indptr is None else g.indptr.ptr,
        offsets=0 if g.offsets is None else g.offsets.ptr, table=0 if g.table is None else g.table.ptr,
        batch_size=0 if g.indptr is None else g.indptr.shape[0] - 1,
        max_pos=0 if g.table is None else g.table.shape[0], table_s0=0 if g.table is None else g.table.strides[0],
        log2_theta=math.log2(theta), rcp_scale=1.0 / scale, smooth_a=smooth_a, smooth_b=smooth_b,
    )  # fmt: skip
    dtype = a.q.dtype.value
    spec, expr = S.rope_spec(dtype, vec), S.rope_instance(dtype, vec, a.interleave)
    return Launch(spec, expr, (gx, -(-heads // per_group)), (units, rows), params)


def _run_gpu(call: Call, a: RopeArgs, q_user: Tensor, k_user: Tensor, inplace: bool, head_size: int | None):
    """Launch on the call's stream; returns (q_out, k_out) in the caller's framework, or None in place."""
    if inplace:
        for name, t in (("q", q_user), ("k", k_user)):
            if t.framework == "jax":
                raise ValueError(
                    f"{name} must be writable for an in-place RoPE but is a JAX array; JAX arrays are immutable: call "
                    "the form without _inplace, which returns new arrays"
                )
            validate.check_writable(name, t)
        outs = (a.q, a.k)
    else:
        user_outs = (call.empty(q_user.shape, q_user.dtype), call.empty(k_user.shape, k_user.dtype))
        outs = tuple(_heads_view(t, head_size) if head_size else t for t in user_outs)
    launch = rope_launch(a, outs, inplace, sm_count(call.device_id))
    if launch is not None:
        launch.run(call.device_id, call.stream)
    return None if inplace else (call.give(user_outs[0]), call.give(user_outs[1]))


# ---- the CPU reference route ---------------------------------------------------------------------------------------


def _finish_host(q: np.ndarray, k: np.ndarray, q64: np.ndarray, k64: np.ndarray, inplace: bool):
    """Round the float64 results to q's dtype: into q / k in place, or as new arrays."""
    if inplace:
        for name, x in (("q", q), ("k", k)):
            validate.check_writable(name, as_tensor(x, name))
        q[...] = q64.reshape(q.shape).astype(q.dtype)
        k[...] = k64.reshape(k.shape).astype(k.dtype)
        return None
    return q64.reshape(q.shape).astype(q.dtype), k64.reshape(k.shape).astype(k.dtype)


def _host(q: np.ndarray, k: np.ndarray, a: RopeArgs, inplace: bool):
    scale, theta, llama31 = a.angles.freqs
    opts = dict(rotary_dim=a.rotary_dim, interleave=a.interleave, rope_scale=scale, rope_theta=theta, llama31=llama31)
    if a.angles.kind == "pos_ids":
        q64, k64 = reference.apply_rope_pos_ids(q, k, a.angles.pos.numpy(), **opts)
    else:
        validate.check_indptr("indptr", a.angles.indptr.numpy(), last=a.nnz, hint="every row of q is a request's")
        validate.check_index_array("offsets", a.angles.offsets.numpy(), nonnegative=False)
        q64, k64 = reference.apply_rope(q, k, a.angles.indptr.numpy(), a.angles.offsets.numpy(), **opts)
    return _finish_host(q, k, q64, k64, inplace)


def _rope(q, k, angles: dict, *, rotary_dim, interleave, rope_scale, rope_theta, llama31=None, inplace: bool):
    freqs = check_freqs(rope_scale, rope_theta, llama31)
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, freqs=freqs)
    if isinstance(q, np.ndarray):
        return _host(q, k, check_rope(q, k, angles, tensor=as_tensor, **opts), inplace)
    call, _ = begin(q, "q")
    a = check_rope(q, k, angles, tensor=call.tensor, **opts)
    if a.angles.kind == "ragged":
        g = a.angles
        a = replace(a, angles=replace(g, indptr=as_int32(call, g.indptr), offsets=as_int32(call, g.offsets)))
    return _run_gpu(call, a, a.q, a.k, inplace, None)


def _rope_table(positions, query, key, head_size, cos_sin_cache, is_neox, inplace: bool):
    if isinstance(query, np.ndarray):
        a, _, _ = check_rope_table(positions, query, key, head_size, cos_sin_cache, is_neox, as_tensor)
        max_pos = a.angles.table.shape[0]
        pos = a.angles.pos.numpy()
        bad = np.flatnonzero((pos < 0) | (pos >= max_pos))
        if bad.size:
            t = int(bad[0])
            raise ValueError(
                f"positions must be in [0, max_position = {max_pos}) (the rows of cos_sin_cache) but positions[{t}] "
                f"= {pos[t]}; grow cos_sin_cache (on the GPU such a token's rotary dims become NaN)"
            )
        hs = int(head_size)
        q3, k3 = query.reshape(query.shape[0], -1, hs), key.reshape(key.shape[0], -1, hs)
        table = a.angles.table.numpy()
        q64 = ref_utils.rope_cos_sin(q3, pos, table, interleave=a.interleave)
        k64 = ref_utils.rope_cos_sin(k3, pos, table, interleave=a.interleave)
        return _finish_host(query, key, q64, k64, inplace)
    call, _ = begin(query, "query")
    a, tq, tk = check_rope_table(positions, query, key, head_size, cos_sin_cache, is_neox, call.tensor)
    return _run_gpu(call, a, tq, tk, inplace, int(head_size))


# ---- the public functions ------------------------------------------------------------------------------------------
# FlashInfer's names and defaults; the in-place forms write into q and k (not JAX arrays: they are immutable).


def apply_rope(q: Any, k: Any, indptr: Any, offsets: Any, *, rotary_dim: int | None = None, interleave: bool = False,
               rope_scale: float = 1.0, rope_theta: float = 1e4) -> tuple[Any, Any]:  # fmt: skip
    """RoPE on ragged q ``[nnz, Hq, D]`` and k ``[nnz, Hk, D]``: row t of request b (``indptr[b] <= t <
    indptr[b+1]``) is at position ``offsets[b] + t - indptr[b]``. Returns new ``(q_rope, k_rope)``."""
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=rope_scale, rope_theta=rope_theta)
    return _rope(q, k, {"indptr": indptr, "offsets": offsets}, inplace=False, **opts)


def apply_rope_inplace(q: Any, k: Any, indptr: Any, offsets: Any, *, rotary_dim: int | None = None,
                       interleave: bool = False, rope_scale: float = 1.0, rope_theta: float = 1e4) -> None:  # fmt: skip
    """``apply_rope`` writing into q and k."""
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=rope_scale, rope_theta=rope_theta)
    return _rope(q, k, {"indptr": indptr, "offsets": offsets}, inplace=True, **opts)


def apply_rope_pos_ids(q: Any, k: Any, pos_ids: Any, *, rotary_dim: int | None = None, interleave: bool = False,
                       rope_scale: float = 1.0, rope_theta: float = 1e4) -> tuple[Any, Any]:  # fmt: skip
    """RoPE on q ``[nnz, Hq, D]`` and k ``[nnz, Hk, D]`` at positions ``pos_ids [nnz]``. Returns new
    ``(q_rope, k_rope)``."""
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=rope_scale, rope_theta=rope_theta)
    return _rope(q, k, {"pos_ids": pos_ids}, inplace=False, **opts)


def apply_rope_pos_ids_inplace(q: Any, k: Any, pos_ids: Any, *, rotary_dim: int | None = None,
                               interleave: bool = False, rope_scale: float = 1.0,
                               rope_theta: float = 1e4) -> None:  # fmt: skip
    """``apply_rope_pos_ids`` writing into q and k."""
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=rope_scale, rope_theta=rope_theta)
    return _rope(q, k, {"pos_ids": pos_ids}, inplace=True, **opts)


def apply_llama31_rope(q: Any, k: Any, indptr: Any, offsets: Any, *, rotary_dim: int | None = None,
                       interleave: bool = False, rope_scale: float = 8.0, rope_theta: float = 5e5,
                       low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                       old_context_len: int = 8192) -> tuple[Any, Any]:  # fmt: skip
    """``apply_rope`` with Llama 3.1's frequencies: pairs whose wavelength ``2π / freq`` is below ``old_context_len /
    high_freq_factor`` keep ``freq``, those above ``old_context_len / low_freq_factor`` get ``freq / rope_scale``, and
    the band between interpolates smoothly."""
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=rope_scale, rope_theta=rope_theta)
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    return _rope(q, k, {"indptr": indptr, "offsets": offsets}, llama31=llama31, inplace=False, **opts)


def apply_llama31_rope_inplace(q: Any, k: Any, indptr: Any, offsets: Any, *, rotary_dim: int | None = None,
                               interleave: bool = False, rope_scale: float = 8.0, rope_theta: float = 5e5,
                               low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                               old_context_len: int = 8192) -> None:  # fmt: skip
    """``apply_llama31_rope`` writing into q and k."""
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=rope_scale, rope_theta=rope_theta)
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    return _rope(q, k, {"indptr": indptr, "offsets": offsets}, llama31=llama31, inplace=True, **opts)


def apply_llama31_rope_pos_ids(q: Any, k: Any, pos_ids: Any, *, rotary_dim: int | None = None,
                               interleave: bool = False, rope_scale: float = 8.0, rope_theta: float = 5e5,
                               low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                               old_context_len: int = 8192) -> tuple[Any, Any]:  # fmt: skip
    """``apply_rope_pos_ids`` with Llama 3.1's frequencies (see ``apply_llama31_rope``)."""
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=rope_scale, rope_theta=rope_theta)
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    return _rope(q, k, {"pos_ids": pos_ids}, llama31=llama31, inplace=False, **opts)


def apply_llama31_rope_pos_ids_inplace(q: Any, k: Any, pos_ids: Any, *, rotary_dim: int | None = None,
                                       interleave: bool = False, rope_scale: float = 8.0, rope_theta: float = 5e5,
                                       low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                                       old_context_len: int = 8192) -> None:  # fmt: skip
    """``apply_llama31_rope_pos_ids`` writing into q and k."""
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=rope_scale, rope_theta=rope_theta)
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    return _rope(q, k, {"pos_ids": pos_ids}, llama31=llama31, inplace=True, **opts)


def apply_rope_with_cos_sin_cache(positions: Any, query: Any, key: Any, head_size: int, cos_sin_cache: Any,
                                  is_neox: bool = True) -> tuple[Any, Any]:  # fmt: skip
    """RoPE with angles from a table, as vLLM / SGLang call it: ``query`` ``[nnz, num_q_heads * head_size]``, ``key``
    ``[nnz, num_k_heads * head_size]`` (or 3-D ``[nnz, heads, head_size]``), ``cos_sin_cache`` float32
    ``[max_position, rotary_dim]`` whose row ``positions[t]`` holds the pairs' cosines then their sines.
    ``is_neox=True`` rotates halves, False interleaved pairs. Returns new ``(query_out, key_out)``."""
    return _rope_table(positions, query, key, head_size, cos_sin_cache, is_neox, inplace=False)


def apply_rope_with_cos_sin_cache_inplace(positions: Any, query: Any, key: Any, head_size: int, cos_sin_cache: Any,
                                          is_neox: bool = True) -> None:  # fmt: skip
    """``apply_rope_with_cos_sin_cache`` writing into query and key."""
    return _rope_table(positions, query, key, head_size, cos_sin_cache, is_neox, inplace=True)


__all__ = [
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
]
