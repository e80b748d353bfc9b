"""Every registered kernel specialisation compiles with NVRTC to cubin for sm_80 and sm_90a, without register
spills or compiler warnings, and its SASS contains what the spec says (16-byte loads, HMMA, ...), no local-memory
traffic, and no address or memory descriptor that reads a uniform register nothing writes (a miscompile ptxas once
produced).

Runs on CPU CI: NVRTC needs no GPU. Modules come through the disk cache (an identical key is the identical artefact).
"""

from __future__ import annotations

import pytest

from cuinfer.jit import get_compiled
from cuinfer.jit.registry import specs
from cuinfer.jit.sass import check_sass, disassemble_instructions, find_cuobjdump, opcode, unwritten_uniform_reads

ARCHS = ("sm_80", "sm_90a")
SPECS = specs()


def test_registry_covers_every_group():
    groups = {s.name.split("/")[0] for s in SPECS}
    assert "merge" in groups
    assert len({s.name for s in SPECS}) == len(SPECS), "two specs share a name"


@pytest.mark.compile
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_compiles_without_spills(spec, arch):
    if not spec.builds_for(arch):
        pytest.skip(f"{spec.name} is written for {', '.join(spec.archs)} only")
    mod = get_compiled(spec, arch)
    assert set(mod.lowered) == set(spec.name_exprs)
    assert mod.cubin, "empty cubin"
    warnings = [line for line in mod.log.splitlines() if "warning" in line.lower()]
    assert not warnings, f"{spec.name} compiles with warnings on {arch}: {warnings[:3]}"
    for expr, sym in mod.lowered.items():
        r = mod.resources.get(sym)
        assert r is not None, f"no ptxas report for {expr}"
        assert r.spill_stores == 0 and r.spill_loads == 0, f"{expr} spills on {arch}: {r}"
        assert r.stack_frame == 0, f"{expr} uses a {r.stack_frame}-byte stack frame on {arch} (local memory)"


@pytest.mark.compile
@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump wheel not installed")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_sass_has_expected_instructions(spec, arch):
    if not spec.builds_for(arch):
        pytest.skip(f"{spec.name} is written for {', '.join(spec.archs)} only")
    mod = get_compiled(spec, arch)
    funcs = disassemble_instructions(mod.cubin)
    assert set(funcs) >= set(mod.lowered.values())
    for expr, sym in mod.lowered.items():
        opcodes = [opcode(i) for i in funcs[sym]]
        problems = check_sass(opcodes, arch, spec.sass_expect, spec.sass_forbid)
        problems += unwritten_uniform_reads(funcs[sym])[:3]
        assert not problems, f"{expr} on {arch}: {problems}"
