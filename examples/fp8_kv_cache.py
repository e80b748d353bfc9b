"""An fp8 KV cache with per-KV-head scales: batch decode and paged prefill, checked against the float64 reference on
the dequantised cache.

    python examples/fp8_kv_cache.py [--framework torch|jax|cupy|numpy] [--format float8_e4m3fn|float8_e5m2]

On a GPU it runs the kernels with torch tensors or JAX arrays (fp8 dtypes: torch.float8_e4m3fn, jnp.float8_e4m3fn)
or CuPy arrays (fp8 held as uint8, read as the plan's kv_dtype); without one, or with --framework numpy, the same
calls run on the CPU reference backend. See docs/fp8.md.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

import cuinfer
from cuinfer import reference

HQ, HKV, D, PAGE = 32, 8, 128, 16
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def quantise(cache: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A float32 cache [pages, 2, page, Hkv, D] -> (fp8 cache, k_scale [Hkv], v_scale [Hkv]): per KV head, saturated."""
    amax = np.abs(cache).max(axis=(0, 2, 4))  # [2, Hkv]
    scales = np.maximum(amax / FP8_MAX[fmt], 1e-8).astype(np.float32)
    q = np.clip(cache / scales[None, :, None, :, None], -FP8_MAX[fmt], FP8_MAX[fmt])
    return q.astype(getattr(ml_dtypes, fmt)), scales[0], scales[1]


def gpu_framework(requested: str | None) -> str:
    if requested is not None:
        return requested
    try:
        import torch

        if torch.cuda.is_available():
            return "torch"
    except ImportError:
        pass
    try:
        import cupy

        if cupy.cuda.is_available():
            return "cupy"
    except ImportError:
        pass
    return "numpy"


def to_device(x: np.ndarray, fw: str):
    """NumPy (ml_dtypes included) -> the framework's GPU array; CuPy gets fp8 and bf16 as their bits' type."""
    if fw == "numpy":
        return x
    if fw == "torch":
        import torch

        if x.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            bits = torch.from_numpy(np.ascontiguousarray(x).view(np.uint16 if x.itemsize == 2 else np.uint8))
            return bits.cuda().view(getattr(torch, x.dtype.name))
        return torch.from_numpy(np.ascontiguousarray(x)).cuda()
    if fw == "jax":
        import jax.numpy as jnp

        return jnp.asarray(x)  # (ml_dtypes' fp8 and bfloat16 are JAX's own dtypes)
    import cupy

    if x.dtype.name.startswith("float8"):
        return cupy.asarray(x.view(np.uint8))  # CuPy has no fp8: the bytes, read as the plan's kv_dtype
    return cupy.asarray(x)


def to_numpy(x, fw: str) -> np.ndarray:
    if fw == "numpy":
        return np.asarray(x, dtype=np.float64)
    if fw == "torch":
        return x.float().cpu().numpy().astype(np.float64)
    if fw == "jax":
        return np.asarray(x).astype(np.float64)
    return x.get().astype(np.float64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", choices=("torch", "jax", "cupy", "numpy"))
    ap.add_argument("--format", default="float8_e4m3fn", choices=tuple(FP8_MAX))
    args = ap.parse_args()
    fw = gpu_framework(args.framework)
    rng = np.random.default_rng(0)

    # a batch of 4 requests of 900, 33, 2048 and 1 tokens, pages scattered over the cache
    lens = np.array([900, 33, 2048, 1])
    pages = (lens + PAGE - 1) // PAGE
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    kv_indices = rng.permutation(int(kv_indptr[-1])).astype(np.int32)
    last = (lens - (pages - 1) * PAGE).astype(np.int32)
    cache32 = rng.standard_normal((int(kv_indptr[-1]), 2, PAGE, HKV, D)).astype(np.float32)
    cache32 *= rng.uniform(0.5, 4.0, HKV)[None, None, None, :, None]  # heads of different ranges
    cache, k_scale, v_scale = quantise(cache32, args.format)
    q = rng.standard_normal((len(lens), HQ, D)).astype(ml_dtypes.bfloat16)

    # decode: the scales per KV head (float32 arrays on the GPU; NumPy arrays on the CPU reference)
    dec = cuinfer.BatchDecode()
    dec.plan(kv_indptr, kv_indices, last, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=PAGE,
             q_dtype="bfloat16", kv_dtype=args.format)  # fmt: skip
    o, lse = dec.run(to_device(q, fw), to_device(cache, fw), k_scale=to_device(k_scale, fw),
                     v_scale=to_device(v_scale, fw), return_lse=True)  # fmt: skip
    ref_o, ref_lse = reference.batch_decode_paged(q, cache, kv_indptr, kv_indices, last, k_scale=k_scale,
                                                  v_scale=v_scale)  # fmt: skip
    err = np.abs(to_numpy(o, fw) - ref_o).max()
    lse_err = np.abs(to_numpy(lse, fw) - ref_lse).max()
    print(f"[{fw}] decode, {args.format} cache with per-head scales: max |o - ref| {err:.2e}, max |lse - ref| "
          f"{lse_err:.2e}")  # fmt: skip

    # prefill: the last 5 tokens of each request (1 for the last), causal, scales as numbers
    qo_lens = np.minimum(lens, 5)
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    qp = rng.standard_normal((int(qo_indptr[-1]), HQ, D)).astype(ml_dtypes.bfloat16)
    pre = cuinfer.BatchPrefill(paged=True)
    pre.plan(qo_indptr, kv_indptr, kv_indices, last, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=PAGE,
             causal=True, q_dtype="bfloat16", kv_dtype=args.format)  # fmt: skip
    ks, vs = float(k_scale.max()), float(v_scale.max())
    op = pre.run(to_device(qp, fw), to_device(cache, fw), k_scale=ks, v_scale=vs)
    ref_p, _ = reference.batch_prefill_paged(qp, cache, qo_indptr, kv_indptr, kv_indices, last, causal=True,
                                             k_scale=ks, v_scale=vs)  # fmt: skip
    print(f"[{fw}] prefill, {args.format} cache: max |o - ref| {np.abs(to_numpy(op, fw) - ref_p).max():.2e}")


if __name__ == "__main__":
    main()
