"""Bad input, one table: every public call refuses it before any launch, with the same exception and the same rule on
the CPU reference route (NumPy arrays) as on the GPU route (run here on a stand-in GPU, ``fake_gpu``: every check the
GPU route makes runs, and the test asserts that nothing was launched). Each row names the argument in its message.

Then the inputs that are *accepted* on purpose (decisions documented in docs/api.md): both routes take them, and the
NumPy result is the float64 reference's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest

import cuinfer
from cuinfer import BatchDecode, BatchPrefill, reference, single_decode, single_prefill
from tests.cpu.fake_gpu import install, to_cuda

F16, BF16, F32, E4M3 = np.float16, ml_dtypes.bfloat16, np.float32, ml_dtypes.float8_e4m3fn


def randn(*shape, dtype=F16, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---- the batches the rows start from ----------------------------------------------------------------------------

# decode: 2 requests of 5 and 9 tokens in pages of 4 (6 pages in the cache), 8 query heads over 2 KV heads, dim 64
D_INDPTR, D_INDICES, D_LAST = (
    np.array([0, 2, 5], np.int32),
    np.array([3, 0, 5, 1, 4], np.int32),
    np.array([1, 1], np.int32),
)
D_PLAN = dict(num_qo_heads=8, num_kv_heads=2, head_dim=64, page_size=4, q_dtype="float16")


def decode_plan(ctor=None, plan=None) -> BatchDecode:
    w = BatchDecode(**(ctor or {}))
    w.plan(D_INDPTR, D_INDICES, D_LAST, **{**D_PLAN, **(plan or {})})
    return w


def decode(mk, *, q=None, cache=None, ctor=None, plan=None, **run):
    w = decode_plan(ctor, plan)
    q = randn(2, 8, 64) if q is None else q
    cache = randn(6, 2, 4, 2, 64, seed=1) if cache is None else cache
    return w.run(mk(q), mk(cache), **{k: mk(v) for k, v in run.items()})


# prefill: 2 requests, 3 + 2 query rows against 4 + 6 keys (ragged) or pages of 4 (paged: 4 pages), bf16
P_QO, P_KV = np.array([0, 3, 5], np.int32), np.array([0, 4, 10], np.int32)
P_PAGES, P_INDICES, P_LAST = np.array([0, 1, 3], np.int32), np.array([2, 0, 3], np.int32), np.array([4, 2], np.int32)
P_PLAN = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, q_dtype="bfloat16")


def ragged(mk, *, q=None, k=None, v=None, plan=None, **run):
    w = BatchPrefill(paged=False)
    w.plan(P_QO, P_KV, **{**P_PLAN, **(plan or {})})
    q = randn(5, 4, 64, dtype=BF16) if q is None else q
    k = randn(10, 2, 64, dtype=BF16, seed=1) if k is None else k
    v = randn(10, 2, 64, dtype=BF16, seed=2) if v is None else v
    kv = (mk(k),) if isinstance(v, tuple) else (mk(k), mk(v))
    return w.run(mk(q), *kv, **{n: mk(x) for n, x in run.items()})


def paged(mk, *, q=None, cache=None, plan=None, indices=P_INDICES, **run):
    w = BatchPrefill(paged=True)
    w.plan(P_QO, P_PAGES, indices, P_LAST, **{**P_PLAN, "page_size": 4, **(plan or {})})
    q = randn(5, 4, 64, dtype=BF16) if q is None else q
    cache = randn(4, 2, 4, 2, 64, dtype=BF16, seed=1) if cache is None else cache
    return w.run(mk(q), mk(cache), **{n: mk(x) for n, x in run.items()})


def sdecode(mk, q=None, k=None, v=None, **kw):
    q = randn(8, 64) if q is None else q
    k = randn(9, 2, 64, seed=1) if k is None else k
    v = randn(9, 2, 64, seed=2) if v is None else v
    return single_decode(mk(q), mk(k), mk(v), **kw)


def sprefill(mk, q=None, k=None, v=None, **kw):
    q = randn(3, 4, 64, dtype=BF16) if q is None else q
    k = randn(5, 2, 64, dtype=BF16, seed=1) if k is None else k
    v = randn(5, 2, 64, dtype=BF16, seed=2) if v is None else v
    return single_prefill(mk(q), mk(k), mk(v), **kw)


def states(*shape, dtype=F16, seed=0):
    return randn(*shape, dtype=dtype, seed=seed), randn(*shape[:-1], dtype=F32, seed=seed + 1)


def merge_pair(mk, *, oa=None, la=None, ob=None, lb=None):
    o, lse = states(5, 2, 64)
    return cuinfer.merge_state(*(mk(x) for x in (o if oa is None else oa, lse if la is None else la,
                                                 o if ob is None else ob, lse if lb is None else lb)))  # fmt: skip


def merge_in_place(mk, *, o=None, lse=None, mask=None):
    o0, l0 = states(5, 2, 64)
    o1, l1 = states(5, 2, 64, seed=3)
    o, lse = o0 if o is None else o, l0 if lse is None else lse
    return cuinfer.merge_state_in_place(mk(o), mk(lse), mk(o1), mk(l1), mask=mk(mask))


def readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def strided_last(a):
    """``a`` with the same shape but a last-dimension stride of 2."""
    return np.repeat(a, 2, axis=-1)[..., ::2]


def other_strides(a):
    """``a``'s values, same shape, other (HND-like) strides: [p, s, h, d] held as [p, h, s, d]."""
    return np.ascontiguousarray(a.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)


