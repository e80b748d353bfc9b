"""Lab tool: snapshot the SASS of every registered kernel (and the benchmark cases' kernels), and diff two snapshots.

A kernel refactor that must not change the generated code is checked here, without a GPU: compile the tree before
and after, compare. Constant-bank offsets (``c[0x0][0x...]``: where a field sits in the parameter struct) are
normalised, so a reordered or extended parameter struct alone does not count as a change.

    python -m bench.lab.sass_snapshot take DIR [--arch sm_90a,sm_80] [--jobs 2]
    python -m bench.lab.sass_snapshot diff DIR_A DIR_B

``take`` writes one file per (arch, spec, instance) named after the spec (stable across template-signature changes)
plus ``index.json`` with registers, spills and instruction counts, and ``source.json``: the kernel_src directory and
digest it compiled. Use a fresh ``CUINFER_CACHE_DIR`` per tree. Another tree is not reached by ``PYTHONPATH`` under
an editable install (its finder maps ``cuinfer.kernel_src`` to this checkout whatever comes first on the path): run
from a git worktree with the finder's ``MAPPING`` pointed there (a ``sitecustomize.py``); ``diff`` warns when both
snapshots compiled the same sources.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import sys
from pathlib import Path


def nvrtc_cubin(source: str, arch: str, options: tuple[str, ...] = (), name: str = "probe.cu") -> bytes | None:
    """A lab probe's CUDA source compiled by NVRTC to a cubin for ``arch`` (C++17), or None when it does not compile
    (no GPU needed; the probes' --sass modes read it with ``cuinfer.jit.sass``)."""
    from cuinfer.jit.toolchain import nvrtc_module

    nv = nvrtc_module()
    _, prog = nv.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    try:
        opts = [o.encode() for o in (*options, "-std=c++17", f"-arch={arch}")]
        (res,) = nv.nvrtcCompileProgram(prog, len(opts), opts)
        if res != nv.nvrtcResult.NVRTC_SUCCESS:
            return None
        _, n = nv.nvrtcGetCUBINSize(prog)
        cubin = b" " * n
        nv.nvrtcGetCUBIN(prog, cubin)
        return cubin
    finally:
        nv.nvrtcDestroyProgram(prog)


_CBANK = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")
_ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")


def bench_case_specs() -> list:
    """Specs of the kernels the standard cases run that the registry does not list (decode without lse)."""
    from cuinfer.decode.policy import decode_config
    from cuinfer.decode.specs import DecodeKernelKey, decode_spec

    cfg = decode_config(4, 128)
    fp8 = decode_config(4, 128, kv_itemsize=1)  # D10, D5-e4m3, D9-e4m3
    return [
        decode_spec(DecodeKernelKey(cfg, "bfloat16", "bfloat16", "bfloat16")),
        decode_spec(DecodeKernelKey(fp8, "bfloat16", "float8_e4m3fn", "bfloat16")),
    ]


def _normalise(sass: str) -> list[str]:
    out = []
    for line in sass.splitlines():
        line = line.strip()
        if not line.startswith("/*") or "*/" not in line:
            continue
        line = _ADDR.sub("", line, count=1).strip()
        line = re.sub(r"/\*\s*0x[0-9a-f]+\s*\*/", "", line).strip()  # encodings
        if not line:
            continue
        out.append(_CBANK.sub("c[0x0][X]", line))
    return out


def cuobjdump_text(cubin: bytes) -> str:
    """``cuobjdump -sass`` of a cubin, encodings included."""
    import os
    import subprocess
    import tempfile

    from cuinfer.jit.sass import find_cuobjdump

    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
        path = fh.name
    try:
        return subprocess.run([find_cuobjdump(), "-sass", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


def _sass_by_symbol(cubin: bytes) -> dict[str, str]:
    funcs: dict[str, list[str]] = {}
    cur = None
    for line in cuobjdump_text(cubin).splitlines():
        m = re.match(r"^\s*Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
        elif cur is not None:
            cur.append(line)
    return {k: "\n".join(v) for k, v in funcs.items()}


def take(out: Path, archs: list[str], jobs: int, group: str | None = None, match: str | None = None) -> int:
    from cuinfer.jit import get_compiled
    from cuinfer.jit.registry import specs

    todo = specs(group) + ([] if group not in (None, "decode") else bench_case_specs())
    if match:
        todo = [s for s in todo if re.search(match, s.name)]
    out.mkdir(parents=True, exist_ok=True)
    from cuinfer.jit.spec import kernel_src_digest, kernel_src_dir

    source = {"kernel_src": kernel_src_dir(), "digest": kernel_src_digest()}
    (out / "source.json").write_text(json.dumps(source, indent=1))
    print(f"kernel_src {source['kernel_src']} (digest {source['digest'][:16]})", flush=True)
    index = {}

    def one(spec, arch):
        return spec, arch, get_compiled(spec, arch)

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futs = [pool.submit(one, s, a) for a in archs for s in todo if s.builds_for(a)]  # (sm90 kernels: sm_90a)
        for i, fut in enumerate(concurrent.futures.as_completed(futs), 1):
            spec, arch, mod = fut.result()
            funcs = _sass_by_symbol(mod.cubin)
            for k, expr in enumerate(spec.name_exprs):
                sym = mod.lowered[expr]
                lines = _normalise(funcs[sym])
                name = f"{arch}__{spec.name.replace('/', '_')}__{k}"
                (out / f"{name}.sass").write_text("\n".join(lines) + "\n")
                r = mod.resources.get(sym)
                index[name] = {
                    "expr": expr,
                    "instructions": len(lines),
                    "registers": r.registers if r else None,
                    "spills": (r.spill_stores + r.spill_loads) if r else None,
                }
            print(f"[{i}/{len(futs)}] {arch} {spec.name}", flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    return 0


def diff(a: Path, b: Path) -> int:
    ia = json.loads((a / "index.json").read_text())
    ib = json.loads((b / "index.json").read_text())
    if (a / "source.json").exists() and (b / "source.json").exists():
        sa, sb = (json.loads((x / "source.json").read_text()) for x in (a, b))
        if sa["digest"] == sb["digest"]:
            print(f"warning: both snapshots compiled the same kernel_src ({sa['kernel_src']}, digest "
                  f"{sa['digest'][:16]})")  # fmt: skip
    common = set(ia) & set(ib)
    if common and len(common) < max(len(ia), len(ib)):  # one side took a single group: compare that group
        ia = {k: v for k, v in ia.items() if k in common}
        ib = {k: v for k, v in ib.items() if k in common}
    same = changed = 0
    for name in sorted(set(ia) | set(ib)):
        if name not in ia or name not in ib:
            print(f"{'only in ' + (str(a) if name in ia else str(b)):40s} {name}")
            changed += 1
            continue
        la = (a / f"{name}.sass").read_text()
        lb = (b / f"{name}.sass").read_text()
        if la == lb:
            same += 1
            continue
        changed += 1
        ra, rb = ia[name], ib[name]
        print(f"differs  {name}: {ra['instructions']} -> {rb['instructions']} instructions, "
              f"{ra['registers']} -> {rb['registers']} registers, spills {ra['spills']} -> {rb['spills']}")  # fmt: skip
    print(f"{same} identical, {changed} different")
    return 1 if changed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lab.sass_snapshot", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("take")
    t.add_argument("out", type=Path)
    t.add_argument("--arch", default="sm_90a,sm_80")
    t.add_argument("--jobs", type=int, default=2)
    t.add_argument("--group", default=None, help="one kernel group (merge, decode, prefill, prefill_sm90, utility)")
    t.add_argument("--match", default=None, help="only specs whose name matches this regular expression")
    d = sub.add_parser("diff")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "take":
        return take(args.out, args.arch.split(","), args.jobs, args.group, args.match)
    return diff(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
