"""Rendering a chain of variants into the C++ the kernels compile: one functor type per variant (the contract of
kernel_src/variants/contract.cuh), ``using Variant = Chain<...>``, and ``VariantParams``, the by-value struct of every
variant's parameters (one nested struct per variant with parameters).

Snippets are placed between ``#line`` markers, so an NVRTC error names the variant, the snippet and its line:
``variant soft_cap.logits(1): error: identifier "cap" is undefined``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from cuinfer.jit.params import ParamStruct
from cuinfer.variants.spec import Variant

_INDEX_NAMES = ("batch", "qo_idx", "qpos", "qo_head", "kv_head", "qo_len", "kv_len", "head_dim")


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
        return any(p.logits for p in self.pieces)

    def pack(self, values: dict[str, dict[str, int | float]]) -> object:
        """The by-value ``VariantParams`` from ``{variant name: {param: value}}`` (every parameter given)."""
        fields = {}
        for piece in self.pieces:
            if piece.params:
                got = values.get(piece.name)
                if got is None:
                    raise ValueError(f"no values for the parameters of variant {piece.name!r}")
                fields[piece.name] = got
        if not fields:
            fields["unused_"] = 0
        return self.params.pack(**fields)


def _piece_struct(v: Variant) -> ParamStruct:
    return ParamStruct(f"{v.name}_params", tuple((p.name, p.kind) for p in v.params))


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
        "kLogits": bool(v.logits),
        "kMask": bool(v.mask),
        "kUpperBound": bool(v.key_hi),
        "kLowerBound": bool(v.key_lo),
        "kQueryTransform": bool(v.query_transform),
        "kKeyTransform": bool(v.key_transform),
    }
    out = [f"struct piece_{v.name} : Identity {{"]
    out += [f"  static constexpr bool {k} = true;" for k, on in flags.items() if on]
    if v.logits:
        out += _functor(
            v, "logits", "float logits(const VP& v_, const Index& ix_, int kv_idx, float x)", v.logits, "ix_"
        )
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
    if v.transforms:
        out.append(f"  struct DimState {{ {v.state_fields} }};")
        out += _functor(v, "dim_state", "DimState dim_state(const VP& v_, int dim, int head_dim)", v.dim_state or "",
                        None, statements=True, prologue=("DimState state;",), epilogue=("return state;",))  # fmt: skip
        if v.query_transform:
            sig = ("float query_transform(const VP& v_, const DimState& state, const Index& ix_, int dim, float x, "
                   "float partner)")  # fmt: skip
            out += _functor(
                v, "query_transform", sig, v.query_transform, "ix_", prologue=("const int pos = ix_.qpos;",)
            )
        if v.key_transform:
            sig = ("float key_transform(const VP& v_, const DimState& state, const Index& ix_, int kv_idx, int dim, "
                   "float x, float partner)")  # fmt: skip
            out += _functor(v, "key_transform", sig, v.key_transform, "ix_", prologue=("const int pos = kv_idx;",))
    out.append("};")
    return out


@functools.cache
def render(pieces: tuple[Variant, ...]) -> Rendered:
    """Render a chain of variants (applied in order: logits compose, masks and bounds intersect)."""
    names = [p.name for p in pieces]
    if len(set(names)) != len(names):
        raise ValueError(f"a chain holds each variant once but got {names}")
    if sum(p.transforms for p in pieces) > 1:
        raise ValueError(f"at most one variant of a chain may transform q / k (rotations do not compose): {names}")
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
