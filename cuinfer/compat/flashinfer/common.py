"""FlashInfer's argument conventions translated into cuinfer's, in one place: option names and defaults, backends,
the workspace buffer, scales, the LSE's base and layout, and the errors for what the drop-in does not cover.

Every function here is pure translation (no kernels): the wrappers in ``decode``, ``prefill`` and ``single`` call
cuinfer's public ``BatchDecode`` / ``BatchPrefill`` / ``single_*`` with what these return.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import numpy as np

from cuinfer.interop.dtypes import as_dtype
from cuinfer.reference.positional import alibi_slopes
from cuinfer.variants.builtins import alibi, soft_cap

# The FlashInfer release whose signatures and semantics this package mirrors.
FLASHINFER_API_VERSION = "0.7.2"
LN2 = math.log(2.0)

POS_ENCODINGS = {"NONE": "none", "ROPE_LLAMA": "rope_llama", "ALIBI": "alibi"}
KV_LAYOUTS = ("NHD", "HND")
LSE_BASES = ("log2", "ln")
LSE_LAYOUTS = ("NH", "HN")
# FlashInfer backend -> cuinfer backend. "fa3" (FlashInfer's Hopper kernels) runs cuinfer's best available kernel
# for the device: "auto", the Hopper kernel on an sm_90 GPU where it fits (docs/compat.md).
BACKENDS = {"auto": "auto", "fa2": "fa2", "fa3": "auto"}
OTHER_BACKENDS = ("trtllm-gen", "cudnn", "cute-dsl", "cute-dsl-prims", "cutlass", "cutile", "prims-ts")
# disable_split_kv=True: a fixed split longer than any KV range, so no range is ever cut (cuinfer's fixed_split_size
# is in tokens and cuts ranges at its multiples).
NO_SPLIT_TOKENS = 1 << 30
# CUDA-graph mode fixes cuinfer's own workspace at construction: the FlashInfer buffer's size, at least this.
GRAPH_WORKSPACE_BYTES = 128 << 20
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}


class InvalidOptionError(KeyError, ValueError):
    """An option value FlashInfer rejects with ``KeyError`` (``pos_encoding_mode``, ``kv_layout``); also a
    ``ValueError``, cuinfer's error for bad input."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def not_covered(what: str, instead: str) -> NotImplementedError:
    """The error for a FlashInfer argument or feature the drop-in does not cover: what, and what to use instead."""
    return NotImplementedError(f"{what} is not covered by cuinfer.compat.flashinfer; {instead} (docs/compat.md)")


# ---- options ---------------------------------------------------------------------------------------------------------


def pos_encoding(mode: Any) -> str:
    """FlashInfer's ``pos_encoding_mode`` ('NONE', 'ROPE_LLAMA', 'ALIBI') -> cuinfer's ``pos_encoding``."""
    name = getattr(mode, "name", mode)  # (FlashInfer's PosEncodingMode enum too)
    if name not in POS_ENCODINGS:
        raise InvalidOptionError(
            f"Invalid pos_encoding_mode {mode!r}: FlashInfer's modes are {', '.join(map(repr, POS_ENCODINGS))}"
        )
    return POS_ENCODINGS[name]


def kv_layout(layout: Any) -> str:
    """'NHD' or 'HND' exactly, as FlashInfer spells them."""
    name = getattr(layout, "name", layout)
    if name not in KV_LAYOUTS:
        raise InvalidOptionError(f"Invalid kv_layout {layout!r}: use 'NHD' or 'HND'")
    return name


def backend(name: Any) -> str:
    """FlashInfer's ``backend`` -> cuinfer's (prefill wrappers); decode accepts the same names."""
    if name in BACKENDS:
        return BACKENDS[name]
    if name in OTHER_BACKENDS:
        raise not_covered(
            f"backend={name!r}", "use backend='auto', 'fa2' or 'fa3' (all run cuinfer's kernels)"
        )  # fmt: skip
    raise ValueError(f"backend must be one of {', '.join(map(repr, (*BACKENDS, *OTHER_BACKENDS)))} but is {name!r}")


def check_no_jit(jit_args: Any, jit_kwargs: Any = None) -> None:
    if jit_args is not None or jit_kwargs is not None:
        raise not_covered(
            "jit_args / jit_kwargs (FlashInfer's custom JIT attention variants)",
            "write the variant as a cuinfer.Variant and pass it to cuinfer.BatchPrefill / BatchDecode "
            "plan(variant=...) (docs/variants.md)",
        )


