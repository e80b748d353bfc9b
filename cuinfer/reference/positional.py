"""Positional encodings of the CPU reference backend: RoPE (rotate-half and interleaved) and ALiBi slopes, float64."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer.reference.util import as_f64, as_index, as_indptr, check_rope_dims


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi slopes [num_heads] float64, as in the ALiBi paper's reference code and FlashInfer.

    With m the largest power of two <= num_heads: slopes 2^(-8(h+1)/m) for h < m, then the odd-indexed slopes of
    the 2m sequence, 2^(-4(2j+1)/m) for j = 0 .. num_heads - m - 1 (so n = 2^k gives exactly 2^(-8(h+1)/n)).
    """
    if isinstance(num_heads, bool) or int(num_heads) != num_heads or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer but is {num_heads!r}")
    n = int(num_heads)
    m = 1 << (n.bit_length() - 1)
    base = 2.0 ** (-8.0 * np.arange(1, m + 1) / m)
    extra = 2.0 ** (-4.0 * (2 * np.arange(n - m) + 1) / m)
    return np.concatenate([base, extra]).astype(np.float64)


def rope(
    x: Any,
    pos: Any,
    *,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1.0,
    rope_theta: float = 1e4,
    llama31: tuple[float, float, float] | None = None,
) -> np.ndarray:
    """Rotary embedding of x[L, H, D] at positions pos[L]; returns float64 [L, H, D].

    Dimension pair i in [0, rotary_dim/2) turns by `pos * freq_i`, `freq_i = rope_theta^(-2i/rotary_dim) /
    rope_scale` (or Llama 3.1's scaled frequencies, `rope_freqs`). The pair is (i, i + rotary_dim/2) (rotate-half,
    default) or (2i, 2i+1) (interleave=True); dims >= rotary_dim are unchanged.
    """
    x = as_f64(x, "x", ndim=3)
    p = np.asarray(pos, dtype=np.float64)
    if p.shape != (x.shape[0],):
        raise ValueError(f"pos must have shape ({x.shape[0]},) (one position per row of x) but has shape {p.shape}")
    r = check_rope_dims(x.shape[2], rotary_dim)
    if not rope_scale > 0:
        raise ValueError(f"rope_scale and rope_theta must be > 0 but are {rope_scale}, {rope_theta}")
    if llama31 is None:  # (pos / rope_scale) * theta^(-2i/r), as before the Llama 3.1 option
        angle = (p / float(rope_scale))[:, None] * rope_freqs(r, rope_theta=rope_theta)[None, :]
    else:
        angle = p[:, None] * rope_freqs(r, rope_scale=rope_scale, rope_theta=rope_theta, llama31=llama31)[None, :]
    return rotate_pairs(x, np.cos(angle)[:, None, :], np.sin(angle)[:, None, :], r, interleave)


def rope_freqs(
    rotary_dim: int,
    *,
    rope_scale: float = 1.0,
    rope_theta: float = 1e4,
    llama31: tuple[float, float, float] | None = None,
) -> np.ndarray:
    """The frequency of each dimension pair, float64 [rotary_dim / 2]: `rope_theta^(-2i/rotary_dim) / rope_scale`.

    `llama31=(low_freq_factor, high_freq_factor, old_context_len)` scales them as Llama 3.1 does (and FlashInfer's
    apply_llama31_rope): with `f = rope_theta^(-2i/rotary_dim)` and wavelength `2π/f`, pairs whose wavelength is
    below `old_context_len / high_freq_factor` keep `f`, those above `old_context_len / low_freq_factor` get
    `f / rope_scale`, and the band between interpolates, `(1 - s)·f/rope_scale + s·f` with
    `s = (old_context_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)`.
    """
    if not rope_scale > 0 or not rope_theta > 0:
        raise ValueError(f"rope_scale and rope_theta must be > 0 but are {rope_scale}, {rope_theta}")
    f = float(rope_theta) ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)
    if llama31 is None:
        return f / float(rope_scale)
    low, high, old = (float(v) for v in llama31)
    if not (0 < low < high) or not old > 0:
        raise ValueError(
            f"llama31 = (low_freq_factor, high_freq_factor, old_context_len) must have 0 < low_freq_factor < "
            f"high_freq_factor and old_context_len > 0 but is {llama31}"
        )
    s = np.clip((old * f / (2 * np.pi) - low) / (high - low), 0.0, 1.0)  # old / wavelength = old * f / 2π
    return (1 - s) * f / float(rope_scale) + s * f


def rotate_pairs(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rotary_dim: int, interleave: bool) -> np.ndarray:
    """x[..., D] with dimension pair i turned by the angle whose cos / sin are cos[..., i] / sin[..., i] (broadcast
    against the pairs): pairs (i, i + rotary_dim/2), or (2i, 2i+1) with interleave; dims >= rotary_dim copied."""
    r, half = rotary_dim, rotary_dim // 2
    out = x.copy()
    if interleave:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = x1 * cos - x2 * sin
        out[..., 1:r:2] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., :half], x[..., half:r]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:r] = x2 * cos + x1 * sin
    return out


def apply_rope_pos_ids(
    q: Any,
    k: Any,
    pos_ids: Any,
    *,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1.0,
    rope_theta: float = 1e4,
    llama31: tuple[float, float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """RoPE on q[nnz, Hq, D] and k[nnz, Hk, D] at explicit positions pos_ids[nnz]; returns float64 (q, k).
    `llama31=(low_freq_factor, high_freq_factor, old_context_len)` scales the frequencies (`rope_freqs`)."""
    pos = as_index(pos_ids, "pos_ids")
    q, k = np.asarray(q), np.asarray(k)
    if q.ndim != 3 or k.ndim != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q and k must be [nnz, heads, head_dim] with the same nnz and head_dim but have shapes "
            f"{q.shape}, {k.shape}"
        )
    opts = dict(
        rotary_dim=rotary_dim, interleave=interleave, rope_scale=rope_scale, rope_theta=rope_theta, llama31=llama31
    )
    return rope(q, pos, **opts), rope(k, pos, **opts)


def apply_rope(
    q: Any,
    k: Any,
    indptr: Any,
    offsets: Any,
    *,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1.0,
    rope_theta: float = 1e4,
    llama31: tuple[float, float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """RoPE on ragged q/k: token t of request b (rows indptr[b]:indptr[b+1]) sits at offsets[b] + t - indptr[b]."""
    nnz = np.asarray(q).shape[0] if np.ndim(q) else 0
    ind = as_indptr(indptr, "indptr", total=nnz)
    off = as_index(offsets, "offsets")
    if off.shape[0] != ind.shape[0] - 1:
        raise ValueError(
            f"offsets must have one entry per request (len(indptr) - 1 = {ind.shape[0] - 1}) but has {off.shape[0]}"
        )
    if ind[0] != 0 or ind[-1] != nnz:
        raise ValueError(
            f"indptr must run from 0 to nnz = {nnz} (every row belongs to a request) but is {ind.tolist()}"
        )
    lens = np.diff(ind)
    req = np.repeat(np.arange(lens.shape[0]), lens)
    pos = off[req] + np.arange(nnz) - ind[req]
    opts = dict(interleave=interleave, rope_scale=rope_scale, rope_theta=rope_theta, llama31=llama31)
    return apply_rope_pos_ids(q, k, pos, rotary_dim=rotary_dim, **opts)
