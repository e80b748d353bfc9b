"""From measurements to what people read: the summary (cuinfer rows with the peers beside them), the text table,
the JSON files and the PNG bar chart. Pure Python + NumPy; matplotlib is imported only to draw, so the whole
module works from a JSON file on a machine without a GPU (``python -m bench plot FILE.json``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.suite import Measurement, SuiteSpec

DASH = "–"

_FMT = {
    "us": ("µs", "{:.1f}"),
    "gbps": ("GB/s", "{:.0f}"),
    "pct_copy": ("% copy", "{:.1f}"),
    "tflops": ("TFLOP/s", "{:.1f}"),
    "pct_matmul": ("% mm", "{:.1f}"),
    "plan_us": ("plan µs", "{:.1f}"),
    "max_abs_diff": ("max|Δ|", "{:.2g}"),
}


def _fmt(key: str, v) -> str:
    if v is None:
        return DASH
    return _FMT[key][1].format(v) if key in _FMT else str(v)


def summarize(spec: SuiteSpec, case_ids: list[str], descs: dict, measurements: list[Measurement]) -> list[dict]:
    """One row per (case, cuinfer variant): its metrics, each peer's metric, the best peer, ratio, target, pass.

    ``vs_peer`` is the best peer's time over cuinfer's (> 1: cuinfer is faster); every implementation of a case
    moves the same bytes and FLOPs, so this is also the throughput ratio.
    """
    rows = []
    for cid in case_ids:
        ms = [m for m in measurements if m.case == cid]
        peers = {}
        best = None
        for impl, variant, header in spec.peers:
            m = next((x for x in ms if x.impl == impl and x.variant == variant), None)
            if m is None or m.status == "skipped":
                peers[header] = None
            elif not m.ok:
                peers[header] = "err"
            else:
                peers[header] = getattr(m, spec.peer_metric)
                if best is None or m.us < best.us:
                    best = m
        for variant in spec.cuinfer_variants:
            m = next((x for x in ms if x.impl == "cuinfer" and x.variant == variant), None)
            if m is None:
                continue
            target = spec.target(cid, variant)
            values = {k: getattr(m, k) for k in ("us", "gbps", "tflops", "pct_copy", "plan_us")} if m.ok else {}
            if m.ok and best is not None and m.us:
                values["vs_peer"] = best.us / m.us
            base_id = spec.compare_to(cid) if spec.compare_to else ""
            base = next((x for x in measurements if x.case == base_id and x.impl == "cuinfer" and x.variant == variant
                         and x.ok), None) if base_id else None  # fmt: skip
            if m.ok and base is not None and m.us:
                values["ratio"] = base.us / m.us  # the speed-up over the 16-bit-KV case, same run and variant
            row = {
                "case": cid,
                "desc": descs.get(cid, ""),
                "variant": variant,
                "status": m.status,
                **{k: (getattr(m, k) if m.ok else None) for k in spec.columns},
                "peers": peers,
                "best_peer": best.label if best else None,
                "best_peer_us": best.us if best else None,
                "vs_peer": (best.us / m.us) if (best and m.ok and m.us) else None,
                "target": target.text if target else "",
                "pass": target.check(values) if (target and m.ok) else None,
                "note": m.error if not m.ok else m.note,
            }
            if m.max_abs_diff is not None:
                row["max_abs_diff"] = m.max_abs_diff
            if "ratio" in values:
                row["ratio"], row["ratio_to"] = values["ratio"], base_id
            rows.append(row)
    return rows


def format_table(spec: SuiteSpec, rows: list[dict], measurements: list[Measurement] = ()) -> str:
    """A fixed-width text table of the summary, then one line per failed peer (their errors do not fit a cell)."""
    headers = ["case", "shape", "cuinfer"] + [_FMT[c][0] for c in spec.columns]
    headers += [h for _, _, h in spec.peers] + ["vs best peer", "target", "ok", "note"]
    body = []
    previous = None
    for r in rows:
        first = r["case"] != previous  # a case's later rows leave its name and peer cells blank: easier to read
        previous = r["case"]
        cells = [r["case"] if first else "", r["desc"] if first else "", r["variant"]]
        cells += [_fmt(c, r.get(c)) for c in spec.columns]
        for _, _, h in spec.peers:
            v = r["peers"].get(h)
            cells.append("" if not first else v if isinstance(v, str) else _fmt(spec.peer_metric, v))
        cells.append(DASH if r["vs_peer"] is None else f"{r['vs_peer']:.2f}×")
        cells.append(r["target"] or DASH)
        cells.append({True: "pass", False: "MISS", None: DASH}[r["pass"]])
        note = r["note"] or ""
        if r.get("ratio") is not None:
            note = (f"{r['ratio']:.2f}× {r['ratio_to']} " + note).strip()
        if r.get("max_abs_diff") is not None:
            note = (f"max|Δ| {r['max_abs_diff']:.2g} " + note).strip()
        cells.append(note if len(note) <= 70 else note[:67] + "...")
        body.append(cells)
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *body, strict=True)]
    lines = [spec.title, "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip() for cells in body]
    failed = [m for m in measurements if m.impl != "cuinfer" and m.status in ("error", "not-implemented")]
    for m in failed:
        lines.append(f"  {m.case} {m.label}: {m.error}")
    return "\n".join(lines)


def payload(
    spec: SuiteSpec,
    *,
    cases: list,
    measurements: list[Measurement],
    roofline: dict | None,
    env: dict,
    args: dict,
    started: float,
) -> dict:
    """Everything one suite run produced, as JSON-ready data."""
    descs = {c.id: c.describe() for c in cases}
    return {
        "suite": spec.name,
        "title": spec.title,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "args": args,
        "env": env,
        "roofline": roofline,
        "cases": [{"id": c.id, "desc": c.describe(), **_case_extra(c)} for c in cases],
        "measurements": [m.as_dict() for m in measurements],
        "summary": summarize(spec, [c.id for c in cases], descs, measurements),
    }


def _case_extra(c) -> dict:
    out = {}
    for k in ("seed", "kv_dtype", "layout", "anchor"):
        if hasattr(c, k):
            out[k] = getattr(c, k)
    for k in ("target", "target_fa2", "target_hopper"):
        if hasattr(c, k):
            out[k] = getattr(c, k).text
    return out


def write_json(out_dir: Path, data: dict, stamp: str | None = None) -> tuple[Path, Path]:
    """``<suite>-<stamp>.json`` and ``<suite>-latest.json`` (same content) in ``out_dir``; written through a
    temporary file and a rename, so a reader never sees half a file."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    text = json.dumps(data, indent=1, default=str, ensure_ascii=False) + "\n"
    path = out_dir / f"{data['suite']}-{stamp}.json"
    latest = out_dir / f"{data['suite']}-latest.json"
    for p in (path, latest):
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(p)
    return path, latest