# ---- the table --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    call: Callable  # call(mk): mk turns each NumPy array into the route's array
    exc: type
    says: tuple[str, ...]  # fragments of the message (the first names the argument)
    absent: tuple[str, ...] = ()  # fragments the message must not hold (a fix that would not work)
    gpu: bool = True  # the GPU route (on the stand-in GPU) raises the same rule
    same_rule: bool = True  # ... with the same "<name> <rule> but <received>" part
    marks: tuple = field(default=())


BIG = 2**20  # a page size whose pages make a request of more than 2**31 tokens cheaply

CASES: dict[str, Bad] = {
    # -- merge_state / merge_states / merge_state_in_place
    "merge-lse-float16": Bad(lambda mk: merge_pair(mk, la=randn(5, 2)), ValueError,
                             ("lse_a must have dtype float32 but has dtype float16",)),
    "merge-o-int32": Bad(lambda mk: merge_pair(mk, oa=np.zeros((5, 2, 64), np.int32)), ValueError,
                         ("o_a must have dtype", "but has dtype int32"), same_rule=False),
    "merge-o-b-dtype": Bad(lambda mk: merge_pair(mk, ob=randn(5, 2, 64, dtype=BF16)), ValueError,
                           ("o_a and o_b must have the same dtype",)),
    "merge-head-dim-96": Bad(lambda mk: merge_pair(mk, oa=randn(5, 2, 96), ob=randn(5, 2, 96)), ValueError,
                             ("o_a has head dim 96",)),
    "merge-o-b-shape": Bad(lambda mk: merge_pair(mk, ob=randn(5, 1, 64)), ValueError,
                           ("o_b must have shape (5, 2, 64) but has shape (5, 1, 64)",)),
    "merge-lse-b-shape": Bad(lambda mk: merge_pair(mk, lb=randn(5, 1, dtype=F32)), ValueError,
                             ("lse_b must have shape (5, 2) but has shape (5, 1)",)),
    "merge-o-last-dim-strided": Bad(lambda mk: merge_pair(mk, oa=strided_last(randn(5, 2, 64))), ValueError,
                                    ("o_a must have a contiguous last dimension",)),
    "merge-o-none": Bad(lambda mk: cuinfer.merge_state(None, randn(5, 2, dtype=F32), None, None), ValueError,
                        ("o_a must be an array", "NoneType")),
    "merge-states-none": Bad(lambda mk: cuinfer.merge_states(None, None), ValueError, ("o must be an array",)),
    "merge-states-lse-shape": Bad(lambda mk: cuinfer.merge_states(mk(randn(5, 3, 2, 64)), mk(randn(5, 3, dtype=F32))),
                                  ValueError, ("lse must have shape (5, 3, 2) but has shape (5, 3)",)),
    "merge-states-lse-float64": Bad(
        lambda mk: cuinfer.merge_states(mk(randn(5, 3, 2, 64)), mk(randn(5, 3, 2, dtype=np.float64))), ValueError,
        ("lse must have dtype float32 but has dtype float64",)),
    "merge-in-place-mask-int": Bad(lambda mk: merge_in_place(mk, mask=np.ones(5, np.int8)), ValueError,
                                   ("mask must have dtype bool but has dtype int8",)),
    "merge-in-place-mask-shape": Bad(lambda mk: merge_in_place(mk, mask=np.ones(4, bool)), ValueError,
                                     ("mask must have shape (5,) but has shape (4,)",)),
    "merge-in-place-readonly-o": Bad(lambda mk: merge_in_place(mk, o=readonly(states(5, 2, 64)[0])), ValueError,
                                     ("o must be writable",)),
    "merge-in-place-lse-float16": Bad(lambda mk: merge_in_place(mk, lse=randn(5, 2)), ValueError,
                                      ("lse must have dtype float32 but has dtype float16",)),
    # -- single_decode
    "single-decode-q-int32": Bad(lambda mk: sdecode(mk, q=np.ones((8, 64), np.int32)), ValueError,
                                 ("q must have dtype float16 or bfloat16 but has dtype int32",)),
    "single-decode-float64": Bad(lambda mk: sdecode(mk, q=randn(8, 64, dtype=np.float64),
                                                    k=randn(9, 2, 64, dtype=np.float64),
                                                    v=randn(9, 2, 64, dtype=np.float64)),  # fmt: skip
                                 ValueError, ("q must have dtype float16 or bfloat16 but has dtype float64",)),
    "single-decode-k-float32": Bad(lambda mk: sdecode(mk, k=randn(9, 2, 64, dtype=F32), v=randn(9, 2, 64, dtype=F32)),
                                   ValueError, ("k must have dtype float16 or bfloat16 but has dtype float32",)),
    "single-decode-k-v-dtypes": Bad(lambda mk: sdecode(mk, v=randn(9, 2, 64, dtype=BF16)), ValueError,
                                    ("k and v must have the same dtype",)),
    "single-decode-head-dim-96": Bad(lambda mk: sdecode(mk, q=randn(8, 96), k=randn(9, 2, 96), v=randn(9, 2, 96)),
                                     ValueError, ("head_dim must be one of 64, 128, 256 for decode but is 96",)),
    "single-decode-q-none": Bad(lambda mk: single_decode(None, mk(randn(9, 2, 64)), mk(randn(9, 2, 64))), ValueError,
                                ("q must be an array", "NoneType")),
    "single-decode-k-none": Bad(lambda mk: single_decode(mk(randn(8, 64)), None, None), ValueError,
                                ("k must be an array",)),
    "single-decode-q-3d": Bad(lambda mk: sdecode(mk, q=randn(1, 8, 64)), ValueError, ("q must have 2 dimensions",)),
    "single-decode-gqa": Bad(lambda mk: sdecode(mk, q=randn(6, 64), k=randn(9, 4, 64), v=randn(9, 4, 64)),
                             ValueError, ("num_qo_heads (6) must be a multiple of num_kv_heads (4)",)),
    "single-decode-window-float": Bad(lambda mk: sdecode(mk, window_left=3.0), TypeError,
                                      ("window_left must be an integer but is 3.0",)),
    "single-decode-k-strided": Bad(lambda mk: sdecode(mk, k=strided_last(randn(9, 2, 64))), ValueError,
                                   ("k must have a contiguous last dimension",)),
    # -- single_prefill
    "single-prefill-q-float32": Bad(lambda mk: sprefill(mk, q=randn(3, 4, 64, dtype=F32)), ValueError,
                                    ("q must have dtype float16 or bfloat16 but has dtype float32",)),
    "single-prefill-k-float16": Bad(lambda mk: sprefill(mk, k=randn(5, 2, 64), v=randn(5, 2, 64)), ValueError,
                                    ("q and k must have the same dtype but q is bfloat16 and k is float16",)),
    "single-prefill-head-dim-96": Bad(lambda mk: sprefill(mk, q=randn(3, 4, 96, dtype=BF16),
                                                          k=randn(5, 2, 96, dtype=BF16), v=randn(5, 2, 96, dtype=BF16)),
                                      ValueError, ("head_dim=96, head_dim_vo=96 is not supported",)),  # fmt: skip
    "single-prefill-mask-int": Bad(lambda mk: sprefill(mk, custom_mask=np.array([[0, 2, 0, 5, 1]] * 3)), ValueError,
                                   ("custom_mask must hold bools (True = keep) or the integers 0 and 1", "is 2")),
    "single-prefill-mask-float": Bad(lambda mk: sprefill(mk, custom_mask=np.zeros((3, 5))), ValueError,
                                     ("custom_mask must have dtype bool", "float64")),
    "single-prefill-mask-shape": Bad(lambda mk: sprefill(mk, custom_mask=np.ones((5, 3), bool)), ValueError,
                                     ("custom_mask must have shape (qo_len, kv_len) = (3, 5)",)),
    "single-prefill-q-none": Bad(lambda mk: single_prefill(None, None, None), ValueError, ("q must be an array",)),
    # -- BatchDecode.plan: counts are ints (never floats or bools), the page table fits the kernels
    "decode-plan-heads-float": Bad(lambda mk: decode(mk, plan=dict(num_qo_heads=8.0)), TypeError,
                                   ("num_qo_heads must be an integer but is 8.0 (a float)",)),
    "decode-plan-heads-bool": Bad(lambda mk: decode(mk, plan=dict(num_kv_heads=True, num_qo_heads=1)), TypeError,
                                  ("num_kv_heads must be an integer but is True (a bool)",)),
    "decode-plan-head-dim-float": Bad(lambda mk: decode(mk, plan=dict(head_dim=64.0)), TypeError,
                                      ("head_dim must be an integer but is 64.0",)),
    "decode-plan-page-size-float": Bad(lambda mk: decode(mk, plan=dict(page_size=4.0)), TypeError,
                                       ("page_size must be an integer but is 4.0",)),
    "decode-plan-window-bool": Bad(lambda mk: decode(mk, plan=dict(window_left=True)), TypeError,
                                   ("window_left must be an integer but is True",)),
    "decode-plan-split-float": Bad(lambda mk: decode(mk, plan=dict(fixed_split_size=8.0)), TypeError,
                                   ("fixed_split_size must be an integer but is 8.0",)),
    "decode-plan-split-zero": Bad(lambda mk: decode(mk, plan=dict(fixed_split_size=0)), ValueError,
                                  ("fixed_split_size must be a positive number of KV tokens but is 0",)),
    "decode-plan-num-sms-float": Bad(lambda mk: decode(mk, plan=dict(num_sms=4.0)), TypeError,
                                     ("num_sms must be an integer but is 4.0",)),
    "decode-ctor-max-batch-float": Bad(lambda mk: BatchDecode(use_cuda_graph=True, max_batch_size=2.0), TypeError,
                                       ("max_batch_size must be an integer but is 2.0",)),
    "decode-ctor-workspace-negative": Bad(lambda mk: BatchDecode(workspace_bytes=-1), ValueError,
                                          ("workspace_bytes must be an integer >= 0 but is -1",)),
    "decode-plan-q-dtype-int32": Bad(lambda mk: decode(mk, plan=dict(q_dtype="int32")), ValueError,
                                     ("q_dtype must be float16 or bfloat16 but is int32",)),
    "decode-plan-indptr-float": Bad(lambda mk: BatchDecode().plan([0.0, 2.0], [0, 1], [1], **D_PLAN), ValueError,
                                    ("kv_indptr must have an integer dtype",)),
    "decode-plan-last-page-0": Bad(lambda mk: BatchDecode().plan(D_INDPTR, D_INDICES, [1, 0], **D_PLAN), ValueError,
                                   ("kv_last_page_len[1] must be in [1, page_size=4] for a request with pages",)),
    "decode-plan-indices-short": Bad(lambda mk: BatchDecode().plan(D_INDPTR, D_INDICES[:4], D_LAST, **D_PLAN),
                                     ValueError, ("kv_indices must have at least 5 entries but has 4",)),
    "decode-plan-indptr-negative-end": Bad(  # (int32 arrays: the fast path hands it over instead of failing itself)
        lambda mk: BatchDecode().plan(np.array([0, -1], np.int32), np.zeros(0, np.int32), np.array([1], np.int32),
                                      **D_PLAN),  # fmt: skip
        ValueError, ("kv_indptr must be non-negative but kv_indptr[1] = -1",)),
    "prefill-plan-kv-indptr-negative-end": Bad(
        lambda mk: BatchPrefill().plan(np.array([0, 0], np.int32), np.array([0, -1], np.int32), np.zeros(0, np.int32),
                                       np.array([0], np.int32), **P_PLAN),  # fmt: skip
        ValueError, ("kv_indptr must be non-negative but kv_indptr[1] = -1",)),
    "decode-plan-kv-len-over-int32": Bad(
        lambda mk: BatchDecode().plan(np.array([0, 4096], np.int32), np.zeros(4096, np.int32),
                                      np.array([BIG], np.int32), **{**D_PLAN, "page_size": BIG}),  # fmt: skip
        ValueError, ("request 0 must hold at most 2147483647 tokens", "4294967296")),
    # -- BatchDecode.run: q, the cache, out / lse against the plan; fixes that would work
    "decode-run-q-int32": Bad(lambda mk: decode(mk, q=np.ones((2, 8, 64), np.int32)), ValueError,
                              ("q has dtype int32 but plan() was made for q_dtype=float16; cast q with",),
                              absent=("q_dtype='int32'",)),
    "decode-run-q-bf16": Bad(lambda mk: decode(mk, q=randn(2, 8, 64, dtype=BF16)), ValueError,
                             ("q has dtype bfloat16", "or call plan() with q_dtype='bfloat16'")),
    "decode-run-q-shape": Bad(lambda mk: decode(mk, q=randn(2, 16, 64)), ValueError,
                              ("q must have shape (2, 8, 64) but has shape (2, 16, 64)",)),
    "decode-run-q-none": Bad(lambda mk: decode_plan().run(None, mk(randn(6, 2, 4, 2, 64))), ValueError,
                             ("q must be an array",)),
    "decode-run-cache-none": Bad(lambda mk: decode_plan().run(mk(randn(2, 8, 64)), None), ValueError,
                                 ("kv_cache must be an array",)),
    "decode-run-cache-float32": Bad(lambda mk: decode(mk, cache=randn(6, 2, 4, 2, 64, dtype=F32)), ValueError,
                                    ("kv_cache has dtype float32 but plan() was made for kv_dtype=float16",),
                                    absent=("kv_dtype='float32'",)),
    "decode-run-cache-tuple-dtypes": Bad(
        lambda mk: decode(mk, cache=(randn(6, 4, 2, 64), randn(6, 4, 2, 64, dtype=BF16))), ValueError,
        ("k_cache and v_cache must have the same dtype",)),
    "decode-run-cache-too-small": Bad(lambda mk: decode(mk, cache=randn(5, 2, 4, 2, 64)), ValueError,
                                      ("kv_indices holds page index 5 but kv_cache has 5 pages",)),
    "decode-run-cache-strided": Bad(lambda mk: decode(mk, cache=strided_last(randn(6, 2, 4, 2, 64))), ValueError,
                                    ("kv_cache must have a contiguous last dimension",)),
    "decode-run-out-float32": Bad(lambda mk: decode(mk, out=np.zeros((2, 8, 64), F32)), ValueError,
                                  ("out has dtype float32 but plan() was made for o_dtype=float16",),
                                  absent=("o_dtype='float32'",)),
    "decode-run-out-bf16": Bad(lambda mk: decode(mk, out=np.zeros((2, 8, 64), BF16)), ValueError,
                               ("out has dtype bfloat16", "or call plan() with o_dtype='bfloat16'")),
    "decode-run-out-shape": Bad(lambda mk: decode(mk, out=np.zeros((2, 8, 32), F16)), ValueError,
                                ("out must have shape (2, 8, 64) but has shape (2, 8, 32)",)),
    "decode-run-out-readonly": Bad(lambda mk: decode(mk, out=readonly(np.zeros((2, 8, 64), F16))), ValueError,
                                   ("out must be writable",)),
    "decode-run-lse-float16": Bad(lambda mk: decode(mk, lse=np.zeros((2, 8), F16)), ValueError,
                                  ("lse must have dtype float32 but has dtype float16",)),
    "decode-run-k-scale-str": Bad(lambda mk: decode(mk, k_scale="2"), TypeError, ("k_scale must be a number",)),
    "decode-run-v-scale-bool": Bad(lambda mk: decode(mk, v_scale=True), TypeError, ("v_scale must be a number",)),
    "decode-run-k-scale-nan": Bad(lambda mk: decode(mk, k_scale=float("nan")), ValueError,
                                  ("k_scale must be a finite, nonzero number",)),
    # fp8 caches (docs/fp8.md): scales and uint8 caches against the plan's kv_dtype
    "decode-run-k-scale-array-16-bit": Bad(lambda mk: decode(mk, k_scale=np.ones(2, F32)), ValueError,
                                           ("k_scale as an array (per KV head) dequantises fp8 caches",)),
    "decode-run-fp8-v-scale-zero": Bad(lambda mk: decode(mk, cache=randn(6, 2, 4, 2, 64, dtype=E4M3, seed=1),
                                                         plan=dict(kv_dtype="float8_e4m3fn"), v_scale=0.0),
                                       ValueError, ("v_scale must be a finite, nonzero number",)),  # fmt: skip
    "decode-run-fp8-k-scale-length": Bad(lambda mk: decode(mk, cache=randn(6, 2, 4, 2, 64, dtype=E4M3, seed=1),
                                                           plan=dict(kv_dtype="float8_e4m3fn"),
                                                           k_scale=np.ones(3, F32)),
                                         ValueError, ("k_scale must be a number or a", "1 or num_kv_heads=2 values",
                                                      "has shape (3,)"), same_rule=False),  # fmt: skip
    "decode-run-uint8-cache-16-bit": Bad(lambda mk: decode(mk, cache=np.zeros((6, 2, 4, 2, 64), np.uint8)),
                                         ValueError, ("kv_cache is uint8 but plan() was made for kv_dtype=float16",)),
    # -- BatchPrefill.plan
    "prefill-plan-heads-float": Bad(lambda mk: ragged(mk, plan=dict(num_qo_heads=4.0)), TypeError,
                                    ("num_qo_heads must be an integer but is 4.0",)),
    "prefill-plan-head-dim-vo-float": Bad(lambda mk: ragged(mk, plan=dict(head_dim_vo=64.0)), TypeError,
                                          ("head_dim_vo must be an integer but is 64.0",)),
    "prefill-plan-tile-float": Bad(lambda mk: ragged(mk, plan=dict(tile_sizes=(64.0, 64))), TypeError,
                                   ("tile_sizes (query_tile) must be an integer but is 64.0",)),
    "prefill-plan-mask-int": Bad(lambda mk: ragged(mk, plan=dict(custom_mask=np.array([0, 2, 0, 5] * 6 + [1] * 8))),
                                 ValueError, ("custom_mask must hold bools", "is 2")),
    "prefill-plan-mask-float": Bad(lambda mk: ragged(mk, plan=dict(custom_mask=np.ones(24, F32))), ValueError,
                                   ("custom_mask must have dtype bool",)),
    "prefill-plan-mask-size": Bad(lambda mk: ragged(mk, plan=dict(custom_mask=np.ones(23, bool))), ValueError,
                                  ("custom_mask must hold sum(qo_len * kv_len) = 24 entries",)),
    "prefill-plan-kv-len-over-int32": Bad(
        lambda mk: BatchPrefill().plan(np.array([0, 1], np.int32), np.array([0, 4096], np.int32),
                                       np.zeros(4096, np.int32), np.array([BIG], np.int32),
                                       **{**P_PLAN, "page_size": BIG}),  # fmt: skip
        ValueError, ("request 0 must hold at most 2147483647 tokens",)),
    # -- BatchPrefill.run
    "prefill-run-kv-float16": Bad(lambda mk: ragged(mk, k=randn(10, 2, 64), v=randn(10, 2, 64)), ValueError,
                                  ("k/v have dtype float16 but plan() was made for kv_dtype=bfloat16",
                                   "or call plan() with q_dtype='float16'")),  # fmt: skip
    "prefill-run-kv-mixed": Bad(lambda mk: ragged(mk, v=randn(10, 2, 64)), ValueError,
                                ("k and v must have the same dtype but k is bfloat16 and v is float16",)),
    "prefill-run-q-int32": Bad(lambda mk: ragged(mk, q=np.ones((5, 4, 64), np.int32)), ValueError,
                               ("q has dtype int32 but plan() was made for q_dtype=bfloat16",),
                               absent=("q_dtype='int32'",)),
    "prefill-run-q-rows": Bad(lambda mk: ragged(mk, q=randn(6, 4, 64, dtype=BF16)), ValueError,
                              ("q has 6 rows but qo_indptr[-1] = 5",)),
    "prefill-run-k-rows": Bad(lambda mk: ragged(mk, k=randn(9, 2, 64, dtype=BF16)), ValueError,
                              ("k has 9 tokens but kv_indptr[-1] = 10",)),
    "prefill-run-out-readonly": Bad(lambda mk: ragged(mk, out=readonly(np.zeros((5, 4, 64), BF16))), ValueError,
                                    ("out must be writable",)),
    "prefill-run-paged-cache-float16": Bad(lambda mk: paged(mk, cache=randn(4, 2, 4, 2, 64)), ValueError,
                                           ("k/v have dtype float16 but plan() was made for kv_dtype=bfloat16",)),
    "prefill-run-paged-strides": Bad(
        lambda mk: paged(mk, cache=(randn(4, 4, 2, 64, dtype=BF16), other_strides(randn(4, 4, 2, 64, dtype=BF16)))),
        ValueError, ("k_cache and v_cache must have the same strides",)),
    "prefill-run-paged-cache-small": Bad(lambda mk: paged(mk, cache=randn(3, 2, 4, 2, 64, dtype=BF16)), ValueError,
                                         ("kv_indices holds page index 3 but kv_cache has 3 pages",)),
    "prefill-run-k-scale-16-bit": Bad(lambda mk: ragged(mk, k_scale=0.5), ValueError,
                                      ("k_scale dequantises fp8 caches but plan() was made for kv_dtype=bfloat16",)),
    "prefill-run-fp8-kv-float16": Bad(lambda mk: ragged(mk, plan=dict(kv_dtype="float8_e5m2"), k=randn(10, 2, 64),
                                                        v=randn(10, 2, 64)),
                                      ValueError, ("k/v have dtype float16 but plan() was made for "
                                                   "kv_dtype=float8_e5m2",)),  # fmt: skip
    "prefill-run-two-arrays": Bad(lambda mk: ragged(mk, v=()), TypeError,
                                  ("a BatchPrefill(paged=False) runs as run(q, k, v) but got 2 arrays",)),
}  # fmt: skip


