"""The Hopper prefill kernel's main loop as ptxas scheduled it (SASS, no GPU): a consumer's softmax of tile i runs
between its two wgmma waits (Q K^T of tile i retired, P V of tile i - 1 still running), and interior tiles take a
copy of the softmax without key compares (a custom mask, on every tile, keeps one copy after the wait).

With one softmax copy and a runtime "this tile needs masks" condition, ptxas folded the condition into a compare and
select per logit on every tile and moved the whole softmax below the P V wait (kernel_src/attention/prefill_sm90/
consumer.cuh softmax_any_tile).
"""

from __future__ import annotations

import pytest

from cuinfer.jit import get_compiled
from cuinfer.jit.sass import (
    WGMMA_WAIT_0,
    WGMMA_WAIT_1,
    between,
    branch_blocks,
    disassemble_instructions,
    find_cuobjdump,
    opcode,
)
from cuinfer.prefill.sm90 import default_specs

SPECS = default_specs()
WAIT_QK = WGMMA_WAIT_1  # wgmma_wait<1>: tile i's Q K^T retired
WAIT_PV = WGMMA_WAIT_0  # wgmma_wait<0>: tile i - 1's P V retired


def softmax_window(instructions: list[str]) -> list[str]:
    """The instructions between the main loop's first wgmma_wait<1> and the wgmma_wait<0> after it."""
    return between(instructions, WAIT_QK, WAIT_PV)


def exps(instructions: list[str]) -> int:
    return sum(opcode(s).startswith("MUFU.EX2") for s in instructions)


def test_window_helpers_on_a_made_up_listing():
    listing = ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ", WAIT_QK + " ;", "ISETP.GT.AND P0, PT, R1, R2, PT",
               "@P0 BRA 0x100", *["MUFU.EX2 R3, R3"] * 3, "BRA 0x200", "FSEL R3, R3, -INF, P1", "MUFU.EX2 R4, R4",
               WAIT_PV + " ;", "MUFU.EX2 R5, R5"]  # fmt: skip
    window = softmax_window(listing)
    assert exps(window) == 4
    assert [exps(b) for b in branch_blocks(window)] == [0, 3, 1]


@pytest.mark.compile
@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump wheel not installed")
@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_softmax_runs_between_the_waits_and_interior_tiles_compare_no_keys(spec):
    if "custom_mask" in spec.name:
        pytest.skip("a custom mask applies to every tile: one softmax copy, after the P V wait (consumer.cuh)")
    mod = get_compiled(spec, "sm_90a")
    (sym,) = mod.lowered.values()
    window = softmax_window(disassemble_instructions(mod.cubin)[sym])
    # a tile's softmax: 64 logits per thread, one exp2 each (more with a logits transform on the MUFU unit)
    assert exps(window) >= 64, f"{spec.name}: {exps(window)} exp2 between the waits; the softmax runs after P V"
    interior = [b for b in branch_blocks(window) if exps(b) >= 64 and not any(opcode(s).startswith("ISETP") for s in b)]
    assert interior, f"{spec.name}: no softmax copy without key compares between the waits"
