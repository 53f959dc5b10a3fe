"""What does a static cache buy in PyTorch on a GPU, eager and as a CUDA graph? ms per decode token of SmolLM2-135M
fp16 and Llama-3.2-1B's shape in bf16 on an NVIDIA H200: eager DynamicCache, eager StaticCache, transformers'
compiled static cache and kvlab's CUDA-graph runner (``python -m kvlab.bench.pytorch``; record: see ``record*.py``
where present, the exact commands in the README).

    python data/pytorch-cuda-graphs/figure.py   # writes figure.png beside it
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.lab import recorded
from kvlab.lab.style import finish, go, legend_below, title, top_margin

RUNS = {"SmolLM2-135M fp16": "smollm2-135m_float16", "Llama-1B bf16": "llama-1b_bfloat16"}  # the full runs
MODES = {
    "eager-dynamic": "eager DynamicCache",
    "eager-static": "eager StaticCache",
    "hf-static-compile": "transformers, static + compile",
    "graph-capture": "kvlab CUDA graph, capture-only",
    "graph-compile": "kvlab CUDA graph, compiled",
}


def figure(rec: Any) -> Any:
    """ms per token per mode (log scale), one group of bars per model."""
    fig = go().Figure()
    results = {name: rec.read(f"{stem}.json")["results"] for name, stem in RUNS.items()}
    for mode, name in MODES.items():
        y = [results[m].get(mode, {}).get("ms_per_token") for m in RUNS]
        fig.add_bar(x=list(RUNS), y=y, name=name, text=[f"{v:.2f}" if v else "" for v in y])
    env = rec.read(f"{RUNS['SmolLM2-135M fp16']}.json")["environment"]
    t = title(
        "PyTorch decode on an NVIDIA H200: ms per token, recorded",
        f"torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']} · random weights · 512-token "
        "prompt, 256 new tokens",
        "a static cache is what lets the step be captured as one CUDA graph",
    )
    finish(fig, t, barmode="group", yaxis_type="log", yaxis_title="ms per token (log)", legend_y=-0.22)
    return fig


def mode_labels(rec: Any) -> dict[str, str]:
    """The name each recorded mode carries in notebook 05's tables and charts (mode -> label); "reduce" names the
    compiled, fused graph of the fastest recipe's runs (reduce attention, max-autotune)."""
    return {
        "eager-dynamic": "eager DynamicCache (kvlab loop)",
        "hf-dynamic": "eager DynamicCache (HF generate)",
        "eager-static": "eager StaticCache",
        "hf-static-compile": "HF generate, static + compile",
        "graph-capture": "kvlab graph, capture-only",
        "graph-capture-fused": "kvlab graph, capture-only, fused",
        "graph-compile": "kvlab graph, compiled",
        "graph-compile-fused": "kvlab graph, compiled, fused",
        "reduce": "kvlab graph, compiled (max-autotune), fused, reduce attention",
    }


def modes(rec: Any, labels: dict[str, str], recipe: str) -> Any:
    """One row per recorded run and mode of ``labels`` (``mode_labels``) without an error: model ("shape dtype"),
    mode (its label; a ``recipe`` run's graph-compile-fused row as ``labels["reduce"]``), run (the file's stem),
    ms/token, allocator requests/step, first call s, peak MiB, first divergence from the eager DynamicCache, kernels
    and kernel ms per step (where profiled) and the roofline ms. Runs: the full runs, the ``_final`` ones and the
    ``recipe`` ones (whose eager DynamicCache rows, as the ``_final`` ones', are left out). A pandas DataFrame;
    ConfigError for a run the folder lacks."""
    import pandas as pd

    rows = []
    for stem in (
        "smollm2-135m_float16",
        "smollm2-135m_bfloat16",
        "llama-1b_bfloat16",
        "smollm2-135m_float16_final",
        "llama-1b_bfloat16_final",
        f"smollm2-135m_float16{recipe}",
        f"llama-1b_bfloat16{recipe}",
    ):
        data = rec.read(f"{stem}.json")
        c = data["config"]
        for mode, r in data["results"].items():
            if "error" in r or mode not in labels:
                continue
            if (stem.endswith("_final") or stem.endswith(recipe)) and mode == "eager-dynamic":
                continue
            p = r.get("profile") or {}
            rows.append(
                {
                    "model": f"{c['shape']} {c['dtype']}",
                    "mode": labels["reduce" if stem.endswith(recipe) else mode],
                    "run": stem,
                    "ms/token": r["ms_per_token"],
                    "allocator requests/step": r["alloc_requests_per_step"],
                    "first call s": r.get("first_call_s"),
                    "peak MiB": r["peak_bytes"] / 2**20,
                    "first divergence": r.get("first_divergence_vs_eager_dynamic"),
                    "kernels/step": p.get("kernels_per_step"),
                    "kernel ms/step": p.get("kernel_ms_per_step"),
                    "roofline ms": c.get("roofline_ms_per_token"),
                }
            )
    return pd.DataFrame(rows)


