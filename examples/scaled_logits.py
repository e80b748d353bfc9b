"""A saturating logits variant written with ``logits_scale``: a "softsign cap" ``c * x / (c + |x|)`` (the logit stays
within ``±c``), run by ``BatchPrefill`` (bfloat16 on the Hopper kernel, where the bound lets it skip the running max;
float16 with CuPy, which has no bfloat16) and checked against the float64 reference run through the variant's NumPy
function. The built-in soft cap (``logits_soft_cap=``) is written the same way.

    python examples/scaled_logits.py [--framework torch|jax|cupy|numpy]

Without a GPU, or with --framework numpy, the same calls run on the CPU reference backend. See docs/variants.md.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

import cuinfer

HQ, HKV, D, C = 16, 4, 128, 20.0
LENS = [300, 1000, 77]

# The snippet gets r's argument x / c and returns r (|r| <= 1); the logit is c * r.
SOFTSIGN_CAP = cuinfer.Variant(
    name="softsign_cap",
    logits="x / (1.f + fabsf(x))",
    logits_scale="c",
    params=(cuinfer.Param("c", "f32"),),
    numpy={"logits": lambda x: x / (1 + np.abs(x))},
)


def softsign_reference(q, k, v, indptr, sm_scale: float) -> np.ndarray:
    """Causal attention with the softsign cap in float64, request by request (GQA: query head h reads KV head
    h // (HQ / HKV))."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    o = np.zeros_like(q)
    g = HQ // HKV
    for b in range(len(indptr) - 1):
        r = slice(indptr[b], indptr[b + 1])
        kb, vb = np.repeat(k[r], g, axis=1), np.repeat(v[r], g, axis=1)  # [L, HQ, D]
        s = np.einsum("ihd,jhd->hij", q[r], kb) * sm_scale
        s = C * s / (C + np.abs(s))
        s = np.where(np.tril(np.ones(s.shape[1:], bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        o[r] = np.einsum("hij,jhd->ihd", p / p.sum(-1, keepdims=True), vb)
    return o


def to_device(x: np.ndarray, fw: str):
    if fw == "torch":
        import torch

        if x.dtype == ml_dtypes.bfloat16:  # (torch has no NumPy bfloat16: its bits, viewed)
            return torch.from_numpy(x.view(np.uint16)).cuda().view(torch.bfloat16)
        return torch.from_numpy(x).cuda()
    if fw == "jax":
        import jax.numpy as jnp

        return jnp.asarray(x)
    if fw == "cupy":
        import cupy

        return cupy.asarray(x)
    return x


def to_host(o, fw: str) -> np.ndarray:
    if fw == "torch":
        return o.float().cpu().numpy()
    if fw == "cupy":
        return o.get()
    return np.asarray(o)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", choices=("torch", "jax", "cupy", "numpy"), default="cupy")
    fw = ap.parse_args().framework
    from cuinfer.runtime.device import gpu_available

    if fw != "numpy" and not gpu_available():
        print("no GPU: running the CPU reference backend (NumPy)")
        fw = "numpy"
    dtype = np.float16 if fw == "cupy" else ml_dtypes.bfloat16
    rng = np.random.default_rng(0)
    n = sum(LENS)
    indptr = np.concatenate([[0], np.cumsum(LENS)]).astype(np.int32)
    q, k, v = (rng.standard_normal((n, h, D), dtype=np.float32).astype(dtype) for h in (HQ, HKV, HKV))

    w = cuinfer.BatchPrefill(paged=False)
    w.plan(indptr, indptr, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, causal=True, q_dtype=dtype,
           variant=SOFTSIGN_CAP, variant_params={"softsign_cap": {"c": C}}, sm_scale=0.5)  # fmt: skip
    o = to_host(w.run(to_device(q, fw), to_device(k, fw), to_device(v, fw)), fw).astype(np.float64)

    ref_o = softsign_reference(q, k, v, indptr, sm_scale=0.5)
    err = np.abs(o - ref_o).max()
    print(f"{fw} ({w.plan_backend}): o {o.shape}, max |o - float64 reference| = {err:.2e}")
    assert err < 3e-2, "the result differs from the float64 reference"


if __name__ == "__main__":
    main()