def _rule(exc: BaseException) -> str:
    """The "<name> <rule> but <received>" part of a message (the fix after "; " may be spelt per framework)."""
    return str(exc).split("; ")[0]


def _raised(bad: Bad, mk: Callable) -> BaseException:
    with pytest.raises(bad.exc) as info:
        bad.call(mk)
    return info.value


@pytest.mark.parametrize("name", list(CASES))
def test_refused_alike_on_both_routes(name, monkeypatch):
    bad = CASES[name]
    got = _raised(bad, lambda a: a)
    for fragment in bad.says:
        assert fragment in str(got), f"{fragment!r} not in {str(got)!r}"
    for fragment in bad.absent:
        assert fragment not in str(got), f"the fix {fragment!r} would not work: {str(got)!r}"
    if not bad.gpu:
        return
    log, _ = install(monkeypatch)
    on_gpu = _raised(bad, to_cuda)
    assert type(on_gpu) is type(got)
    for fragment in bad.says:
        assert fragment in str(on_gpu), f"GPU route: {fragment!r} not in {str(on_gpu)!r}"
    if bad.same_rule:
        assert _rule(on_gpu) == _rule(got)
    assert [e for e in log if e[0] == "launch"] == [], "a refused call launched a kernel"


def test_none_is_not_a_missing_gpu():
    """The real GPU route (no stand-in): None or a list as q is the mistake to name, not NoGPUError."""
    with pytest.raises(ValueError, match="q must be an array .* but is a NoneType"):
        single_decode(None, randn(9, 2, 64), randn(9, 2, 64))
    w = BatchDecode()
    w.plan(D_INDPTR, D_INDICES, D_LAST, **D_PLAN)
    with pytest.raises(ValueError, match="q must be an array"):
        w.run(None, randn(6, 2, 4, 2, 64))
    with pytest.raises(ValueError, match="o must be an array"):
        cuinfer.merge_state_in_place(None, None, None, None)


