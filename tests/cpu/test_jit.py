"""The compile layer: parameter structs, rendering, NVRTC errors, the disk cache and its guarantees."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from cuinfer.errors import CompileError
from cuinfer.jit import KernelSpec, ParamStruct, cache, compile_spec, get_compiled
from cuinfer.jit.compiler import parse_resources
from cuinfer.jit.sass import check_sass, unwritten_uniform_reads
from cuinfer.merge.specs import merge_spec

P = ParamStruct("TestParams", (("x", "ptr"), ("n", "i32"), ("scale", "f32"), ("big", "i64"), ("k", "u32")))

_KERNEL = """
#include "common/types.cuh"
template <int N>
__global__ void scale_kernel(const __grid_constant__ TestParams p) {
  float* x = reinterpret_cast<float*>(p.x);
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) x[i] = x[i] * p.scale * N + $offset;
}
"""


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _spec(tmp_path, body=_KERNEL, offset="1.0f", name="test/scale") -> KernelSpec:
    src = tmp_path / "scale.cu"
    src.write_text(body)
    return KernelSpec(
        name=name,
        source=str(src),  # absolute paths are allowed, for tests and experiments
        name_exprs=("scale_kernel<2>", "scale_kernel<3>"),
        preamble=P.c_decl(),
        substitutions=(("offset", offset),),
    )


def test_param_struct_matches_numpy_layout():
    dt = P.numpy_dtype
    assert dt.itemsize == 32 and dt.alignment == 8
    assert dt.fields["big"][1] == 16 and dt.fields["k"][1] == 24  # 8 + 4 + 4, then the i64, then u32 + padding
    packed = P.pack(x=0xDEADBEEF00, n=7, scale=0.5, big=-3, k=9)
    assert isinstance(packed, np.void) and packed["n"] == 7 and packed["big"] == -3
    assert "static_assert(sizeof(TestParams) == 32" in P.c_decl()


def test_param_struct_rejects_missing_and_unknown_fields():
    with pytest.raises(TypeError, match=r"missing fields \['k'\], unknown fields \['zz'\]"):
        P.pack(x=0, n=1, scale=1.0, big=0, zz=1)
    with pytest.raises(ValueError, match="has kind 'f16'"):
        ParamStruct("Bad", (("a", "f16"),))
    with pytest.raises(ValueError, match="has no fields"):
        ParamStruct("Empty", ())


def test_nested_param_structs_match_c_layout(tmp_path):
    """A nested struct (a variant's parameters) has C's layout: tail padding included, checked by NVRTC."""
    inner = ParamStruct("InnerP", (("d", "f64"), ("f", "f32")))  # 16 bytes with 4 of tail padding
    outer = ParamStruct("OuterP", (("a", "i32"), ("inner", inner), ("b", "i32")))
    assert outer.numpy_dtype.itemsize == 32 and outer.numpy_dtype.fields["b"][1] == 24
    packed = outer.pack(a=1, inner={"d": 0.25, "f": 2.0}, b=3)
    assert packed["inner"]["d"] == 0.25 and packed["b"] == 3
    decl = outer.c_decl()
    assert decl.index("struct InnerP") < decl.index("struct OuterP")
    src = tmp_path / "nested.cu"
    src.write_text("__global__ void k(const __grid_constant__ OuterP p) {}\n")
    compile_spec(KernelSpec(name="test/nested", source=str(src), name_exprs=("k",), preamble=decl), "sm_80")


def test_static_assert_catches_layout_drift(tmp_path):
    # A preamble whose struct disagrees with its asserted size must not compile.
    bad = P.c_decl().replace("float scale;", "double scale;")
    spec = _spec(tmp_path)
    spec = KernelSpec(spec.name, spec.source, spec.name_exprs, preamble=bad, substitutions=spec.substitutions)
    with pytest.raises(CompileError, match="size differs from the NumPy dtype"):
        compile_spec(spec, "sm_80")


def test_compile_reports_resources_and_lowered_names(tmp_path):
    mod = compile_spec(_spec(tmp_path), "sm_90a")
    assert set(mod.lowered) == {"scale_kernel<2>", "scale_kernel<3>"}
    assert all(sym.startswith("_Z") for sym in mod.lowered.values())
    for sym in mod.lowered.values():
        r = mod.resources[sym]
        assert 0 < r.registers <= 32 and r.spill_stores == 0


def test_compile_error_carries_log_options_and_numbered_source(tmp_path):
    spec = _spec(tmp_path, offset="undefined_symbol_xyz")
    with pytest.raises(CompileError) as info:
        compile_spec(spec, "sm_80")
    err = info.value
    assert "undefined_symbol_xyz" in err.log and "error" in err.log
    assert any(o.startswith("--gpu-architecture=sm_80") for o in err.options)
    # the error cites the source file by name (#line markers), and the listing is numbered
    assert "scale.cu" in err.log
    assert "    1  " in err.source_listing


def test_misspelt_placeholder_raises_with_names(tmp_path):
    spec = _spec(tmp_path, body=_KERNEL.replace("$offset", "$offsett"))
    with pytest.raises(ValueError, match=r"placeholder \$offsett .* provides only \['offset'\]"):
        spec.render()


def test_parse_resources_reads_ptxas_lines():
    log = textwrap.dedent("""\
        ptxas info    : Compiling entry function '_Z3foov' for 'sm_90a'
        ptxas info    : Function properties for _Z3foov
        ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
        ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem
        """)
    r = parse_resources(log)["_Z3foov"]
    assert (r.registers, r.spill_stores, r.spill_loads, r.stack_frame, r.smem_static, r.barriers) == (
        40, 8, 4, 16, 1024, 1,
    )  # fmt: skip


def test_disk_cache_hit_corrupt_entry_and_atomic_write(tmp_path, tmp_cache):
    spec = _spec(tmp_path)
    before = cache.stats.compiles
    first = get_compiled(spec, "sm_80")
    assert cache.stats.compiles == before + 1
    files = os.listdir(tmp_cache)
    assert len(files) == 1 and files[0].endswith(".cubin"), files  # no temp files left behind
    hits = cache.stats.disk_hits
    again = get_compiled(spec, "sm_80")
    assert cache.stats.compiles == before + 1 and cache.stats.disk_hits == hits + 1
    assert again.cubin == first.cubin and again.lowered == first.lowered
    # flip one byte of the payload: the checksum fails, the entry is recompiled, not trusted
    path = tmp_cache / files[0]
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    path.write_bytes(bytes(blob))
    corrupt = cache.stats.disk_corrupt
    fixed = get_compiled(spec, "sm_80")
    assert cache.stats.disk_corrupt == corrupt + 1 and cache.stats.compiles == before + 2
    # NVRTC output is not byte-for-byte deterministic (a per-program id in the ELF), so compare what matters
    assert len(fixed.cubin) == len(first.cubin) and fixed.lowered == first.lowered
    # truncated entry: same
    path.write_bytes(path.read_bytes()[:20])
    get_compiled(spec, "sm_80")
    assert cache.stats.compiles == before + 3


def test_key_changes_with_source_and_arch(tmp_path):
    a = _spec(tmp_path)
    b = _spec(tmp_path, offset="2.0f")
    assert cache.spec_key(a, "sm_80") != cache.spec_key(b, "sm_80")
    assert cache.spec_key(a, "sm_80") != cache.spec_key(a, "sm_90a")
    assert cache.spec_key(a, "sm_80") == cache.spec_key(_spec(tmp_path), "sm_80")


def test_cold_compile_of_merge_kernel_under_two_seconds(tmp_cache):
    spec = merge_spec("bfloat16", 128)
    start = time.perf_counter()
    mod = get_compiled(spec, "sm_90a")
    elapsed = time.perf_counter() - start
    assert mod.compile_seconds > 0
    assert elapsed < 2.0, f"cold NVRTC compile of {spec.name} took {elapsed:.2f}s (target < 2 s)"


def test_second_process_loads_from_disk_without_nvrtc(tmp_cache):
    spec = merge_spec("float16", 64)
    get_compiled(spec, "sm_90a")  # warm the cache in this process
    code = textwrap.dedent("""
        import sys, time
        from cuinfer.merge.specs import merge_spec
        from cuinfer.jit import get_compiled, stats
        spec = merge_spec("float16", 64)
        t = time.perf_counter()
        mod = get_compiled(spec, "sm_90a")
        dt = time.perf_counter() - t
        print(stats.compiles, stats.disk_hits, "cuda.bindings.nvrtc" in sys.modules, len(mod.cubin), f"{dt:.6f}")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    compiles, hits, nvrtc_loaded, size, dt = out.stdout.split()
    assert compiles == "0" and hits == "1", out.stdout
    assert nvrtc_loaded == "False", "a warm cache must not even load NVRTC"
    assert int(size) > 0
    assert float(dt) < 0.020, f"warm load took {float(dt) * 1e3:.1f} ms (target < 20 ms)"


def test_check_sass_patterns():
    ops = ["LDG.E.NA.128.CONSTANT", "HMMA.16816.F32.BF16", "STG.E.128", "EXIT"]
    assert check_sass(ops, "sm_80", (r"LDG\.E\..*128", r"HMMA"), (r"LDL", r"STL")) == []
    assert check_sass(ops, "sm_80", ("sm_90a:HGMMA",), ()) == []  # arch-qualified: not for sm_80
    assert check_sass(ops, "sm_90a", ("sm_90a:HGMMA",), ()) != []
    assert "forbidden" in check_sass(ops + ["LDL.64"], "sm_80", (), (r"LDL",))[0]


def test_unwritten_uniform_reads_finds_the_miscompiled_copy():
    """The copies NVRTC 13's ptxas emitted for an fp8 decode copy form (an illegal instruction on the H200): the address
    and the descriptor read UR0 / UR1, which nothing wrote. The same copies from a sound build read written ones."""
    bad = [
        "S2UR UR4, SR_CgaCtaId",
        "UMOV UR5, 0x400",
        "ULEA UR5, UR4, UR5, 0x18",
        "LDS.U8 R5, [UR5+0x1881c]",
        "@!PT LDS RZ, [RZ]",
        "LDGSTS.E.BYPASS.LTC128B.128 [R167+UR0], desc[UR1][R8.64], !P0",
        "LDGSTS.E.BYPASS.LTC128B.128 [R167+UR0+0x4000], desc[UR1][R10.64], !P0",
    ]
    problems = unwritten_uniform_reads(bad)
    assert len(problems) == 2 and all("reads UR0, UR1" in p for p in problems), problems
    good = ["ULDC.64 UR6, c[0x0][0x208]", "LDGSTS.E.BYPASS.LTC128B.128 [R139+0x4000], desc[UR6][R10.64], !P0"]
    assert unwritten_uniform_reads(good) == []  # (a .64 destination writes the pair)
    assert unwritten_uniform_reads(["LDGSTS.E.BYPASS.LTC128B.128 [R139], desc[UR6][R10.64], !P0"]) != []


# ---- registry ----------------------------------------------------------------------------------------------------


def test_registry_groups_of_the_providers():
    from cuinfer.jit import registry

    assert registry.groups() == ["decode", "merge", "prefill", "prefill_sm90", "utility"]
    for group in registry.groups():
        assert registry.specs(group), f"group {group} registers no kernel"
        assert all(isinstance(s, KernelSpec) for s in registry.specs(group))


def test_help_texts_list_the_registered_groups():
    """The --group help of the cuinfer CLI (and of the lab's SASS snapshot tool) names every registered group."""
    import re
    from pathlib import Path

    from cuinfer.jit import registry

    root = Path(__file__).resolve().parents[2]
    for path in (root / "cuinfer" / "cli.py", root / "bench" / "lab" / "sass_snapshot.py"):
        listed = re.findall(r"one kernel group \(([^)]*)\)", path.read_text())
        assert listed, path
        for text in listed:
            assert sorted(text.split(", ")) == registry.groups(), f"{path.name}: ({text})"


def test_registry_raises_when_a_provider_fails_to_import(monkeypatch):
    from cuinfer.jit import registry

    monkeypatch.setattr(registry, "_PROVIDERS", registry._PROVIDERS + ("cuinfer.no_such_provider",))
    with pytest.raises(ImportError, match=r"the kernel provider cuinfer\.no_such_provider failed to import"):
        registry.groups()
