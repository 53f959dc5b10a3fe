"""A benchmark's results: the environment they were measured in, the files they are written to (JSON, CSV,
charts) and the report of the targets, computed from the rows' fields (ratios come from paired runs)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..core.paths import write_atomic
from ..lab.style import PNG_ATTEMPTS
from ..ort import open_device, opened
from ..ort.runtime import memory
from ..ort.runtime.device import backend, describe
from .chart import bench_figure
from .variants import GENAI, GENAI_GRAPH, KVLAB, MATMULS_ONLY, SMALL_PAGES


def environment(bandwidth: dict[str, Any], genai_huge_bytes: int = 0) -> dict[str, Any]:
    """What a result was measured in: versions, backend, platform, CPU and Vulkan adapters, memory bandwidth, huge
    pages (kvlab's and the genai peer's), CPU EP options, the commit and the date."""
    env = describe()
    cpu = opened("cpu")
    huge = {**memory.state(), "cpu_session_bytes": cpu.huge_page_bytes if cpu else 0, "genai_bytes": genai_huge_bytes}
    env.update(
        {
            "backend_package": backend().package,
            "backend_version": backend().version,
            "bandwidth_gbps": bandwidth,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "huge_pages": huge,
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "cpu_ep_options": open_device("cpu").ep_options,  # threads always; spinning and huge pages when asked
        }
    )
    try:
        env["commit"] = os.environ.get("KVLAB_COMMIT") or (  # given: a copy of the tree whose git may be stale
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parents[2],
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        env["commit"] = "unknown"
    env["onnxruntime_genai"] = env["versions"].get("onnxruntime-genai", "missing")
    return env


def write_recording(path: str | os.PathLike, result: dict[str, Any], note: str = "not measured by this script") -> Path:
    """``result`` with the environment it was measured in (no memory bandwidth measured: ``note`` says why) written
    to ``path`` as JSON, atomically (the folder made first): how scripts/ record one run into data/."""
    recorded = {**result, "environment": environment({"note": note})}
    return write_atomic(path, json.dumps(recorded, indent=1, default=str) + "\n")


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` as CSV, a list value as its items space-separated, written whole or not at all (``write_atomic``)."""
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows({k: " ".join(f"{x:.3f}" for x in v) if isinstance(v, list) else v for k, v in r.items()} for r in rows)
    return write_atomic(path, text.getvalue())