def test_memo_does_not_take_a_float_for_the_int_it_was_made_for():
    """plan() memoises what its counts fix; 8.0 == 8 (and True == 1) hash alike, so the memo must not let them by."""
    w = BatchDecode()
    w.plan(D_INDPTR, D_INDICES, D_LAST, **D_PLAN)
    with pytest.raises(TypeError, match="num_qo_heads must be an integer but is 8.0"):
        w.plan(D_INDPTR, D_INDICES, D_LAST, **{**D_PLAN, "num_qo_heads": 8.0})
    w.plan(D_INDPTR, D_INDICES, D_LAST, **{**D_PLAN, "num_qo_heads": np.int64(8)})  # NumPy integers are ints
    p = BatchPrefill(paged=False)
    p.plan(P_QO, P_KV, **P_PLAN)
    with pytest.raises(TypeError, match="num_kv_heads must be an integer but is True"):
        p.plan(P_QO, P_KV, **{**P_PLAN, "num_kv_heads": True, "num_qo_heads": 1})
    with pytest.raises(TypeError, match="window_left must be an integer but is 2.0"):
        p.plan(P_QO, P_KV, **P_PLAN, window_left=2.0)
    with pytest.raises(TypeError, match="num_sms must be an integer but is 8.0"):
        p.plan(P_QO, P_KV, **P_PLAN, num_sms=8.0)