def data_type(x: Any) -> Any:
    """A FlashInfer dtype argument (torch dtype or a torch attribute name such as 'float16' / 'half') for cuinfer."""
    if isinstance(x, str):
        return _DTYPE_ALIASES.get(x, x)
    return x


def kv_data_type(x: Any) -> Any:
    """``data_type`` of a wrapper's ``kv_data_type``; fp8 raises: the wrappers do not route FlashInfer's fp8 scales to
    cuinfer's fp8 kernels yet (the ragged prefill wrapper would drop them)."""
    x = data_type(x)
    if x is not None:
        try:
            fp8 = as_dtype(x).is_float8
        except (TypeError, ValueError):  # (cuinfer's plan() names what it cannot read)
            return x
        if fp8:
            raise not_covered(
                f"kv_data_type={x}: an fp8 KV cache through the drop-in's wrappers",
                "plan the fp8 cache with cuinfer.BatchDecode / cuinfer.BatchPrefill(kv_dtype=...) and pass k_scale / "
                "v_scale to their run() (docs/fp8.md)",
            )
    return x


OPTION_NAMES = ("pos_encoding_mode", "window_left", "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta")

# FlashInfer's ALiBi bias is ``slope_h * (j - i)`` with ``i`` the query's index within its request (0 in decode), not
# cuinfer's bottom-right-aligned ``j - (i + kv_len - qo_len)``: the two differ by a constant per request, which
# leaves o alone but shifts lse by ``slope_h * (kv_len - qo_len)`` (and moves logits inside a soft cap). The drop-in
# runs FlashInfer's bias as a variant, and the soft cap after it (FlashInfer's order) when both are on.
FLASHINFER_ALIBI = dataclasses.replace(
    alibi.ALIBI,
    name="flashinfer_alibi",
    slope=None,
    logits="x + row.slope * static_cast<float>(kv_idx - qo_idx)",
    numpy={"logits": lambda x, kv_idx, qo_idx, qo_head, params: (
        x + alibi_slopes(params.num_qo_heads)[qo_head] * (kv_idx - qo_idx))},
    doc="FlashInfer's ALiBi: logit += slope_h * (kv_idx - qo_idx), qo_idx the query's index within its request.",
)  # fmt: skip
FLASHINFER_SOFT_CAP = dataclasses.replace(
    soft_cap.SOFT_CAP,
    name="flashinfer_soft_cap",
    numpy={"logits": lambda x: np.tanh(x)},  # (of x / cap: logits_scale)
    doc="The soft cap after FlashInfer's ALiBi (cuinfer's built-in soft cap, applied after the variants given).",
)


def attention_options(args: dict[str, Any], num_qo_heads: int) -> dict[str, Any]:
    """FlashInfer's attention options (``OPTION_NAMES``, read from ``args``: the caller's arguments) with their
    ``None`` defaults resolved, as cuinfer ``plan()`` keywords. FlashInfer applies the soft cap only when it is
    > 0, so None, 0 and negative values all disable it. ALiBi becomes ``variant=`` / ``variant_params=`` keywords
    (FLASHINFER_ALIBI for ``num_qo_heads`` heads)."""
    cap = 0.0 if args["logits_soft_cap"] is None else float(args["logits_soft_cap"])
    sm_scale, rope_scale, rope_theta = args["sm_scale"], args["rope_scale"], args["rope_theta"]
    out = dict(
        pos_encoding=pos_encoding(args["pos_encoding_mode"]), window_left=int(args["window_left"]),
        logits_soft_cap=cap if cap > 0 else 0.0, sm_scale=None if sm_scale is None else float(sm_scale),
        rope_scale=1.0 if rope_scale is None else float(rope_scale),
        rope_theta=1e4 if rope_theta is None else float(rope_theta),
    )  # fmt: skip
    if out["pos_encoding"] == "alibi":  # FlashInfer's bias (FLASHINFER_ALIBI), then its soft cap
        heads = int(num_qo_heads)
        out.update(pos_encoding="none", variant=[FLASHINFER_ALIBI],
                   variant_params={FLASHINFER_ALIBI.name: alibi.values(heads)})  # fmt: skip
        if out["logits_soft_cap"] > 0:
            out["variant"].append(FLASHINFER_SOFT_CAP)
            out["variant_params"][FLASHINFER_SOFT_CAP.name] = soft_cap.values(out["logits_soft_cap"])
            out["logits_soft_cap"] = 0.0
    return out