def ms_per_token(rec: Any, best: Any, order: list[str], models: list[str]) -> Any:
    """``best`` (one row per model and mode, as ``modes`` gives them) as horizontal bars of ms/token on a log axis,
    modes in ``order`` (top to bottom reversed), models coloured in the order of ``models``, each model's HBM
    roofline a dotted line. A plotly Figure."""
    import plotly.express as px

    env = rec.read(f"{RUNS['SmolLM2-135M fp16']}.json")["environment"]
    ranked = best.sort_values("ms/token", ascending=False)
    fig = px.bar(
        ranked,
        x="ms/token",
        y="mode",
        color="model",
        barmode="group",
        orientation="h",
        log_x=True,
        template="plotly_white",
        height=600,
        category_orders={"mode": order[::-1], "model": models},
        text=ranked["ms/token"].round(2),
    )
    for _, rf in best.groupby("model")["roofline ms"].first().items():
        fig.add_vline(x=rf, line_dash="dot", line_color="gray")
    fig.update_traces(textposition="outside", textfont_size=10)
    ticks = [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100]
    fig.update_xaxes(range=[-1.3, 2.1], title="ms per token (log scale)", tickvals=ticks)
    t = title(
        "Decode time per token, recorded",
        f"{env['gpu']}, torch {env['torch']}, transformers {env['transformers']}; batch 1, 512-token prompt, "
        "256 new tokens",
        "dotted: HBM roofline (weights + KV read once per token at the measured copy bandwidth)",
    )
    fig.update_layout(title=t, margin={**top_margin(t), "l": 10}, legend=legend_below(-0.12), yaxis_title="")
    return fig


def divergence(rec: Any, labels: dict[str, str], recipe: str) -> str:
    """What notebook 05 says of Llama-1B bf16's diverging tokens: the eager DynamicCache's top-2 logit gaps, where
    each fused graph first diverged and the eager gap there, and the ``recipe`` run's teacher-forced agreement with
    the eager tokens (labels from ``mode_labels``). Lines of text; ConfigError for a run the folder lacks."""
    ll = rec.read("llama-1b_bfloat16_final.json")
    margins = ll["results"]["eager-dynamic"]["top2_margin"]
    lines = [
        f"Llama-1B bf16, eager DynamicCache: top-2 logit gap per generated token: min {margins['min']} median "
        f"{margins['median']} | steps with a gap below 0.05: {margins['steps_below_0.05']} of 256"
    ]
    for mode in ("graph-capture-fused", "graph-compile-fused"):
        r = ll["results"][mode]
        lines.append(
            f"{labels[mode]:36s} first divergence at token {r['first_divergence_vs_eager_dynamic']}, "
            f"where the eager top-2 gap was {r['eager_dynamic_top2_margin_at_divergence']}"
        )
    # teacher forcing: eager's tokens fed to the graph, each step's choice compared, so one flip changes one step
    tf = rec.read(f"llama-1b_bfloat16{recipe}.json")["results"]["graph-compile-fused"]["teacher_forced"]
    gaps = tf["eager_top2_margin_at_differ"]
    lines.append(
        f"{labels['reduce']}, teacher-forced: {tf['agree']}/{tf['steps']} steps choose eager's token; at the "
        f"{len(gaps)} others eager's own top-2 gap was {min(gaps)}-{max(gaps)} ({gaps.count(0.0)} exact ties)"
    )
    return "\n".join(lines)


if __name__ == "__main__":  # python data/<question>/figure.py: figure.png beside it
    recorded.load(Path(__file__).parent.name).figure().write_image(Path(__file__).with_name("figure.png"), width=1000)
