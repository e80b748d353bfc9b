"""Lab tool: the control bits ptxas gives each SASS instruction, and a model of one SMSP issuing a window of them.

Every sm_70+ instruction carries, in bits 105-125 of its 128-bit encoding (the top of the second 64-bit word
``cuobjdump -sass`` prints), the schedule ptxas chose: a stall count (cycles before the warp's next issue), a yield
hint, the scoreboard a variable-latency result sets (``wb``) and the one its operand reads set (``rb``), and the
scoreboards it waits on before issue (``w``). Fixed-latency results (FFMA, FMUL, FADD) are covered by stall counts
alone; MUFU, shared-memory and global results by scoreboards. Reading them shows what ptxas assumed about each
unit's latency, which no opcode listing does.

    python -m bench.lab.sass_ctrl print SPEC [--tile interior|all]
    python -m bench.lab.sass_ctrl model SPEC [--latency 20,24,28] [--slot 1|2]

SPEC is a registered sm90 prefill spec's name (``prefill_sm90/ragged/bfloat16/d128/causal+soft_cap/max-free``);
the window is the consumer's main loop between ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` and ``... 0x0`` (the softmax), its
interior-tile block by default. Another tree: install it with ``pip install --target`` (bench/lab/ab_install.sh) and
put that directory first on ``PYTHONPATH``, with its own ``CUINFER_CACHE_DIR``.

``model`` replays the window on one SMSP: in-order issue, one instruction per cycle, each warp's stall counts and
scoreboard waits as encoded; MUFU ops occupy the SMSP's MUFU unit for ``--interval`` cycles (16 results per SM and
clock: 8 per warp op) and deliver ``--latency`` cycles after dispatch; fixed-latency results after 4. It prints the
window's cycles for one warp alone and the mean over offsets 0..1000 of two warps (the two consumers) running it on
one SMSP. Calibration (docs/results/lab-findings.md, 2026-12-05 (e)): at latency 24 and one issue per cycle it
followed the soft cap's lab bounds that shorten the tanh -> exp2 chain (noffma, bound within ~1 point) and nofadd,
but not qscale or added FMA-pipe work (the quarter-polynomial exp2: +12 % modelled, -2 % measured); with
``--slot 2`` it misses nofadd and poly instead; and it gives about half the cycles the probe measured for the
softmax. It ranks schedules of one instruction mix, nothing more.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

_LINE1 = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* 0x([0-9a-f]{16}) \*/")
_LINE2 = re.compile(r"^\s*/\* 0x([0-9a-f]{16}) \*/\s*$")
_FUNC = re.compile(r"^\s*Function : (\S+)")


@dataclass(frozen=True)
class Insn:
    text: str  # guard, opcode, operands (no address)
    stall: int
    yld: bool
    wb: int | None  # scoreboard the result sets (None: 7, none)
    rb: int | None  # scoreboard the operand reads set
    wait: tuple[int, ...]  # scoreboards waited on before issue

    @property
    def opcode(self) -> str:
        parts = self.text.split()
        return parts[1] if parts[0].startswith("@") else parts[0]

    def line(self) -> str:
        w = "".join(str(s) for s in self.wait)
        wb = "-" if self.wb is None else self.wb
        rb = "-" if self.rb is None else self.rb
        return f"{self.text:48s} S{self.stall:<2d} {'Y' if self.yld else ' '} wb{wb} rb{rb} w[{w}]"


def control(hi: int) -> dict:
    """The control fields of an instruction's high 64-bit word."""
    c = hi >> 41
    return {
        "stall": c & 15,
        "yld": bool((c >> 4) & 1),
        "wb": None if (c >> 5) & 7 == 7 else (c >> 5) & 7,
        "rb": None if (c >> 8) & 7 == 7 else (c >> 8) & 7,
        "wait": tuple(s for s in range(6) if (c >> 11) >> s & 1),
    }


def parse_listing(text: str) -> dict[str, list[Insn]]:
    """cuobjdump -sass output -> instructions with control bits, per kernel symbol."""
    funcs: dict[str, list[Insn]] = {}
    cur: list[Insn] | None = None
    pend = None
    for ln in text.splitlines():
        m = _FUNC.match(ln)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = _LINE1.search(ln)
        if m:
            pend = m.group(2).strip()
            continue
        m = _LINE2.match(ln)
        if m and pend is not None and cur is not None:
            cur.append(Insn(pend, **control(int(m.group(1), 16))))
            pend = None
    return funcs


