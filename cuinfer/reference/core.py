"""CPU reference backend: exact float64 attention with cuinfer's semantics (the oracle of every GPU test).

Pure NumPy. Inputs may be any float dtype (float16, ml_dtypes bfloat16 / float8_e4m3fn / float8_e5m2); they are cast
to float64 first and all outputs are float64. Semantics (docs/api.md, "Semantics"), per request of qo_len Lq and
kv_len Lkv, query row i at position `i + Lkv - Lq` (bottom-right aligned):

- logit `s = (q·k)·sm_scale·k_scale` (sm_scale default 1/sqrt(head_dim_qk)); ALiBi adds `slope_h·(j - qpos_i)`;
  soft cap (cap > 0) maps `s -> cap·tanh(s / cap)` after ALiBi; `rope_llama` rotates q at qpos_i and k at j first.
- kept keys: causal `j <= qpos_i`; window w >= 0: `j >= qpos_i - w`; custom mask True = keep; all ANDed.
- `lse = log2(Σ_j exp(s_j))` (base 2); o = softmax(s)·v·v_scale; a row with no kept key has o = 0, lse = -inf.
  `k_scale` / `v_scale` are numbers or arrays of one value per KV head (fp8 caches quantised per head).
- GQA: query head h reads kv head `h // (Hq // Hkv)`.

This module holds the attention math; the other pieces live beside it and ``cuinfer.reference`` re-exports them all:
`positional` (RoPE, ALiBi slopes), `state` (merge), `paged` (page tables, append), `mask` (bit-packed masks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer.reference.paged import page_table
from cuinfer.reference.positional import alibi_slopes, rope
from cuinfer.reference.util import as_bool_mask, as_f64, as_indptr, check_memory

POS_ENCODINGS = ("none", "rope_llama", "alibi")
LOG2E = 1.0 / math.log(2.0)

# Score blocks are computed a chunk of query rows at a time so that a long prefill never materialises the full
# [Hq, Lq, Lkv] float64 matrix: 2^22 elements (32 MiB per temporary) keeps a 4096 x 4096 x 32-head prefill in ~200 MiB.
_SCORE_BLOCK_ELEMS = 1 << 22


@dataclass(frozen=True)
class _Options:
    causal: bool
    sm_scale: float | None
    logits_soft_cap: float
    window_left: int
    pos_encoding: str
    rope_scale: float
    rope_theta: float
    k_scale: Any  # float, or float64 [num_kv_heads]
    v_scale: Any


def _options(
    *,
    causal: bool,
    sm_scale: float | None,
    logits_soft_cap: float,
    window_left: int,
    pos_encoding: Any,
    rope_scale: float,
    rope_theta: float,
    k_scale: float | None,
    v_scale: float | None,
) -> _Options:
    raw = getattr(pos_encoding, "value", pos_encoding)
    pos = raw.lower() if isinstance(raw, str) else raw
    if pos not in POS_ENCODINGS:
        raise ValueError(f"pos_encoding must be one of {POS_ENCODINGS} but is {pos_encoding!r}")
    if logits_soft_cap is None or not logits_soft_cap >= 0:
        raise ValueError(f"logits_soft_cap must be >= 0 (0 disables it) but is {logits_soft_cap}")
    if int(window_left) != window_left or window_left < -1:
        raise ValueError(f"window_left must be an integer >= -1 (-1 disables the window) but is {window_left}")
    if pos == "rope_llama" and not (rope_scale > 0 and rope_theta > 0):
        raise ValueError(f"rope_scale and rope_theta must be > 0 but are {rope_scale}, {rope_theta}")
    return _Options(
        causal=bool(causal),
        sm_scale=None if sm_scale is None else float(sm_scale),
        logits_soft_cap=float(logits_soft_cap),
        window_left=int(window_left),
        pos_encoding=pos,
        rope_scale=float(rope_scale),
        rope_theta=float(rope_theta),
        k_scale=_scale("k_scale", k_scale),
        v_scale=_scale("v_scale", v_scale),
    )


def _scale(name: str, x: Any) -> Any:
    """A scale as a float, or a 1-D float64 array of per-KV-head values (checked against the heads in _head_scale)."""
    if x is None:
        return 1.0
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        return float(a)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a number or a 1-D array of one value per KV head but has shape {a.shape}")
    return a


def _head_scale(name: str, x: Any, hkv: int, g: int) -> Any:
    """``x`` (float or per KV head) broadcast over the query heads: a float or float64 [Hq, 1, 1]."""
    if isinstance(x, float):
        return x
    if x.shape[0] not in (1, hkv):
        raise ValueError(f"{name} has {x.shape[0]} values but the cache has {hkv} KV heads; pass one per KV head")
    return np.repeat(np.broadcast_to(x, (hkv,)), g)[:, None, None]


def _check_heads(q: tuple, k: tuple, v: tuple) -> None:
    """Shapes [tokens, heads, dim] of q, k, v: shared head_dim for q/k, shared heads for k/v, GQA divisibility."""
    if q[2] != k[2]:
        raise ValueError(f"q and k must share head_dim but have shapes {q} and {k}")
    if k[1] != v[1]:
        raise ValueError(f"k and v must have the same num_kv_heads but have shapes {k} and {v}")
    hq, hkv = q[1], k[1]
    if hkv == 0 or hq % hkv:
        raise ValueError(
            f"num_qo_heads ({hq}) must be a multiple of num_kv_heads ({hkv}) for grouped-query attention; "
            f"query head h reads kv head h // (num_qo_heads // num_kv_heads)"
        )


def _peak_bytes(q_shape: tuple, kv_tokens: int, kv_heads: int, d: int, dv: int, qo_lens: Any, kv_lens: Any) -> int:
    """An upper estimate of the bytes a reference call allocates: float64 copies of q, of ``kv_tokens`` K/V rows (the
    whole ragged k / v, or the longest request gathered from pages, with its RoPE / transposed copies), o and lse, and
    the largest request's score block with its temporaries (at least one query row: ``Hq x kv_len`` scores)."""
    tokens, hq = int(q_shape[0]), int(q_shape[1])
    per_kv = kv_heads * (d + dv)
    whole = tokens * hq * (d + 2 * dv + 2) + 3 * kv_tokens * per_kv
    block = 0
    for lq, lkv in zip(np.asarray(qo_lens).tolist(), np.asarray(kv_lens).tolist(), strict=True):
        if lq and lkv:
            rows = min(lq, max(1, _SCORE_BLOCK_ELEMS // (hq * lkv)))
            block = max(block, 5 * hq * rows * lkv + 2 * lkv * per_kv + rows * hq * (d + dv))
    return 8 * (whole + block)


def _check_size(what: str, q: Any, k: Any, v: Any, qo_lens: Any = None, kv_lens: Any = None,
                kv_tokens: int | None = None) -> None:  # fmt: skip
    """``check_memory`` from the shapes alone, before anything is converted to float64. ``q``, ``k``, ``v``: ragged
    [tokens, heads, dim] (one request when ``qo_lens`` is None), or page-table views [pages, page_size, heads, dim]
    whose longest request holds ``kv_tokens`` keys. Malformed shapes are left to the checks that name them."""
    qs, ks, vs = np.shape(q), np.shape(k), np.shape(v)
    if len(qs) != 3 or len(ks) < 3 or len(vs) < 3:
        return
    if qo_lens is None:
        qo_lens, kv_lens = [qs[0]], [ks[0]]
    tokens = ks[0] if kv_tokens is None else kv_tokens
    check_memory(_peak_bytes(qs, tokens, ks[-2], ks[-1], vs[-1], qo_lens, kv_lens), what)


def _ragged_qkv(q: Any, k: Any, v: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v of one request or a ragged batch as float64 ``[tokens, heads, dim]``, their shapes checked."""
    q64, k64, v64 = as_f64(q, "q", ndim=3), as_f64(k, "k", ndim=3), as_f64(v, "v", ndim=3)
    _check_heads(q64.shape, k64.shape, v64.shape)
    if k64.shape[0] != v64.shape[0]:
        raise ValueError(f"k and v must have the same number of tokens but have shapes {k64.shape} and {v64.shape}")
    return q64, k64, v64


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, opt: _Options):
    """One request, float64: q[Lq,Hq,D], k[Lkv,Hkv,D], v[Lkv,Hkv,Dv], mask [Lq,Lkv] bool or None -> (o, lse)."""
    lq, hq, d = q.shape
    lkv, hkv, dv = v.shape
    g = hq // hkv
    o = np.zeros((lq, hq, dv))
    lse = np.full((lq, hq), -np.inf)
    if lq == 0 or lkv == 0:
        return o, lse
    shift = lkv - lq  # query row i sits at position i + shift
    j = np.arange(lkv)
    if opt.pos_encoding == "rope_llama":
        q = rope(q, np.arange(lq) + shift, rope_scale=opt.rope_scale, rope_theta=opt.rope_theta)
        k = rope(k, j, rope_scale=opt.rope_scale, rope_theta=opt.rope_theta)
    scale = (1.0 / math.sqrt(d) if opt.sm_scale is None else opt.sm_scale) * _head_scale("k_scale", opt.k_scale, hkv, g)
    v_scale = _head_scale("v_scale", opt.v_scale, hkv, g)  # [Hq, 1, 1] or a float
    slopes = alibi_slopes(hq)[:, None, None] if opt.pos_encoding == "alibi" else None
    k_t = k.transpose(1, 2, 0)  # [Hkv, D, Lkv]
    v_h = v.transpose(1, 0, 2)  # [Hkv, Lkv, Dv]
    rows = max(1, _SCORE_BLOCK_ELEMS // (hq * lkv))
    for r0 in range(0, lq, rows):
        r1 = min(lq, r0 + rows)
        n = r1 - r0
        qpos = np.arange(r0, r1) + shift
        # [n, Hq, D] -> [Hq, n, D] -> [Hkv, g*n, D]: query head h = kv_head * g + h_in_group.
        qg = q[r0:r1].transpose(1, 0, 2).reshape(hkv, g * n, d)
        s = np.matmul(qg, k_t).reshape(hq, n, lkv) * scale
        if slopes is not None:
            s += slopes * (j[None, :] - qpos[:, None])[None]
        if opt.logits_soft_cap > 0:
            s = opt.logits_soft_cap * np.tanh(s / opt.logits_soft_cap)
        keep = None if mask is None else mask[r0:r1]
        if opt.causal:
            c = j[None, :] <= qpos[:, None]
            keep = c if keep is None else keep & c
        if opt.window_left >= 0:
            w = j[None, :] >= qpos[:, None] - opt.window_left
            keep = w if keep is None else keep & w
        if keep is not None:
            s = np.where(keep[None], s, -np.inf)
        m = s.max(axis=-1)  # [Hq, n]; -inf for rows with no kept key
        empty = m == -np.inf
        p = np.exp(s - np.where(empty, 0.0, m)[..., None])  # masked logits give exp(-inf) = 0
        denom = p.sum(axis=-1)
        safe = np.where(empty, 1.0, denom)
        out = np.matmul(p.reshape(hkv, g * n, lkv), v_h).reshape(hq, n, dv) / safe[..., None] * v_scale
        o[r0:r1] = out.transpose(1, 0, 2)
        lse[r0:r1] = np.where(empty, -np.inf, (np.where(empty, 0.0, m) + np.log(safe)) * LOG2E).T
    return o, lse


def attention(
    q: Any, k: Any, v: Any, *, causal: bool = False, custom_mask: Any = None, sm_scale: float | None = None,
    logits_soft_cap: float = 0.0, window_left: int = -1, pos_encoding: str = "none", rope_scale: float = 1.0,
    rope_theta: float = 1e4, k_scale: float | None = None, v_scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Attention for one request: q[Lq,Hq,D], k[Lkv,Hkv,D], v[Lkv,Hkv,Dv] -> float64 (o[Lq,Hq,Dv], lse[Lq,Hq]).

    custom_mask: [Lq, Lkv] bool, True = keep, ANDed with causal and window. lse is base 2.
    """
    opt = _options(causal=causal, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
                   pos_encoding=pos_encoding, rope_scale=rope_scale, rope_theta=rope_theta, k_scale=k_scale,
                   v_scale=v_scale)  # fmt: skip
    _check_size("this attention call", q, k, v)
    q64, k64, v64 = _ragged_qkv(q, k, v)
    mask = None if custom_mask is None else as_bool_mask(custom_mask, "custom_mask", (q64.shape[0], k64.shape[0]))
    return _attend(q64, k64, v64, mask, opt)


def _split_flat_mask(custom_mask: Any, qo_lens: np.ndarray, kv_lens: np.ndarray) -> list[np.ndarray] | None:
    """Cut a flat batch mask (concatenated row-major [Lq_b, Lkv_b] blocks) into per-request 2-D masks."""
    if custom_mask is None:
        return None
    sizes = qo_lens * kv_lens
    flat = as_bool_mask(np.asarray(custom_mask).reshape(-1), "custom_mask", (int(sizes.sum()),))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [flat[starts[b] : starts[b + 1]].reshape(qo_lens[b], kv_lens[b]) for b in range(sizes.shape[0])]


def batch_attention_ragged(
    q: Any, k: Any, v: Any, qo_indptr: Any, kv_indptr: Any, *, causal: bool = False, custom_mask: Any = None,
    sm_scale: float | None = None, logits_soft_cap: float = 0.0, window_left: int = -1, pos_encoding: str = "none",
    rope_scale: float = 1.0, rope_theta: float = 1e4, k_scale: float | None = None, v_scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Batched attention over ragged q[nnz_q,Hq,D], k[nnz_kv,Hkv,D], v[nnz_kv,Hkv,Dv] -> float64 (o, lse).

    Request b owns query rows qo_indptr[b]:qo_indptr[b+1] and kv rows kv_indptr[b]:kv_indptr[b+1]. custom_mask is
    flat: the concatenation of each request's row-major [Lq_b, Lkv_b] bool mask. Query rows outside every request
    (padding) come back empty: o = 0, lse = -inf.
    """
    opt = _options(causal=causal, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
                   pos_encoding=pos_encoding, rope_scale=rope_scale, rope_theta=rope_theta, k_scale=k_scale,
                   v_scale=v_scale)  # fmt: skip
    qo = as_indptr(qo_indptr, "qo_indptr", total=_rows(q))
    kv = as_indptr(kv_indptr, "kv_indptr", total=_rows(k))
    if qo.shape != kv.shape:
        raise ValueError(
            f"qo_indptr and kv_indptr must both have batch_size + 1 entries but have {qo.shape[0]} and {kv.shape[0]}"
        )
    _check_size("this batch", q, k, v, np.diff(qo), np.diff(kv))
    q64, k64, v64 = _ragged_qkv(q, k, v)
    masks = _split_flat_mask(custom_mask, np.diff(qo), np.diff(kv))
    o = np.zeros((q64.shape[0], q64.shape[1], v64.shape[2]))
    lse = np.full(q64.shape[:2], -np.inf)
    for b in range(qo.shape[0] - 1):
        qs, ks = slice(qo[b], qo[b + 1]), slice(kv[b], kv[b + 1])
        o[qs], lse[qs] = _attend(q64[qs], k64[ks], v64[ks], None if masks is None else masks[b], opt)
    return o, lse


def _rows(x: Any) -> int | None:
    """Rows of an array-like (None for a scalar: the checks that need an array name it)."""
    shape = np.shape(x)
    return shape[0] if shape else None


def _paged_q(q: Any, kv_cache: Any, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, kv_layout: str,
             qo_indptr: Any = None):  # fmt: skip
    """q as float64 ``[tokens, heads, dim]``, the validated page table of ``kv_cache`` and ``qo_indptr`` (None: one
    query row per request, decode), their heads checked and the memory the call needs too (``_check_size``)."""
    table = page_table(kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout)
    batch = table.kv_lens.shape[0]
    qo = None if qo_indptr is None else as_indptr(qo_indptr, "qo_indptr", total=_rows(q))
    qo_lens = np.ones(batch, np.int64) if qo is None else np.diff(qo)
    if qo_lens.shape[0] == batch:  # (else the caller names the mismatch)
        longest = int(table.kv_lens.max()) if batch else 0
        _check_size("this batch", q, table.k, table.v, qo_lens, table.kv_lens, kv_tokens=longest)
    q64 = as_f64(q, "q", ndim=3)
    _check_heads(q64.shape, table.k.shape[1:], table.v.shape[1:])
    return q64, table, qo


def batch_decode_paged(
    q: Any, kv_cache: Any, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, *, kv_layout: str = "NHD",
    sm_scale: float | None = None, logits_soft_cap: float = 0.0, window_left: int = -1, pos_encoding: str = "none",
    rope_scale: float = 1.0, rope_theta: float = 1e4, k_scale: float | None = None, v_scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Decode over a paged cache: one query token per request, q[B,Hq,D] -> float64 (o[B,Hq,Dv], lse[B,Hq]).

    The query sits at position kv_len - 1 (window and rope/alibi positions follow the rules with Lq = 1).
    """
    opt = _options(causal=False, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
                   pos_encoding=pos_encoding, rope_scale=rope_scale, rope_theta=rope_theta, k_scale=k_scale,
                   v_scale=v_scale)  # fmt: skip
    q64, table, _ = _paged_q(q, kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout)
    batch = table.kv_lens.shape[0]
    if q64.shape[0] != batch:
        raise ValueError(f"q has {q64.shape[0]} rows but the page table has {batch} requests; decode takes one each")
    o = np.zeros((batch, q64.shape[1], table.v.shape[3]))
    lse = np.full((batch, q64.shape[1]), -np.inf)
    for b in range(batch):
        k64, v64 = (x.astype(np.float64) for x in table.request_kv(b))
        o[b : b + 1], lse[b : b + 1] = _attend(q64[b : b + 1], k64, v64, None, opt)
    return o, lse


def batch_prefill_paged(
    q: Any, kv_cache: Any, qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, *,
    kv_layout: str = "NHD", causal: bool = False, custom_mask: Any = None, sm_scale: float | None = None,
    logits_soft_cap: float = 0.0, window_left: int = -1, pos_encoding: str = "none", rope_scale: float = 1.0,
    rope_theta: float = 1e4, k_scale: float | None = None, v_scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Prefill over a paged cache: ragged q[nnz_q,Hq,D] -> float64 (o[nnz_q,Hq,Dv], lse[nnz_q,Hq]).

    custom_mask is flat, per request a row-major [qo_len_b, kv_len_b] block (kv_len from the page table).
    """
    opt = _options(causal=causal, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
                   pos_encoding=pos_encoding, rope_scale=rope_scale, rope_theta=rope_theta, k_scale=k_scale,
                   v_scale=v_scale)  # fmt: skip
    q64, table, qo = _paged_q(q, kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout, qo_indptr)
    batch = table.kv_lens.shape[0]
    if qo.shape[0] != batch + 1:
        raise ValueError(
            f"qo_indptr has {qo.shape[0]} entries but the page table has {batch} requests; pass batch_size + 1"
        )
    masks = _split_flat_mask(custom_mask, np.diff(qo), table.kv_lens)
    o = np.zeros((q64.shape[0], q64.shape[1], table.v.shape[3]))
    lse = np.full(q64.shape[:2], -np.inf)
    for b in range(batch):
        k64, v64 = (x.astype(np.float64) for x in table.request_kv(b))
        qs = slice(qo[b], qo[b + 1])
        o[qs], lse[qs] = _attend(q64[qs], k64, v64, None if masks is None else masks[b], opt)
    return o, lse
