"""A variant written outside the package compiles into every attention kernel, without touching a kernel body: a new
"built-in" (a soft cap with another formula) is this file's few lines and one register() call. NVRTC, no GPU."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
import time

import pytest

from cuinfer.compat.flashinfer.common import FLASHINFER_ALIBI, FLASHINFER_SOFT_CAP
from cuinfer.decode.policy import decode_config
from cuinfer.decode.specs import DecodeKernelKey, decode_spec
from cuinfer.errors import CompileError
from cuinfer.jit import compile_spec
from cuinfer.jit.sass import check_sass, disassemble, find_cuobjdump
from cuinfer.prefill.policy import block_groups, default_kv_tile
from cuinfer.prefill.specs import PrefillKernelKey, prefill_spec
from cuinfer.prefill.tiles import tile_config
from cuinfer.variants import Param, Variant, lookup, register, render

# ---- the whole of a new variant: a rational soft cap, logit / (1 + |logit| / cap) -------------------------------
SOFT_CAP_RATIONAL = register(
    Variant(
        name="soft_cap_rational",
        logits="x / (1.f + fabsf(x) * params.inv_cap)",
        params=(Param("inv_cap", "f32"),),
    )
)
# ------------------------------------------------------------------------------------------------------------------


def _decode_key(chain, tensor_cores: bool) -> DecodeKernelKey:
    cfg = decode_config(4 if tensor_cores else 1, 128, use_tensor_cores=tensor_cores)
    return DecodeKernelKey(cfg, "bfloat16", "bfloat16", "bfloat16", chain, lse=True)


def _prefill_key(chain, paged: bool) -> PrefillKernelKey:
    cfg = tile_config(128, default_kv_tile(128, 128, 128, chain.register_heavy, chain.wide_logits), 128)  # (policy's)
    cfg = dataclasses.replace(cfg, groups=block_groups(cfg, 128, 128, paged, variant=chain.register_heavy))
    return PrefillKernelKey("bfloat16", "bfloat16", 128, 128, cfg, paged, chain)


def _specs(chain):
    return {
        "decode-tc": decode_spec(_decode_key(chain, True)),
        "decode-cc": decode_spec(_decode_key(chain, False)),
        "prefill-ragged": prefill_spec(_prefill_key(chain, False)),
        "prefill-paged": prefill_spec(_prefill_key(chain, True)),
    }


def test_a_registered_variant_is_found_by_name():
    assert lookup("soft_cap_rational") is SOFT_CAP_RATIONAL


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("kind", ["decode-tc", "decode-cc", "prefill-ragged", "prefill-paged"])
def test_a_user_variant_compiles_into_every_kernel(kind, arch):
    """Cold NVRTC compiles (no cache): within 3 s each on a 2-core machine; no spills; the SASS has what the kernel is
    made of. The budget is on the process's CPU time (NVRTC compiles on the calling thread, so on an idle machine it is
    the wall time; other processes loading the host stretch only the wall time). Both are printed (pytest -s)."""
    chain = (
        render((lookup("causal"), SOFT_CAP_RATIONAL)) if kind.startswith("prefill") else render((SOFT_CAP_RATIONAL,))
    )
    spec = _specs(chain)[kind]
    t0, c0 = time.perf_counter(), time.process_time()
    mod = compile_spec(spec, arch)
    seconds = time.process_time() - c0
    print(f"{kind} {arch} {spec.name}: {seconds:.2f} s CPU, {time.perf_counter() - t0:.2f} s wall")
    assert seconds < 3.0, f"{spec.name} took {seconds:.2f} s of CPU to compile for {arch} (the budget is 3 s)"
    for sym, r in mod.resources.items():
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, f"{sym}: {r}"
    if find_cuobjdump() is not None:
        funcs = disassemble(mod.cubin)
        for sym in mod.lowered.values():
            assert not check_sass(funcs[sym], arch, spec.sass_expect, spec.sass_forbid)


@pytest.mark.compile
def test_a_typo_in_a_snippet_names_the_variant_the_functor_and_the_line():
    typo = Variant(
        name="typo_var", logits="const float y = x * 2.f;\nreturn y * params.scal;", params=(Param("scale"),)
    )
    spec = _specs(render((typo,)))["decode-tc"]
    with pytest.raises(CompileError) as err:
        compile_spec(spec, "sm_90a")
    assert re.search(r'variant typo_var\.logits\(2\): error: .*"scal"', str(err.value)), str(err.value)[:2000]


def test_key_bounds_and_masks_reach_the_kernels_as_written():
    """The rendered functors of a window-like bound and a mask, exactly as the snippets say."""
    v = Variant(name="sinks_window", mask="kv_idx < params.sinks || kv_idx >= qpos - params.window",
                params=(Param("sinks", "i32"), Param("window", "i32")))  # fmt: skip
    src = render((lookup("causal"), v)).source
    assert "return (kv_idx < params.sinks || kv_idx >= qpos - params.window);" in src
    assert "static constexpr bool kMask = true;" in src and "static constexpr bool kUpperBound = true;" in src


# ---- the built-ins added with sinks, sigmoid attention and value / output transforms ---------------------------

# A user variant with value and output transforms (an array parameter per KV head), written in this file.
VALUE_OUTPUT = Variant(
    name="test_value_output",
    value_transform="x * params.v_scale[kv_head]",
    output_transform="x * params.o_gain + 0.f * lse",
    params=(Param("v_scale", "f32", per="kv_head"), Param("o_gain", "f32")),
)
# A user key transform with a per-position state and no pos_advance (an xPos-like decay of k by position, per dim):
# every key's pos_state computed exactly, in decode too. (With causal in the paged prefill kernel it spills 24 bytes at
# 255 registers, exactly as the same transform written without pos_state, `x * fmath::ex2(float(pos) * state.rate)`:
# that kernel's register pressure, not the hook's.)
KEY_DECAY = Variant(
    name="test_key_decay",
    dim_state="state.rate = -float(dim + 1) * 1e-4f;",
    state_fields="float rate;",
    pos_fields="float scale;",
    pos_state="kpos.scale = fmath::ex2(float(pos) * state.rate);",
    key_transform="x * kpos.scale",
)
NEW_CHAINS = {
    "sinks": ("sinks",),
    "sigmoid": ("sigmoid",),
    "rope_llama31": ("rope_llama31",),
    "value_output": (VALUE_OUTPUT,),
    "soft_cap": ("soft_cap",),  # (one MUFU op and Newton steps per logit)
    "alibi": ("alibi",),  # (a row state)
    # the drop-in's FlashInfer ALiBi (qo_idx in the logits) and the soft cap after it, as user variants
    "flashinfer_alibi_soft_cap": (FLASHINFER_ALIBI, FLASHINFER_SOFT_CAP),
}


@pytest.mark.compile
@pytest.mark.parametrize("kind", ["decode-tc", "decode-cc", "prefill-ragged", "prefill-paged"])
@pytest.mark.parametrize("name", list(NEW_CHAINS))
def test_new_builtins_compile_into_every_kernel(name, kind):
    """sm_90a, cold: no spills, the SASS has what the kernel is made of; prefill with causal (its boundary masks)."""
    pieces = tuple(lookup(p) if isinstance(p, str) else p for p in NEW_CHAINS[name])
    chain = render((lookup("causal"), *pieces)) if kind.startswith("prefill") else render(pieces)
    spec = _specs(chain)[kind]
    t0 = time.perf_counter()
    mod = compile_spec(spec, "sm_90a")
    print(f"{kind} sm_90a {spec.name}: {time.perf_counter() - t0:.2f} s")
    for sym, r in mod.resources.items():
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, f"{sym}: {r}"
    if find_cuobjdump() is not None:
        funcs = disassemble(mod.cubin)
        for sym in mod.lowered.values():
            assert not check_sass(funcs[sym], "sm_90a", spec.sass_expect, spec.sass_forbid)


@pytest.mark.compile
def test_soft_cap_and_alibi_add_no_mufu_op_per_logit_but_the_soft_caps_exp2():
    """Issue 17: the soft cap takes one MUFU op per logit (its exp2; the reciprocal is Newton steps on the FMA pipe),
    and ALiBi's slope is the row's state (no exp2f / division per tile): the soft-capped prefill kernel has the plain
    causal kernel's MUFU.RCP (the epilogue's), ALiBi's one more (once per KV tile: the slope's accumulator units,
    1 / x_scale, kernel.cuh tile_scores), and neither a call (an IEEE division's slow path), at the policy's tiles,
    sm_90a."""
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")

    def ops(*names):
        spec = _specs(render(tuple(lookup(n) for n in names)))["prefill-ragged"]
        mod = compile_spec(spec, "sm_90a")
        (sym,) = mod.lowered.values()
        return disassemble(mod.cubin)[sym]

    causal, soft_cap, alibi = ops("causal"), ops("causal", "soft_cap"), ops("causal", "alibi")
    for name, got, extra in (("soft_cap", soft_cap, 0), ("alibi", alibi, 1)):
        assert got.count("MUFU.RCP") == causal.count("MUFU.RCP") + extra, name
        assert not [o for o in got if o.startswith("CALL")], name


@pytest.mark.compile
def test_alibi_as_a_slope_costs_prefill_at_most_two_float_ops_per_logit():
    """Issue 17: ALiBi is a slope, whose bias the prefill kernels put into Q·K^T's initial accumulators (one FFMA per
    logit; kFoldSlope). At the policy's 128 x 64 tiles (64 logits per thread and tile) the ragged and paged kernels have
    at most 128 more FMUL + FADD + FFMA than plain causal's (2 per logit; as a logits transform, scaled score, key
    distance and FFMA, it was 377 more), spill-free, sm_90a."""
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")

    def fops(kind, *names):
        mod = compile_spec(_specs(render(tuple(lookup(n) for n in names)))[kind], "sm_90a")
        (sym,) = mod.lowered.values()
        r = next(iter(mod.resources.values()))
        assert r.spill_stores == 0 and r.spill_loads == 0, f"{names} {kind}: {r}"
        return sum(1 for o in disassemble(mod.cubin)[sym] if o.split(".")[0].split()[0] in ("FMUL", "FADD", "FFMA"))

    for kind in ("prefill-ragged", "prefill-paged"):
        extra = fops(kind, "causal", "alibi") - fops(kind, "causal")
        assert extra <= 128, f"{kind}: ALiBi adds {extra} float instructions to causal's"


@pytest.mark.compile
def test_a_typo_in_an_output_transform_names_the_functor_and_the_line():
    typo = Variant(name="typo_out", output_transform="const float y = x + lse;\nreturn y * params.gian;",
                   params=(Param("gain"),))  # fmt: skip
    spec = _specs(render((typo,)))["decode-cc"]
    with pytest.raises(CompileError) as err:
        compile_spec(spec, "sm_90a")
    assert re.search(r'variant typo_out\.output_transform\(2\): error: .*"gian"', str(err.value)), str(err.value)[:2000]


@pytest.mark.compile
@pytest.mark.parametrize("kind", ["decode-tc", "decode-cc", "prefill-ragged", "prefill-paged"])
def test_a_pos_state_without_advance_compiles_into_every_kernel(kind):
    chain = render((lookup("causal"), KEY_DECAY)) if kind.startswith("prefill") else render((KEY_DECAY,))
    spec = _specs(chain)[kind]
    mod = compile_spec(spec, "sm_90a")
    for sym, r in mod.resources.items():
        assert kind == "prefill-paged" or (r.spill_stores == 0 and r.stack_frame == 0), f"{sym}: {r}"
    assert "kpos.scale = fmath::ex2(float(pos) * state.rate);" in spec.preamble


def _tile_sass(chain, group: int = 4, head_dim: int = 128) -> tuple[list[str], object]:
    """The SASS (opcode and operands) of the tensor-core decode kernel's per-tile work, built with
    -DCUINFER_SASS_MARKS (debug/trace.cuh: a read of %globaltimer_lo before it, %globaltimer_hi after it), bf16, no
    lse (the D6 benchmark's kernel), sm_90a; and the resources of the same kernel built without the marks."""
    cfg = decode_config(group, head_dim, use_tensor_cores=True)
    key = DecodeKernelKey(cfg, "bfloat16", "bfloat16", "bfloat16", *((chain,) if chain is not None else ()))
    spec = decode_spec(key)
    shipped = compile_spec(spec, "sm_90a")
    marked = dataclasses.replace(spec, extra_options=(*spec.extra_options, "-DCUINFER_SASS_MARKS"))
    mod = compile_spec(marked, "sm_90a")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(mod.cubin)
        text = subprocess.run([find_cuobjdump(), "-sass", path], capture_output=True, text=True, check=True).stdout
    ins = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", text)]
    begin = [i for i, x in enumerate(ins) if "SR_GLOBALTIMERLO" in x]
    end = [i for i, x in enumerate(ins) if "SR_GLOBALTIMERHI" in x]
    assert len(begin) == 1 and len(end) == 1 and begin[0] < end[0], (begin, end)
    ops = [x.split()[1] if x.startswith("@") else x.split()[0] for x in ins[begin[0] + 1 : end[0]]]
    return ops, next(iter(shipped.resources.values()))


@pytest.mark.compile
@pytest.mark.parametrize("tensor_cores", [True, False], ids=["tc", "cc"])
def test_rope_keys_take_one_exact_sin_cos_per_tile_and_thread_in_decode(tensor_cores):
    """RoPE's key rotation (pos_state + pos_advance): sin / cos once per (key, dimension pair), exact only once per
    tile and dimension pair of a thread. CUDA cores (keys rotated in shared memory): per tile a thread issues 8
    MUFU.SIN (one per dimension pair) however many rows it transforms; the rest of the statically counted sines are
    the q rotation's (one per pair: q reuses the kernel's DimStates) and the steps' (once per kernel). Tensor cores
    (keys rotated on their MMA fragments, variant::FragStates): a thread holds D/8 = 16 dimension pairs of two keys
    (gid, gid + 8) per tile, so a seed tile costs it 16 MUFU.SIN (key gid exact; gid + 8 by one angle addition) and
    a carried tile (key gid's states advanced from the item's last tile, 3 tiles of 4) none."""
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    if tensor_cores:
        ops, _ = _tile_sass(render((lookup("rope"),)))
        assert sum(op.startswith("MUFU.SIN") for op in ops) == 16
        return
    spec = decode_spec(_decode_key(render((lookup("rope"),)), tensor_cores))
    mod = compile_spec(spec, "sm_90a")
    ops = disassemble(mod.cubin)[next(iter(mod.lowered.values()))]
    assert sum(op.startswith("MUFU.SIN") for op in ops) == 8 + 8 + 8  # steps (per kernel), tile seeds, q (per item)


@pytest.mark.compile
@pytest.mark.parametrize("name", ["rope", "rope_llama31"])
def test_rope_tensor_core_decode_rotates_keys_in_registers(name):
    """The D6 kernel (bf16, group 4, head dim 128, tensor cores): with in-kernel RoPE a K tile costs the same
    shared-memory stores and barriers as plain decode (the keys are rotated on their ldmatrix fragments, not read,
    rotated and written back in shared memory behind a warp barrier: that path had 8 STS.128 and 8 LDS.128 per tile
    and thread more than plain), the same ldmatrix loads, and only the tables' reads (one LDS.128 per dimension pair
    of the thread and tile; the seed path reads DimState and step, the carry path the tile's and the 8-key steps:
    16 + 16 in the SASS of both); no spills. Per tile and warp (sm_90a): plain 282 instructions, the shared-memory
    rotation 804, the register rotation 772 on a seed tile and 664 on a carried one; the two paths' extra
    instructions over plain (490 + 382) are bounded here by 900."""
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    plain, _ = _tile_sass(None)
    rope, res = _tile_sass(render((lookup(name),)))
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res

    def count(ops, *prefixes):
        return sum(op.startswith(prefixes) for op in ops)

    assert count(rope, "STS", "STSM") == count(plain, "STS", "STSM") == 0
    assert count(rope, "BAR") == count(plain, "BAR") and count(rope, "WARPSYNC") == count(plain, "WARPSYNC")
    assert count(rope, "LDSM") == count(plain, "LDSM")
    assert [op for op in rope if op.startswith("LDS") and not op.startswith("LDSM")] == ["LDS.128"] * 32
    assert len(rope) - len(plain) <= 900, (len(plain), len(rope))
