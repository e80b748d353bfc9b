"""Lab tool: run a fixed set of decode / prefill / merge cases (fixed seed, public API only) and save every output,
so two builds can be compared bit for bit (``compare A.npz B.npz``).

    python bench/lab/dump_outputs.py dump OUT.npz        (GPU; any build with the public API)
    python bench/lab/dump_outputs.py compare A.npz B.npz
"""

from __future__ import annotations

import sys

import numpy as np


def _cases():
    # (name, kind, options)
    for opts in ({}, {"logits_soft_cap": 30.0}, {"window_left": 300}, {"pos_encoding": "alibi"},
                 {"pos_encoding": "rope_llama"}):  # fmt: skip
        for tc in (True, False):
            yield (
                f"decode-{'tc' if tc else 'cc'}-{'-'.join(f'{k}={v}' for k, v in opts.items()) or 'plain'}",
                "decode",
                (
                    tc,
                    opts,
                ),
            )
    for opts in ({"causal": True}, {"causal": False}, {"causal": True, "window_left": 200},
                 {"causal": True, "logits_soft_cap": 30.0}, {"causal": True, "pos_encoding": "alibi"}):  # fmt: skip
        for paged in (False, True):
            yield (
                f"prefill-{'paged' if paged else 'ragged'}-{'-'.join(f'{k}={v}' for k, v in opts.items())}",
                "prefill",
                (
                    paged,
                    opts,
                ),
            )
    yield "merge-states", "merge", None


def dump(path: str) -> None:
    import cupy as cp
    import ml_dtypes

    import cuinfer

    bf16 = ml_dtypes.bfloat16
    out = {}
    for name, kind, arg in _cases():
        rng = np.random.default_rng(1234)
        try:
            if kind == "decode":
                tc, opts = arg
                lens = np.array([1, 17, 513, 4097, 2000, 33])
                ps, hq, hkv, d = 16, 32, 8, 128
                pages = (lens + ps - 1) // ps
                indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
                n = int(indptr[-1]) + 3
                indices = rng.permutation(n)[: indptr[-1]].astype(np.int32)
                last = (lens - (pages - 1) * ps).astype(np.int32)
                cache = cp.asarray(rng.standard_normal((n, 2, ps, hkv, d), dtype=np.float32).astype(bf16))
                q = cp.asarray(rng.standard_normal((lens.size, hq, d), dtype=np.float32).astype(bf16))
                w = cuinfer.BatchDecode(use_tensor_cores=tc)
                w.plan(indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps,
                       q_dtype="bfloat16", **opts)  # fmt: skip
                o, lse = w.run(q, cache, return_lse=True)
            elif kind == "prefill":
                paged, opts = arg
                qo, kv = np.array([1, 300, 37, 1000]), np.array([17, 700, 37, 1500])
                hq, hkv, d, ps = 32, 8, 128, 16
                qi = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
                q = cp.asarray(rng.standard_normal((int(qo.sum()), hq, d), dtype=np.float32).astype(bf16))
                w = cuinfer.BatchPrefill(paged=paged)
                kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, q_dtype="bfloat16", **opts)
                if paged:
                    pages = (kv + ps - 1) // ps
                    ki = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
                    n = int(ki[-1]) + 3
                    idx = rng.permutation(n)[: ki[-1]].astype(np.int32)
                    last = (kv - (pages - 1) * ps).astype(np.int32)
                    cache = cp.asarray(rng.standard_normal((n, 2, ps, hkv, d), dtype=np.float32).astype(bf16))
                    w.plan(qi, ki, idx, last, page_size=ps, **kw)
                    o, lse = w.run(q, cache, return_lse=True)
                else:
                    ki = np.concatenate([[0], np.cumsum(kv)]).astype(np.int32)
                    k = cp.asarray(rng.standard_normal((int(kv.sum()), hkv, d), dtype=np.float32).astype(bf16))
                    v = cp.asarray(rng.standard_normal((int(kv.sum()), hkv, d), dtype=np.float32).astype(bf16))
                    w.plan(qi, ki, **kw)
                    o, lse = w.run(q, k, v, return_lse=True)
            else:
                o_in = cp.asarray(rng.standard_normal((257, 5, 8, 128), dtype=np.float32).astype(bf16))
                lse_in = cp.asarray(rng.standard_normal((257, 5, 8), dtype=np.float32))
                o, lse = cuinfer.merge_states(o_in, lse_in)
            cp.cuda.Device().synchronize()
            out[name + "/o"] = cp.asnumpy(o).view(np.uint16)
            out[name + "/lse"] = cp.asnumpy(lse)
            print(f"{name}: ok", flush=True)
        except Exception as ex:  # noqa: BLE001 - a lab dump: record and go on
            print(f"{name}: {type(ex).__name__}: {str(ex).splitlines()[0]}", flush=True)
    np.savez_compressed(path, **out)


def compare(a: str, b: str) -> int:
    A, B = np.load(a), np.load(b)
    names = sorted(set(A.files) | set(B.files))
    for n in names:
        if n not in A.files or n not in B.files:
            print(f"{n:60s} only in {'A' if n in A.files else 'B'}")
            continue
        x, y = A[n], B[n]
        if n.endswith("/o"):
            fx = x.view(np.uint16).astype(np.uint32) << 16
            fy = y.view(np.uint16).astype(np.uint32) << 16
            fx, fy = fx.view(np.float32), fy.view(np.float32)
        else:
            fx, fy = x, y
        same = np.array_equal(x, y, equal_nan=True)
        diff = np.abs(fx.astype(np.float64) - fy.astype(np.float64))
        diff = diff[np.isfinite(diff)]
        print(f"{n:60s} {'bit-identical' if same else 'differs'}  elements differing: "
              f"{int((x != y).sum()) if x.shape == y.shape else 'shape'} / {x.size}  max |diff| "
              f"{diff.max() if diff.size else 0:.3g}")  # fmt: skip
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(sys.argv[2])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
