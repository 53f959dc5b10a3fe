"""How much device memory does a StaticCache take on a real GPU, against its exact KV bytes? phi4-kv in fp32 and
fp16 on an NVIDIA H200's WebGPU, one process per point: the GPU memory the process gained as the cache allocated
(NVML) beside kvlab's exact KV bytes (``record_memory.py``).

    python data/memory-on-a-gpu/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import KIND_COLORS, SHADES, finish, go, title

GIB = 1 << 30


TITLE = (  # the figure's title, subtitle and note
    "A StaticCache's device memory on an NVIDIA H200, recorded",
    "phi4-kv (32 layers x 8 KV heads x 128) · onnxruntime-webgpu 1.27 · one process per point",
    "the pool rounds each of the 64 KV tensors up to its bucket: 1.3-2x the exact bytes",
)


def figure(rec: Any) -> Any:
    """Per precision, against the context: the static cache's exact KV bytes and the GPU memory NVML saw it take."""
    rows = [r for res in rec.results["fresh_process"] for r in res["rows"] if r["cache"] == "static"]
    fig = go().Figure()
    for precision, color in (("fp32", KIND_COLORS["static"]), ("fp16", SHADES["static"][1])):
        mine = sorted((r for r in rows if r["precision"] == precision), key=lambda r: r["context"])
        x = [r["context"] for r in mine]
        exact = [r["live_cache_bytes_last"] / GIB for r in mine]
        grown = [(r["nvml_opened_bytes"] - r["nvml_before_bytes"]) / GIB for r in mine]
        fig.add_scatter(x=x, y=exact, name=f"{precision}: exact KV bytes", line={"color": color, "dash": "dot"})
        fig.add_scatter(x=x, y=grown, name=f"{precision}: GPU memory taken (NVML)", line={"color": color})
    finish(
        fig,
        title(*TITLE),
        xaxis_type="log",
        xaxis_title="context (tokens; positions = context + 16)",
        yaxis_title="GiB",
    )
    return fig


def exact_and_pooled(rec: Any, contexts: Sequence[int]) -> Any:
    """Per precision, at each of ``contexts`` (recorded contexts, in tokens): the static cache's exact KV bytes (the
    config's prediction), the same with each of its 64 tensors rounded up to its pool bucket, and the GPU memory
    NVML saw it take, drawn by ``kvlab.lab.memory.bytes_figure``. A plotly Figure; KeyError for a context the
    recording lacks."""
    from kvlab.core.buckets import bucket_of
    from kvlab.lab import memory

    runs = rec.results["fresh_process"]
    by = {(r["precision"], r["context"]): r for res in runs for r in res["rows"] if r["cache"] == "static"}
    lines, points = [], []
    for p in ("fp32", "fp16"):
        rows = [by[(p, c)] for c in contexts]
        per_token = rows[0]["predicted_config_bytes"] / rows[0]["positions"]
        held = [r["live_cache_bytes_last"] for r in rows]
        lines.append(memory.Line(f"phi4-kv {p}, exact (= the config's prediction)", held, per_token))
        pooled = [64 * bucket_of(b // 64) for b in held]
        lines.append(
            memory.Line(f"phi4-kv {p}, 64 tensors each rounded up to its pool bucket", pooled, per_token, False)
        )
        grown = [(c, r["nvml_opened_bytes"] - r["nvml_before_bytes"]) for c, r in zip(contexts, rows)]
        points.append((f"H200, {p}: NVML growth as the cache allocates (recorded)", grown))
    run = runs[0]
    return memory.bytes_figure(
        contexts,
        lines,
        points=points,
        what="Recorded: a StaticCache's device memory on an NVIDIA H200",
        common=f"phi4-kv, onnxruntime-webgpu {run['environment']['backend_version']} on {run['adapter']}; "
        "NVML per process, one process per point",
        note="recorded in data/memory-on-a-gpu (not run here); positions = context + 16",
    )


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