def listing(cubin: bytes) -> dict[str, list[Insn]]:
    from bench.lab.sass_snapshot import cuobjdump_text

    return parse_listing(cuobjdump_text(cubin))


def softmax_window(insns: list[Insn], tile: str = "interior") -> list[Insn]:
    """The sm90 consumer's instructions between the Q K^T wait and the P V wait; with tile="interior" the longest
    branch-delimited block without a compare (the interior tiles' softmax_tile copy)."""
    from cuinfer.jit.sass import WGMMA_WAIT_0, WGMMA_WAIT_1, between, branch_blocks

    w = between(insns, WGMMA_WAIT_1, WGMMA_WAIT_0, text=lambda x: x.text)
    if tile == "all":
        return w
    blocks = branch_blocks(w, op=lambda x: x.opcode)
    return max(blocks, key=lambda b: (not any(x.opcode.startswith("ISETP") for x in b)) * len(b))


def issue_model(
    prog: list[Insn], offsets: list[int], latency: int = 24, interval: int = 8, fixed: int = 4, slot: int = 1
) -> list[int]:
    """Cycles each warp (starting at its offset) takes to issue ``prog`` and see its last result on one SMSP.
    ``slot``: cycles of the SMSP's issue port each instruction takes (2: the warps beside them take half)."""
    n = len(offsets)
    pc = [0] * n
    nxt = list(offsets)
    sb: list[list[list[int]]] = [[[] for _ in range(6)] for _ in range(n)]
    unit = port = t = 0
    done: list[int | None] = [None] * n
    while any(d is None for d in done):
        for k in sorted(range(n), key=lambda k: nxt[k]):  # oldest ready first, one issue per `slot` cycles
            if port > t or done[k] is not None or nxt[k] > t:
                continue
            x = prog[pc[k]]
            if any(c > t for s in x.wait for c in sb[k][s]):
                continue
            mufu = x.opcode.startswith("MUFU")
            if mufu and unit > t:
                continue
            for s in range(6):
                sb[k][s] = [c for c in sb[k][s] if c > t]
            if mufu:
                unit = t + interval
            lat = latency if mufu else fixed
            if x.wb is not None:
                sb[k][x.wb].append(t + lat)
            if x.rb is not None:
                sb[k][x.rb].append(t + 2)
            nxt[k] = t + max(x.stall, slot)
            port = t + slot
            pc[k] += 1
            if pc[k] == len(prog):
                done[k] = max([nxt[k]] + [c for s in sb[k] for c in s])
            break
        t += 1
    return [d - o for d, o in zip(done, offsets, strict=True)]  # type: ignore[operator]


def spec_window(name: str, tile: str) -> list[Insn]:
    from cuinfer.jit import get_compiled
    from cuinfer.jit.registry import specs

    spec = next((s for s in specs("prefill_sm90") if s.name == name), None)
    if spec is None:
        raise SystemExit(f"no registered prefill_sm90 spec named {name!r}")
    mod = get_compiled(spec, "sm_90a")
    (sym,) = mod.lowered.values()
    return softmax_window(listing(mod.cubin)[sym], tile)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lab.sass_ctrl", description=__doc__.splitlines()[0])
    p.add_argument("cmd", choices=("print", "model"))
    p.add_argument("spec")
    p.add_argument("--tile", choices=("interior", "all"), default="interior")
    p.add_argument("--latency", default="20,24,28")
    p.add_argument("--interval", type=int, default=8)
    p.add_argument("--slot", type=int, default=1, help="issue-port cycles per instruction (2: half the issue rate)")
    a = p.parse_args(argv)
    w = spec_window(a.spec, a.tile)
    if a.cmd == "print":
        for x in w:
            print(x.line())
        return 0
    nm = sum(x.opcode.startswith("MUFU") for x in w)
    print(f"{len(w)} instructions, {nm} MUFU; MUFU-bound floor {nm * a.interval} cycles per warp")
    for lat in (int(v) for v in a.latency.split(",")):
        alone = issue_model(w, [0], lat, a.interval, slot=a.slot)[0]
        two = []
        for o in range(0, 1001, 100):
            d0, d1 = issue_model(w, [0, o], lat, a.interval, slot=a.slot)
            two.append(max(d0, d1 + o))
        mean = sum(two) / len(two)
        print(f"latency {lat:3d}: alone {alone:5d} cycles, two warps (mean span over offsets) {mean:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
