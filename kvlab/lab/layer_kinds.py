"""Which layers of a model grow with the context, per architecture: each model's layer kinds, the memory its layout
needs at given lengths, the bytes each cache holds against its report, and each cache's decode step timed against
the context. Every function takes ``models`` (preset name -> loaded ``kvlab.Model``) and returns a pandas table;
the measurements close every cache they open."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..ort import DynamicCache, StaticCache, Stepper, generate, make_cache

_SHORT = {"full attention": "F", "conv state": "C", "linear attention (recurrent state)": "L"}  # any other: S


def layer_kinds(models: dict[str, Any], architectures: dict[str, str]) -> Any:
    """One row per model, indexed by preset: its architecture (``architectures[name]``; KeyError for a model it does
    not name), its layers' kinds in order (F full, S sliding, L linear, C conv), how many grow, the KV bytes one
    token adds and the bytes of its fixed-size states. Reads the layouts only."""
    import pandas as pd

    rows = []
    for name, m in models.items():
        layout = m.info.layout
        rows.append(
            {
                "preset": name,
                "architecture": architectures[name],
                "layers (F full, S sliding, L linear, C conv)": " ".join(
                    _SHORT.get(layer.kind.name, "S") for layer in layout.layers
                ),
                "growing layers": sum(layer.kind.grows for layer in layout.layers),
                "KV bytes / token": layout.bytes_per_token,
                "fixed state bytes": layout.fixed_bytes,
            }
        )
    return pd.DataFrame(rows).set_index("preset")


def memory_at_lengths(models: dict[str, Any], lengths: Sequence[int] = (1024, 8192, 32768)) -> Any:
    """One row per model, indexed by preset: its growing layers ("2 of 8"), the MiB its layout's report needs at each
    of ``lengths`` (multiples of 1024), and at the last length the MiB of fixed states in it and the MiB a ring
    buffer (each layer holding only the positions it attends to) would need; 3 decimals. Reads the layouts only."""
    import pandas as pd

    mib = 2**20
    rows = []
    for name, m in models.items():
        layers = m.info.layout.layers
        row: dict[str, Any] = {
            "preset": name,
            "growing layers": f"{sum(layer.kind.grows for layer in layers)} of {len(layers)}",
        }
        for n in lengths:
            report = m.info.layout.report(n)
            row[f"{n // 1024}k: MiB"] = round(report.total_bytes / mib, 3)
            if n == lengths[-1]:
                ring = sum(layer.fixed_bytes + layer.kind.attended(n) * layer.bytes_per_token for layer in layers)
                row[f"{n // 1024}k: of it state, MiB"] = round(report.fixed_bytes / mib, 3)
                row[f"{n // 1024}k: ring buffer, MiB"] = round(ring / mib, 3)
        rows.append(row)
    return pd.DataFrame(rows).set_index("preset")


def held_against_report(models: dict[str, Any], prompt: Sequence[int], device: Any, max_cache_len: int = 256) -> Any:
    """Per model and cache (a StaticCache of ``max_cache_len``, the same with ``states="in-place"`` where the model
    has states, a DynamicCache): 8 tokens generated after ``prompt`` on the opened ``device``, one row each: preset,
    cache spec, the bytes it held, whether that is the device's live-byte delta, whether its bytes per layer are
    its report's (a static cache's ``memory_report``, a dynamic one's layout at its length), and for a static cache
    whether no decode step allocated a buffer ("-" for the dynamic one). Raises what ``kvlab.generate`` raises."""
    import pandas as pd

    rows = []
    for name, m in models.items():
        for cache in (StaticCache(max_cache_len), StaticCache(max_cache_len, states="in-place"), DynamicCache()):
            if cache.kind == "static" and cache.states == "in-place" and not m.info.layout.states:
                continue
            before = device.live_bytes
            with cache:
                report = cache.memory_report(m.info) if cache.kind == "static" else None
                g = generate(m, prompt, cache=cache, max_new_tokens=8, stop_on_eos=False)
                expected = report.layers if report else m.info.layout.memory(cache.seq_length)
                rows.append(
                    {
                        "preset": name,
                        "cache": str(cache.spec),
                        "bytes held": cache.live_bytes,
                        "= device delta": cache.live_bytes == device.live_bytes - before,
                        "per layer = the report": cache.held_bytes_by_layer()
                        == {r.layer: r.total_bytes for r in expected},
                        "no new buffer after step 0": all(r.new_buffers == 0 for r in g.records[1:]) if report else "-",
                    }
                )
    return pd.DataFrame(rows)


def decode_step_times(
    models: dict[str, Any], contexts: Iterable[int], new_tokens: int, rounds: int, device: str = "cpu"
) -> tuple[dict[tuple[int, str, str], list[float]], dict[tuple[int, str], tuple[int, int]]]:
    """``rounds`` rounds of, per context (a prompt length) and model, a dynamic then a static cache of ``context +
    new_tokens`` fed the prompt then ``new_tokens`` single tokens through a ``kvlab.Stepper`` on ``device``. Returns
    (every decode step's wall ms keyed by (context, preset, kind); the (length, live bytes) each dynamic cache held
    at its end in the last round, keyed by (context, preset)). Raises what the stepper raises."""
    contexts = list(contexts)
    steps: dict[tuple[int, str, str], list[float]] = {}
    held: dict[tuple[int, str], tuple[int, int]] = {}
    for _ in range(rounds):
        for context in contexts:
            for name, m in models.items():
                ids = m.tokens_of("The KV cache keeps keys and values for every position. ", context)
                for kind in ("dynamic", "static"):
                    with (
                        make_cache(kind, context + new_tokens) as cache,
                        Stepper(m, cache, device, context + new_tokens) as stepper,
                    ):
                        stepper.step(ids, logits_out="none")
                        for _ in range(new_tokens):
                            _, record = stepper.step([7], logits_out="none")
                            steps.setdefault((context, name, kind), []).append(record.wall_ms)
                        if kind == "dynamic":
                            held[(context, name)] = (cache.seq_length, cache.live_bytes)
    return steps, held


def static_gains(steps: dict[tuple[int, str, str], list[float]], growing: Any, models: dict[str, Any]) -> Any:
    """What a StaticCache saves per decode step, from ``decode_step_times``'s ``steps`` at exactly two contexts, one
    row per model (indexed by preset, sorted by ``growing[name]``, its growing layers): KV bytes per token, per
    context each cache's 10th-percentile step ms and the ms saved, at the longer context the gain of the 10th
    percentiles and of the medians, and the ms saved per 1k more tokens. ValueError for other than two contexts."""
    import numpy as np
    import pandas as pd

    contexts = sorted({c for c, _, _ in steps})
    if len(contexts) != 2:
        raise ValueError(f"static_gains compares two contexts; the steps hold {contexts}")
    short, long = contexts
    rows = []
    for name, m in models.items():
        row: dict[str, Any] = {
            "preset": name,
            "growing layers": growing[name],
            "KV bytes / token": m.info.layout.bytes_per_token,
        }
        for context in contexts:
            dyn, sta = (np.percentile(steps[(context, name, k)], 10) for k in ("dynamic", "static"))
            row[f"{context}: dynamic ms"], row[f"{context}: static ms"] = round(dyn, 2), round(sta, 2)
            row[f"{context}: saved ms/step"] = round(dyn - sta, 2)
            if context == long:
                medians = [np.median(steps[(context, name, k)]) for k in ("dynamic", "static")]
                row[f"{context}: static gain"] = f"{dyn / sta - 1:+.0%}"
                row[f"{context}: median gain"] = f"{medians[0] / medians[1] - 1:+.0%}"
        saved = row[f"{long}: saved ms/step"] - row[f"{short}: saved ms/step"]
        row["saved ms per 1k more tokens"] = round(saved / ((long - short) / 1024), 2)
        rows.append(row)
    return pd.DataFrame(rows).set_index("preset").sort_values("growing layers")
