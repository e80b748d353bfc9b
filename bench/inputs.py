"""Device inputs for the standard cases: fresh random data (seeded per case), paged caches scattered over the pool.

Index arrays are kept twice: NumPy for cuinfer (its plan() takes host arrays with no device sync) and device int32
tensors for FlashInfer, called as the anchor script calls it so its numbers are comparable with docs/benchmarks.md's
anchors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.cases import DecodeCase, MergeCase, PageTable, PrefillCase, Shape, indptr, page_table
from bench.timing import cuda_torch


def torch_dtype(name: str):
    """The torch dtype of a dtype name ("bfloat16", "float8_e4m3fn", ...)."""
    import torch

    return getattr(torch, name)


def _generator(seed: int):
    torch = cuda_torch()
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def _randn(shape, dtype: str, g):
    """Standard normal data in ``dtype`` (fp8 via bf16: torch has no fp8 randn)."""
    torch = cuda_torch()
    if dtype.startswith("float8"):
        return torch.randn(shape, dtype=torch.bfloat16, device="cuda", generator=g).to(torch_dtype(dtype))
    return torch.randn(shape, dtype=torch_dtype(dtype), device="cuda", generator=g)


def _dev_i32(x: np.ndarray):
    torch = cuda_torch()
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int32)).to("cuda")


@dataclass
class PagedKV:
    """A paged KV cache ``[num_pages, 2, page_size, Hkv, D]`` (NHD) with its page table, host and device."""

    cache: object
    table: PageTable
    kv_lens: np.ndarray
    kv_indptr_d: object
    kv_indices_d: object
    kv_last_page_len_d: object
    kv_lens_d: object


def paged_kv(kv_lens: np.ndarray, shape: Shape, kv_dtype: str, seed: int, g) -> PagedKV:
    table = page_table(kv_lens, shape.page_size, seed)
    cache = _randn((table.num_pages, 2, shape.page_size, shape.num_kv_heads, shape.head_dim), kv_dtype, g)
    return PagedKV(
        cache=cache,
        table=table,
        kv_lens=kv_lens,
        kv_indptr_d=_dev_i32(table.kv_indptr),
        kv_indices_d=_dev_i32(table.kv_indices),
        kv_last_page_len_d=_dev_i32(table.kv_last_page_len),
        kv_lens_d=_dev_i32(kv_lens),
    )


@dataclass
class DecodeInputs:
    case: DecodeCase
    q: object  # [B, Hq, D]
    kv: PagedKV


def decode_inputs(case: DecodeCase) -> DecodeInputs:
    s = case.shape
    g = _generator(case.seed)
    kv_lens = case.lengths.draw(case.seed)
    q = _randn((case.lengths.batch, s.num_qo_heads, s.head_dim), s.dtype, g)
    return DecodeInputs(case, q, paged_kv(kv_lens, s, case.kv_dtype, case.seed, g))


@dataclass
class PrefillInputs:
    case: PrefillCase
    lens: np.ndarray
    qo_indptr: np.ndarray
    qo_indptr_d: object
    q: object  # [ntok, Hq, D]
    k: object | None = None  # ragged [ntok, Hkv, D]
    v: object | None = None
    kv: PagedKV | None = None  # paged


def prefill_inputs(case: PrefillCase) -> PrefillInputs:
    """Prefill from an empty cache: every request's query length equals its KV length (causal, P1-P6)."""
    s = case.shape
    g = _generator(case.seed)
    lens = case.lengths.draw(case.seed)
    qo = indptr(lens)
    ntok = int(lens.sum())
    q = _randn((ntok, s.num_qo_heads, s.head_dim), s.dtype, g)
    inp = PrefillInputs(case, lens, qo, _dev_i32(qo), q)
    if case.layout == "ragged":
        inp.k = _randn((ntok, s.num_kv_heads, s.head_dim), case.kv_dtype, g)
        inp.v = _randn((ntok, s.num_kv_heads, s.head_dim), case.kv_dtype, g)
    else:
        inp.kv = paged_kv(lens, s, case.kv_dtype, case.seed, g)
    return inp


@dataclass
class MergeInputs:
    case: MergeCase
    o: object  # [L, S, H, D]
    lse: object  # [L, S, H] float32


def merge_inputs(case: MergeCase) -> MergeInputs:
    g = _generator(case.seed)
    o = _randn((case.rows, case.num_states, case.num_heads, case.head_dim), case.dtype, g)
    # spread of a few units in base-2 LSE: every state carries weight, none is negligible or dominant
    lse = _randn((case.rows, case.num_states, case.num_heads), "float32", g) * 4.0
    return MergeInputs(case, o, lse)


def free() -> None:
    """Return the cached blocks of the previous case, so a large case does not fragment the next one."""
    torch = cuda_torch()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
