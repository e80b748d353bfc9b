"""Attention variants as specs: validation, the registry, and their rendering into the kernels' C++ (no GPU needed).

Compiling variants into the decode and prefill kernels (and the CompileError of a typo) is tested in
test_variant_kernels.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from cuinfer.variants import Param, Variant, lookup, register, registered, render
from cuinfer.variants.builtins import soft_cap

BUILTINS = (
    "alibi",
    "causal",
    "custom_mask",
    "rope",
    "rope_llama31",
    "sigmoid",
    "sinks",
    "soft_cap",
    "soft_cap_accurate",
    "window",
)


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
        pytest.param(
            dict(name="rows", mask="true", row_state="row.a = 0;", row_fields="float a;"),
            "only read by logits",
            id="row-state-without-logits",
        ),  # fmt: skip
        pytest.param(dict(name="rows", logits="x", row_state="row.a = 0;"), "without row_fields", id="row-no-fields"),
        pytest.param(dict(name="rows", logits="x", row_fields="float a;"), "row_fields without", id="row-fields"),
        pytest.param(dict(name="rise", mask="true", rising_logits=True), "rising_logits=True but no logits", id="rise"),
        pytest.param(dict(name="both", logits="x", slope="1.f"), "has both slope and logits", id="slope-and-logits"),
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
    assert render((b,)) is render((Variant(name="h1", logits="x"),)), "equal chains render once"
    assert render((a,)) == render((b,)), "... and variants equal but for NumPy functions give equal chains (kernels)"
    assert render((a,)).pieces[0].numpy is a.numpy, "each chain keeps the NumPy functions it was given"


def test_rendering_a_chain_of_builtins():
    r = render(tuple(lookup(n) for n in ("causal", "window", "custom_mask", "alibi", "soft_cap")))
    assert r.name == "causal+window+custom_mask+alibi+soft_cap"
    src = r.preamble()
    # parameter structs in the order of the chain, VariantParams last
    assert src.index("struct window_params") < src.index("struct soft_cap_params") < src.index("struct VariantParams")
    assert "using Variant = ::cuinfer::variant::Chain<::cuinfer::variant::piece_causal," in src
    # each snippet between #line markers that name the variant and its functor
    for marker in ("variant causal.key_range", "variant window.key_range", "variant custom_mask.mask",
                   "variant alibi.row_state", "variant alibi.slope", "variant soft_cap.logits"):  # fmt: skip
        assert f'#line 1 "{marker}"' in src
    # expression snippets become a return, bounds an intersection; a row state is filled once per row
    assert "return (fmath::tanh_approx(x));" in src  # (the scaled core: logits_scale="cap")
    assert (
        "return v_.soft_cap.cap * logits_core(v_, ix_, row, kv_idx, kv_dist, x * v_.soft_cap.logits_inv_scale_);" in src
    )
    assert "RowState row;" in src and "row.slope = fmath::alibi_slope(qo_head, params.num_qo_heads);" in src
    assert "hi = min(hi, static_cast<int>(qpos + 1));" in src
    assert "lo = max(lo, static_cast<int>(qpos - params.window_left));" in src
    assert r.has_logits and not r.transforms


def test_variant_params_pack_by_variant_name():
    r = render((lookup("window"), lookup("soft_cap")))
    packed = r.pack({"window": {"window_left": 7}, "soft_cap": soft_cap.values(30.0)})
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


# ---- sinks, softmax=False, value / output transforms, array parameters, NumPy functions ------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        pytest.param(dict(name="nosm", mask="true", softmax=False), ValueError, "softmax=False but no logits",
                     id="no-logits"),
        pytest.param(dict(name="nosm_sink", logits="x", sink="0.f", softmax=False), ValueError, "a sink joins",
                     id="sink-no-softmax"),
        pytest.param(dict(name="np1", logits="x", numpy={"logit": abs}), ValueError, r"numpy names \['logit'\]",
                     id="np-name"),
        pytest.param(dict(name="np2", logits="x", numpy={"logits": 3}), TypeError, "must be a function",
                     id="np-callable"),
        pytest.param(dict(name="np3", logits="x", numpy=[abs]), TypeError, "numpy must be a dict", id="np-dict"),
    ],
)  # fmt: skip
def test_new_variant_fields_are_validated(kwargs, error, message):
    with pytest.raises(error, match=message):
        Variant(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        pytest.param(dict(name="p1", query_transform="x", pos_state="kpos.a = 0.f;", pos_fields="float a;"),
                     "pos_state is only used by key_transform", id="no-key-transform"),
        pytest.param(dict(name="p2", key_transform="x", pos_fields="float a;"), "pos_fields without", id="fields"),
        pytest.param(dict(name="p3", key_transform="x", pos_advance="kpos.a += step.a;"), "there is no pos_state",
                     id="advance"),
    ],
)  # fmt: skip
def test_pos_state_fields_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Variant(**kwargs)


def test_rope_renders_its_key_rotation_as_pos_state_and_pos_advance():
    src = render((lookup("rope"),)).source
    assert "struct PosState { float sn, cs; };" in src
    assert "static constexpr bool kPosState = true;" in src and "static constexpr bool kPosAdvance = true;" in src
    assert "PosState pos_state(const VP& v_, const DimState& state, int dim, int pos)" in src
    # a transform without pos_state gets an empty PosState and never the flags
    src = render((Variant(name="neg_k", key_transform="-x"),)).source
    assert "struct PosState {  };" in src and "kPosState" not in src


def test_array_params_are_validated():
    assert Param("s", "f32", per="qo_head").is_array and not Param("s").is_array
    with pytest.raises(ValueError, match="one element per qo_head / kv_head / request"):
        Param("s", "f32", per="head")
    with pytest.raises(ValueError, match="its elements are one of i32, i64, f32, f64"):
        Param("s", "ptr", per="request")


def test_sinks_sigmoid_and_llama31_are_builtins_written_as_variants():
    sinks, sigmoid, llama = lookup("sinks"), lookup("sigmoid"), lookup("rope_llama31")
    assert sinks.sink == "params.sinks[qo_head]" and sinks.params[0].per == "qo_head"
    assert not sigmoid.softmax and "fmath::sigmoid" in sigmoid.logits
    assert llama.transforms and [p.name for p in llama.params] == [
        "rope_theta", "rope_scale", "low_freq_factor", "high_freq_factor", "original_max_position",
    ]  # fmt: skip


def test_rendering_sinks_typed_arrays_and_no_softmax():
    r = render((lookup("causal"), lookup("sinks")))
    src = r.preamble()
    assert "const float* sinks;" in src, "an f32 array parameter is a typed pointer"
    assert "static constexpr bool kSink = true;" in src and '#line 1 "variant sinks.sink"' in src
    assert "return (params.sinks[qo_head]);" in src
    assert r.has_sink and r.softmax and r.prefill_splits and not r.register_heavy
    assert r.array_params == (("sinks", Param("sinks", "f32", per="qo_head")),)
    assert r.pack({}, {("sinks", "sinks"): 0x1234})["sinks"]["sinks"] == 0x1234
    assert r.pack({})["sinks"]["sinks"] == 0, "arrays are null until run() gives them"
    s = render((lookup("sigmoid"),))
    assert "static constexpr bool kSoftmax = false;" in s.source
    assert not s.softmax and not s.prefill_splits and s.register_heavy


def test_rendering_value_and_output_transforms():
    v = Variant(
        name="vo_test", value_transform="x * params.vs[kv_head]", output_transform="x + 0.f * lse",
        params=(Param("vs", "f32", per="kv_head"), Param("k", "i32")),
    )  # fmt: skip
    r = render((lookup("causal"), v))
    src = r.source
    assert "static float value_transform(const VP& v_, const Index& ix_, int kv_idx, int dim, float x)" in src
    assert "static float output_transform(const VP& v_, const Index& ix_, int dim, float x, float lse)" in src
    assert '#line 1 "variant vo_test.value_transform"' in src and '#line 1 "variant vo_test.output_transform"' in src
    assert "static constexpr bool kValueTransform = true;" in src
    assert "static constexpr bool kOutputTransform = true;" in src
    assert r.register_heavy and not r.prefill_splits, "an output transform keeps prefill from splitting"
    packed = r.pack({"vo_test": {"k": 3}}, {("vo_test", "vs"): 77})
    assert packed["vo_test"]["k"] == 3 and packed["vo_test"]["vs"] == 77


def test_a_chain_holds_one_sink_and_no_sink_without_softmax():
    other = Variant(name="other_sink", sink="-1.f")
    with pytest.raises(ValueError, match="at most one variant of a chain may have a sink"):
        render((lookup("sinks"), other))
    with pytest.raises(ValueError, match="turns the softmax off"):
        render((lookup("sinks"), lookup("sigmoid")))


def test_missing_numpy_functions_are_listed():
    v = Variant(name="np_half", logits="x", mask="true", numpy={"logits": lambda x: x})
    assert v.missing_numpy() == ["mask"]
    t = Variant(name="np_dim", dim_state="state.a = 0.f;", state_fields="float a;", query_transform="x")
    assert t.missing_numpy() == ["query_transform"], "dim_state needs no NumPy function"


def test_rising_logits_is_rendered_for_alibi_only():
    """ALiBi (and FlashInfer's ALiBi of the drop-in) declare rising logits, which the prefill kernel reads as
    kRisingLogits (traits.cuh kBackwardTiles, kernel.cuh kStickyExact); the soft cap does not, so its kernels keep
    their code."""
    from cuinfer.compat.flashinfer.common import FLASHINFER_ALIBI

    assert lookup("alibi").rising_logits and FLASHINFER_ALIBI.rising_logits
    assert not any(lookup(n).rising_logits for n in ("soft_cap", "causal", "window", "sinks", "sigmoid"))
    assert "struct piece_alibi : Identity {" in render((lookup("alibi"),)).preamble()
    alibi_src = render((lookup("causal"), lookup("alibi"))).preamble()
    cap_src = render((lookup("causal"), lookup("soft_cap"))).preamble()
    assert "static constexpr bool kRisingLogits = true;" in alibi_src
    assert "kRisingLogits" not in cap_src
    assert Variant(name="a", logits="x") != Variant(name="a", logits="x", rising_logits=True)


def test_a_slope_renders_its_logits_and_the_chain_folds_leading_slopes():
    """A slope piece is a logits piece (kLogits, its logits x + slope · kv_dist, for decode and for chains where a
    logits piece comes first) that also says kSlope, which the chain's kLeadSlope / logits_rest read (contract.cuh)."""
    src = render((lookup("causal"), lookup("alibi"), lookup("soft_cap"))).preamble()
    alibi = src[src.index("struct piece_alibi") : src.index("struct piece_soft_cap")]
    assert "static constexpr bool kLogits = true;" in alibi and "static constexpr bool kSlope = true;" in alibi
    assert "return (row.slope);" in alibi and "return x + slope(v_, ix_, row) * kv_dist;" in alibi
    assert "kSlope" not in src[src.index("struct piece_soft_cap") :].split("};")[0]
    lin = Variant(name="lin", slope="params.a", params=(Param("a"),))
    assert lin.has_logits and render((lin,)).has_logits and render((lin,)).register_heavy
    assert Variant(name="lin", slope="params.a", row_state="row.b = 1.f;", row_fields="float b;").row_state


# ---- scaled logits (logits_scale): the soft cap's c * r(x / c) ------------------------------------------------------


def test_logits_scale_names_a_scalar_f32_parameter_of_a_logits_variant():
    ok = Variant(name="t_cap", logits="fmath::tanh_approx(x)", logits_scale="c", params=(Param("c", "f32"),))
    assert ok.logits_scale == "c"
    with pytest.raises(
        ValueError, match=r"logits_scale='d' must name one of its scalar f32 parameters \(it has \['c'\]\)"
    ):
        Variant(name="t_cap", logits="x", logits_scale="d", params=(Param("c", "f32"),))
    with pytest.raises(ValueError, match="must name one of its scalar f32 parameters"):
        Variant(name="t_cap", logits="x", logits_scale="c", params=(Param("c", "i32"),))
    with pytest.raises(ValueError, match="must name one of its scalar f32 parameters"):
        Variant(name="t_cap", logits="x", logits_scale="c", params=(Param("c", "f32", per="qo_head"),))
    with pytest.raises(ValueError, match="has logits_scale but no logits snippet"):
        Variant(name="t_cap", mask="kv_idx > 0", logits_scale="c", params=(Param("c", "f32"),))
    with pytest.raises(ValueError, match="'logits_inv_scale_' is reserved"):
        Variant(name="t_cap", logits="x", params=(Param("logits_inv_scale_", "f32"),))


def test_scaled_logits_pack_one_over_c_and_refuse_a_bad_c():
    r = render((lookup("causal"), lookup("soft_cap")))
    assert r.scaled_logits is lookup("soft_cap")
    packed = r.pack({"soft_cap": {"cap": 30.0}})
    assert packed["soft_cap"]["cap"] == 30.0
    assert packed["soft_cap"]["logits_inv_scale_"] == np.float32(1 / 30.0)
    for bad in (0.0, -2.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="its logits_scale parameter 'cap' must be a finite number > 0"):
            r.pack({"soft_cap": {"cap": bad}})
    # the chain's only logits piece must be the scaled one: ALiBi before it makes two
    assert render((lookup("alibi"), lookup("soft_cap"))).scaled_logits is None
    assert render((lookup("soft_cap_accurate"),)).scaled_logits is lookup("soft_cap_accurate")
    assert render((lookup("causal"),)).scaled_logits is None
    src = r.preamble()
    assert "static constexpr bool kScaled = true;" in src
