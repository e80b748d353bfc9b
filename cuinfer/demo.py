"""``cuinfer demo``: a small serving-shaped workload through the public API, checked against the float64 reference.

1. Split-KV decode: each request's KV is cut into chunks, an attention state (o, lse) is computed per chunk, and the
   states are merged with ``merge_states`` into the full result, which must equal attention over the whole cache.
2. A paged-KV decode step: ``BatchDecode.plan()`` on the host, ``run()`` on the device.
On a GPU the calls run the kernels (CuPy arrays); without one the same calls run on the CPU reference backend.
"""

from __future__ import annotations

import time

import numpy as np


def _cupy_or_none():
    from cuinfer.runtime.device import gpu_available

    if not gpu_available():
        return None
    import cupy

    return cupy


def _rel_err(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(x.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def demo_split_kv_merge(xp, rng: np.random.Generator) -> tuple[str, float, float]:
    """8 decode requests, 32 query / 8 KV heads, head dim 128, each KV cut into 4 chunks whose states are merged."""
    import ml_dtypes

    import cuinfer
    from cuinfer import reference

    batch, hq, hkv, d, chunks = 8, 32, 8, 128, 4
    kv_lens = rng.integers(97, 2049, size=batch)
    parts_o = np.empty((batch, chunks, hq, d))
    parts_lse = np.empty((batch, chunks, hq))
    full_o = np.empty((batch, hq, d))
    for b, n in enumerate(kv_lens):
        q = rng.standard_normal((1, hq, d))
        k = rng.standard_normal((n, hkv, d))
        v = rng.standard_normal((n, hkv, d))
        full_o[b] = reference.attention(q, k, v)[0][0]
        bounds = np.linspace(0, n, chunks + 1).astype(int)
        for c in range(chunks):
            o, lse = reference.attention(q, k[bounds[c] : bounds[c + 1]], v[bounds[c] : bounds[c + 1]])
            parts_o[b, c], parts_lse[b, c] = o[0], lse[0]
    o_in = parts_o.astype(ml_dtypes.bfloat16)
    lse_in = parts_lse.astype(np.float32)
    if xp is not None:
        o_in, lse_in = xp.asarray(o_in), xp.asarray(lse_in)
    start = time.perf_counter()
    o, _ = cuinfer.merge_states(o_in, lse_in)
    if xp is not None:
        xp.cuda.get_current_stream().synchronize()
        o = xp.asnumpy(o)
    elapsed = time.perf_counter() - start
    err = _rel_err(np.asarray(o), full_o)
    return "split-KV decode: merge 4 chunk states x 8 requests (bf16)", err, elapsed


def demo_paged_decode(xp, rng: np.random.Generator) -> tuple[str, float, float]:
    """One decode step of a serving batch: 12 requests of mixed lengths against a paged KV cache (page 16, pages
    scattered), Llama-3.1-8B heads (32 query / 8 KV), planned once on the host, run on the device."""
    import ml_dtypes

    import cuinfer
    from cuinfer import reference

    batch, hq, hkv, d, ps = 12, 32, 8, 128, 16
    kv_lens = rng.integers(1, 3000, size=batch)
    pages = (kv_lens + ps - 1) // ps
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    num_pages = int(kv_indptr[-1]) + 7
    kv_indices = rng.permutation(num_pages)[: kv_indptr[-1]].astype(np.int32)
    last = (kv_lens - (pages - 1) * ps).astype(np.int32)
    cache = rng.standard_normal((num_pages, 2, ps, hkv, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
    q = rng.standard_normal((batch, hq, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
    ref_o, _ = reference.batch_decode_paged(q, cache, kv_indptr, kv_indices, last)
    w = cuinfer.BatchDecode(kv_layout="NHD")
    w.plan(kv_indptr, kv_indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps,
           q_dtype="bfloat16")  # fmt: skip
    gq, gcache = (q, cache) if xp is None else (xp.asarray(q), xp.asarray(cache))
    start = time.perf_counter()
    o = w.run(gq, gcache)
    if xp is not None:
        xp.cuda.get_current_stream().synchronize()
        o = xp.asnumpy(o)
    elapsed = time.perf_counter() - start
    err = _rel_err(np.asarray(o), ref_o)
    return f"paged-KV batch decode: {batch} requests, kv 1-3000 tokens, page {ps} (bf16)", err, elapsed


def run_demo(*, cpu: bool = False) -> int:
    xp = None if cpu else _cupy_or_none()
    if xp is None:
        why = "requested with --cpu" if cpu else "no CUDA GPU was found on this machine"
        print(f"cuinfer demo: running on the CPU reference backend (float64 NumPy) -- {why}.")
        print("The same public calls run on the GPU kernels when a CUDA GPU is present.")
    else:
        from cuinfer.runtime.device import device_info

        info = device_info()
        print(f"cuinfer demo: running on {info.name} ({info.arch}, {info.sm_count} SMs) with CuPy arrays.")
    rng = np.random.default_rng()
    tol = 8e-3  # bf16 storage of the merged states: rounding error ~2^-9 relative
    failures = 0
    for step in (demo_split_kv_merge, demo_paged_decode):
        name, err, elapsed = step(xp, rng)
        ok = err < tol
        failures += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: relative error vs float64 reference {err:.2e} "
              f"(tolerance {tol:.0e}), {elapsed * 1e3:.1f} ms")  # fmt: skip
    print("demo passed" if not failures else f"demo FAILED ({failures} step(s))")
    return 1 if failures else 0
