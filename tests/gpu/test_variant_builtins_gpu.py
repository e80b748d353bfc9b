"""The variant built-ins added with sinks and sigmoid attention, and the value / output transform hooks, on the GPU:
each against the float64 reference on decode (both kernels), paged prefill and ragged prefill.

- ``sinks`` (per-head logits given at run()): with a custom mask (applied on every tile, interior tiles included), a
  window (decode) or causal (prefill, with rows that see no key: o = 0, lse = the sink), split and unsplit rows
  (decode: the in-kernel merge folds the sink; prefill: the first piece of a split row does);
- ``sigmoid`` (no softmax): with a custom mask (masked keys weigh 0 on every tile), causal in prefill; decode splits
  (its merge adds pieces), prefill never does;
- ``rope_llama31``: Llama-3.1 frequencies (a short original context so all three regimes occur), causal + window;
  the reference rotates q and k in float64 and rounds them to bf16, as the kernels keep them (in shared memory, or
  the tensor-core decode kernel as bf16 MMA fragments rotated in registers);
- a user variant written here (``USER_VO``): logits tilt per query row (a ``row_state``: head and position), a mask
  on every tile, a value transform scaled per KV head by an array given at run(), an output transform reading lse,
  against NumPy attention written here.

GQA groups 1 / 4 / 8 and head dims 64 / 128 / 256 each appear for every built-in and path (parametrised so each
case is one kernel: the suite compiles ~40 kernels, ~1-3 s each on first use). Outputs (and the split workspace)
are poisoned with NaN before each run; tolerances are those of test_prefill.py: |o - ref| <= 4u (|ref| + row rms),
lse to 1e-3 (sigmoid's lse, a log of a sum of fp32 weights, too).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from cuinfer.reference import variants as ref_variants
from cuinfer.variants import Param, Variant

pytestmark = pytest.mark.gpu

BF16 = ml_dtypes.bfloat16
U = 2.0**-8
LOG2E = 1.0 / math.log(2.0)
LLAMA31 = {"rope_theta": 5e5, "rope_scale": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position": 256}  # fmt: skip
SIGMOID_BIAS = -2.0

# ---- the user variant of this file --------------------------------------------------------------------------------

USER_VO = Variant(
    name="test_gpu_value_output",
    # a per-row state (once per query row: its token and head) read by logits
    row_state="row.tilt = 1.f + 0.0625f * (qo_head % 4) + 0.03125f * (qpos % 3);",
    row_fields="float tilt;",
    logits="x * row.tilt",
    mask="(kv_idx * 7 + qo_head) % 11 != 3",  # every tile: ~9 % of the keys of every row
    value_transform="x * params.v_gain[kv_head]",
    output_transform="x * params.o_gain + 0.03125f * lse",
    params=(Param("v_gain", "f32", per="kv_head"), Param("o_gain", "f32")),
    # the same functions for the CPU reference backend (NumPy inputs)
    numpy={
        "logits": lambda x, qo_head, qpos: x * (1 + 0.0625 * (qo_head % 4) + 0.03125 * (qpos % 3)),
        "mask": lambda kv_idx, qo_head: (kv_idx * 7 + qo_head) % 11 != 3,
        "value_transform": lambda x, kv_head, params: x * params.v_gain[kv_head],
        "output_transform": lambda x, lse, params: x * params.o_gain + 0.03125 * lse,
    },
)
O_GAIN = 1.5


def _v_gain(hkv: int) -> np.ndarray:
    return (2.0 ** (np.arange(hkv) % 3 - 1)).astype(np.float32)  # 0.5, 1, 2, ...: exact in bf16


def _user_attend(q, k, v, v_gain):
    """float64 attention of one query row with USER_VO over the keys it sees, head by head (o, lse): its position is
    the last key's (decode; prefill's rows cut to their visible keys)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    lq, hq, d = q.shape
    lkv, hkv, dv = v.shape
    assert lq == 1
    qpos = lkv - 1
    g = hq // hkv
    o = np.zeros((lq, hq, dv))
    lse = np.full((lq, hq), -np.inf)
    j = np.arange(lkv)
    for h in range(hq):
        s = q[:, h] @ k[:, h // g].T / math.sqrt(d) * (1 + 0.0625 * (h % 4) + 0.03125 * (qpos % 3))
        keep = np.broadcast_to((j * 7 + h) % 11 != 3, s.shape)
        s = np.where(keep, s, -np.inf)
        m = s.max(axis=1, initial=-np.inf)
        has = np.isfinite(m)
        p = np.exp(s - np.where(has, m, 0)[:, None])
        den = p.sum(axis=1)
        vh = v[:, h // g] * float(v_gain[h // g])
        o[has, h] = p[has] @ vh / den[has, None]
        lse[has, h] = (m[has] + np.log(den[has])) * LOG2E
        o[:, h] = o[:, h] * O_GAIN + 0.03125 * lse[:, h, None]  # (a row without keys: -inf)
    return o, lse


# ---- checks and data -------------------------------------------------------------------------------------------------


def _check(o, lse, ref_o, ref_lse, what: str, loose: float = 1.0):
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    fin = np.isfinite(ref_o)
    assert (np.isfinite(o) == fin).all(), f"{what}: NaN/inf where the reference has none (or an unwritten element)"
    err = np.abs(np.where(fin, o - ref_o, 0))
    rms = np.sqrt(np.mean(np.where(fin, ref_o, 0) ** 2, axis=-1, keepdims=True))
    bound = loose * 4 * U * (np.abs(np.where(fin, ref_o, 0)) + rms) + 1e-6
    if (err > bound).any():
        i = np.unravel_index(np.argmax(err / bound), err.shape)
        raise AssertionError(f"{what}: {(err > bound).sum()} of {err.size} elements beyond 4u(|ref| + rms); worst at "
                             f"{i}: got {o[i]:.6f}, want {ref_o[i]:.6f}")  # fmt: skip
    empty = np.isneginf(ref_lse)
    assert np.isneginf(lse[empty]).all(), f"{what}: rows without keys (and no sink) have lse = -inf"
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=1e-3 * loose, atol=1e-3 * loose,
                               err_msg=f"lse of {what}")  # fmt: skip


@pytest.fixture
def fw():
    from conftest import _load_framework

    return _load_framework("cupy")


def _paged(rng, kv_lens, hkv, d, ps=16):
    kv_lens = np.asarray(kv_lens)
    pages = (kv_lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    n = int(indptr[-1]) + 3
    indices = rng.permutation(n)[: indptr[-1]].astype(np.int32)
    last = np.where(pages > 0, kv_lens - (pages - 1) * ps, 1).astype(np.int32)
    cache = rng.standard_normal((n, 2, ps, hkv, d), dtype=np.float32).astype(BF16)
    ks, vs = [], []
    for b, m in enumerate(kv_lens):
        rows = np.arange(m)
        pg = indices[indptr[b] : indptr[b + 1]]
        ks.append(cache[pg[rows // ps], 0, rows % ps])
        vs.append(cache[pg[rows // ps], 1, rows % ps])
    return (indptr, indices, last), cache, ks, vs


def _rounded_rope(x, pos, d, rounded=True):
    """x rotated in float64 at positions pos, rounded to bf16 where the kernel keeps the rotated values as bf16 (keys;
    q on the tensor-core decode kernel and in prefill: in shared memory, or the tensor-core decode kernel's MMA
    fragments rotated in registers, rounded the same way); the CUDA-core decode kernel keeps its rotated q in float32
    registers (``rounded=False``)."""
    inv = ref_variants.llama31_inv_freq(d, **LLAMA31)
    out = ref_variants.rotate_half(np.asarray(x, np.float64), np.asarray(pos)[:, None, None], inv)
    return out.astype(BF16) if rounded else out


def _steps(kind, *, causal, window, masks, sinks):
    """The reference steps of a case (RoPE handled by rounding q and k beforehand)."""
    out = [ref_variants.causal()] if causal else []
    if window >= 0:
        out.append(ref_variants.window(window))
    if masks is not None:
        out.append(ref_variants.custom_mask(masks))
    if kind == "sinks":
        out.append(ref_variants.sinks(sinks))
    elif kind == "sigmoid":
        out.append(ref_variants.sigmoid(SIGMOID_BIAS))
    return out


def _plan_kw(kind, hq, hkv):
    if kind == "sinks":
        return dict(variant="sinks")
    if kind == "sigmoid":
        return dict(variant="sigmoid", variant_params={"sigmoid": {"bias": SIGMOID_BIAS}})
    if kind == "rope_llama31":
        return dict(variant="rope_llama31", variant_params={"rope_llama31": LLAMA31})
    return dict(variant=USER_VO, variant_params={USER_VO.name: {"o_gain": O_GAIN}})


def _arrays(fw, kind, rng, hq, hkv):
    """(run()'s variant_arrays on the GPU, the host values)."""
    if kind == "sinks":
        s = (2 * rng.standard_normal(hq)).astype(np.float32)
        return {"sinks": fw.asarray(s)}, s
    if kind == "user":
        g = _v_gain(hkv)
        return {"v_gain": fw.asarray(g)}, g
    return None, None


KINDS = ("sinks", "sigmoid", "rope_llama31", "user")
# (heads, head dim, tensor cores, fixed split): every group 1 / 4 / 8 and head dim 64 / 128 / 256 once per built-in
DECODE_SHAPES = (((32, 8), 128, True, 512), ((8, 8), 256, False, 512), ((32, 4), 64, True, None))
PREFILL_SHAPES = (((32, 8), 128, 512), ((8, 8), 64, None), ((32, 4), 256, 1024))


def _decode_params():
    out = []
    for kind in KINDS:
        for (heads, d, tc, split), g in zip(DECODE_SHAPES, (4, 1, 8), strict=True):
            out.append(pytest.param(kind, heads, d, tc, split, id=f"{kind}-g{g}-d{d}-{'tc' if tc else 'cc'}"
                                    + (f"-split{split}" if split else "")))  # fmt: skip
    return out


def _prefill_params():
    out = []
    for kind in KINDS:
        for (heads, d, split), g in zip(PREFILL_SHAPES, (4, 1, 8), strict=True):
            for paged in (False, True):
                if kind in ("sigmoid", "user") and split:
                    split = None  # (never split in prefill: no softmax / an output transform)
                out.append(pytest.param(kind, paged, heads, d, split, id=f"{kind}-{'paged' if paged else 'ragged'}"
                                        f"-g{g}-d{d}" + (f"-split{split}" if split else "")))  # fmt: skip
    return out


# ---- decode ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "heads", "d", "tc", "split"), _decode_params())
def test_variant_builtins_in_decode(rng, fw, kind, heads, d, tc, split):
    from cuinfer.decode import BatchDecode

    hq, hkv = heads
    lens = np.array([1, 17, 300, 1000, 4097, 33])
    table, cache, ks, vs = _paged(rng, lens, hkv, d)
    q = (2 * rng.standard_normal((lens.size, hq, d), dtype=np.float32)).astype(BF16)
    window = 700 if kind in ("sinks", "rope_llama31") else -1
    mask = None
    if kind in ("sinks", "sigmoid"):
        mask = rng.random(int(lens.sum())) < 0.6  # every tile
        mask[: lens[0]] = False  # request 0 sees no key (sinks: o = 0, lse = sink)
    w = BatchDecode(use_tensor_cores=tc)
    w.plan(*table, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=16, q_dtype="bfloat16",
           window_left=window, custom_mask=mask, fixed_split_size=split, **_plan_kw(kind, hq, hkv))  # fmt: skip
    if split:
        assert w._plan.work.num_partial_rows > 0, "long requests are split: the in-kernel merge runs"
    arrays, host = _arrays(fw, kind, rng, hq, hkv)
    out = fw.asarray(np.full(q.shape, np.nan, BF16))
    lse = fw.asarray(np.full(q.shape[:2], np.nan, np.float32))
    w.run(fw.asarray(q), fw.asarray(cache), out=out, lse=lse, variant_arrays=arrays)
    o, lse = fw.to_numpy(out), fw.to_numpy(lse)
    ref_o, ref_lse = np.zeros(q.shape), np.full(q.shape[:2], -np.inf)
    ends = np.cumsum(lens)
    for b, n in enumerate(lens):
        qb, kb = q[b : b + 1], ks[b]
        if kind == "user":
            ref_o[b : b + 1], ref_lse[b : b + 1] = _user_attend(qb, kb, vs[b], host)
            continue
        if kind == "rope_llama31":
            qb, kb = _rounded_rope(qb, [n - 1], d, rounded=tc), _rounded_rope(kb, np.arange(n), d)
        masks = None if mask is None else {b: mask[ends[b] - n : ends[b]].reshape(1, n)}
        steps = _steps(kind, causal=False, window=window, masks=masks, sinks=host)
        ref_o[b : b + 1], ref_lse[b : b + 1] = ref_variants.attend(qb, kb, vs[b], steps, batch=b)
    _check(o, lse, ref_o, ref_lse, f"decode {kind}")
    if kind == "sinks":
        assert (np.asarray(o[0], np.float64) == 0).all(), "a request without keys: o = 0"
        np.testing.assert_allclose(lse[0], host * LOG2E, rtol=1e-5, err_msg="... and lse = its sinks in base 2")


# ---- prefill ---------------------------------------------------------------------------------------------------------

QO = np.array([1, 37, 300, 5, 129, 64])
KV = np.array([17, 100, 700, 3, 1000, 2048])  # request 3: 5 queries on 3 keys (causal: 2 rows see no key)


@pytest.mark.parametrize(("kind", "paged", "heads", "d", "split"), _prefill_params())
def test_variant_builtins_in_prefill(rng, fw, kind, paged, heads, d, split):
    from cuinfer.prefill import BatchPrefill

    hq, hkv = heads
    qo_indptr = np.concatenate([[0], np.cumsum(QO)]).astype(np.int32)
    q = (2 * rng.standard_normal((int(qo_indptr[-1]), hq, d), dtype=np.float32)).astype(BF16)
    window = 1500 if kind == "rope_llama31" else -1  # (ranges of up to ~1600 keys: split1024 still splits)
    mask = rng.random(int((QO * KV).sum())) < 0.6 if kind in ("sinks", "sigmoid") else None
    w = BatchPrefill(paged=paged)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, causal=True, q_dtype="bfloat16", window_left=window,
              custom_mask=mask, fixed_split_size=split, **_plan_kw(kind, hq, hkv))  # fmt: skip
    if paged:
        table, cache, ks, vs = _paged(rng, KV, hkv, d)
        w.plan(qo_indptr, *table, page_size=16, **kw)
        args = (fw.asarray(cache),)
    else:
        kv_indptr = np.concatenate([[0], np.cumsum(KV)]).astype(np.int32)
        k = rng.standard_normal((int(kv_indptr[-1]), hkv, d), dtype=np.float32).astype(BF16)
        v = rng.standard_normal((int(kv_indptr[-1]), hkv, d), dtype=np.float32).astype(BF16)
        w.plan(qo_indptr, kv_indptr, **kw)
        ks = [k[kv_indptr[b] : kv_indptr[b + 1]] for b in range(KV.size)]
        vs = [v[kv_indptr[b] : kv_indptr[b + 1]] for b in range(KV.size)]
        args = (fw.asarray(k), fw.asarray(v))
    work = w._plan.work
    if split:
        assert work.num_partial_rows > 0, "the fixed split size splits the long requests"
    if kind in ("sigmoid", "user"):
        assert work.num_partial_rows == 0, "prefill never splits a chain without softmax or with an output transform"
    arrays, host = _arrays(fw, kind, rng, hq, hkv)
    out = fw.asarray(np.full(q.shape, np.nan, BF16))
    lse = fw.asarray(np.full(q.shape[:2], np.nan, np.float32))
    if w._buffers is not None:
        w._buffers.workspace.fill(0xFF)  # NaN partial states: an unwritten one fails
    w.run(fw.asarray(q), *args, out=out, lse=lse, variant_arrays=arrays)
    o, lse = fw.to_numpy(out), fw.to_numpy(lse)
    ref_o, ref_lse = np.zeros(q.shape), np.full(q.shape[:2], -np.inf)
    sizes = QO * KV
    ends = np.cumsum(sizes)
    for b in range(QO.size if kind != "user" else 0):
        rows = slice(qo_indptr[b], qo_indptr[b + 1])
        qb, kb = q[rows], ks[b]
        if kind == "rope_llama31":
            qb = _rounded_rope(qb, np.arange(QO[b]) + KV[b] - QO[b], d)
            kb = _rounded_rope(kb, np.arange(KV[b]), d)
        masks = None if mask is None else {b: mask[ends[b] - sizes[b] : ends[b]].reshape(QO[b], KV[b])}
        steps = _steps(kind, causal=True, window=window, masks=masks, sinks=host)
        ref_o[rows], ref_lse[rows] = ref_variants.attend(qb, kb, vs[b], steps, batch=b)
    if kind == "user":
        ref_o, ref_lse = _user_prefill_causal(q, ks, vs, qo_indptr, host)
    _check(o, lse, ref_o, ref_lse, f"prefill {kind}")
    if kind == "sinks":
        empty = slice(qo_indptr[3], qo_indptr[3] + 2)  # request 3's rows without keys
        assert (np.asarray(o[empty], np.float64) == 0).all()
        np.testing.assert_allclose(lse[empty], np.broadcast_to(host * LOG2E, (2, hq)), rtol=1e-5)


def _user_prefill_causal(q, ks, vs, qo_indptr, v_gain):
    """USER_VO with the plan's causal mask, request by request: keys past a row's position get -inf logits (a row
    with none left ends as o = 0 · o_gain + lse / 32 = -inf, as the kernels compute it)."""
    ref_o, ref_lse = np.zeros(q.shape), np.full(q.shape[:2], -np.inf)
    for b in range(len(ks)):
        rows = slice(qo_indptr[b], qo_indptr[b + 1])
        lq, lkv = qo_indptr[b + 1] - qo_indptr[b], ks[b].shape[0]
        for i in range(lq):  # one row at a time over its visible keys
            n = max(0, min(lkv, i + lkv - lq + 1))
            o_i, l_i = _user_attend(q[rows][i : i + 1], ks[b][:n], vs[b][:n], v_gain)
            ref_o[qo_indptr[b] + i], ref_lse[qo_indptr[b] + i] = o_i[0], l_i[0]
    return ref_o, ref_lse


# ---- run()-time arrays from every framework ----------------------------------------------------------------------


def test_sinks_from_every_framework(rng, framework):
    """variant_arrays accept any framework's CUDA array (DLPack, on the call's stream); q and the cache come from the
    same framework, as a serving loop would hold them."""
    from cuinfer.decode import BatchDecode

    hq, hkv, d = 32, 8, 128
    lens = np.array([5, 300, 2000])
    table, cache, ks, vs = _paged(rng, lens, hkv, d)
    q = (2 * rng.standard_normal((lens.size, hq, d), dtype=np.float32)).astype(BF16)
    s = rng.standard_normal(hq).astype(np.float32)
    w = BatchDecode()
    w.plan(*table, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=16, q_dtype="bfloat16",
           variant="sinks")  # fmt: skip
    o, lse = w.run(framework.asarray(q), framework.asarray(cache), variant_arrays={"sinks": framework.asarray(s)},
                   return_lse=True)  # fmt: skip
    ref = [ref_variants.attend(q[b : b + 1], ks[b], vs[b], [ref_variants.sinks(s)]) for b in range(lens.size)]
    _check(framework.to_numpy(o), framework.to_numpy(lse), np.concatenate([r[0] for r in ref]),
           np.concatenate([r[1] for r in ref]), f"decode sinks ({framework})")  # fmt: skip