def split_options(fixed_split_size: Any, disable_split_kv: bool, page_size: int = 1) -> int | None:
    """cuinfer's ``fixed_split_size`` (KV tokens) from FlashInfer's (pages; tokens for ragged KV, ``page_size=1``)
    and ``disable_split_kv``."""
    if disable_split_kv:
        return NO_SPLIT_TOKENS
    if fixed_split_size is None or int(fixed_split_size) <= 0:  # (FlashInfer's -1: automatic)
        return None
    return int(fixed_split_size) * int(page_size)


def refuse(**options: Any) -> None:
    """Raise for the first option given a value that changes results and that cuinfer does not implement.
    Keys are option names; values are ``(value, is it in use, what to use instead)``."""
    for name, (value, used, instead) in options.items():
        if used:
            raise not_covered(f"{name}={_short(value)}", instead)


def _short(value: Any) -> str:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)
    shape = getattr(value, "shape", None)
    return f"<{type(value).__name__}{'' if shape is None else ' of shape ' + str(tuple(shape))}>"


def plan_refusals(
    *, use_fp16_qk_reduction: bool, prefix_len_ptr: Any, token_pos_in_items_ptr: Any, max_item_len_ptr: Any
) -> None:
    """The prefill ``plan()`` options cuinfer does not implement (each changes results)."""
    refuse(
        use_fp16_qk_reduction=(use_fp16_qk_reduction, bool(use_fp16_qk_reduction),
                               "cuinfer accumulates q·k in float32; leave it False"),
        prefix_len_ptr=(prefix_len_ptr, prefix_len_ptr is not None, MULTI_ITEM),
        token_pos_in_items_ptr=(token_pos_in_items_ptr, token_pos_in_items_ptr is not None, MULTI_ITEM),
        max_item_len_ptr=(max_item_len_ptr, max_item_len_ptr is not None, MULTI_ITEM),
    )  # fmt: skip


def run_refusals(args: tuple, sinks: Any = None, kv_cache_sf: Any = None, skip_softmax: Any = None) -> None:
    """The ``run()`` arguments cuinfer does not implement (each changes results)."""
    refuse(
        args=(args, bool(args), NO_RUN_ARGS), sinks=(sinks, sinks is not None, NO_SINKS),
        kv_cache_sf=(kv_cache_sf, kv_cache_sf is not None, NO_NVFP4),
        skip_softmax_threshold_scale_factor=(skip_softmax, skip_softmax is not None, NO_SKIP_SOFTMAX),
    )  # fmt: skip


MULTI_ITEM = "multi-item scoring masks are not in cuinfer; express the mask as custom_mask / packed_custom_mask"
NO_SINKS = "attention sinks are not in cuinfer's variants yet; leave sinks=None"
NO_NVFP4 = "NVFP4 / fp8 KV caches are not implemented in cuinfer yet; use float16 or bfloat16 caches"
NO_SKIP_SOFTMAX = "skip-softmax sparsity is not in cuinfer; leave it None"
NO_RUN_ARGS = "extra positional run() arguments feed FlashInfer's custom JIT kernels; use a cuinfer.Variant"


# ---- arrays ----------------------------------------------------------------------------------------------------------


def is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or hasattr(x, "__dlpack__")


def device_of(buffer: Any) -> int | None:
    """The CUDA device of FlashInfer's ``float_workspace_buffer`` (None for a host array: the CPU reference)."""
    dev = getattr(buffer, "__dlpack_device__", None)
    if dev is None:
        raise TypeError(
            f"float_workspace_buffer must be an array (a torch.Tensor on the GPU) but is {type(buffer).__name__}; "
            "cuinfer keeps its own workspace and reads only the buffer's device, so a small one will do"
        )
    kind, index = (int(x) for x in dev())
    return index if kind in (2, 13) else None  # kDLCUDA, kDLCUDAManaged


def graph_workspace_bytes(buffer: Any) -> int:
    return max(int(getattr(buffer, "nbytes", 0) or 0), GRAPH_WORKSPACE_BYTES)


def require_buffers(mode: str, **buffers: Any) -> None:
    """CUDA-graph mode: FlashInfer's preallocated buffers must be tensors (its ``ValueError``, ``mode`` being how
    that wrapper's message names CUDA-graph mode)."""
    for name, buf in buffers.items():
        if not is_array(buf):
            raise ValueError(f"{name} should be a torch.Tensor in {mode} mode")