# ---- sizes the CPU reference refuses up front -------------------------------------------------------------------


def test_a_billion_token_decode_is_refused_up_front_with_its_size():
    """A 10**9-token request (a zero-stride cache: no memory behind it) plans fine (the GPU could run it) but the
    float64 reference refuses it at once, naming the size, instead of a 238 GiB MemoryError half-way through."""
    ps, pages = BIG, 954
    last = 10**9 - (pages - 1) * ps
    cache = np.broadcast_to(np.zeros((1, 2, 1, 8, 128), F16), (1, 2, ps, 8, 128))
    w = BatchDecode()
    w.plan(np.array([0, pages], np.int32), np.zeros(pages, np.int32), np.array([last], np.int32),
           num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=ps, q_dtype="float16")  # fmt: skip
    assert int(w._plan.kv_lens[0]) == 10**9
    with pytest.raises(ValueError, match=r"the CPU reference backend would need about \d+\.\d GiB of memory"):
        w.run(randn(1, 32, 128), cache)
    k = np.broadcast_to(np.zeros((1, 8, 128), F16), (10**9, 8, 128))
    with pytest.raises(ValueError, match="would need about .* GiB"):
        single_decode(randn(32, 128), k, k)
    with pytest.raises(ValueError, match="would need about .* GiB"):
        reference.attention(randn(1, 32, 128), k, k)