def write(result: dict[str, Any], out: Path, charts: bool = True) -> list[Path]:
    """results.json, results.csv (each written whole or not at all: ``write_atomic``) and (unless disabled) one
    chart per (model, device) as HTML and PNG."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "results.json", out / "results.csv"]
    write_atomic(files[0], json.dumps(result, indent=1, default=float))
    write_csv(files[1], result["rows"])
    if charts and importlib.util.find_spec("plotly") is None:
        print(
            "kvlab bench: plotly is not installed: no charts (results.json has everything; `kvlab.bench.chart."
            "bench_figure` draws them later)"
        )
        charts = False
    if charts:
        for model, device in sorted({(r["model"], r["device"]) for r in result["rows"]}):
            fig = bench_figure(result, model, device)
            stem = out / f"{model}-{device}"
            fig.write_html(stem.with_suffix(".html"), include_plotlyjs="cdn")
            files.append(stem.with_suffix(".html"))
            for attempt in range(PNG_ATTEMPTS):  # kaleido's page can lose a race on a loaded machine: again
                try:
                    fig.write_image(stem.with_suffix(".png"), width=1100, height=600)
                    files.append(stem.with_suffix(".png"))
                    break
                except Exception as exc:  # noqa: BLE001 - kaleido needs a Chromium; the HTML is still there
                    if attempt == PNG_ATTEMPTS - 1:
                        print(f"kvlab bench: no PNG for {stem.name} after {PNG_ATTEMPTS} tries ({exc})")
    return files


def _is(row: dict[str, Any], runner: str, kind: str = "", variant: str = "") -> bool:
    return row["runner"] == runner and (not kind or row["cache_kind"] == kind) and row["cache_variant"] == variant


def report(result: dict[str, Any]) -> str:
    """The targets of the benchmark issue, computed from the rows (ratios come from paired runs): one line per CPU
    context, and per WebGPU buffer cache mode and context one line and its graph capture lines."""
    contexts: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for r in result["rows"]:
        contexts.setdefault((r["device"], r["model"], r["buffer_cache_mode"], r["context"]), []).append(r)
    lines = []
    for (device, model, mode, ctx), row in sorted(contexts.items()):  # the CPU's first
        if device == "cpu":
            lines.append(_cpu_line(model, ctx, row))
        else:
            lines += [_webgpu_line(model, mode, ctx, row), *capture_lines(row)]
    return "\n".join(lines)


def _cpu_line(model: str, ctx: int, row: list[dict[str, Any]]) -> str:
    """One CPU context: the best static cache against genai (target <= 0.9) and the dynamic cache, its roofline,
    and where measured the matmuls-only floor and the 4 KiB-pages twin."""
    static = min((r for r in row if _is(r, KVLAB, "static")), key=lambda r: r["decode_ms"])
    dynamic = next(r for r in row if _is(r, KVLAB, "dynamic"))
    line = f"{model} cpu ctx {ctx}: static {static['decode_ms']:.1f} ms ({static['variant']})"
    genai = next((r for r in row if _is(r, GENAI)), None)
    if genai:
        line += (
            f"; genai {genai['decode_ms']:.1f} ms -> static/genai "
            f"{static['decode_ms'] / genai['decode_ms']:.2f} (target <= 0.9; tokens equal: "
            f"{genai['tokens_equal'] and static['tokens_equal']})"
        )
    line += f"; dynamic/static {dynamic['decode_ms'] / static['decode_ms']:.1f}x"
    line += (
        f"; roofline {static['roofline_fraction']:.0%} (paired; "
        f"{static['roofline_fraction_at_run_best']:.0%} at the run's best bandwidth); Python's own time "
        f"{static['overhead_fraction']:.1%}; cpu steal {static['cpu_steal_fraction']:.1%}"
    )
    fit = next((r for r in row if _is(r, KVLAB, "static") and r["fitted"]), None)
    floor = next((r for r in row if _is(r, MATMULS_ONLY)), None)
    if floor and fit:  # how far the matrix products alone get; what the rest of a step adds
        rest = [a - b for a, b in zip(fit["decode_ms_runs"], floor["decode_ms_runs"])]
        line += (
            f"; matmuls alone {floor['decode_ms']:.1f} ms = {floor['roofline_fraction']:.0%} of their "
            f"roofline (paired), the rest of {fit['variant']}'s step {np.median(rest):.1f} ms "
            f"(per round {min(rest):.1f} to {max(rest):.1f})"
        )
    twin = next((r for r in row if _is(r, KVLAB, "static", SMALL_PAGES)), None)
    if twin and fit:
        ratios = [a / b for a, b in zip(fit["decode_ms_runs"], twin["decode_ms_runs"])]
        line += (
            f"; huge pages x{np.median(ratios):.2f} vs 4 KiB ({fit['variant']}, paired, faster in "
            f"{sum(x < 1 for x in ratios)}/{len(ratios)})"
        )
    return line


def _webgpu_line(model: str, mode: str, ctx: int, row: list[dict[str, Any]]) -> str:
    """One WebGPU context in one buffer cache mode: the dynamic cache against the worst static one (target >= 1),
    and each static cache against genai where it ran."""
    dynamic = next(r for r in row if _is(r, KVLAB, "dynamic"))
    statics = [r for r in row if _is(r, KVLAB, "static")]
    worst = max((r for r in statics if not r.get("token_on_device")), key=lambda r: r["ratio_to_dynamic"])
    line = (
        f"{model} webgpu/{mode} ctx {ctx}: dynamic {dynamic['decode_ms']:.1f} ms, "
        + ", ".join(f"{r['variant']} {r['decode_ms']:.1f} ms" for r in statics)
        + f"; dynamic/static {1 / worst['ratio_to_dynamic']:.2f}x (worst static; target >= 1)"
        + f"; static new buffers/step {max(r['new_buffers_per_step'] for r in statics):g}"
        + f"; Python's own time {worst['overhead_fraction']:.1%}"
    )
    genai = next((r for r in row if _is(r, GENAI)), None)
    if genai:

        def to_genai(r: dict[str, Any], equal: bool) -> str:  # r's steps over genai's, paired by round
            x = [a / b for a, b in zip(r["decode_ms_runs"], genai["decode_ms_runs"])]
            return f"{np.median(x):.3f} (paired, {min(x):.3f}-{max(x):.3f}; tokens equal: {equal})"

        line += f"; genai {genai['decode_ms']:.1f} ms -> static/genai {to_genai(worst, genai['tokens_equal'])}"
        for tok in (r for r in statics if r.get("token_on_device")):
            line += f"; {tok['variant']}/genai {to_genai(tok, tok['tokens_equal'])}"
    for packed in (r for r in row if r["runner"] == KVLAB and "kv-" in r["cache_variant"]):
        twin = next(
            r for r in row if _is(r, KVLAB, packed["cache_kind"]) and r["max_cache_len"] == packed["max_cache_len"]
        )
        line += (
            f"; {packed['variant']} {packed['decode_ms']:.1f} ms, {_paired(packed, twin)} of {twin['variant']} "
            f"(lossy KV, prefilled on WebGPU: tokens equal the first row's: {packed['tokens_equal']})"
        )
    return line


def _paired(a: dict[str, Any], b: dict[str, Any], key: str = "decode_ms_runs") -> str:
    ratios = [x / y for x, y in zip(a[key], b[key]) if y]
    return f"x{np.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "n/a"


def capture_lines(row: list[dict[str, Any]]) -> list[str]:
    """Graph capture against the same loop uncaptured, from paired runs: kvlab's captured static cache against
    its uncaptured twin (same size), genai captured against genai plain; wall time, the process's CPU time and
    the loop thread's CPU time per decode step."""

    def twin(cap: dict[str, Any]) -> dict[str, Any] | None:  # the same static cache, uncaptured
        variant = cap["cache_variant"].replace("graph", "", 1).lstrip("+")
        same = (u for u in row if _is(u, KVLAB, "static", variant) and u["max_cache_len"] == cap["max_cache_len"])
        return next(same, None)

    pairs = [(r, twin(r)) for r in row if r["runner"] == KVLAB and r["cache_variant"].startswith("graph")]
    pairs.append((next((r for r in row if _is(r, GENAI_GRAPH)), None), next((r for r in row if _is(r, GENAI)), None)))
    return [
        f"    graph capture {cap['variant']} vs {plain['variant']}: step {cap['decode_ms']:.2f} vs "
        f"{plain['decode_ms']:.2f} ms, paired {_paired(cap, plain)}; process CPU/step "
        f"{cap['cpu_ms']:.2f} vs {plain['cpu_ms']:.2f} ms ({_paired(cap, plain, 'cpu_ms_runs')}); loop "
        f"thread CPU/step {cap['thread_cpu_ms']:.2f} vs {plain['thread_cpu_ms']:.2f} ms "
        f"({_paired(cap, plain, 'thread_cpu_ms_runs')}); tokens equal: "
        f"{bool(cap['tokens_equal'] and plain['tokens_equal'])}"
        for cap, plain in pairs
        if cap is not None and plain is not None
    ]
