"""Batch and single decode on the GPU against the float64 reference (torch, JAX and CuPy inputs).

The cross product of the issue's "done when" list (batch {1, 7, 128}, kv lengths {1, 17, 513, 4097, 33001} mixed,
page size {1, 5, 16}, heads 32:8 32:32 28:4 64:8 40:8 16:1, head dims {64, 128, 256}, NHD/HND, fp16/bf16, both
kernels, with and without split-KV, lse) is sampled by named cases so that every value appears at least once and the
suite stays well under two minutes (each distinct kernel costs ~1 s of NVRTC on first use).

Outputs are poisoned: ``out=`` / ``lse=`` buffers and the split-KV workspace are filled with NaN before each run, so
an element the kernels never write fails. Tolerances are in units of the output dtype's rounding (u = 2^-8 bf16,
2^-11 fp16): 4u (|ref| + 1) covers the output rounding plus the 16-bit rounding of the probabilities that the
tensor-core kernel feeds to mma. lse is checked to 1e-3 (it never goes through 16 bits), which also catches a
missing or doubled KV chunk that the averaged o could hide.

A kernel fault (illegal address) would poison the CUDA context of the whole pytest process and take every later GPU
test with it, so a child process first runs a canary (one small case of each kernel, split and unsplit); if it
crashes, this module errors with its output and the rest of the GPU suite still runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest

from cuinfer import reference

pytestmark = pytest.mark.gpu

# JAX grabs 75% of the GPU on first use unless told otherwise, starving the torch / CuPy allocations of later tests.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

DTYPES = {"bf16": (ml_dtypes.bfloat16, 2.0**-8), "fp16": (np.float16, 2.0**-11)}

MIX7 = (1, 17, 513, 4097, 33001, 17, 1)
MIX7S = (1, 17, 513, 4097, 17, 1, 2000)  # wide head configs: the same mix without the 33001
MIX128 = tuple(4097 if i == 100 else (1, 17, 513)[i % 3] for i in range(128))
LONG1 = (33001,)
SHORT5 = (5, 300, 1000, 1, 77)


@dataclass(frozen=True)
class Case:
    lens: tuple
    page_size: int
    heads: tuple  # (num_qo_heads, num_kv_heads)
    head_dim: int
    layout: str = "NHD"
    dtype: str = "bf16"
    tensor_cores: bool | None = None
    split: int | None = None  # fixed_split_size
    framework: str = "torch"
    cache: str = "5d"  # or "tuple"
    q_slice: bool = False  # q sliced out of a fused QKV tensor
    opts: dict = field(default_factory=dict)
    scales: tuple = (None, None)  # k_scale, v_scale
    loose: float = 1.0
    rerun: bool = False  # run again without lse (the kernel serving uses; one more compile per case)
    # RoPE on tensor cores: the kernel rotates q and k in fp32 and rounds them to the input dtype for the mma (as
    # FlashInfer's tensor-core decode does); the reference does the same (_rope_rounded), at the standard tolerance
    rope_rounded: bool = False


CASES = [
    pytest.param(Case(MIX7, 16, (32, 8), 128, rerun=True), id="b7mix-p16-32x8-d128-nhd-bf16-auto(tc)"),
    pytest.param(Case(MIX7, 16, (32, 8), 128, tensor_cores=False, rerun=True), id="b7mix-p16-32x8-d128-nhd-bf16-cc"),
    pytest.param(Case(LONG1, 16, (32, 8), 128, "HND", "fp16", framework="cupy"), id="b1long-p16-32x8-d128-hnd-fp16-tc"),
    pytest.param(Case(LONG1, 5, (8, 8), 128), id="b1long-p5-8x8-d128-nhd-bf16-auto(cc)"),
    pytest.param(Case(MIX128, 5, (32, 32), 128, split=256), id="b128mix-p5-32x32-d128-bf16-cc-split256"),
    pytest.param(Case(MIX128, 1, (28, 4), 64, "HND", "fp16", framework="jax"), id="b128mix-p1-28x4-d64-hnd-fp16-tc"),
    pytest.param(
        Case(MIX7S, 5, (64, 8), 256, split=512, framework="cupy"), id="b7mix-p5-64x8-d256-nhd-bf16-tc-split512"
    ),
    pytest.param(Case(MIX7, 1, (40, 8), 128, "HND", tensor_cores=False), id="b7mix-p1-40x8-d128-hnd-bf16-cc"),
    pytest.param(Case(MIX7, 16, (16, 1), 128, dtype="fp16"), id="b7mix-p16-16x1-d128-fp16-tc-group16"),
    pytest.param(
        Case(MIX7, 16, (16, 1), 64, tensor_cores=False, split=1024, framework="cupy"),
        id="b7mix-p16-16x1-d64-bf16-cc-group16-split1024",
    ),
    pytest.param(Case(MIX7S, 5, (32, 32), 256, "HND", "fp16", split=2048), id="b7mix-p5-32x32-d256-hnd-fp16-cc-split"),
    pytest.param(Case(MIX7S, 16, (32, 8), 256, "HND", tensor_cores=False), id="b7mix-p16-32x8-d256-hnd-bf16-cc-g4"),
    pytest.param(Case(MIX7, 16, (16, 8), 64, split=256, framework="jax"), id="b7mix-p16-16x8-d64-bf16-cc-g2-split"),
    pytest.param(
        Case(MIX128, 16, (32, 8), 128, split=512, framework="cupy", rerun=True), id="b128mix-p16-32x8-bf16-tc-split512"
    ),
    # many pieces per request: the merge's weights computed per thread (more than fit its shared-memory table),
    # with the pieces cut into slices (tensor cores, 4 rows) and without (CUDA cores, 16 rows)
    pytest.param(Case(LONG1, 16, (32, 8), 128, split=128), id="b1long-p16-32x8-tc-split128-many-pieces"),
    pytest.param(
        Case(LONG1, 16, (16, 1), 64, tensor_cores=False, split=128), id="b1long-16x1-d64-cc-g16-split128-many-pieces"
    ),
    # the tensor-core kernel carries a split piece's count and merge over the next tiles (kernels.cuh PendingPiece):
    # pieces of one tile (the next piece ends before the waiting one is flagged: settled at once) and of three
    # (flagged just as the next boundary comes)
    pytest.param(Case(MIX7, 16, (32, 8), 128, split=64), id="b7mix-p16-32x8-tc-split64-one-tile-pieces"),
    pytest.param(Case(MIX128, 16, (32, 8), 128, split=192), id="b128mix-p16-32x8-tc-split192-three-tile-pieces"),
    pytest.param(Case(MIX7, 16, (32, 8), 128, cache="tuple"), id="b7mix-tuple-cache-tc"),
    pytest.param(Case(MIX7, 5, (32, 8), 128, "HND", cache="tuple", q_slice=True), id="b7mix-tuple-hnd-fused-qkv-slice"),
    pytest.param(Case((1,), 1, (32, 8), 128, framework="cupy"), id="b1-kv1-p1"),
    pytest.param(Case((0, 5, 0, 40), 16, (32, 8), 128), id="empty-requests-tc"),
    pytest.param(Case((0, 5, 0, 40), 16, (8, 8), 64, "HND"), id="empty-requests-cc"),
    # options
    pytest.param(
        Case(SHORT5, 16, (32, 8), 128, opts={"pos_encoding": "rope_llama"}, rope_rounded=True), id="rope-tc-bf16"
    ),
    pytest.param(
        Case(
            MIX7,
            5,
            (8, 8),
            128,
            dtype="fp16",
            opts={"pos_encoding": "rope_llama", "rope_theta": 5e5, "rope_scale": 2.0},
            loose=3,
        ),
        id="rope-cc-fp16-long",
    ),  # fmt: skip
    pytest.param(Case(SHORT5, 16, (28, 4), 128, opts={"pos_encoding": "alibi"}), id="alibi-tc-28heads"),
    pytest.param(Case(SHORT5, 5, (16, 8), 64, "HND", "fp16", opts={"pos_encoding": "alibi"}), id="alibi-cc-fp16"),
    pytest.param(
        Case(MIX7, 16, (32, 8), 128, split=512, opts={"logits_soft_cap": 30.0, "window_left": 700}),
        id="softcap-window-tc-split",
    ),
    pytest.param(
        Case(SHORT5, 1, (8, 4), 128, dtype="fp16", opts={"logits_soft_cap": 5.0, "window_left": 0, "sm_scale": 0.3}),
        id="softcap-window0-cc-smscale",
    ),
    pytest.param(Case(SHORT5, 16, (32, 8), 128, scales=(0.5, 2.0)), id="k-scale-v-scale"),
]


def _framework(name: str):
    from conftest import _load_framework

    return _load_framework(name)


def _build(rng, c: Case):
    dtype = DTYPES[c.dtype][0]
    hq, hkv = c.heads
    d, ps = c.head_dim, c.page_size
    lens = np.asarray(c.lens)
    pages = (lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    num_pages = int(indptr[-1]) + 3
    indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)  # pages scattered over the pool
    last = np.where(pages > 0, lens - (pages - 1) * ps, 1).astype(np.int32)
    shape = (num_pages, 2, ps, hkv, d) if c.layout == "NHD" else (num_pages, 2, hkv, ps, d)
    cache = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    q = (2 * rng.standard_normal((lens.shape[0], hq, d), dtype=np.float32)).astype(dtype)
    return q, cache, indptr, indices, last


def _check(o, lse, ref_o, ref_lse, dtype: str, loose: float = 1.0, what: str = "o"):
    u = DTYPES[dtype][1]
    o = np.asarray(o, np.float64)
    assert np.isfinite(o).all(), f"{what} has NaN/inf: an element was never written (outputs are poisoned with NaN)"
    err = np.abs(o - ref_o)
    bound = loose * 4 * u * (np.abs(ref_o) + 1)
    if (err > bound).any():
        i = np.unravel_index(np.argmax(err / bound), err.shape)
        raise AssertionError(
            f"{what}: {(err > bound).sum()} of {err.size} elements beyond 4u(|ref|+1); worst at {i}: got {o[i]:.6f}, "
            f"want {ref_o[i]:.6f} (max error {err.max():.3e})"
        )
    if lse is None:
        return
    lse = np.asarray(lse, np.float64)
    empty = np.isneginf(ref_lse)
    assert np.isneginf(lse[empty]).all(), "a request with no keys must have lse = -inf"
    assert (o[empty] == 0).all(), "a request with no keys must have o = 0 exactly"
    tol = 1e-3 * loose
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=tol, atol=tol, err_msg=f"lse of {what}")


def _rope_rounded(q, cache, indptr, indices, last, c: Case):
    """q and the cache with RoPE applied (q at position kv_len - 1, key t at t) and rounded to the input dtype: the
    inputs of the tensor-core kernel's products. (Checked against the kernel on seed 1626664701, where its lse sat
    7.8e-3 from the exact float64 reference: this model gives its value to 2e-9.)"""
    from cuinfer.reference.positional import rope

    assert c.layout == "NHD", "the rounded-RoPE reference handles NHD caches"
    dtype = DTYPES[c.dtype][0]
    kw = {k: v for k, v in c.opts.items() if k in ("rope_scale", "rope_theta")}
    ps = c.page_size
    rq = np.empty_like(q)
    rcache = cache.copy()
    for b in range(q.shape[0]):
        pages = indices[indptr[b] : indptr[b + 1]]
        n = 0 if pages.size == 0 else (pages.size - 1) * ps + int(last[b])
        if n == 0:
            rq[b] = q[b]
            continue
        rq[b] = rope(q[b : b + 1].astype(np.float64), np.array([n - 1]), **kw)[0].astype(dtype)
        rows = np.arange(n)
        page, slot = pages[rows // ps], rows % ps
        k = cache[page, 0, slot].astype(np.float64)  # [n, hkv, d]
        rcache[page, 0, slot] = rope(k, rows, **kw).astype(dtype)
    return rq, rcache


def _nan_like(fw, shape, dtype):
    return fw.asarray(np.full(shape, np.nan, dtype))


def _poison_cupy_pool(nbytes: int = 64 << 20) -> None:
    import cupy

    x = cupy.full(nbytes // 4, np.nan, dtype=np.float32)
    del x


def _poison_workspace(w) -> None:
    if w._buffers is not None:
        w._buffers.workspace.fill(0xFF)  # 0xFFFFFFFF is a float32 NaN


@pytest.mark.parametrize("c", CASES)
def test_batch_decode(rng, c: Case):
    from cuinfer.decode import BatchDecode

    fw = _framework(c.framework)
    dtype = DTYPES[c.dtype][0]
    hq, hkv = c.heads
    q, cache, indptr, indices, last = _build(rng, c)
    if c.rope_rounded:
        rq, rcache = _rope_rounded(q, cache, indptr, indices, last, c)
        opts = {k: v for k, v in c.opts.items() if not k.startswith(("pos_encoding", "rope_"))}
        ref_o, ref_lse = reference.batch_decode_paged(rq, rcache, indptr, indices, last, kv_layout=c.layout, **opts)
    else:
        ref_o, ref_lse = reference.batch_decode_paged(
            q, cache, indptr, indices, last, kv_layout=c.layout, k_scale=c.scales[0], v_scale=c.scales[1], **c.opts
        )
    w = BatchDecode(kv_layout=c.layout, use_tensor_cores=c.tensor_cores)
    w.plan(
        indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=c.head_dim, page_size=c.page_size,
        q_dtype=dtype, fixed_split_size=c.split, **c.opts,
    )  # fmt: skip
    if c.split is not None:
        assert w._plan.work.num_partial_rows > 0, "the fixed split size must split something"
    if c.q_slice:
        b, d = q.shape[0], c.head_dim
        fused = np.concatenate([q.reshape(b, hq * d), q.reshape(b, hq * d)[:, : 2 * hkv * d]], axis=1)
        gq = fw.asarray(fused)[:, : hq * d].reshape(b, hq, d)  # strides (fused width, d, 1): a view, not a copy
    else:
        gq = fw.asarray(q)
    kv = (fw.asarray(cache[:, 0]), fw.asarray(cache[:, 1])) if c.cache == "tuple" else fw.asarray(cache)
    k_scale, v_scale = c.scales
    if c.framework == "jax":  # immutable arrays: outputs come back fresh, allocated from CuPy's pool
        _poison_cupy_pool()
        _poison_workspace(w)
        o, lse = w.run(gq, kv, return_lse=True, k_scale=k_scale, v_scale=v_scale)
    else:
        out = _nan_like(fw, q.shape, dtype)
        lse_buf = _nan_like(fw, q.shape[:2], np.float32)
        _poison_workspace(w)
        o, lse = w.run(gq, kv, out=out, lse=lse_buf, k_scale=k_scale, v_scale=v_scale)
        assert o is out and lse is lse_buf
    _check(fw.to_numpy(o), fw.to_numpy(lse), ref_o, ref_lse, c.dtype, c.loose)
    if c.rerun:  # the plan is reusable; the kernel without lse gives the same o
        o2 = w.run(gq, kv, k_scale=k_scale, v_scale=v_scale)
        np.testing.assert_array_equal(fw.to_numpy(o2).astype(np.float32), fw.to_numpy(o).astype(np.float32))


@pytest.mark.parametrize(
    ("fw_name", "layout", "kv_len", "heads", "d", "dt", "tc"),
    [
        pytest.param("torch", "NHD", 33001, (32, 8), 128, "bf16", None, id="torch-nhd-33001-tc-split"),
        pytest.param("cupy", "HND", 17, (32, 32), 64, "fp16", None, id="cupy-hnd-17-cc"),
        pytest.param("jax", "NHD", 4097, (28, 4), 128, "bf16", None, id="jax-nhd-4097-tc"),
        pytest.param("torch", "HND", 513, (8, 8), 256, "fp16", None, id="torch-hnd-513-d256-cc"),
        pytest.param("cupy", "NHD", 0, (8, 2), 128, "bf16", None, id="cupy-empty"),
    ],
)
def test_single_decode(rng, fw_name, layout, kv_len, heads, d, dt, tc):
    from cuinfer.decode import single_decode

    fw = _framework(fw_name)
    dtype = DTYPES[dt][0]
    hq, hkv = heads
    q = (2 * rng.standard_normal((hq, d), dtype=np.float32)).astype(dtype)
    shape = (kv_len, hkv, d) if layout == "NHD" else (hkv, kv_len, d)
    k = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    v = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    kn, vn = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2), v.transpose(1, 0, 2))
    ref_o, ref_lse = reference.attention(q[None], kn, vn)
    o, lse = single_decode(fw.asarray(q), fw.asarray(k), fw.asarray(v), kv_layout=layout, return_lse=True)
    assert tuple(o.shape) == (hq, d) and tuple(lse.shape) == (hq,)
    _check(fw.to_numpy(o), fw.to_numpy(lse), ref_o[0], ref_lse[0], dt)


def test_cuda_graph_replays_after_replan(rng):
    """A run captured once keeps working after plan() is called again with other lengths (same capacity)."""
    from cuinfer.decode import BatchDecode

    cupy = _framework("cupy").module
    hq, hkv, d, ps = 32, 8, 128, 16
    lens_a, lens_b = (100, 2000, 5, 33), (3000, 7, 260, 1)
    num_pages = 400
    cache = rng.standard_normal((num_pages, 2, ps, hkv, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
    q = (2 * rng.standard_normal((4, hq, d), dtype=np.float32)).astype(ml_dtypes.bfloat16)
    perm = rng.permutation(num_pages).astype(np.int32)

    def table(lens):
        lens = np.asarray(lens)
        pages = (lens + ps - 1) // ps
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        return indptr, perm[: indptr[-1]], (lens - (pages - 1) * ps).astype(np.int32)

    w = BatchDecode(use_cuda_graph=True, max_batch_size=8)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="bfloat16")
    gq, gc = cupy.asarray(q), cupy.asarray(cache)
    out = cupy.full(q.shape, np.nan, dtype=q.dtype)
    lse = cupy.full(q.shape[:2], np.nan, dtype=np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        w.plan(*table(lens_a), **kw)
        w.run(gq, gc, out=out, lse=lse)  # compiles and loads everything before the capture
        stream.begin_capture()
        w.run(gq, gc, out=out, lse=lse)
        graph = stream.end_capture()
    for lens in (lens_a, lens_b):
        with stream:
            w.plan(*table(lens), **kw)
            out.fill(np.nan)
            lse.fill(np.nan)
            graph.launch(stream)
        stream.synchronize()
        ref_o, ref_lse = reference.batch_decode_paged(q, cache, *table(lens))
        _check(out.get(), lse.get(), ref_o, ref_lse, "bf16", what=f"graph replay {lens}")


def test_split_requests_merge_in_kernel_on_every_run(rng):
    """Split requests are merged inside the decode kernel by the last piece to finish, counted in arrival counters
    the kernel returns to 0: every run of a plan, and of later plans with other pieces, writes every output row."""
    from cuinfer.decode import BatchDecode

    cupy = _framework("cupy").module
    hq, hkv, d, ps = 32, 8, 128, 16
    num_pages = 4200
    cache = rng.standard_normal((num_pages, 2, ps, hkv, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
    gc = cupy.asarray(cache)
    perm = rng.permutation(num_pages).astype(np.int32)
    w = BatchDecode()
    for lens in ((33001,), (5000, 17, 9000, 1), (1, 1, 1, 20000, 3000, 64)):
        lens = np.asarray(lens)
        pages = (lens + ps - 1) // ps
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        table = (indptr, perm[: indptr[-1]], (lens - (pages - 1) * ps).astype(np.int32))
        q = (2 * rng.standard_normal((len(lens), hq, d), dtype=np.float32)).astype(ml_dtypes.bfloat16)
        w.plan(*table, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="bfloat16")
        assert w._plan.work.n_merge > 0, f"lengths {lens.tolist()} should be split"
        ref_o, ref_lse = reference.batch_decode_paged(q, cache, *table)
        gq = cupy.asarray(q)
        for run in range(3):
            out = cupy.full(q.shape, np.nan, dtype=q.dtype)
            lse = cupy.full(q.shape[:2], np.nan, dtype=np.float32)
            _poison_workspace(w)
            w.run(gq, gc, out=out, lse=lse)
            _check(out.get(), lse.get(), ref_o, ref_lse, "bf16", what=f"run {run} of {lens.tolist()}")
        assert int(w._buffers.merge_count.max().get()) == 0, "every arrival counter is back to 0 after a run"


def test_gpu_errors_before_launch(rng):
    """Host-side checks of run() with device arrays: nothing is launched for a bad page table or a misaligned q."""
    from cuinfer.decode import BatchDecode

    fw = _framework("torch")
    c = Case(SHORT5, 16, (32, 8), 128)
    q, cache, indptr, indices, last = _build(rng, c)
    w = BatchDecode()
    w.plan(indptr, indices, last, num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16, q_dtype="bfloat16")
    small = fw.asarray(cache[: int(indices.max())])
    with pytest.raises(ValueError, match=r"kv_indices holds page index \d+ but kv_cache has \d+ pages"):
        w.run(fw.asarray(q), small)
    flat = fw.asarray(np.concatenate([q.reshape(-1), q.reshape(-1)[:1]]))
    misaligned = flat[1:].reshape(q.shape)
    with pytest.raises(ValueError, match="q must start on a 16-byte boundary"):
        w.run(misaligned, fw.asarray(cache))
    with pytest.raises(ValueError, match="q has dtype float16 but plan"):
        w.run(fw.asarray(q.astype(np.float16)), fw.asarray(cache))


# ---- the canary ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _canary():
    from conftest import run_canary

    run_canary(__file__, "decode", "one small case per kernel")


def _canary_main() -> None:
    """Small CuPy cases of both kernels, split and unsplit; exit code 1 on a wrong result, a crash otherwise."""
    import cupy

    from cuinfer.decode import BatchDecode

    rng = np.random.default_rng(7)
    for tc in (False, True):
        for split in (None, 16):
            c = Case((3, 40, 1, 0, 129), 5, (8, 2), 128, tensor_cores=tc, split=split)
            q, cache, indptr, indices, last = _build(rng, c)
            ref_o, ref_lse = reference.batch_decode_paged(q, cache, indptr, indices, last)
            w = BatchDecode(use_tensor_cores=tc)
            w.plan(indptr, indices, last, num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=5,
                   q_dtype="bfloat16", fixed_split_size=split)  # fmt: skip
            o, lse = w.run(cupy.asarray(q), cupy.asarray(cache), return_lse=True)
            cupy.cuda.runtime.deviceSynchronize()
            _check(o.get(), lse.get(), ref_o, ref_lse, "bf16", what=f"canary tc={tc} split={split}")
            print(f"canary tc={tc} split={split}: ok", flush=True)


if __name__ == "__main__":
    _canary_main()
