"""The page-table fast path of plan() (``formats.paged.read_page_table_fast``: two reductions over 1-D NumPy int32
arrays) against the validators' path it stands in for, and its hand-over of anything it cannot vouch for."""

from __future__ import annotations

import numpy as np
import pytest

from cuinfer.formats.paged import read_checked_page_table, read_page_table, read_page_table_fast


def _table(rng, b: int, ps: int, zero_pages: bool, spare: int):
    lens = rng.integers(1, 40 * ps, b)
    pages = -(-lens // ps)
    if zero_pages:
        pages[rng.random(b) < 0.2] = 0
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.where(pages > 0, lens - (np.maximum(pages, 1) - 1) * ps, rng.integers(1, ps + 1, b)).astype(np.int32)
    indices = rng.permutation(int(indptr[-1]) + spare).astype(np.int32)
    return indptr, indices, last


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name, v in a.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, b[name], err_msg=name)
            assert v.dtype == b[name].dtype, name
        else:
            assert v == b[name], (name, v, b[name])


@pytest.mark.parametrize(
    "b, ps, zero_pages, spare",
    [
        pytest.param(128, 16, False, 0, id="128-page16"),
        pytest.param(57, 5, True, 0, id="57-page5-empty-requests"),
        pytest.param(9, 1, False, 7, id="9-page1-spare-indices"),
        pytest.param(1, 16, False, 3, id="one-request"),
    ],
)
def test_fast_page_table_is_the_validators(b, ps, zero_pages, spare, rng):
    indptr, indices, last = _table(rng, b, ps, zero_pages, spare)
    fast, slow = {}, {}
    assert read_page_table_fast(fast, indptr, indices, last, ps)
    read_checked_page_table(slow, indptr, indices, last, ps)
    _same(fast, slow)
    both = {}
    read_page_table(both, indptr, indices, last, ps)
    _same(both, slow)
    assert slow["kv_lens"].dtype == np.int32 and slow["nnz"] == int(indptr[-1])


@pytest.mark.parametrize(
    "bad",
    ["negative-page", "last-page-0", "last-page-over", "decreasing", "negative-end", "kv-len-over-int32", "2d",
     "short"],
)  # fmt: skip
def test_fast_page_table_hands_bad_input_to_the_validators(bad, rng):
    indptr, indices, last = _table(rng, 12, 16, False, 0)
    if bad == "negative-page":
        indices[int(rng.integers(0, int(indptr[-1])))] = -2
    elif bad == "last-page-0":
        last[3] = 0
    elif bad == "last-page-over":
        last[3] = 17
    elif bad == "decreasing":
        indptr[5] = indptr[4] - 1
    elif bad == "negative-end":  # (kv_indptr[-1] < 0: no page count to slice kv_indices with)
        indptr[-1] = -1
    elif bad == "kv-len-over-int32":  # (pages x page_size past int32: the fast path's int32 lengths would wrap)
        indptr = (np.arange(13) * 4096).astype(np.int32)
        indices, last = np.zeros(int(indptr[-1]), np.int32), np.full(12, 2**20, np.int32)
    elif bad == "2d":
        indptr = indptr.reshape(1, -1)
    else:
        indices = indices[:-1]
    ps = 2**20 if bad == "kv-len-over-int32" else 16
    out = {}
    assert not read_page_table_fast(out, indptr, indices, last, ps)
    assert out == {}
    with pytest.raises(ValueError):
        read_page_table(out, indptr, indices, last, ps)


def test_other_inputs_take_the_validators(rng):
    """Lists and int64 arrays are read by the validators' path, with the same facts."""
    indptr, indices, last = _table(rng, 20, 16, True, 2)
    want, got = {}, {}
    read_page_table(want, indptr, indices, last, 16)
    read_page_table(got, indptr.tolist(), indices.astype(np.int64), last.tolist(), 16)
    _same(got, want)
