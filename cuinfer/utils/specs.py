"""Kernel specs and parameter structs of the serving utilities (kernel_src/utility/): appends to a paged KV cache,
RoPE, bit packing and the index arrays of a step.

One module per concern and dtype; every instance a public call can launch is listed here, so CI compiles them all
for sm_80 and sm_90a (group ``utility``) and ``cuinfer warmup --group utility`` pre-compiles them.
"""

from __future__ import annotations

import functools

from cuinfer.jit import KernelSpec, ParamStruct

DTYPES = {"float16": "half", "bfloat16": "__nv_bfloat16"}
ITEMSIZE = {"float16": 2, "bfloat16": 2}

# 16-byte loads and stores in the data path (bit packing: stores of 16 packed bytes per lane).
_WIDE = (r"LDG\.E\..*128", r"STG\.E\.128")

# ---- append_paged_kv_cache -----------------------------------------------------------------------------------------

APPEND_THREADS = 256
# 16-byte vectors per thread and side whose loads are in flight before the stores: 2 (K, V) x 2 x 16 B x 1024
# threads = 64 KB per SM (launch bounds 256 x 4 blocks, 64 registers), above the ~40 KB an H200 SM needs in flight
# at its share of the DRAM bandwidth; the slot lookups of a vector serve K and V. (4 vectors a side: 94 registers,
# 2 blocks per SM, the same bytes in flight behind half as many independent lookup chains.)
APPEND_UNROLL = 2
APPEND_BLOCKS_PER_SM = 4

AppendSide = ParamStruct(
    "AppendSide",
    (("src", "ptr"), ("dst", "ptr"))
    + tuple((n, "i64") for n in ("src_s0", "src_s1", "dst_page", "dst_slot", "dst_head"))
    + (("vecs_per_row", "i32"), ("vecs_per_token", "i32"))
    + tuple((n, "u32") for n in ("row_mul", "row_shift"))
    + (("scale", "f32"),),  # an fp8 cache stores saturate(x / scale); unused by a 16-bit cache
)

AppendParams = ParamStruct(
    "AppendParams",
    (("k", AppendSide), ("v", AppendSide))
    + tuple((n, "ptr") for n in ("batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len"))
    + tuple((n, "i32") for n in ("token_begin", "nnz", "batch_size", "num_pages", "num_indices", "page_size"))
    + (("page_mul", "u32"), ("page_shift", "u32"))
    + (("vecs_per_token", "i32"), ("tok_mul", "u32"), ("tok_shift", "u32")),
)


