"""One small case of each kernel, for compute-sanitizer's racecheck and synccheck (.ci/gpu_sanitize.sh), which are
too slow for the GPU suite: decode on the tensor-core kernel, decode on the CUDA-core kernel with split requests (the
in-kernel merge), prefill over ragged K/V on the cross-item pipeline (one SM: many items per CTA, paired blocks),
prefill over a paged cache split into partials (and the merge_partials kernel), prefill on small tiles (16 query rows:
several warps per row block, the staged epilogue, not cross-item), and the three merge kernels (merge_state,
merge_states, merge_state_in_place with a mask).

Runnable as a script on a GPU machine, with CuPy arrays and only the public API (``cuinfer``, ``cuinfer.reference``):

    python3 tests/gpu/sanitize_cases.py              # every case
    python3 tests/gpu/sanitize_cases.py decode-tc    # some cases (--list names them)

Each case checks its outputs against the float64 reference (loosely: a sanitizer run is about memory and races, this
only makes sure the kernels ran), prints one line, and the script exits 1 if any case is wrong.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

BF16, F16 = ml_dtypes.bfloat16, np.float16
CASES: dict[str, Callable[[np.random.Generator], float]] = {}


def case(name: str):
    def register(fn):
        CASES[name] = fn
        return fn

    return register


def _page_table(rng: np.random.Generator, lens, page_size: int, spare: int = 3):
    lens = np.asarray(lens)
    pages = -(-lens // page_size)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    num_pages = int(indptr[-1]) + spare
    indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)
    last = np.where(pages > 0, lens - (pages - 1) * page_size, 1).astype(np.int32)
    return indptr, indices, last, num_pages


def _err(got, want) -> float:
    """Largest error relative to the reference's scale (NaN / inf count as a failure)."""
    got = np.asarray(got, np.float64)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.max(np.abs(got - want), initial=0.0) / (np.max(np.abs(want), initial=0.0) + 1.0))


def _lse_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    empty = np.isneginf(want)
    if not np.array_equal(np.isneginf(got), empty):
        return float("inf")
    return float(np.max(np.abs(got[~empty] - want[~empty]), initial=0.0))


def _decode(rng, *, tensor_cores: bool, heads: tuple[int, int], split: int | None, dtype) -> float:
    import cupy

    import cuinfer
    from cuinfer import reference

    hq, hkv, d, ps = heads[0], heads[1], 128, 16
    indptr, indices, last, num_pages = _page_table(rng, [1, 33, 0, 300], ps)
    cache = rng.standard_normal((num_pages, 2, ps, hkv, d), dtype=np.float32).astype(dtype)
    q = rng.standard_normal((4, hq, d), dtype=np.float32).astype(dtype)
    w = cuinfer.BatchDecode(use_tensor_cores=tensor_cores)
    w.plan(indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype=dtype,
           fixed_split_size=split)  # fmt: skip
    o, lse = w.run(cupy.asarray(q), cupy.asarray(cache), return_lse=True)
    cupy.cuda.runtime.deviceSynchronize()
    ref_o, ref_lse = reference.batch_decode_paged(q, cache, indptr, indices, last)
    return max(_err(o.get(), ref_o), _lse_err(lse.get(), ref_lse))


@case("decode-tc")
def decode_tensor_cores(rng) -> float:
    """The tensor-core decode kernel (a GQA group of 4), unsplit."""
    return _decode(rng, tensor_cores=True, heads=(32, 8), split=None, dtype=BF16)


@case("decode-cc-split")
def decode_cuda_cores_split(rng) -> float:
    """The CUDA-core decode kernel (group 1) with 64-token pieces: the last piece of a request merges in the kernel."""
    return _decode(rng, tensor_cores=False, heads=(8, 8), split=64, dtype=F16)


QO, KV = [5, 40, 17, 1, 60, 0], [17, 54, 40, 97, 150, 9]  # (a request with no query rows at the end)


