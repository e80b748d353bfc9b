"""FlashInfer code on cuinfer: the only change is the import (docs/compat.md).

One serving step written against FlashInfer's API on torch tensors: a paged KV cache, prefill of new tokens with a
causal mask, a decode step on the tensor-core kernel, and the attention states of two halves of the KV merged into
the state of the whole. Run on a CUDA GPU with torch installed:

    python examples/compat_flashinfer.py            # cuinfer.compat.flashinfer
    python examples/compat_flashinfer.py --real     # the same code on FlashInfer itself, if installed
"""

from __future__ import annotations

import sys

import torch

if "--real" in sys.argv:
    import flashinfer
else:
    import cuinfer.compat.flashinfer as flashinfer

NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
DTYPE, DEVICE = torch.bfloat16, "cuda"


def paged_cache(kv_lens: list[int]) -> tuple[torch.Tensor, ...]:
    """A 5-D NHD cache [pages, 2, page_size, kv_heads, head_dim] and the CSR page table of requests of kv_lens."""
    pages = [-(-n // PAGE_SIZE) for n in kv_lens]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    indices = torch.randperm(int(indptr[-1]), device=DEVICE).int()
    last = [n - PAGE_SIZE * (p - 1) for n, p in zip(kv_lens, pages, strict=True)]
    last = torch.tensor(last, dtype=torch.int32, device=DEVICE)
    cache = torch.randn(int(indptr[-1]), 2, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=DTYPE, device=DEVICE)
    return cache, indptr, indices, last


def main() -> None:
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU (cuinfer's CPU reference runs NumPy arrays: see docs/compat.md)")
        return
    torch.manual_seed(0)
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=DEVICE)  # cuinfer reads only its device
    kv_lens = [300, 17, 1024, 64]
    cache, indptr, indices, last = paged_cache(kv_lens)

    # Prefill: the last qo_len tokens of each request attend causally to the whole cache (bottom-right aligned).
    qo_lens = [40, 17, 1, 64]
    qo_indptr = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    prefill.plan(qo_indptr, indptr, indices, last, NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, causal=True,
                 q_data_type=DTYPE)  # fmt: skip
    q = torch.randn(sum(qo_lens), NUM_QO_HEADS, HEAD_DIM, dtype=DTYPE, device=DEVICE)
    o = prefill.run(q, cache)
    print(f"prefill: o {tuple(o.shape)} {o.dtype} on {o.device} ({type(o).__module__}.{type(o).__name__})")

    # Decode: one query token per request, on the tensor-core kernel, with the base-2 lse.
    decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    decode.plan(indptr, indices, last, NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, q_data_type=DTYPE)
    q1 = torch.randn(len(kv_lens), NUM_QO_HEADS, HEAD_DIM, dtype=DTYPE, device=DEVICE)
    o_full, lse_full = decode.run(q1, cache, return_lse=True)

    # The same decode over the KV split in two (a shared prefix and the rest, as a cascade would), merged.
    k, v = cache[:, 0], cache[:, 1]
    parts = []
    for lo, hi in ((0, 256), (256, None)):
        rows_k, rows_v, lens = [], [], []
        for b, n in enumerate(kv_lens):
            pages = indices[indptr[b] : indptr[b + 1]].long()
            kb = k[pages].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:n][lo:hi]
            vb = v[pages].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:n][lo:hi]
            rows_k.append(kb)
            rows_v.append(vb)
            lens.append(kb.shape[0])
        o_b, lse_b = [], []
        for b in range(len(kv_lens)):  # one request at a time, through single_decode_with_kv_cache
            if lens[b] == 0:  # an empty part: the merge's identity
                o_b.append(torch.zeros(NUM_QO_HEADS, HEAD_DIM, dtype=DTYPE, device=DEVICE))
                lse_b.append(torch.full((NUM_QO_HEADS,), -float("inf"), device=DEVICE))
                continue
            ob, lb = flashinfer.single_decode_with_kv_cache(q1[b], rows_k[b], rows_v[b], return_lse=True)
            o_b.append(ob)
            lse_b.append(lb)
        parts.append((torch.stack(o_b), torch.stack(lse_b)))
    o_merged, lse_merged = flashinfer.merge_state(*parts[0], *parts[1])
    print(f"decode: max |o_full - o_merged| = {(o_full.float() - o_merged.float()).abs().max().item():.2e}, "
          f"max |lse_full - lse_merged| = {(lse_full - lse_merged).abs().max().item():.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
