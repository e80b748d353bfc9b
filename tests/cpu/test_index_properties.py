"""Property tests over the index arrays of BatchDecode and BatchPrefill on NumPy inputs: mostly-valid page tables,
ragged offsets and custom masks with one random corruption each (negative, decreasing, wrong length, out-of-range page
index, last_page_len 0 or past page_size, wrong dtype, 2-D, a start other than 0, an empty batch, a longer index
buffer, a list or int64 array instead of int32). Whatever is drawn, plan() + run() either raise ValueError /
TypeError naming the argument that was corrupted (or one it is checked against), or return exactly what the float64
``cuinfer.reference`` functions compute on the same data, cast to the output dtypes. Nothing is accepted that the
reference would refuse or compute differently, and no other exception escapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cuinfer import BatchDecode, BatchPrefill, reference

F16, BF16, F32 = np.float16, ml_dtypes.bfloat16, np.float32
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# corruption -> the arguments it may apply to
CORRUPTIONS = {
    "none": ("kv_indptr",),
    "negative": ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"),
    "decreasing": ("qo_indptr", "kv_indptr"),
    "start-nonzero": ("qo_indptr", "kv_indptr"),
    "longer": ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "custom_mask"),
    "shorter": ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "custom_mask"),
    "grow-last-offset": ("qo_indptr", "kv_indptr"),
    "page-out-of-range": ("kv_indices",),
    "last-page-0": ("kv_last_page_len",),
    "last-page-over": ("kv_last_page_len",),
    "float": ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "custom_mask"),
    "bool": ("kv_indptr", "kv_indices", "kv_last_page_len"),
    "int64": ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "custom_mask"),
    "list": ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "custom_mask"),
    "2d": ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "custom_mask"),
    "mask-int-2": ("custom_mask",),
    "mask-0-1-ints": ("custom_mask",),
    "empty-batch": ("kv_indptr",),
    "kv-len-over-int32": ("kv_last_page_len",),  # (paged: pages x page_size past 2**31 - 1 tokens)
}
HUGE_PAGE = 2**20  # the page size of "kv-len-over-int32" (its cache is a zero-stride view: no memory behind it)

# a corrupted argument may be reported as one it is checked against (a shorter kv_indptr makes kv_last_page_len the
# wrong length; q's rows follow qo_indptr; a mask's size follows the lengths)
RELATED = {
    "qo_indptr": ("qo_indptr", "kv_indptr", "kv_last_page_len", "custom_mask", "q"),
    "kv_indptr": ("kv_indptr", "qo_indptr", "kv_indices", "kv_last_page_len", "custom_mask", "q", "k", "v"),
    "kv_indices": ("kv_indices",),
    "kv_last_page_len": ("kv_last_page_len", "custom_mask"),
    "custom_mask": ("custom_mask",),
}


@dataclass
class Batch:
    qo_lens: np.ndarray
    kv_lens: np.ndarray
    page_size: int
    num_pages: int
    args: dict  # the index arrays (and mask) by name, int32 / bool, valid


def _batch(draw, *, paged: bool, decode: bool, masked: bool) -> Batch:
    b = draw(st.integers(1, 4))
    ps = draw(st.sampled_from([1, 3, 4])) if paged else 1
    kv_lens = np.array(draw(st.lists(st.integers(0, 11), min_size=b, max_size=b)), np.int64)
    qo_lens = np.ones(b, np.int64) if decode else np.array(draw(st.lists(st.integers(0, 5), min_size=b, max_size=b)))
    args = {}
    if not decode:
        args["qo_indptr"] = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    num_pages = 0
    if paged:
        pages = -(-kv_lens // ps)
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        num_pages = int(indptr[-1]) + draw(st.integers(0, 3))
        seed = draw(st.integers(0, 2**16))
        indices = np.random.default_rng(seed).permutation(num_pages)[: indptr[-1]].astype(np.int32)
        last = np.where(pages > 0, kv_lens - (pages - 1) * ps, draw(st.integers(0, ps))).astype(np.int32)
        args.update(kv_indptr=indptr, kv_indices=indices, kv_last_page_len=last)
    else:
        args["kv_indptr"] = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    if masked:
        n = int((qo_lens * kv_lens).sum())
        seed = draw(st.integers(0, 2**16))
        args["custom_mask"] = np.random.default_rng(seed).random(n) < 0.7
    return Batch(qo_lens, kv_lens, ps, max(num_pages, 1), args)


def _corrupt(draw, batch: Batch, kind: str, target: str) -> None:
    a = batch.args
    x = a[target]
    if kind == "negative":
        i = draw(st.integers(1 if target.endswith("indptr") else 0, max(len(x) - 1, 0)))
        if len(x):
            x = x.copy()
            x[i] = -draw(st.integers(1, 5))
    elif kind == "decreasing" and len(x) > 1:
        x = x.copy()
        i = draw(st.integers(1, len(x) - 1))
        x[i] = x[i - 1] - 1
    elif kind == "start-nonzero":
        x = x.copy()
        x[0] = 1
    elif kind == "longer":
        extra = draw(st.integers(-3, 40))
        x = np.concatenate([x, np.array([extra], x.dtype if x.dtype != bool else np.int64)]).astype(x.dtype)
    elif kind == "shorter" and len(x):
        x = x[:-1]
    elif kind == "grow-last-offset":
        x = x.copy()
        x[-1] += draw(st.integers(1, 3))
    elif kind == "page-out-of-range" and len(x):
        x = x.copy()
        x[draw(st.integers(0, len(x) - 1))] = batch.num_pages + draw(st.integers(0, 5))
    elif kind in ("last-page-0", "last-page-over"):
        x = x.copy()
        x[draw(st.integers(0, len(x) - 1))] = 0 if kind == "last-page-0" else batch.page_size + draw(st.integers(1, 3))
    elif kind == "float":
        x = x.astype(np.float64) + (0.5 if draw(st.booleans()) and len(x) else 0.0)
    elif kind == "bool":
        x = x.astype(bool)
    elif kind == "int64":
        x = x.astype(np.int64)
    elif kind == "list":
        x = x.tolist()
    elif kind == "2d":
        x = x.reshape(1, -1) if draw(st.booleans()) else x.reshape(-1, 1)
    elif kind == "mask-int-2" and len(x):
        x = x.astype(np.int32)
        x[draw(st.integers(0, len(x) - 1))] = 2
    elif kind == "mask-0-1-ints":
        x = x.astype(np.uint8)
    elif kind == "kv-len-over-int32":
        n = 2**31 // HUGE_PAGE + draw(st.integers(0, 3))
        b = len(a["kv_last_page_len"])
        a["kv_indptr"] = np.concatenate([[0], np.full(b, n).cumsum()]).astype(np.int32)
        a["kv_indices"] = np.zeros(n * b, np.int32)
        a["kv_last_page_len"] = np.full(b, HUGE_PAGE, np.int32)
        batch.page_size, batch.num_pages = HUGE_PAGE, 1
        a.pop("custom_mask", None)
        return
    elif kind == "empty-batch":
        for name in a:
            a[name] = np.zeros(1 if name.endswith("indptr") else 0, np.int32 if name != "custom_mask" else bool)
        batch.qo_lens, batch.kv_lens = batch.qo_lens[:0], batch.kv_lens[:0]
        return
    a[target] = x


def _corruption(draw, batch: Batch) -> tuple[str, str]:
    """Draw a corruption that applies to one of ``batch``'s arguments, apply it, and return (kind, argument)."""
    kinds = sorted(k for k, targets in CORRUPTIONS.items() if any(t in batch.args for t in targets))
    kind = draw(st.sampled_from(kinds))
    target = draw(st.sampled_from([t for t in CORRUPTIONS[kind] if t in batch.args]))
    _corrupt(draw, batch, kind, target)
    return kind, target