def _prefill(rng, *, paged: bool, tile_sizes, num_sms: int | None, split: int | None) -> float:
    import cupy

    import cuinfer
    from cuinfer import reference

    hq, hkv, d = 32, 8, 128
    qo = np.concatenate([[0], np.cumsum(QO)]).astype(np.int32)
    q = rng.standard_normal((int(qo[-1]), hq, d), dtype=np.float32).astype(BF16)
    w = cuinfer.BatchPrefill(paged=paged)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, q_dtype="bfloat16", causal=True, tile_sizes=tile_sizes,
              num_sms=num_sms, fixed_split_size=split)  # fmt: skip
    if paged:
        ps = 5
        indptr, indices, last, num_pages = _page_table(rng, KV, ps)
        cache = rng.standard_normal((num_pages, 2, ps, hkv, d), dtype=np.float32).astype(BF16)
        w.plan(qo, indptr, indices, last, page_size=ps, **kw)
        o, lse = w.run(cupy.asarray(q), cupy.asarray(cache), return_lse=True)
        ref_o, ref_lse = reference.batch_prefill_paged(q, cache, qo, indptr, indices, last, causal=True)
    else:
        kvi = np.concatenate([[0], np.cumsum(KV)]).astype(np.int32)
        k, v = (rng.standard_normal((int(kvi[-1]), hkv, d), dtype=np.float32).astype(BF16) for _ in range(2))
        w.plan(qo, kvi, **kw)
        o, lse = w.run(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v), return_lse=True)
        ref_o, ref_lse = reference.batch_attention_ragged(q, k, v, qo, kvi, causal=True)
    cupy.cuda.runtime.deviceSynchronize()
    return max(_err(o.get(), ref_o), _lse_err(lse.get(), ref_lse))


@case("prefill-ragged-cross-item")
def prefill_ragged_cross_item(rng) -> float:
    """Ragged K/V planned for one SM: 128-row query tiles, one warp per row block (the cross-item pipeline, its item
    table refilled), paired blocks."""
    return _prefill(rng, paged=False, tile_sizes=None, num_sms=1, split=None)


@case("prefill-paged-split")
def prefill_paged_split(rng) -> float:
    """A paged cache (page size 5) with 32-token KV chunks: split-KV partials in the workspace, then merge_partials."""
    return _prefill(rng, paged=True, tile_sizes=None, num_sms=None, split=32)


@case("prefill-small-tile")
def prefill_small_tile(rng) -> float:
    """16-row query tiles: four warps along the keys of a row block (not the cross-item pipeline; the staged
    epilogue merges the warps' states in shared memory)."""
    return _prefill(rng, paged=False, tile_sizes=(16,), num_sms=None, split=None)


@case("merge")
def merge(rng) -> float:
    """merge_state, merge_states and merge_state_in_place (masked), with empty states among them."""
    import cupy

    import cuinfer
    from cuinfer import reference

    rows, states, heads, d = 37, 5, 4, 128
    o = rng.standard_normal((rows, states, heads, d), dtype=np.float32).astype(F16)
    lse = rng.standard_normal((rows, states, heads), dtype=np.float32)
    lse[rng.random(lse.shape) < 0.2] = -np.inf
    err = 0.0
    mo, ml = cuinfer.merge_states(cupy.asarray(o), cupy.asarray(lse))
    ref = reference.merge_states(o, lse)
    err = max(err, _err(mo.get(), ref[0]), _lse_err(ml.get(), ref[1]))
    a, la, b, lb = cupy.asarray(o[:, 0]), cupy.asarray(lse[:, 0]), cupy.asarray(o[:, 1]), cupy.asarray(lse[:, 1])
    po, pl = cuinfer.merge_state(a, la, b, lb)
    ref = reference.merge_state(o[:, 0], lse[:, 0], o[:, 1], lse[:, 1])
    err = max(err, _err(po.get(), ref[0]), _lse_err(pl.get(), ref[1]))
    mask = rng.random(rows) < 0.5
    cuinfer.merge_state_in_place(a, la, b, lb, mask=cupy.asarray(mask))
    cupy.cuda.runtime.deviceSynchronize()
    want_o = np.where(mask[:, None, None], ref[0], o[:, 0])
    want_l = np.where(mask[:, None], ref[1], lse[:, 0])
    return max(err, _err(a.get(), want_o), _lse_err(la.get(), want_l))


TOLERANCE = 0.05  # errors relative to the output's scale (16-bit outputs; lse in absolute units)


def main(argv: list[str]) -> int:
    if "--list" in argv:
        print("\n".join(CASES))
        return 0
    names = [a for a in argv if not a.startswith("-")] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}", file=sys.stderr)
        return 2
    failed = 0
    for name in names:
        t0 = time.perf_counter()
        err = CASES[name](np.random.default_rng(1234))
        ok = err <= TOLERANCE
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max error {err:.2e} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
