"""Batch prefill on the Hopper kernel (``BatchPrefill(backend="sm90")``): a ragged causal batch with GQA and ALiBi,
then the same K / V as a paged cache with ``backend="auto"`` (on an sm_90 GPU it picks the Hopper kernel for these
long requests), both checked against the float64 reference.

    python examples/prefill_sm90.py [--framework torch|jax|cupy|numpy]

On an sm_90 GPU it runs the wgmma / TMA kernel with the framework's arrays (float16: CuPy has no bfloat16); on other
GPUs it says so and runs ``backend="fa2"``; without a GPU, or with --framework numpy, the same calls run on the CPU
reference backend. See docs/prefill.md, "The Hopper kernel".
"""

from __future__ import annotations

import argparse

import numpy as np

import cuinfer
from cuinfer import reference

HQ, HKV, D = 32, 8, 128
LENS = [577, 37, 2048, 1000]  # query = KV lengths of the requests


def hopper() -> bool:
    from cuinfer.runtime.device import current_device_id, device_info, gpu_available

    return gpu_available() and device_info(current_device_id()).arch == "sm_90a"


def to_device(x: np.ndarray, fw: str):
    if fw == "torch":
        import torch

        return torch.from_numpy(x).cuda()
    if fw == "jax":
        import jax.numpy as jnp

        return jnp.asarray(x)
    if fw == "cupy":
        import cupy

        return cupy.asarray(x)
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", choices=("torch", "jax", "cupy", "numpy"), default="cupy")
    args = ap.parse_args()
    fw = args.framework
    from cuinfer.runtime.device import gpu_available

    if fw != "numpy" and not gpu_available():
        print("no GPU: running the CPU reference backend (NumPy)")
        fw = "numpy"
    backend = "sm90" if fw == "numpy" or hopper() else "fa2"
    if backend == "fa2":
        print("not an sm_90 GPU: backend='sm90' needs Hopper; running backend='fa2'")

    rng = np.random.default_rng(0)
    n = sum(LENS)
    indptr = np.concatenate([[0], np.cumsum(LENS)]).astype(np.int32)
    q = rng.standard_normal((n, HQ, D), dtype=np.float32).astype(np.float16)
    k = rng.standard_normal((n, HKV, D), dtype=np.float32).astype(np.float16)
    v = rng.standard_normal((n, HKV, D), dtype=np.float32).astype(np.float16)

    w = cuinfer.BatchPrefill(paged=False, backend=backend)
    w.plan(indptr, indptr, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, causal=True, q_dtype="float16",
           pos_encoding="alibi")  # fmt: skip
    o, lse = w.run(to_device(q, fw), to_device(k, fw), to_device(v, fw), return_lse=True)
    o = np.asarray(o.cpu() if fw == "torch" else o.get() if fw == "cupy" else o, dtype=np.float64)

    ref_o, ref_lse = reference.batch_attention_ragged(q, k, v, indptr, indptr, causal=True, pos_encoding="alibi")
    err = np.abs(o - ref_o).max()
    print(f"{fw} backend={backend}: o {o.shape}, max |o - float64 reference| = {err:.2e}")
    assert err < 2e-2, "the result differs from the float64 reference"

    # The same K / V in a paged cache (pages of 16 tokens, NHD, scattered), backend="auto"
    ps = 16
    pages = [-(-n_kv // ps) for n_kv in LENS]
    num_pages = sum(pages)
    order = rng.permutation(num_pages).astype(np.int32)  # request b's pages: order[page_indptr[b]:page_indptr[b+1]]
    page_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    cache = np.zeros((num_pages, 2, ps, HKV, D), np.float16)
    for b, n_kv in enumerate(LENS):
        for j in range(pages[b]):
            rows = slice(indptr[b] + j * ps, indptr[b] + min((j + 1) * ps, n_kv))
            page = order[page_indptr[b] + j]
            cache[page, 0, : rows.stop - rows.start] = k[rows]
            cache[page, 1, : rows.stop - rows.start] = v[rows]
    last = np.array([n_kv - (p - 1) * ps for n_kv, p in zip(LENS, pages, strict=True)], np.int32)
    w = cuinfer.BatchPrefill(paged=True)
    w.plan(indptr, page_indptr, order, last, page_size=ps, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D,
           causal=True, q_dtype="float16", pos_encoding="alibi")  # fmt: skip
    o = w.run(to_device(q, fw), to_device(cache, fw))
    o = np.asarray(o.cpu() if fw == "torch" else o.get() if fw == "cupy" else o, dtype=np.float64)
    err = np.abs(o - ref_o).max()
    print(f"{fw} paged, backend='auto' planned {w.plan_backend!r}: max |o - float64 reference| = {err:.2e}")
    assert err < 2e-2, "the result differs from the float64 reference"


if __name__ == "__main__":
    main()
