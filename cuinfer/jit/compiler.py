"""NVRTC: render a KernelSpec, compile it to cubin (never PTX: a newer NVRTC's PTX is refused by an older driver),
and read the per-kernel resource report that ptxas prints."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from cuinfer.errors import CompileError
from cuinfer.jit.spec import KernelSpec, kernel_src_dir
from cuinfer.jit.toolchain import include_dir, nvrtc_module, toolchain


@dataclass(frozen=True)
class ResourceUsage:
    """What ptxas reported for one kernel."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    smem_static: int
    barriers: int = 0


@dataclass
class CompiledModule:
    spec: KernelSpec
    arch: str
    cubin: bytes
    lowered: dict[str, str]  # name expression -> mangled symbol
    log: str
    options: list[str]
    compile_seconds: float = 0.0
    resources: dict[str, ResourceUsage] = field(default_factory=dict)  # mangled symbol -> usage


def nvrtc_options(arch: str) -> list[str]:
    """Options of every compile. ``arch`` is e.g. ``sm_90a`` (Hopper instructions need the ``a``) or ``sm_80``."""
    return [
        f"--gpu-architecture={arch}",
        "-std=c++17",
        "-default-device",
        "-DNDEBUG",
        f"-I{include_dir()}",
        f"-I{kernel_src_dir()}",
        "--ptxas-options=-v",
        "--ptxas-options=--warn-on-spills",
    ]


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def parse_resources(log: str) -> dict[str, ResourceUsage]:
    """Per-kernel registers / spills / smem from the ptxas ``-v`` lines of an NVRTC log."""
    out: dict[str, ResourceUsage] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    current = None
    props_for = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
        elif m := _PROPS.search(line):
            props_for = m.group(1)
        elif (m := _FRAME.search(line)) and props_for:
            frames[props_for] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and current:
            stack, st, ld = frames.get(current, (0, 0, 0))
            out[current] = ResourceUsage(
                registers=int(m.group(1)),
                spill_stores=st,
                spill_loads=ld,
                stack_frame=stack,
                smem_static=int(m.group(3) or 0),
                barriers=int(m.group(2) or 0),
            )
    return out


def _check(nvrtc, result, what: str) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


def _log(nvrtc, prog) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0 ").decode(errors="replace")


def compile_spec(spec: KernelSpec, arch: str) -> CompiledModule:
    """Compile one spec to cubin for ``arch``; works without a GPU. Raises CompileError with log and source."""
    nvrtc = nvrtc_module()
    toolchain()  # refuses a header / NVRTC major mismatch before NVRTC prints pages of parse errors
    source = spec.render()
    options = nvrtc_options(arch) + list(spec.extra_options)
    start = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{spec.name}.cu".encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        for expr in spec.name_exprs:
            _check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, expr.encode()), f"nvrtcAddNameExpression({expr})")
        opts = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = _log(nvrtc, prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(spec.name, log, options, source)
        lowered = {}
        for expr in spec.name_exprs:
            err, name = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            _check(nvrtc, err, f"nvrtcGetLoweredName({expr})")
            lowered[expr] = name.decode()
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompiledModule(
        spec=spec,
        arch=arch,
        cubin=bytes(cubin),
        lowered=lowered,
        log=log,
        options=options,
        compile_seconds=time.perf_counter() - start,
        resources=parse_resources(log),
    )
