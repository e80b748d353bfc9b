"""Attention variants as specs: validation, the registry, and their rendering into the kernels' C++ (no GPU needed).

Compiling variants into the decode and prefill kernels (and the CompileError of a typo) is tested in
test_variant_kernels.py.
"""

from __future__ import annotations

import pytest

from cuinfer.variants import Param, Variant, lookup, register, registered, render

BUILTINS = ("alibi", "causal", "custom_mask", "rope", "soft_cap", "window")


def test_every_builtin_is_registered_and_written_as_a_variant():
    reg = registered()
    for name in BUILTINS:
        assert isinstance(reg[name], Variant) and lookup(name) is reg[name]


def test_registering_a_name_twice_with_another_variant_raises():
    v = Variant(name="test_scale_logits", logits="x * params.s", params=(Param("s", "f32"),))
    assert register(v) is v and register(v) is v  # the same spec again is fine
    with pytest.raises(ValueError, match="already registered as 'test_scale_logits'"):
        register(Variant(name="test_scale_logits", logits="x * 2.f"))
    with pytest.raises(ValueError, match="no variant is registered as 'nope'; registered: .*causal"):
        lookup("nope")
    with pytest.raises(TypeError, match="takes a cuinfer.Variant"):
        register("causal")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        pytest.param(dict(name="bad name", logits="x"), "not a C identifier", id="name"),
        pytest.param(dict(name="empty"), "has no snippet", id="no-snippet"),
        pytest.param(
            dict(name="twice", logits="x", params=(Param("a"), Param("a"))),
            "declares a parameter twice",
            id="param-twice",
        ),  # fmt: skip
        pytest.param(
            dict(name="lonely", dim_state="state.a = 0;", logits="x"), "dim_state is only used", id="dim-state-alone"
        ),  # fmt: skip
        pytest.param(dict(name="fields", logits="x", state_fields="float a;"), "state_fields without", id="fields"),
    ],
)
def test_variant_specs_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Variant(**kwargs)


def test_param_kinds_and_names_are_validated():
    with pytest.raises(ValueError, match="kinds are"):
        Param("a", "f16")
    with pytest.raises(ValueError, match="not a C identifier"):
        Param("1a")


def test_variants_are_frozen_hashable_specs():
    a = Variant(name="h1", logits="x", numpy={"logits": lambda *a: a[-1]})
    b = Variant(name="h1", logits="x")
    assert a == b and hash(a) == hash(b), "NumPy helpers are not part of a variant's identity"
    assert render((a,)) is render((b,)), "equal chains render once"


def test_rendering_a_chain_of_builtins():
    r = render(tuple(lookup(n) for n in ("causal", "window", "custom_mask", "alibi", "soft_cap")))
    assert r.name == "causal+window+custom_mask+alibi+soft_cap"
    src = r.preamble()
    # parameter structs in the order of the chain, VariantParams last
    assert src.index("struct window_params") < src.index("struct soft_cap_params") < src.index("struct VariantParams")
    assert "using Variant = ::cuinfer::variant::Chain<::cuinfer::variant::piece_causal," in src
    # each snippet between #line markers that name the variant and its functor
    for marker in ("variant causal.key_range", "variant window.key_range", "variant custom_mask.mask",
                   "variant alibi.logits", "variant soft_cap.logits"):  # fmt: skip
        assert f'#line 1 "{marker}"' in src
    # expression snippets become a return, bounds an intersection
    assert "return (params.cap * fmath::tanh(x * params.inv_cap));" in src
    assert "hi = min(hi, static_cast<int>(qpos + 1));" in src
    assert "lo = max(lo, static_cast<int>(qpos - params.window_left));" in src
    assert r.has_logits and not r.transforms


def test_variant_params_pack_by_variant_name():
    r = render((lookup("window"), lookup("soft_cap")))
    packed = r.pack({"window": {"window_left": 7}, "soft_cap": {"cap": 30.0, "inv_cap": 1 / 30}})
    assert packed["window"]["window_left"] == 7 and packed["soft_cap"]["cap"] == 30.0
    with pytest.raises(ValueError, match="no values for the parameters of variant 'soft_cap'"):
        r.pack({"window": {"window_left": 7}})
    plain = render(())
    assert plain.name == "plain" and "unused_" in plain.params.c_decl()
    assert plain.pack({})["unused_"] == 0


def test_a_chain_holds_one_transform_and_each_variant_once():
    rope = lookup("rope")
    other = Variant(name="scale_q", query_transform="x * 2.f")
    with pytest.raises(ValueError, match="at most one variant of a chain may transform"):
        render((rope, other))
    with pytest.raises(ValueError, match="holds each variant once"):
        render((rope, rope))
    r = render((lookup("causal"), rope))
    assert r.transforms and "struct DimState { float hi, lo; };" in r.source