FP8_DTYPES = {"float8_e4m3fn": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2"}


def append_instance(dtype: str, cache_dtype: str | None = None) -> str:
    """Rows of ``dtype`` into a cache of ``cache_dtype`` (default: the same, a copy; fp8 rows into an fp8 cache are
    a copy too, FlashInfer's fp8 append)."""
    names = DTYPES | FP8_DTYPES
    c = names[dtype]
    cc = names[cache_dtype] if cache_dtype else c
    return f"cuinfer::append::append_paged_kv_cache<{c}, {cc}, {APPEND_UNROLL}>"


@functools.cache
def append_spec(dtype: str, cache_dtype: str | None = None) -> KernelSpec:
    """The append of ``dtype`` rows into a cache of ``dtype`` (a copy) or of an fp8 ``cache_dtype`` (quantising:
    16-byte loads, 8-byte stores; on sm_90a one F2FP per pair of values)."""
    if cache_dtype is None or cache_dtype == dtype:
        return KernelSpec(
            name=f"utility/append/{dtype}",
            source="utility/append.cu",
            name_exprs=(append_instance(dtype),),
            preamble=AppendParams.c_decl(),
            sass_expect=_WIDE,
        )
    fmt = "E4M3" if "e4m3" in cache_dtype else "E5M2"
    return KernelSpec(
        name=f"utility/append/{dtype}/{cache_dtype}",
        source="utility/append.cu",
        name_exprs=(append_instance(dtype, cache_dtype),),
        preamble=AppendParams.c_decl(),
        sass_expect=(r"LDG\.E\..*128", r"STG\.E\.64", rf"sm_90a:F2FP\.SATFINITE\.{fmt}"),
    )


# ---- RoPE ----------------------------------------------------------------------------------------------------------

ROPE_THREADS = 256
ROPE_BLOCKS_PER_SM = 2  # launch bounds (256, 2): up to 128 registers for 4 heads' loads in flight
# Elements per chunk (the widest first): 16 bytes when the rotary split and the rows allow it, else narrower.
ROPE_VECS = {"float16": (8, 4, 2, 1), "bfloat16": (8, 4, 2, 1)}
POS_INT32, POS_INT64, POS_RAGGED = 0, 1, 2

RopeParams = ParamStruct(
    "RopeParams",
    tuple((n, "ptr") for n in ("q", "k", "q_out", "k_out"))
    + tuple((n, "i64") for n in ("q_s0", "q_s1", "k_s0", "k_s1", "qo_s0", "qo_s1", "ko_s0", "ko_s1"))
    + tuple(
        (n, "i32")
        for n in ("nnz", "num_q_heads", "num_k_heads", "rotary_dim", "rot_units", "heads_per_group", "pos_kind")
    )
    + tuple((n, "ptr") for n in ("pos", "indptr", "offsets", "table"))
    + (("batch_size", "i32"), ("max_pos", "i32"), ("table_s0", "i64"))
    + tuple((n, "f64") for n in ("log2_theta", "rcp_scale", "smooth_a", "smooth_b")),
)


def rope_instance(dtype: str, vec: int, interleave: bool) -> str:
    return f"cuinfer::rope::apply_rope<{DTYPES[dtype]}, {vec}, {'true' if interleave else 'false'}>"


@functools.cache
def rope_spec(dtype: str, vec: int) -> KernelSpec:
    """Rotate-half and interleaved kernels with chunks of ``vec`` elements (interleave needs pairs: vec >= 2)."""
    modes = (False, True) if vec >= 2 else (False,)
    return KernelSpec(
        name=f"utility/rope/{dtype}/v{vec}",
        source="utility/rope.cu",
        name_exprs=tuple(rope_instance(dtype, vec, m) for m in modes),
        preamble=RopeParams.c_decl(),
        sass_expect=_WIDE if vec * ITEMSIZE[dtype] == 16 else (),
    )


# ---- packbits, segment_packbits ------------------------------------------------------------------------------------

PACK_THREADS = 256
PACK_WARP_ELEMS = 4096  # elements a warp packs per round on the 16-byte path
PACK_ITEM_BYTES = 512  # output bytes of a segment_packbits work item (a warp's; 4096 elements)

PackParams = ParamStruct(
    "PackParams",
    tuple((n, "ptr") for n in ("x", "out", "indptr", "new_indptr", "chunk_ptr"))
    + (("n", "i64"), ("num_segments", "i32")),
)


def pack_instance(kind: str, bitorder: str) -> str:
    return f"cuinfer::bits::{kind}<{'true' if bitorder == 'big' else 'false'}>"


@functools.cache
def pack_spec() -> KernelSpec:
    exprs = tuple(pack_instance(k, b) for k in ("packbits", "segment_packbits") for b in ("little", "big"))
    return KernelSpec(
        name="utility/packbits",
        source="utility/packbits.cu",
        name_exprs=exprs,
        preamble=PackParams.c_decl(),
        # packbits: 16-byte loads and stores; segment_packbits: 16-byte loads (its stores are bytes: no alignment)
        sass_expect=(r"LDG\.E\..*128",),
    )


# ---- get_batch_indices_positions, get_seq_lens ---------------------------------------------------------------------

POSITIONS_THREADS = 256

PositionsParams = ParamStruct(
    "PositionsParams",
    tuple((n, "ptr") for n in ("indptr", "lens", "out0", "out1")) + (("n", "i64"), ("batch_size", "i32"))
    + (("page_size", "i32"),),
)  # fmt: skip

POSITIONS_KERNELS = ("batch_indices_positions", "seq_lens", "narrow_indices")


def positions_instance(kind: str) -> str:
    return f"cuinfer::positions::{kind}"


@functools.cache
def positions_spec() -> KernelSpec:
    return KernelSpec(
        name="utility/positions",
        source="utility/positions.cu",
        name_exprs=tuple(positions_instance(k) for k in POSITIONS_KERNELS),
        preamble=PositionsParams.c_decl(),
        sass_expect=(r"STG\.E\.128",),
    )


def all_specs() -> list[KernelSpec]:
    out = [append_spec(dt) for dt in (*DTYPES, *FP8_DTYPES)]
    out += [append_spec(dt, c) for dt in DTYPES for c in FP8_DTYPES]
    out += [rope_spec(dt, v) for dt in DTYPES for v in ROPE_VECS[dt]]
    return out + [pack_spec(), positions_spec()]