def scalar(x: Any) -> float | None:
    """A scale given as a number or a one-element tensor (None stays None)."""
    return None if x is None else float(x)


def expand_paged(cache: Any, layout: str) -> Any:
    """FlashInfer's page-size-1 shorthands: a 4-D single cache ``[pages, 2, heads, dim]`` or a tuple of 3-D caches
    ``[pages, heads, dim]`` gets its page dimension back (a view)."""

    def expand(x: Any, full: int) -> Any:
        if getattr(x, "ndim", full) != full - 1:
            return x
        return x[..., None, :, :] if layout == "NHD" else x[..., None, :]

    if isinstance(cache, (tuple, list)):
        parts = tuple(expand(c, 4) for c in cache)
        # the caller's own tuple when nothing changed: cuinfer reuses a cache's checked view by its identity
        return cache if all(p is c for p, c in zip(parts, cache, strict=False)) else parts
    return expand(cache, 5)


def length(x: Any) -> int:
    """len() of a 1-D index array (list, NumPy, tensor)."""
    return int(x.shape[0]) if hasattr(x, "shape") else len(x)


# ---- outputs ---------------------------------------------------------------------------------------------------------


def check_lse_options(lse_base: str, lse_layout: str) -> None:
    if lse_base not in LSE_BASES:
        raise ValueError(f"lse_base must be one of {LSE_BASES}, got {lse_base!r}")
    if lse_layout not in LSE_LAYOUTS:
        raise ValueError(f"lse_layout must be one of {LSE_LAYOUTS}, got {lse_layout!r}")


def stage_lse(lse: Any, lse_layout: str, return_lse: bool) -> tuple[Any, Any]:
    """(the lse cuinfer writes, the caller's ``[heads, tokens]`` destination): cuinfer writes ``[tokens, heads]``, so
    with ``lse_layout='HN'`` the caller's buffer is filled afterwards (``finish_lse``)."""
    if not return_lse or lse_layout != "HN":
        return lse, None
    return None, lse


def finish_lse(lse: Any, lse_base: str, lse_layout: str, dst: Any) -> Any:
    """cuinfer's base-2 ``[tokens, heads]`` lse in the base and layout asked for (FlashInfer's ``lse_base`` /
    ``lse_layout``): 'ln' multiplies by ln 2; 'HN' is the contiguous transpose, written into ``dst`` when given."""
    if lse_layout == "NH":
        if lse_base == "ln":
            lse *= LN2  # (in place for torch, CuPy and NumPy, as FlashInfer's lse.mul_)
        return lse
    src = lse.T * LN2 if lse_base == "ln" else lse.T
    if dst is not None:
        dst[...] = src
        return dst
    if hasattr(src, "contiguous"):  # torch
        return src.contiguous()
    if isinstance(src, np.ndarray):
        return np.ascontiguousarray(src)
    return src.copy()


def scale_output(out: Any, v_scale: Any) -> Any:
    """FlashInfer's ``v_scale`` on 16-bit outputs: ``out *= v_scale`` after the kernel (None and 1.0 leave it)."""
    if v_scale is None or (isinstance(v_scale, float) and v_scale == 1.0):
        return out
    out *= scalar(v_scale)
    return out


# ---- FlashInfer's deprecated positional plan() arguments -------------------------------------------------------------


def merge_legacy_positional(api: str, args: tuple, names: tuple[str, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Optional plan() arguments passed positionally (deprecated in FlashInfer): named by ``names``, in order; a
    ``DeprecationWarning`` as FlashInfer gives, a ``TypeError`` for too many or for one also given by keyword."""
    if len(args) > len(names):
        raise TypeError(
            f"{api}.plan() accepts at most {len(names)} deprecated optional positional arguments after page_size; "
            f"got {len(args)}"
        )
    merged = dict(kwargs)
    for name, value in zip(names, args, strict=False):
        if name in merged:
            raise TypeError(f"{api}.plan() got multiple values for argument {name!r}")
        merged[name] = value
    warnings.warn(
        f"Passing optional arguments to {api}.plan() positionally is deprecated; pass them as keyword arguments "
        "instead. Scheduled for removal in a future release.",
        DeprecationWarning,
        stacklevel=3,
    )
    return merged