def _cache(rng, batch: Batch, dtype) -> np.ndarray:
    shape = (batch.num_pages, 2, batch.page_size, 2, 64)
    if batch.page_size == HUGE_PAGE:
        return np.broadcast_to(np.zeros((1, 2, 1, 2, 64), dtype), shape)
    return rng.standard_normal(shape).astype(dtype)


def _rows(x, default: int) -> int:
    """Rows a (possibly corrupted) indptr asks for: its last entry when it reads as one, else ``default``."""
    arr = np.asarray(x)
    if arr.ndim == 1 and arr.size and arr.dtype.kind in "iu" and int(arr[-1]) >= 0:
        return int(arr[-1])
    return default


def _names(msg: str, allowed: tuple[str, ...]) -> bool:
    return any(re.search(rf"(?<![\w\[]){re.escape(n)}(?![\w])", msg) for n in allowed)


def _check_outcome(call, expected, target: str) -> None:
    """``call()`` raises ValueError / TypeError naming ``target`` (or a related argument), or equals ``expected()``."""
    try:
        got = call()
    except (ValueError, TypeError) as exc:
        event(f"refused: {type(exc).__name__}")
        assert _names(str(exc), RELATED[target]), f"the message does not name {target}: {exc}"
        return
    event("accepted")
    want = expected()
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@st.composite
def decode_cases(draw):
    batch = _batch(draw, paged=True, decode=True, masked=False)
    kind, target = _corruption(draw, batch)
    return batch, kind, target, draw(st.integers(0, 2**16))