def load(path: Path) -> tuple[dict, list[Measurement]]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return data, [Measurement.from_dict(d) for d in data["measurements"]]


def plot(spec: SuiteSpec, data: dict, measurements: list[Measurement], path: Path) -> Path | None:
    """Bar chart per case: every cuinfer variant and every peer, with the ceiling line (copy bandwidth or matmul
    rate measured in the same run). Returns None (and says why) when matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as ex:
        print(f"plot skipped: matplotlib is not importable ({ex}); `python -m bench plot <json>` draws it later")
        return None
    import numpy as np

    metric = spec.plot_metric
    case_ids = [c["id"] for c in data["cases"]]
    series = [("cuinfer", v, f"cuinfer {v}") for v in spec.cuinfer_variants]
    series += [(impl, v, f"{impl} {v}") for impl, v, _ in spec.peers]
    values = []
    for impl, variant, _ in series:
        col = []
        for cid in case_ids:
            m = next((x for x in measurements if (x.case, x.impl, x.variant) == (cid, impl, variant)), None)
            col.append(getattr(m, metric) if (m and m.ok and getattr(m, metric) is not None) else np.nan)
        values.append(col)
    keep = [i for i, col in enumerate(values) if not np.all(np.isnan(col))]
    series, values = [series[i] for i in keep], [values[i] for i in keep]

    fig, ax = plt.subplots(figsize=(min(16.0, 2.0 + 0.3 * len(case_ids) * max(1, len(series))), 5.0))
    x = np.arange(len(case_ids))
    width = 0.8 / max(1, len(series))
    n_ours = sum(1 for impl, _, _ in series if impl == "cuinfer")
    ours_colors = plt.get_cmap("Blues")(np.linspace(0.9, 0.45, max(1, n_ours)))
    peer_colors = plt.get_cmap("Oranges")(np.linspace(0.8, 0.35, max(1, len(series) - n_ours)))
    for i, ((impl, _, label), col) in enumerate(zip(series, values, strict=True)):
        color = ours_colors[i] if impl == "cuinfer" else peer_colors[i - n_ours]
        hatch = None if impl == "cuinfer" else "//"
        ax.bar(x + (i - (len(series) - 1) / 2) * width, col, width, label=label, color=color, hatch=hatch,
               edgecolor="white" if impl == "cuinfer" else "0.3", linewidth=0.5)  # fmt: skip
    roof = data.get("roofline") or {}
    units = {"gbps": "GB/s", "tflops": "TFLOP/s", "us": "µs (host)"}[metric]
    if spec.ceiling == "copy" and roof.get("copy_gbps"):
        ax.axhline(roof["copy_gbps"], color="k", ls="--", lw=1, label=f"copy {roof['copy_gbps']:.0f} GB/s")
    if spec.ceiling == "matmul" and roof.get("matmul_tflops"):
        ax.axhline(roof["matmul_tflops"], color="k", ls="--", lw=1, label=f"bf16 mm {roof['matmul_tflops']:.0f}")
    ax.set_xticks(x)
    ax.set_xticklabels(case_ids)
    ax.set_ylabel(units)
    env = data.get("env") or {}
    ax.set_title(f"{spec.title}\n{env.get('gpu', '')} {data.get('started', '')}", fontsize=9)
    ax.legend(fontsize=7, ncol=min(5, len(series) + 1), loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