def test_the_reference_size_check_lets_ordinary_batches_by(monkeypatch):
    import cuinfer.reference.util as util

    o = decode(lambda a: a)
    assert o.shape == (2, 8, 64)
    monkeypatch.setattr(util, "memory_limit", lambda: 1 << 16)  # a tiny machine: the same batch is refused
    with pytest.raises(ValueError, match="may use 0.0 GiB"):
        decode(lambda a: a)


def test_a_plan_whose_buffers_cannot_be_allocated_raises_at_plan_with_the_size(monkeypatch):
    """On a GPU, plan() allocates the workspace and the plan buffer (page table): a failed allocation is a
    MemoryError naming the buffer and its bytes, and the wrapper keeps its previous workspace."""
    import cupy

    import cuinfer.runtime.wrapper as wrapper
    from cuinfer.runtime.buffers import allocating
    from tests.cpu.fake_gpu import FakeBuffers

    with pytest.raises(MemoryError, match=r"plan\(\) needs 5000 bytes \(0.00 GiB\) for the workspace on cuda:0"):
        with allocating(0, 5000, "workspace"):
            raise cupy.cuda.memory.OutOfMemoryError(5000, 0, 0)
    log, _ = install(monkeypatch)

    class Tight(FakeBuffers):  # a device with room for 4 KiB of workspace
        def ensure_workspace(self, nbytes: int) -> None:
            if nbytes > 4096:
                with allocating(self.device_id, nbytes, "workspace"):
                    raise cupy.cuda.memory.OutOfMemoryError(nbytes, 0, 0)
            super().ensure_workspace(nbytes)

    monkeypatch.setattr(wrapper, "Buffers", lambda *a: Tight(log, *a))
    monkeypatch.setattr(BatchDecode, "_DEFAULT_WORKSPACE_BYTES", 4096)
    w = BatchDecode()  # (no workspace_bytes: the workspace grows as plans need)
    need = w.workspace_size(D_INDPTR, D_INDICES, D_LAST, **D_PLAN, fixed_split_size=1)
    assert need > 4096
    with pytest.raises(MemoryError, match=f"plan\\(\\) needs {need} bytes .* for the workspace"):
        w.plan(D_INDPTR, D_INDICES, D_LAST, **D_PLAN, fixed_split_size=1)
    assert w.workspace_bytes == 4096
    w.plan(D_INDPTR, D_INDICES, D_LAST, **D_PLAN)  # a plan that fits still does


