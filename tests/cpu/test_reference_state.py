"""The reference merge operator: definition, associativity, commutativity, empty states, in-place masking."""

from __future__ import annotations

import numpy as np
import pytest

from cuinfer import reference as R


@pytest.fixture
def rng(request):
    seed = int(np.random.SeedSequence().entropy % (1 << 63))
    print(f"random seed for {request.node.name}: {seed}")
    return np.random.default_rng(seed)


def random_state(rng, L=7, H=5, D=11, empty_rows=()):
    o = rng.standard_normal((L, H, D))
    lse = rng.standard_normal((L, H)) * 8.0
    for r in empty_rows:
        o[r], lse[r] = 0.0, -np.inf
    return o, lse


def test_merge_state_matches_definition(rng):
    (oa, la), (ob, lb) = random_state(rng), random_state(rng)
    o, lse = R.merge_state(oa, la, ob, lb)
    wa, wb = 2.0**la, 2.0**lb  # no overflow at these magnitudes: the textbook form is a fair oracle
    np.testing.assert_allclose(
        o, (wa[..., None] * oa + wb[..., None] * ob) / (wa + wb)[..., None], rtol=1e-12, atol=1e-13
    )
    np.testing.assert_allclose(lse, np.log2(wa + wb), rtol=1e-13, atol=1e-13)


def test_merge_state_is_stable_for_huge_lse(rng):
    (oa, la), (ob, lb) = random_state(rng), random_state(rng)
    o, lse = R.merge_state(oa, la + 5000.0, ob, lb + 5000.0)  # 2^5000 overflows float64
    o_ref, lse_ref = R.merge_state(oa, la, ob, lb)
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(lse))
    # lse + 5000 keeps ~5000·eps absolute precision, so the weights agree to ~1e-12 only
    np.testing.assert_allclose(o, o_ref, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(lse, lse_ref + 5000.0, rtol=1e-13, atol=1e-13)


def test_merge_is_commutative_and_associative(rng):
    a, b, c = random_state(rng, empty_rows=(1,)), random_state(rng, empty_rows=(1, 3)), random_state(rng)
    ab = R.merge_state(*a, *b)
    ba = R.merge_state(*b, *a)
    np.testing.assert_allclose(ab[0], ba[0], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(ab[1], ba[1], rtol=1e-14, atol=1e-13)
    left = R.merge_state(*ab, *c)
    right = R.merge_state(*a, *R.merge_state(*b, *c))
    np.testing.assert_allclose(left[0], right[0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(left[1], right[1], rtol=1e-13, atol=1e-13)


def test_merging_an_empty_state_is_a_no_op(rng):
    o, lse = random_state(rng)
    empty_o, empty_lse = np.zeros_like(o), np.full_like(lse, -np.inf)
    for merged in (R.merge_state(o, lse, empty_o, empty_lse), R.merge_state(empty_o, empty_lse, o, lse)):
        np.testing.assert_array_equal(merged[0], o)
        np.testing.assert_array_equal(merged[1], lse)


def test_all_empty_merge_is_empty_not_nan(rng):
    o = rng.standard_normal((3, 4, 2, 8))  # garbage o under lse = -inf must not leak
    lse = np.full((3, 4, 2), -np.inf)
    mo, ml = R.merge_states(o, lse)
    assert np.all(mo == 0.0) and np.all(ml == -np.inf)
    so, sl = R.merge_state(o[:, 0], lse[:, 0], o[:, 1], lse[:, 1])
    assert np.all(so == 0.0) and np.all(sl == -np.inf)


@pytest.mark.parametrize("S", [pytest.param(1, id="s1"), pytest.param(5, id="s5"), pytest.param(13, id="s13")])
def test_merge_states_equals_sequential_merges(rng, S):
    L, H, D = 6, 3, 9
    o = rng.standard_normal((L, S, H, D))
    lse = rng.standard_normal((L, S, H)) * 10.0
    lse[0, :-1] = -np.inf  # row 0: only the last state is non-empty
    mo, ml = R.merge_states(o, lse)
    acc = (o[:, 0], lse[:, 0])
    for s in range(1, S):
        acc = R.merge_state(*acc, o[:, s], lse[:, s])
    np.testing.assert_allclose(mo, acc[0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(ml, acc[1], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(mo[0], o[0, -1], rtol=1e-14, atol=1e-13)


def test_merge_states_of_kv_chunks_equals_whole_attention(rng):
    lq, lkv, hq, d = 5, 61, 4, 16
    q, k, v = rng.standard_normal((lq, hq, d)), rng.standard_normal((lkv, 2, d)), rng.standard_normal((lkv, 2, d))
    o, lse = R.attention(q, k, v, causal=True, pos_encoding="alibi")
    cuts = [0, 7, 30, 31, 56, lkv]
    mask = np.tril(np.ones((lq, lkv), bool), k=lkv - lq)  # causal, expressed as a mask to cut it by column
    parts = [R.attention(q, k[a:b], v[a:b], custom_mask=mask[:, a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
    # ALiBi depends on absolute positions, so compare the plain (non-ALiBi) merge with plain attention instead.
    o_plain, lse_plain = R.attention(q, k, v, causal=True)
    mo, ml = R.merge_states(np.stack([p[0] for p in parts], 1), np.stack([p[1] for p in parts], 1))
    np.testing.assert_allclose(mo, o_plain, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ml, lse_plain, rtol=1e-12, atol=1e-13)
    assert not np.allclose(o, o_plain)  # ALiBi does change the result


def test_merge_state_in_place_respects_mask(rng):
    o, lse = random_state(rng)
    o = o.astype(np.float32)
    lse = lse.astype(np.float32)
    other_o, other_lse = random_state(rng)
    o0, lse0 = o.copy(), lse.copy()
    mask = np.array([True, False, True, True, False, False, True])
    R.merge_state_in_place(o, lse, other_o, other_lse, mask=mask)
    want_o, want_lse = R.merge_state(o0, lse0, other_o, other_lse)
    np.testing.assert_array_equal(o[~mask], o0[~mask])  # untouched bit for bit
    np.testing.assert_array_equal(lse[~mask], lse0[~mask])
    np.testing.assert_array_equal(o[mask], want_o[mask].astype(np.float32))
    np.testing.assert_array_equal(lse[mask], want_lse[mask].astype(np.float32))
    assert o.dtype == np.float32 and lse.dtype == np.float32


def test_merge_state_in_place_without_mask(rng):
    (o, lse), (oo, lo) = random_state(rng), random_state(rng)
    want = R.merge_state(o, lse, oo, lo)
    R.merge_state_in_place(o, lse, oo, lo)
    np.testing.assert_array_equal(o, want[0])
    np.testing.assert_array_equal(lse, want[1])


def test_merge_shape_errors(rng):
    o, lse = random_state(rng)
    with pytest.raises(ValueError, match="lse must have shape"):
        R.merge_state(o, lse[:, :-1], o, lse)
    with pytest.raises(ValueError, match="mask must have shape"):
        R.merge_state_in_place(o, lse, o, lse, mask=np.ones(3, bool))
