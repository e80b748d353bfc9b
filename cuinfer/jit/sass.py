"""SASS inspection with the ``cuobjdump`` of the nvidia-cuda-cuobjdump wheel (no CUDA toolkit needed).

CI uses it to check that each kernel contains what it is meant to (16-byte loads, HMMA, LDGSTS) and no local-memory
traffic (LDL/STL). Expectations are regular expressions over opcodes; ``sm_90a:HGMMA`` applies to one arch only.
``unwritten_uniform_reads`` checks the operands: every uniform register an address or a memory descriptor reads is
written somewhere in the kernel (NVRTC 13's ptxas once emitted ``LDGSTS [R+UR0], desc[UR1]`` with neither written:
an illegal instruction on the H200).
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


@functools.lru_cache(maxsize=1)
def find_cuobjdump() -> str | None:
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    for root in sys.path:
        for hit in glob.glob(os.path.join(root, "nvidia", "*", "bin", "cuobjdump")):
            if os.access(hit, os.X_OK):
                return hit
    return None


_FUNC = re.compile(r"^\s*Function : (\S+)")
_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+((?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)[^;]*);")


def disassemble(cubin: bytes) -> dict[str, list[str]]:
    """Opcodes (with modifiers, e.g. ``LDG.E.128``) per kernel symbol."""
    return {sym: [opcode(insn) for insn in insns] for sym, insns in disassemble_instructions(cubin).items()}


def opcode(insn: str) -> str:
    """The opcode of an instruction of disassemble_instructions (its guard skipped)."""
    return insn.split()[1] if insn.startswith("@") else insn.split()[0]


def disassemble_instructions(cubin: bytes) -> dict[str, list[str]]:
    """Whole instructions (guard, opcode, operands; no address or encoding) per kernel symbol."""
    exe = find_cuobjdump()
    if exe is None:
        raise RuntimeError("cuobjdump not found: pip install nvidia-cuda-cuobjdump (the test extra brings it)")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
        path = fh.name
    try:
        out = subprocess.run([exe, "-sass", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    funcs: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        if m := _FUNC.match(line):
            current = funcs.setdefault(m.group(1), [])
        elif current is not None and (m := _INSN.search(line)):
            current.append(m.group(1).strip())
    return funcs


WGMMA_WAIT_1 = "WARPGROUP.DEPBAR.LE gsb0, 0x1"  # wgmma_wait<1>: all but the last wgmma group retired
WGMMA_WAIT_0 = "WARPGROUP.DEPBAR.LE gsb0, 0x0"  # wgmma_wait<0>: every wgmma group retired


def between(items: Sequence[T], first: str, last: str, text: Callable[[T], str] = str) -> list[T]:
    """The items after the first whose text starts with ``first``, up to the next whose text starts with ``last``
    (e.g. an sm90 consumer's softmax: between ``WGMMA_WAIT_1`` and ``WGMMA_WAIT_0``)."""
    start = next(i for i, x in enumerate(items) if text(x).startswith(first))
    end = next(i for i in range(start, len(items)) if text(items[i]).startswith(last))
    return list(items[start + 1 : end])


def branch_blocks(items: Sequence[T], op: Callable[[T], str] = opcode) -> list[list[T]]:
    """``items`` cut after every branch (``op``: an item's opcode)."""
    out: list[list[T]] = [[]]
    for x in items:
        out[-1].append(x)
        if op(x).startswith("BRA"):
            out.append([])
    return out


_UR_DEST = re.compile(r"^(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s+UR(\d+)\b")
_BRACKETS = re.compile(r"\[([^\]]*)\]")
_UR = re.compile(r"\bUR(\d+)\b")


def unwritten_uniform_reads(instructions: list[str]) -> list[str]:
    """Problems: instructions whose address or memory descriptor (``[R1+UR4]``, ``desc[UR6]``) reads a uniform
    register that no instruction of the kernel writes (a destination is an instruction's first operand; a ``.64``
    destination writes the pair). Empty for a sound kernel."""
    written: set[int] = set()
    for insn in instructions:
        if m := _UR_DEST.match(insn):
            n = int(m.group(2))
            written.update(range(n, n + (2 if ".64" in m.group(1) else 1)))
    bad = []
    for insn in instructions:
        unwritten = sorted({int(u) for b in _BRACKETS.findall(insn) for u in _UR.findall(b)} - written)
        if unwritten:
            bad.append(f"{insn!r} reads {', '.join(f'UR{u}' for u in unwritten)}, which nothing in the kernel writes")
    return bad


def _applies(pattern: str, arch: str) -> tuple[bool, str]:
    if ":" in pattern:
        only, pat = pattern.split(":", 1)
        return only == arch, pat
    return True, pattern


def check_sass(opcodes: list[str], arch: str, expect: tuple[str, ...], forbid: tuple[str, ...]) -> list[str]:
    """Problems found (empty when the kernel's SASS is as specified)."""
    problems = []
    for pattern in expect:
        ok, pat = _applies(pattern, arch)
        if ok and not any(re.match(pat, op) for op in opcodes):
            problems.append(f"expected an instruction matching {pat!r}, found none")
    for pattern in forbid:
        ok, pat = _applies(pattern, arch)
        bad = sorted({op for op in opcodes if re.match(pat, op)}) if ok else []
        if bad:
            problems.append(f"forbidden instructions {bad} (pattern {pat!r})")
    return problems