@given(decode_cases())
@SETTINGS
def test_batch_decode_index_arrays(case):
    batch, kind, target, seed = case
    event(f"{kind} {target}")
    a = batch.args
    rng = np.random.default_rng(seed)
    b = max(len(np.asarray(a["kv_indptr"]).reshape(-1)) - 1, 0)
    q = rng.standard_normal((b, 4, 64)).astype(F16)
    cache = _cache(rng, batch, F16)

    def call():
        w = BatchDecode()
        w.plan(a["kv_indptr"], a["kv_indices"], a["kv_last_page_len"], num_qo_heads=4, num_kv_heads=2, head_dim=64,
               page_size=batch.page_size, q_dtype="float16")  # fmt: skip
        return w.run(q, cache, return_lse=True)

    def expected():
        o, lse = reference.batch_decode_paged(q, cache, a["kv_indptr"], a["kv_indices"], a["kv_last_page_len"])
        return o.astype(F16), lse.astype(F32)

    _check_outcome(call, expected, target)


@st.composite
def prefill_cases(draw):
    paged = draw(st.booleans())
    batch = _batch(draw, paged=paged, decode=False, masked=draw(st.booleans()))
    kind, target = _corruption(draw, batch)
    return paged, batch, kind, target, draw(st.integers(0, 2**16))


@given(prefill_cases())
@SETTINGS
def test_batch_prefill_index_arrays(case):
    paged, batch, kind, target, seed = case
    event(f"{'paged' if paged else 'ragged'} {kind} {target}")
    a = batch.args
    rng = np.random.default_rng(seed)
    nq = _rows(a["qo_indptr"], int(batch.qo_lens.sum()))
    q = rng.standard_normal((nq, 4, 64)).astype(BF16)
    mask = a.get("custom_mask")
    kw = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, q_dtype="bfloat16", custom_mask=mask)
    if paged:
        cache = _cache(rng, batch, BF16)
        kv = (cache,)
        index = (a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["kv_last_page_len"])
        kw["page_size"] = batch.page_size
    else:
        nkv = _rows(a["kv_indptr"], int(batch.kv_lens.sum()))
        kv = tuple(rng.standard_normal((nkv, 2, 64)).astype(BF16) for _ in range(2))
        index = (a["qo_indptr"], a["kv_indptr"])

    def call():
        w = BatchPrefill(paged=paged)
        w.plan(*index, **kw)
        return w.run(q, *kv, return_lse=True)

    def expected():
        if paged:
            o, lse = reference.batch_prefill_paged(q, cache, *index, custom_mask=mask)
        else:
            o, lse = reference.batch_attention_ragged(q, *kv, *index, custom_mask=mask)
        return o.astype(BF16), lse.astype(F32)

    _check_outcome(call, expected, target)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "ragged"])
def test_an_empty_batch_runs_to_empty_outputs(paged):
    w = BatchPrefill(paged=paged)
    index = ([0], [0], [], []) if paged else ([0], [0])
    w.plan(*index, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=4, q_dtype="bfloat16")
    kv = (np.zeros((1, 2, 4, 2, 64), BF16),) if paged else (np.zeros((0, 2, 64), BF16),) * 2
    o, lse = w.run(np.zeros((0, 4, 64), BF16), *kv, return_lse=True)
    assert o.shape == (0, 4, 64) and o.dtype == BF16 and lse.shape == (0, 4) and lse.dtype == F32