# ---- accepted on purpose -----------------------------------------------------------------------------------------


def _reference_decode(q, cache, indptr=D_INDPTR, indices=D_INDICES, last=D_LAST):
    o, lse = reference.batch_decode_paged(q, cache, indptr, indices, last)
    return o.astype(q.dtype), lse.astype(F32)


@pytest.mark.parametrize("route", ["numpy", "gpu"])
def test_longer_kv_indices_are_a_buffer_whose_tail_is_not_read(route, monkeypatch):
    """FlashInfer takes a kv_indices buffer longer than kv_indptr[-1] (CUDA-graph users preallocate it): the tail is
    neither read nor checked, on the fast path (int32 NumPy) and the validators' path (lists) alike."""
    mk = (lambda a: a) if route == "numpy" else to_cuda
    log = install(monkeypatch)[0] if route == "gpu" else None
    q, cache = randn(2, 8, 64), randn(6, 2, 4, 2, 64, seed=1)
    for tail in ([-1, 10**9], [7]):
        for indices in (np.concatenate([D_INDICES, np.array(tail, np.int32)]), D_INDICES.tolist() + tail):
            w = BatchDecode()
            w.plan(D_INDPTR, indices, D_LAST, **D_PLAN)
            np.testing.assert_array_equal(w._plan.kv_indices, D_INDICES)
            o = w.run(mk(q), mk(cache))
            if route == "numpy":
                np.testing.assert_array_equal(o, _reference_decode(q, cache)[0])
    if log is not None:
        assert [e[0] for e in log].count("launch") == 4


