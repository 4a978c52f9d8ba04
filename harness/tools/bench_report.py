"""A bench report: bench-<operator>.json (the figures) and bench-<operator>.md (drawn from that JSON alone, so
`harness report` can redraw it, its targets judged anew)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..model import registry
from ..model.spec import OperatorSpec, short_dtype
from ..store.provenance import backend_provenance, device_class
from ..store.reports import atomic_write
from .bench_timing import MIN_CALLS
from .perf_targets import check_targets, target_lines

_KERNEL_NAME_WIDTH = 80  # a profiler's kernel name (templated C++) can run to hundreds of characters


def _fmt(x: Any, spec: str = ".3g") -> str:
    """A table cell: numbers formatted by ``spec``, None empty, anything else as text."""
    return "" if x is None else (format(x, spec) if isinstance(x, (int, float)) else str(x))


def _ms_cell(r: dict, key: str) -> str:
    """The median, with the 20th-80th percentile spread beside it where it was recorded."""
    spread = r.get(key + "_spread")
    return _fmt(r.get(key)) + (f" ({_fmt(spread[0])}-{_fmt(spread[1])})" if spread and r.get(key) is not None else "")


def _header_lines(payload: dict, baseline: str) -> list[str]:
    """Title, provenance, and what the figures are: the rooflines measured in this run, medians, spreads."""
    prov, bw, tf, rows = payload["provenance"], payload["copy_gbps"], payload["gemm_tflops"], payload["rows"]
    return [
        f"# Benchmark: `{payload['operator']}`",
        "",
        f"{prov['device']}, commit `{prov['commit']}`, {prov['date']}; "
        + ", ".join(f"{k} {v}" for k, v in prov["versions"].items())
        + ".",
        "",
        f"Measured in the same run: copy bandwidth **{bw:.0f} GB/s** (bytes read + written), bf16 GEMM "
        f"**{tf:.0f} TFLOP/s**. Times are medians (ms). `× {baseline}` is the speedup over the baseline "
        "backend on the same shape (higher is faster)"
        + ("; in brackets, the 20th-80th percentile spread of the calls (at least "
           f"{MIN_CALLS} timed, fewer only for a call slower than 100 ms)"
           if any(r.get("fwd_ms_spread") for r in rows) else " (this run recorded no spread)")
        + ". Bandwidth fractions use the operator's floor bytes (each input read once, each output written once).",
        "",
    ]


def _table_lines(rows: list[dict], baseline: str) -> list[str]:
    """One line per backend x case x dtype; a skipped or failed backend says why across its cells."""
    lines = [
        "| case | dtype | backend | fwd ms | bwd ms | fwd+bwd ms | fwd BW | bwd BW | TFLOP/s | peak extra GB | "
        f"× {baseline} (fwd+bwd) |",
        "|---" * 11 + "|",
    ]
    for r in rows:
        if "skip" in r or "error" in r:
            lines.append(
                f"| {r['case']} | {short_dtype(r['dtype'])} | {r['backend']} | "
                f"{'SKIP: ' + r['skip'] if 'skip' in r else 'ERROR: ' + r['error']} |" + " |" * 7
            )
            continue
        role = f" ({r['role']})" if r["role"] != "kernel" else ""
        lines.append(
            f"| {r['case']} | {short_dtype(r['dtype'])} | {r['backend']}{role} | "
            f"{_ms_cell(r, 'fwd_ms')} | {_ms_cell(r, 'bwd_ms')} | {_ms_cell(r, 'fwd_bwd_ms')} | "
            f"{_fmt(r.get('fwd_bw_frac'), '.0%')} | {_fmt(r.get('bwd_bw_frac'), '.0%')} | "
            f"{_fmt(r.get('tflops'), '.0f')} | "
            f"{_fmt(r.get('peak_extra_gb'), '.2f')} | {_fmt(r.get('speedup_fwd_bwd'), '.2f')} |"
        )
    return lines


def _profile_lines(rows: list[dict]) -> list[str]:
    """"Where the time goes": the device kernels of each profiled row (`harness bench --profile`), if any."""
    prof = [r for r in rows if r.get("kernels")]
    if not prof:
        return []
    lines = ["", "## Where the time goes", "",
             "Device kernels of one forward+backward (torch.profiler, mean of 3 calls), longest first.", ""]
    for r in prof:
        lines += [f"**{r['backend']}**, {r['case']}, {short_dtype(r['dtype'])}:", "",
                  "| kernel | launches | ms | share |", "|---|---|---|---|"]
        for k in r["kernels"]:
            name = k["kernel"]
            if len(name) > _KERNEL_NAME_WIDTH:
                name = name[: _KERNEL_NAME_WIDTH - 3] + "..."
            lines.append(f"| `{name.replace('|', '/')}` | {k['calls']:.3g} | {k['ms']:.3g} | {k['share']:.0%} |")
        lines.append("")
    return lines


def render_bench(payload: dict, baseline: str) -> str:
    """The markdown of a bench report from its JSON payload (so `harness report` can redraw it)."""
    rows = payload["rows"]
    lines = _header_lines(payload, baseline) + _table_lines(rows, baseline)
    notes = [f"- {r['backend']}, {r['case']}: {r['input_note']}" for r in rows if r.get("input_note")]
    if notes:
        lines += [""] + notes
    if payload.get("targets"):
        lines += ["", "## Targets", "", "The operator's declared targets on these shapes, judged on this run's "
                  "figures.", ""]
        lines += target_lines(payload["targets"])
    lines += _profile_lines(rows)
    return "\n".join(lines) + "\n"


def redraw(path: Path) -> Path | None:
    """Redraw a bench report's markdown from its JSON, its targets judged anew from the operator's current
    declaration (the measurements as recorded); None where the operator is unknown here."""
    payload = json.loads(path.read_text())
    try:
        op = registry.get_operator(payload["operator"])
    except KeyError:  # an operator of a plugin that this command did not load
        return None
    gpu = payload["provenance"].get("device_class", "cpu") != "cpu"
    payload["targets"] = check_targets(op.perf_targets, payload["rows"], gpu)
    atomic_write(path, json.dumps(payload, indent=1, default=str) + "\n")
    out = path.with_suffix(".md")
    atomic_write(out, render_bench(payload, op.baseline))
    return out


def write_bench_report(
    op: OperatorSpec, rows: list[dict], prov: dict, bw: float, tf: float, device: str, report_dir: str,
    chosen: list[registry.Backend],
) -> list[dict]:
    """Write and print one operator's bench report (a GPU's at the report root, others' under their device
    class); its targets judged, which it returns."""
    payload = {
        "operator": op.name,
        "provenance": prov,
        "copy_gbps": bw,
        "gemm_tflops": tf,
        "rows": rows,
        "targets": check_targets(op.perf_targets, rows, device.startswith("cuda")),
        "backends": {b.name: backend_provenance(b.source_files()) for b in chosen},
    }
    text = render_bench(payload, op.baseline)
    root = Path(report_dir)
    dst = root if device.startswith("cuda") else root / device_class(device)
    atomic_write(dst / f"bench-{op.name}.md", text)
    atomic_write(dst / f"bench-{op.name}.json", json.dumps(payload, indent=1, default=str) + "\n")
    print(text)
    return payload["targets"]
