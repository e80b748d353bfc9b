"""Rendering a chain of variants into the C++ the kernels compile: one functor type per variant (the contract of
kernel_src/variants/contract.cuh), ``using Variant = Chain<...>``, and ``VariantParams``, the by-value struct of every
variant's parameters (one nested struct per variant with parameters).

Snippets are placed between ``#line`` markers, so an NVRTC error names the variant, the snippet and its line:
``variant soft_cap.logits(1): error: identifier "cap" is undefined``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from cuinfer.jit.params import ParamStruct
from cuinfer.variants.spec import LOGITS_INV_SCALE, Param, Variant

_INDEX_NAMES = ("batch", "qo_idx", "qpos", "qo_head", "kv_head", "qo_len", "kv_len", "head_dim")
# Built-in logits variants whose chains (alone, or after causal) keep the plain prefill tiles: Rendered.wide_logits
WIDE_LOGITS = ("soft_cap", "alibi")


def _builtin(name: str) -> Variant:
    from cuinfer.variants.registry import lookup

    return lookup(name)


@dataclass(frozen=True)
class Rendered:
    """A chain of variants as the kernels see it."""

    name: str  # the chain's name in kernel names: "causal+soft_cap", "plain" for none
    pieces: tuple[Variant, ...]
    params: ParamStruct  # VariantParams
    source: str  # the C++ (after the parameter structs)

    def preamble(self) -> str:
        """Everything a kernel module needs before its source: the parameter structs and the functors."""
        return self.params.c_decl() + self.source

    @property
    def transforms(self) -> bool:
        return any(p.transforms for p in self.pieces)

    @property
    def has_logits(self) -> bool:
        return any(p.has_logits for p in self.pieces)

    @property
    def register_heavy(self) -> bool:
        """Per-element work that takes registers the plain kernels give to wider tiles (a logits transform, a value
        transform): the prefill tile policy picks narrower KV tiles for it (no spills at 255 registers), except for
        ``wide_logits`` chains, and runs one CTA per block."""
        return any(p.has_logits or p.value_transform for p in self.pieces)

    @property
    def wide_logits(self) -> bool:
        """A register-heavy chain whose prefill kernels keep the plain tiles (d128: 128 x 64) without spilling, when
        unpaired and with 16-bit K/V: the soft cap or ALiBi, alone or after causal (WIDE_LOGITS; compiled spill-free
        with NVRTC 12.9 for sm_90a and sm_80, ragged and paged, bf16 and fp16: tests/cpu/test_variant_tiles.py).
        Their combinations with each other or with a window spilled (8-72 bytes) and keep the narrower tiles."""
        heavy = [p for p in self.pieces if p.has_logits or p.value_transform]
        rest = [p for p in self.pieces if not (p.has_logits or p.value_transform)]
        return (
            len(heavy) == 1
            and heavy[0].name in WIDE_LOGITS
            and heavy[0] == _builtin(heavy[0].name)
            and all(p == _builtin("causal") for p in rest)
        )

    @property
    def scaled_logits(self) -> Variant | None:
        """The chain's only logits piece when it has ``logits_scale`` (its logits are ``c * r`` with ``|r| <= 1``):
        the kernels may fold ``c`` into their scales and bound the logits by it (contract.cuh, kScaledLogits)."""
        logits = [p for p in self.pieces if p.has_logits]
        return logits[0] if len(logits) == 1 and logits[0].logits_scale else None

    @property
    def row_state(self) -> bool:
        """Whether a piece has a row state (kept in the prefill kernel's shared memory: tiles.ROW_STATE_BYTES)."""
        return any(p.row_state for p in self.pieces)

    @property
    def softmax(self) -> bool:
        """False when a piece sets softmax=False: weights summed without normalisation."""
        return all(p.softmax for p in self.pieces)

    @property
    def has_sink(self) -> bool:
        return any(p.sink for p in self.pieces)

    @property
    def prefill_splits(self) -> bool:
        """Whether prefill may split a row's KV: its merge kernel is the softmax merge of normalised states, which
        neither a chain without softmax nor an output transform (applied once, to the final row) survives."""
        return self.softmax and not any(p.output_transform for p in self.pieces)

    @property
    def array_params(self) -> tuple[tuple[str, Param], ...]:
        """``(variant name, Param)`` of every array parameter (given at run()), in chain order."""
        return tuple((v.name, q) for v in self.pieces for q in v.params if q.is_array)

    def pack(self, values: dict[str, dict[str, int | float]], arrays: dict | None = None) -> object:
        """The by-value ``VariantParams`` from ``{variant name: {param: value}}`` (every scalar parameter given) and
        ``arrays``, ``{(variant name, param): device address}`` of the array parameters (0 where missing)."""
        fields = {}
        for piece in self.pieces:
            if piece.params:
                scalars = [q.name for q in piece.params if not q.is_array]
                got = values.get(piece.name)
                if got is None and scalars:
                    raise ValueError(f"no values for the parameters of variant {piece.name!r}")
                vals = dict(got or {})
                for q in piece.params:
                    if q.is_array:
                        vals[q.name] = int((arrays or {}).get((piece.name, q.name), 0))
                if piece.logits_scale:
                    vals[LOGITS_INV_SCALE] = 1.0 / logits_scale_value(piece, vals)
                fields[piece.name] = vals
        if not fields:
            fields["unused_"] = 0
        return self.params.pack(**fields)


def logits_scale_value(v: Variant, values: dict) -> float:
    """The value of ``v``'s logits_scale parameter among its ``values``, checked: a finite number > 0."""
    c = values.get(v.logits_scale)
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0:
        raise ValueError(
            f"variant {v.name!r}: its logits_scale parameter {v.logits_scale!r} must be a finite number > 0 "
            f"(the logits are c * r, |r| <= 1) but is {c!r}"
        )
    return float(c)


def _piece_struct(v: Variant) -> ParamStruct:
    fields = tuple((p.name, f"{p.kind}*" if p.is_array else p.kind) for p in v.params)
    if v.logits_scale:  # (1 / c, packed beside c: a constant-bank operand, no division in the kernels)
        fields += ((LOGITS_INV_SCALE, "f32"),)
    return ParamStruct(f"{v.name}_params", fields)


def _body(snippet: str, where: str, *, statements: bool = False) -> list[str]:
    text = snippet.strip()
    if not statements and "return" not in text:
        text = f"return ({text});"
    return [f'#line 1 "variant {where}"', *text.splitlines()]


def _functor(v: Variant, name: str, signature: str, snippet: str, index: str | None, *, statements: bool = False,
             prologue: tuple[str, ...] = (), epilogue: tuple[str, ...] = ()) -> list[str]:  # fmt: skip
    lines = ["  template <class VP>", f"  __device__ __forceinline__ static {signature} {{"]
    if v.params:
        lines.append(f"    [[maybe_unused]] const auto& params = v_.{v.name};")
    if index is not None:
        aliases = ", ".join(f"{n} = {index}.{n}" for n in _INDEX_NAMES)
        lines.append(f"    [[maybe_unused]] const int {aliases};")
    lines += [f"    {p}" for p in prologue]
    lines += _body(snippet, f"{v.name}.{name}", statements=statements)
    lines += [f"    {e}" for e in epilogue]
    lines.append("  }")
    return lines


def _piece(v: Variant) -> list[str]:
    flags = {
        "kLogits": v.has_logits,
        "kSlope": bool(v.slope),
        "kMask": bool(v.mask),
        "kUpperBound": bool(v.key_hi),
        "kLowerBound": bool(v.key_lo),
        "kQueryTransform": bool(v.query_transform),
        "kKeyTransform": bool(v.key_transform),
        "kSink": bool(v.sink),
        "kValueTransform": bool(v.value_transform),
        "kOutputTransform": bool(v.output_transform),
        "kRowState": bool(v.row_state),
        "kPosState": bool(v.pos_state),
        "kPosAdvance": bool(v.pos_advance),
        "kRisingLogits": bool(v.rising_logits),
        "kScaled": bool(v.logits_scale),
    }
    out = [f"struct piece_{v.name} : Identity {{"]
    out += [f"  static constexpr bool {k} = true;" for k, on in flags.items() if on]
    if not v.softmax:
        out.append("  static constexpr bool kSoftmax = false;")
    if v.row_state:
        out.append(f"  struct RowState {{ {v.row_fields} }};")
        out += _functor(v, "row_state", "RowState row_state(const VP& v_, const Index& ix_)", v.row_state, "ix_",
                        statements=True, prologue=("RowState row;",), epilogue=("return row;",))  # fmt: skip
    sig = "float logits(const VP& v_, const Index& ix_, const RowState& row, int kv_idx, float kv_dist, float x)"
    if v.logits and v.logits_scale:  # logits_core is the snippet (of x / c); logits() the whole c * core(x / c)
        core = sig.replace("float logits(", "float logits_core(")
        out += _functor(v, "logits", core, v.logits, "ix_")
        c = f"v_.{v.name}.{v.logits_scale}"
        out += ["  template <class VP>", f"  __device__ __forceinline__ static {sig} {{",
                f"    return {c} * logits_core(v_, ix_, row, kv_idx, kv_dist, x * v_.{v.name}.{LOGITS_INV_SCALE});",
                "  }", "  template <class VP> __device__ __forceinline__ static float logits_scale(const VP& v_) {",
                f"    return {c};", "  }",
                "  template <class VP> __device__ __forceinline__ static float logits_inv_scale(const VP& v_) {",
                f"    return v_.{v.name}.{LOGITS_INV_SCALE};", "  }"]  # fmt: skip
    elif v.logits:
        out += _functor(v, "logits", sig, v.logits, "ix_")
    if v.slope:  # (and its logits: x + slope * kv_dist, wherever the kernel does not fold the bias into Q·K^T)
        out += _functor(v, "slope", "float slope(const VP& v_, const Index& ix_, const RowState& row)", v.slope, "ix_")
        out += ["  template <class VP>", f"  __device__ __forceinline__ static {sig} {{",
                "    return x + slope(v_, ix_, row) * kv_dist;", "  }"]  # fmt: skip
    if v.mask:
        out += _functor(v, "mask", "bool mask(const VP& v_, const Index& ix_, int kv_idx)", v.mask, "ix_")
    if v.key_hi or v.key_lo:
        body = []
        if v.key_hi:
            body.append(f"hi = min(hi, static_cast<int>({v.key_hi.strip()}));")
        if v.key_lo:
            body.append(f"lo = max(lo, static_cast<int>({v.key_lo.strip()}));")
        out += _functor(v, "key_range", "void key_range(const VP& v_, const Index& ix_, int& lo, int& hi)",
                        "\n".join(body), "ix_", statements=True)  # fmt: skip
    if v.sink:
        out += _functor(v, "sink", "float sink(const VP& v_, const Index& ix_)", v.sink, "ix_")
    if v.value_transform:
        sig = "float value_transform(const VP& v_, const Index& ix_, int kv_idx, int dim, float x)"
        out += _functor(v, "value_transform", sig, v.value_transform, "ix_")
    if v.output_transform:
        sig = "float output_transform(const VP& v_, const Index& ix_, int dim, float x, float lse)"
        out += _functor(v, "output_transform", sig, v.output_transform, "ix_")
    if v.transforms:
        out.append(f"  struct DimState {{ {v.state_fields} }};")
        out.append(f"  struct PosState {{ {v.pos_fields} }};")
        out += _functor(v, "dim_state", "DimState dim_state(const VP& v_, int dim, int head_dim)", v.dim_state or "",
                        None, statements=True, prologue=("DimState state;",), epilogue=("return state;",))  # fmt: skip
        if v.pos_state:
            sig = "PosState pos_state(const VP& v_, const DimState& state, int dim, int pos)"
            out += _functor(v, "pos_state", sig, v.pos_state, None, statements=True,
                            prologue=("PosState kpos;",), epilogue=("return kpos;",))  # fmt: skip
        if v.pos_advance:
            sig = "void pos_advance(const VP& v_, const DimState& state, int dim, PosState& kpos, const PosState& step)"
            out += _functor(v, "pos_advance", sig, v.pos_advance, None, statements=True)
        if v.query_transform:
            sig = ("float query_transform(const VP& v_, const DimState& state, const Index& ix_, int dim, float x, "
                   "float partner)")  # fmt: skip
            pos = "[[maybe_unused]] const int pos = ix_.qpos;"  # (the snippet's alias of the position it rotates by)
            out += _functor(v, "query_transform", sig, v.query_transform, "ix_", prologue=(pos,))
        if v.key_transform:
            sig = ("float key_transform(const VP& v_, const DimState& state, [[maybe_unused]] const PosState& kpos, "
                   "const Index& ix_, int kv_idx, int dim, float x, float partner)")  # fmt: skip
            pos = "[[maybe_unused]] const int pos = kv_idx;"
            out += _functor(v, "key_transform", sig, v.key_transform, "ix_", prologue=(pos,))
    out.append("};")
    return out


def render(pieces: tuple[Variant, ...]) -> Rendered:
    """Render a chain of variants (applied in order: logits compose, masks and bounds intersect). Equal chains render
    once; variants equal but for their NumPy functions (not part of a variant's identity, nor of the kernel's) get a
    ``Rendered`` of their own, holding their pieces, so the CPU reference runs the functions a plan was given."""
    return _render(tuple(pieces), tuple(0 if p.numpy is None else id(p.numpy) for p in pieces))


@functools.cache
def _render(pieces: tuple[Variant, ...], _numpy_ids: tuple[int, ...]) -> Rendered:
    names = [p.name for p in pieces]
    if len(set(names)) != len(names):
        raise ValueError(f"a chain holds each variant once but got {names}")
    if sum(p.transforms for p in pieces) > 1:
        raise ValueError(f"at most one variant of a chain may transform q / k (rotations do not compose): {names}")
    sinks = [p.name for p in pieces if p.sink]
    if len(sinks) > 1:
        raise ValueError(f"at most one variant of a chain may have a sink (a row has one sink logit): {sinks}")
    no_softmax = [p.name for p in pieces if not p.softmax]
    if sinks and no_softmax:
        raise ValueError(
            f"variant {sinks[0]!r} has a sink, which joins a softmax denominator, but {no_softmax[0]!r} turns the "
            "softmax off (softmax=False); use them in different plans"
        )
    fields = tuple((p.name, _piece_struct(p)) for p in pieces if p.params)
    params = ParamStruct("VariantParams", fields or (("unused_", "i32"),))
    lines = ['#line 1 "variants"', '#include "common/math.cuh"', '#include "variants/contract.cuh"']
    lines += ["namespace cuinfer {", "namespace variant {"]
    for p in pieces:
        lines += _piece(p)
        lines.append(f'#line {len(lines) + 1} "variants"')  # (the next line's index in `lines`)
    chain = ", ".join(f"::cuinfer::variant::piece_{p.name}" for p in pieces)
    lines += [
        "}  // namespace variant",
        "}  // namespace cuinfer",
        f"using Variant = ::cuinfer::variant::Chain<{chain}>;",
    ]
    return Rendered("+".join(names) or "plain", tuple(pieces), params, "\n".join(lines) + "\n")