def test_decode_takes_a_kv_dtype_other_than_q():
    """Decode (BatchDecode and single_decode) takes float16 q over a bfloat16 cache, as BatchDecode.plan documents."""
    q, cache = randn(2, 8, 64), randn(6, 2, 4, 2, 64, dtype=BF16, seed=1)
    o = decode(lambda a: a, cache=cache, plan=dict(kv_dtype="bfloat16"))
    np.testing.assert_array_equal(o, _reference_decode(q, cache)[0])
    k, v = randn(9, 2, 64, dtype=BF16, seed=1), randn(9, 2, 64, dtype=BF16, seed=2)
    o1, lse1 = single_decode(randn(8, 64), k, v, return_lse=True)
    ref_o, ref_lse = reference.attention(randn(8, 64)[None], k, v)
    assert o1.dtype == F16 and lse1.dtype == F32
    np.testing.assert_array_equal(o1, ref_o[0].astype(F16))


def test_a_0_1_integer_mask_is_the_bool_mask():
    mask = np.random.default_rng(5).random((3, 5)) < 0.6
    mask[:, 0] = True
    want = sprefill(lambda a: a, custom_mask=mask)
    np.testing.assert_array_equal(sprefill(lambda a: a, custom_mask=mask.astype(np.int64)), want)
    np.testing.assert_array_equal(sprefill(lambda a: a, custom_mask=mask.astype(np.uint8).tolist()), want)


@pytest.mark.parametrize("dtype", [F16, BF16, F32, np.float64])
def test_merge_outputs_come_back_in_the_input_dtype(dtype):
    o, lse = states(4, 3, 2, 64, dtype=dtype)
    mo, ml = cuinfer.merge_states(o, lse)
    assert mo.dtype == dtype and ml.dtype == F32
    ref_o, ref_lse = reference.merge_states(o, lse)
    np.testing.assert_array_equal(mo, ref_o.astype(dtype))
    np.testing.assert_array_equal(ml, ref_lse.astype(F32))
    po, pl = cuinfer.merge_state(o[:, 0], lse[:, 0], o[:, 1], lse[:, 1])
    assert po.dtype == dtype and pl.dtype == F32


@pytest.mark.parametrize("which", ["merge_state", "merge_states", "merge_state_in_place"])
def test_an_empty_state_is_never_read(which):
    """An empty state (lse = -inf) may hold anything in o, NaN included: merging it is an exact no-op."""
    o, lse = states(6, 2, 64)
    junk = np.full_like(o, np.nan)
    empty = np.full_like(lse, -np.inf)
    if which == "merge_state":
        mo, ml = cuinfer.merge_state(o, lse, junk, empty)
    elif which == "merge_states":
        mo, ml = cuinfer.merge_states(np.stack([junk, o, junk], axis=1), np.stack([empty, lse, empty], axis=1))
    else:
        mo, ml = o.copy(), lse.copy()
        cuinfer.merge_state_in_place(mo, ml, junk, empty)
    np.testing.assert_array_equal(mo, o)
    np.testing.assert_array_equal(ml, lse)
    # all states empty: o = 0, lse = -inf, never NaN
    mo, ml = cuinfer.merge_state(junk, empty, junk, empty)
    assert not np.isnan(mo).any() and (mo == 0).all() and (ml == -np.inf).all()
