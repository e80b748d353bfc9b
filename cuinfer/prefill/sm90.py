"""The Hopper backend of ``BatchPrefill`` (``backend="sm90"``): wgmma tensor cores, TMA copies and warp
specialisation on sm_90a (kernel_src/attention/prefill_sm90/).

What it runs (checked at ``plan()``, each limit named in the error): ragged K / V (``paged=False``) or a paged cache
(any page size; K / V rows gathered by page table), q / k / v / o of one 16-bit type (float16 or bfloat16), ``head_dim =
head_dim_vo = 128``, any GQA group, and the softmax variants of logits, key ranges and masks (causal, sliding window,
soft cap, ALiBi, custom masks and user variants of those kinds); an sm_90 GPU; K / V may be fp8 (float8_e4m3fn,
float8_e5m2: copied as bytes into a staging ring and converted to float16 by the producer; the MMAs then run in float16,
bfloat16 q scaled per row by a power of two). The rest (other head dims,
RoPE / sinks / sigmoid and other transforms) runs on ``backend="fa2"``. CUDA-graph mode works as on the FA2-class
kernel: the TMA maps are kernel arguments captured with the launch, like the parameter struct's pointers.

Its plan is the same plan format as the FA2-class kernel's (cuinfer/planner, read by kernel_src/plan/work.cuh) with
one difference: an item is 128 query rows of **one query head** (the planner sees ``num_qo_heads`` KV heads of group
1; the kernel finds the KV head as head // group), over KV granules of 128 keys, on one persistent CTA per SM.
Split items write partial states that the usual merge kernel combines.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer.formats.kv import KV
from cuinfer.interop.arrays import Tensor
from cuinfer.jit import KernelSpec, get_kernel
from cuinfer.prefill.launch import PrefillLaunch
from cuinfer.prefill.specs import CTYPES, PrefillParams
from cuinfer.variants import Rendered, lookup, render
from cuinfer.variants.render import logits_scale_value

HEAD_DIM = 128
TILE_Q = 128  # query rows of an item (64 per consumer warpgroup)
TILE_KV = 128  # keys of a K / V tile: the planner's KV granule
STAGES = 2
THREADS = 384  # producer warpgroup + two consumer warpgroups
# Q, the K and V rings, 10 mbarriers, the unit slot, the item broadcast, and 1024 bytes to align the tiles; fp8 K / V
# add their staging ring (K and V tiles of one byte per element, converted to float16 by the producer)
SMEM_BYTES = 1024 + TILE_Q * HEAD_DIM * 2 + 2 * STAGES * TILE_KV * HEAD_DIM * 2 + 8 * (2 + 4 * STAGES) + 64 + 16
FP8_STAGING_BYTES = 2 * STAGES * TILE_KV * HEAD_DIM
FP8_KV = ("float8_e4m3fn", "float8_e5m2")
STAGE_TMA_EXTRA = 8 * 4 * STAGES  # fp8 staged by TMA: the staging slots' full and empty barriers
ARCH = "sm_90a"
#: Share of the cost left to the plan's shared tail (taken one item at a time, largest first, by the CTAs that finish
#: their lists first); the FA2-class plans leave 4 % (cuinfer.planner.assign.POOL_SHARE). Items are always dealt
#: largest first (SORTED_DEAL), the query heads of a tile side by side (their K / V tiles shared in the L2).
POOL_SHARE = 0.04
SORTED_DEAL = True
#: backend="auto" picks this kernel for a plan it runs on an sm_90 GPU (no tile_sizes=) when its 128-row items are this
#: full on average (sum of qo lengths over the same rounded up to 128 per request): a batch of short appends fills them
#: poorly, where the FA2-class kernel's tiles (query rows x GQA group) fit better. Measured (H200, 64 appends over 2048
#: keys, bench/lab/sm90_auto_crossover.py): the FA2-class kernel is 1.23x faster at a fill of 0.5, this one 1.17-1.18x
#: faster at 0.75. In CUDA-graph mode the first plan decides for every later one (the captured kernel is fixed).
AUTO_MIN_ROW_FILL = 0.75
#: The max-free softmax (consumer.cuh softmax_tile) takes a chain's scaled logits (its only logits piece has
#: logits_scale c: |logit| <= c) against the fixed reference c log2(e) - 32 instead of a running max; every p then lies
#: in [2^(32 - 2 c log2 e), 2^32], normal floats for c log2(e) <= MAX_FREE_BOUND. bfloat16 P only: float16's range is
#: too narrow. Measured on the soft cap (H200, P1-P3, bench/lab/softcap_poly_trees.py): 0.84-0.86x of causal with the
#: running max, 0.90-0.92x without.
MAX_FREE_BOUND = 79.0
TMA_DESC = np.dtype([("opaque", "<u8", (16,))], align=True)  # CUtensorMap: 128 opaque bytes (the kernel's TmaDesc)


@dataclass(frozen=True)
class Sm90KernelKey:
    """Everything that selects one compiled specialisation of the Hopper prefill kernel."""

    dtype: str  # q and o (and k, v unless kv_dtype says otherwise)
    variant: Rendered
    paged: bool = False
    head_dim: int = HEAD_DIM
    kv_dtype: str | None = None  # fp8 K / V (FP8_KV); None: dtype
    # fp8: the staging copies are TMA boxes issued by one warp while three convert (always for ragged K / V; paged,
    # when the page size is a multiple of 16); else cp.async by all four, each converting its own copies
    stage_tma: bool = False
    # the max-free softmax of scaled logits (MAX_FREE_BOUND; max_free_ok says when a plan may take it)
    max_free: bool = False

    def __post_init__(self) -> None:
        fp8 = self.kv_dtype not in (None, self.dtype)
        if self.stage_tma and not fp8:
            raise ValueError("stage_tma is for fp8 K / V: 16-bit K / V go to the stages without staging")
        if self.max_free and (fp8 or self.dtype != "bfloat16" or self.variant.scaled_logits is None):
            raise ValueError("max_free is for bfloat16 q / k / v and a chain whose only logits piece has logits_scale")
        if fp8 and not self.paged and not self.stage_tma:
            raise ValueError("ragged fp8 K / V is staged by TMA: pass stage_tma=True")

    @property
    def kv(self) -> str:
        return self.kv_dtype or self.dtype

    def name_expr(self) -> str:
        t = CTYPES[self.dtype]
        tail = ""  # (trailing defaults left out: the plain kernels keep their names)
        if self.stage_tma or self.max_free:
            tail = f", {str(self.stage_tma).lower()}"
        if self.max_free:
            tail += ", true"
        return f"cuinfer::batch_prefill_sm90<{t}, {self.head_dim}, {str(self.paged).lower()}, {CTYPES[self.kv]}{tail}>"

    def short_name(self) -> str:
        kv = "paged" if self.paged else "ragged"
        fp8 = f"/kv-{self.kv}{'-tma' if self.stage_tma else ''}" if self.kv != self.dtype else ""
        free = "/max-free" if self.max_free else ""
        return f"prefill_sm90/{kv}/{self.dtype}{fp8}/d{self.head_dim}/{self.variant.name}{free}"

    @property
    def smem_bytes(self) -> int:
        fp8 = FP8_STAGING_BYTES if self.kv != self.dtype else 0
        return SMEM_BYTES + fp8 + (STAGE_TMA_EXTRA if self.stage_tma else 0)


@functools.cache
def sm90_spec(key: Sm90KernelKey) -> KernelSpec:
    return KernelSpec(
        name=key.short_name(),
        source="attention/prefill_sm90.cu",
        name_exprs=(key.name_expr(),),
        preamble=PrefillParams.c_decl() + key.variant.preamble(),
        # wgmma, TMA boxes (q; ragged k / v; fp8 staging with stage_tma) and cp.async (paged tiles, a ragged tile that
        # crosses the last key, fp8 tiles without stage_tma), the register split of the warpgroups
        sass_expect=(r"HGMMA", r"UTMALDG", r"USETMAXREG") + (() if key.stage_tma else (r"LDGSTS",)),
        archs=(ARCH,),
        smem_bytes=key.smem_bytes,
    )


def max_free_ok(dtype: str, kv_dtype: str, chain: Rendered, values: dict) -> bool:
    """Whether a plan takes the max-free softmax: bfloat16 q and K / V, a chain whose only logits piece has
    logits_scale c (its packed ``values``: {variant: {param: value}}) with c log2(e) <= MAX_FREE_BOUND."""
    piece = chain.scaled_logits
    if dtype != "bfloat16" or kv_dtype != dtype or piece is None:
        return False
    return logits_scale_value(piece, values.get(piece.name, {})) * math.log2(math.e) <= MAX_FREE_BOUND


def default_specs() -> list[KernelSpec]:
    """The specialisations CI compiles (sm_90a only): plain and causal in both 16-bit types, the built-in variants of
    logits and key ranges, a custom mask, and fp8 K / V (both formats, ragged and paged, with a logits variant)."""

    def key(dtype: str, *names: str, paged: bool = False, kv: str | None = None, tma: bool = False,
            free: bool = False) -> KernelSpec:  # fmt: skip
        chain = render(tuple(lookup(n) for n in names))
        return sm90_spec(Sm90KernelKey(dtype, chain, paged, kv_dtype=kv, stage_tma=tma, max_free=free))

    return [
        key("bfloat16", "causal"),
        key("float16"),
        key("bfloat16", "causal", "soft_cap", free=True),
        key("bfloat16", "causal", "soft_cap"),
        key("bfloat16", "causal", "alibi"),
        key("bfloat16", "causal", "window"),
        key("float16", "causal", "custom_mask"),
        key("bfloat16", "causal", paged=True),
        key("float16", "causal", "custom_mask", paged=True),
        key("bfloat16", "causal", paged=True, kv="float8_e4m3fn"),
        key("float16", "causal", kv="float8_e5m2", tma=True),
        key("bfloat16", "causal", "soft_cap", kv="float8_e4m3fn", tma=True),
        key("bfloat16", "causal", paged=True, kv="float8_e4m3fn", tma=True),
        key("bfloat16", "causal", "alibi", paged=True, kv="float8_e5m2"),  # (page sizes not a multiple of 16)
    ]


def unsupported(plan: Any) -> str | None:
    """Why the Hopper kernel cannot run ``plan`` (None when it can): the first limit it meets, as a sentence."""
    if plan.head_dim != HEAD_DIM or plan.head_dim_vo != HEAD_DIM:
        return f"head_dim={plan.head_dim}, head_dim_vo={plan.head_dim_vo} (it is built for 128)"
    if plan.q_dtype.value not in ("float16", "bfloat16"):
        return f"q_dtype={plan.q_dtype.value} (it takes float16 or bfloat16)"
    if plan.kv_dtype is not plan.q_dtype and plan.kv_dtype.value not in FP8_KV:
        return (
            f"kv_dtype={plan.kv_dtype.value} with q_dtype={plan.q_dtype.value} (k and v must have q's dtype or be fp8)"
        )
    if plan.o_dtype is not plan.q_dtype:
        return f"o_dtype={plan.o_dtype.value} with q_dtype={plan.q_dtype.value} (o must have q's dtype)"
    for piece in plan.variant.pieces:
        what = [
            name
            for name, on in (
                ("a query transform", piece.query_transform), ("a key transform", piece.key_transform),
                ("a value transform", piece.value_transform), ("an output transform", piece.output_transform),
                ("a sink", piece.sink), ("no softmax", not piece.softmax),
            )
            if on
        ]  # fmt: skip
        if what:
            kinds = "it runs softmax variants of logits, key ranges and masks"
            return f"the variant {piece.name!r} ({', '.join(what)}; {kinds})"
    return None


def row_fill(qo_indptr: np.ndarray) -> float:
    """Query rows over the rows of the plan's 128-row items (1.0 when every request's length is a multiple of 128)."""
    qo = np.diff(np.asarray(qo_indptr, dtype=np.int64))
    rows = int(((qo + TILE_Q - 1) // TILE_Q).sum()) * TILE_Q
    return float(qo.sum()) / rows if rows else 0.0


def auto_picks(plan: Any, arch: str | None) -> bool:
    """Whether ``backend="auto"`` runs ``plan`` on this kernel: an sm_90 GPU (``arch``; None: no GPU), no
    ``tile_sizes=`` (FA2-class tiles), a plan it runs (``unsupported``), and items filled to ``AUTO_MIN_ROW_FILL``;
    ragged or paged, CUDA-graph mode or not."""
    if arch != ARCH:
        return False
    t = plan.static.tiles if plan.static is not None else None
    if t is not None and any(x is not None for x in (t.tile_q, t.tile_kv, t.stages, t.groups, t.convert)):
        return False
    return unsupported(plan) is None and row_fill(plan.qo_indptr) >= AUTO_MIN_ROW_FILL


def check_device(device_id: int | None) -> None:
    """The Hopper kernel needs an sm_90 GPU (wgmma, TMA); ``device_id`` None (no GPU) plans on the host only."""
    if device_id is None:
        return
    from cuinfer.runtime.device import device_info

    arch = device_info(device_id).arch
    if arch != ARCH:
        raise ValueError(
            f"backend='sm90' needs a Hopper GPU (sm_90a: wgmma and TMA) but cuda:{device_id} is {arch}; use "
            "backend='fa2' or 'auto'"
        )


def _encode_map(
    ptr: int, kind: Any, dims: tuple, byte_strides: tuple, box: tuple, swizzle: str, promotion: str, what: str
) -> np.void:
    """cuTensorMapEncodeTiled of ``dims`` (innermost first; ``byte_strides`` between the outer ones) in boxes of
    ``box`` elements, as the kernel's by-value TmaDesc argument; out-of-range elements of a box read as zero."""
    from cuda.bindings import driver as cu

    err, tmap = cu.cuTensorMapEncodeTiled(
        kind,
        cu.cuuint32_t(len(dims)),
        int(ptr),
        [cu.cuuint64_t(max(1, n)) for n in dims],
        [cu.cuuint64_t(n) for n in byte_strides],
        [cu.cuuint32_t(n) for n in box],
        [cu.cuuint32_t(1)] * len(dims),
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}"),
        getattr(cu.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{promotion}"),
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({err}) for {what}")
    out = np.zeros((), TMA_DESC)
    out["opaque"] = np.frombuffer(ctypes.string_at(tmap.getPtr(), 128), dtype="<u8")
    return out[()]


def tensor_map(ptr: int, dtype: str, rows: int, heads: int, stride_n: int, stride_h: int) -> np.void:
    """TMA map of a 16-bit ``[rows, heads, 128]`` tensor with element strides ``stride_n`` (rows) and ``stride_h``
    (heads): boxes of 128 rows x 1 head x 64 columns in the 128-byte swizzle (the wgmma layout), as the kernel's
    by-value TmaDesc argument (cuTensorMapEncodeTiled; out-of-range rows of a box read as zero)."""
    from cuda.bindings import driver as cu

    kind = (
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        if dtype == "bfloat16"
        else cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    )
    return _encode_map(
        ptr, kind, (HEAD_DIM, heads, rows), (2 * stride_h, 2 * stride_n),  # bytes between heads, between rows
        (64, 1, TILE_KV), "128B", "L2_256B",
        f"a [{rows}, {heads}, {HEAD_DIM}] {dtype} tensor with strides ({stride_n}, {stride_h}, 1) at 0x{int(ptr):x}",
    )  # fmt: skip


STAGE_TMA_ROWS = 16  # rows of a paged fp8 TMA box: page sizes that are multiples of it stage by TMA


def fp8_map(ptr: int, strides: tuple[int, int, int], kv: KV, paged: bool, nk: int) -> np.void:
    """TMA map of fp8 K or V as bytes, for the staging copies: ragged ``[rows, heads, 128]`` in boxes of 128 rows, or
    a paged cache ``[pages, page_size, heads, 128]`` (any layout: element strides page, slot, head) in boxes of 16
    slots of one page; no swizzle (the staging ring is row-major)."""
    from cuda.bindings import driver as cu

    s_page, s_slot, s_head = strides
    if paged:
        dims = (HEAD_DIM, kv.num_kv_heads, kv.page_size, kv.num_pages)
        byte_strides = (s_head, s_slot, s_page)
        box = (HEAD_DIM, 1, STAGE_TMA_ROWS, 1)
    else:  # (ragged K / V: rows n, heads h as KV's slot and head strides)
        dims = (HEAD_DIM, kv.num_kv_heads, nk)
        byte_strides = (s_head, s_slot)
        box = (HEAD_DIM, 1, TILE_KV)
    return _encode_map(
        ptr, cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8, dims, byte_strides, box, "NONE", "L2_128B",
        f"fp8 K / V dims {dims} strides {byte_strides}",
    )  # fmt: skip


class Sm90Launch(PrefillLaunch):
    """What run() launches for one plan on the Hopper kernel: the FA2-class launch state (parameter struct, variant
    parameters, merge of split plans) with the sm90 kernel, one CTA per planned CTA, and the TMA maps of q, k and v
    as extra arguments (re-encoded when a pointer or stride changes)."""

    def _configure(self, plan: Any, paged: bool, device_id: int) -> None:
        kv = plan.kv_dtype.value
        fp8 = kv != plan.q_dtype.value
        stage_tma = fp8 and (not paged or plan.page_size % STAGE_TMA_ROWS == 0)
        free = max_free_ok(plan.q_dtype.value, kv, plan.variant, self.vvalues)
        key = Sm90KernelKey(plan.q_dtype.value, plan.variant, paged, kv_dtype=kv if fp8 else None,
                            stage_tma=stage_tma, max_free=free)  # fmt: skip
        self.kernel = get_kernel(sm90_spec(key), key.name_expr(), device_id)
        self.num_ctas, self.threads, self.smem_bytes = plan.work.num_ctas, THREADS, key.smem_bytes
        self.paged, self.max_free = paged, free
        self.tma_kv = not paged and key.kv == key.dtype  # (paged or fp8 K / V: rows copied by the producer threads)
        self.stage_tma = stage_tma

    def _extra_args(self, tq: Tensor, kv: KV) -> tuple:
        plan = self.plan
        dtype = plan.q_dtype.value
        q_map = tensor_map(tq.ptr, dtype, plan.nnz_qo, tq.shape[1], tq.strides[0], tq.strides[1])
        if self.stage_tma:  # (fp8 K / V staged by TMA: byte maps)
            return q_map, *(fp8_map(ptr, strides, kv, self.paged, nk=int(plan.kv_indptr[-1])) for ptr, strides in
                            ((kv.k_ptr, kv.k_strides), (kv.v_ptr, kv.v_strides)))  # fmt: skip
        if not self.tma_kv:  # (K / V rows gathered by page table or staged as fp8: their maps are not read)
            unused = np.zeros((), TMA_DESC)[()]
            return q_map, unused, unused
        nk, heads = int(plan.kv_indptr[-1]), kv.num_kv_heads
        return (
            q_map,
            tensor_map(kv.k_ptr, dtype, nk, heads, kv.k_strides[1], kv.k_strides[2]),
            tensor_map(kv.v_ptr, dtype, nk, heads, kv.v_strides[1], kv.v_strides[2]),
        )
