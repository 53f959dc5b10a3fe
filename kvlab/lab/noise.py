"""Timing on a noisy machine: decode steps of several caches taken in turns (each round in another order, so other
work on the machine lands on all of them), every cache's per-step ratio to a baseline with its spread, the machine's
own noise (an identical twin of the baseline timed the same way), and a verdict saying whether an effect stands out
of that noise. A lesson prints the verdict instead of asserting what a chart should show.

    steps = paired_steps(model, {"static@2304": StaticCache(2304), "static@2304 again": StaticCache(2304),
                                 "dynamic": DynamicCache()}, ids, steps=24, device="cpu")
    table = ratios(steps, baseline="static@2304", twin="static@2304 again")
    print(verdict(table, "dynamic", expect="slower"))

``fastest_runs`` is the cheaper, looser way: whole generations in interleaved rounds, each cache keeping its fastest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import Any

import numpy as np

from ..core.errors import check_choice
from ..core.generation import positions_needed
from ..ort import DynamicCache, Stepper, generate, load, open_device

LOW, HIGH = 10, 90  # the percentiles that bound a spread: 8 in 10 steps lie inside it
EXPECTATIONS = ("same", "slower", "faster")


def paired_steps(
    model: Any, caches: Mapping[str, Any], prompt_ids: Any, steps: int, device: str = "cpu", twin_of: str = ""
) -> Any:
    """Prefill ``prompt_ids`` into every cache of ``caches`` (name -> a fresh kvlab cache; the one named
    "<``twin_of``> again" receives a copy of ``twin_of``'s prefill instead), then take ``steps`` greedy decode steps
    in turns, each round starting one cache later. Returns a pandas frame, one row per round: ``position`` (the
    cache length after the step) and each cache's step wall ms. Every cache is disposed at the end; ValueError when
    the caches' greedy tokens part ways, and what the steps raise."""
    import pandas as pd

    model, device = load(model), open_device(device)
    ids = np.asarray(prompt_ids)
    positions = positions_needed(len(ids), steps + 1)
    names = list(caches)
    with ExitStack() as stack:
        steppers, tokens = {}, {}
        for name, cache in caches.items():
            stack.enter_context(cache)
            steppers[name] = stack.enter_context(Stepper(model, cache, device, positions))
        for name, s in steppers.items():
            if twin_of and name == f"{twin_of} again":
                s.receive(caches[twin_of])
                tokens[name] = tokens[twin_of]
            else:
                logits, _ = s.step(ids)
                tokens[name] = int(logits.argmax())
        rows = []
        for i in range(steps):
            row = {"position": len(ids) + i + 1}
            for name in names[i % len(names) :] + names[: i % len(names)]:
                logits, record = steppers[name].step([tokens[name]])
                tokens[name], row[name] = int(logits.argmax()), record.wall_ms
            if len(set(tokens.values())) > 1:
                raise ValueError(f"the caches' greedy tokens parted at step {i}: {tokens}")
            rows.append(row)
    return pd.DataFrame(rows)


def fastest_runs(
    model: Any, ids: Any, caches: Mapping[str, Callable[[], Any]], device: str, new_tokens: int, rounds: int = 2
) -> dict[str, Any]:
    """One warm-up generation, then ``rounds`` interleaved rounds of one greedy generation of ``new_tokens`` per cache
    (name -> a factory of a fresh kvlab cache, disposed after its run). Returns each cache's fastest run (by its
    median decode step): other work only ever adds time. Raises what ``generate`` raises."""
    model = load(model)
    with DynamicCache() as cache:
        generate(model, ids[:16], cache=cache, device=device, max_new_tokens=2)
    tried: dict[str, list[Any]] = {name: [] for name in caches}
    for _ in range(rounds):
        for name, make in caches.items():
            with make() as cache:
                tried[name].append(generate(model, ids, cache=cache, device=device, max_new_tokens=new_tokens,
                                            stop_on_eos=False))  # fmt: skip
    return {name: min(runs, key=lambda g: g.decode_ms()) for name, runs in tried.items()}


def ratios(steps: Any, baseline: str, twin: str) -> Any:
    """Every cache's per-step ratio to ``baseline`` (from the same round), summarised: a pandas frame indexed by cache
    with the median ratio, the single steps' ``LOW``-``HIGH`` percentiles and the median's ``notch`` (1.58 x IQR /
    sqrt(steps), a notched box plot's, roughly a 95% interval). The ``twin`` row is the noise."""
    import pandas as pd

    rows = {}
    for name in steps.columns.drop(["position", baseline]):
        r = steps[name] / steps[baseline]
        q1, q3 = np.percentile(r, [25, 75])
        rows[name] = {
            "median ratio": r.median(),
            "low": np.percentile(r, LOW),
            "high": np.percentile(r, HIGH),
            "notch": 1.58 * (q3 - q1) / np.sqrt(len(r)),
        }
    table = pd.DataFrame(rows).T
    table.attrs.update(baseline=baseline, twin=twin, steps=len(steps))
    return table


def noise_band(table: Any) -> tuple[float, float]:
    """The ratios an identical cache can show here (``ratios``'s twin row): its median +- its notch, widened to
    take in 1. A median ratio inside it is not told apart from the baseline on this machine."""
    twin = table.loc[table.attrs["twin"]]
    return min(twin["median ratio"] - twin["notch"], 1.0), max(twin["median ratio"] + twin["notch"], 1.0)


def verdict(table: Any, name: str, expect: str) -> str:
    """One sentence on cache ``name`` against ``table``'s baseline (``ratios``'s): its median ratio and notch, its
    single steps' spread, the noise band, and whether that supports ``expect`` (one of ``EXPECTATIONS``). The effect
    stands out only where the median's notch and the band do not overlap (the notched box plot's rule); otherwise
    it is "same", and a difference expected was too small for this machine's noise. ValueError for another
    ``expect``."""
    check_choice(expect, EXPECTATIONS, "expect=", ValueError)
    base, n = table.attrs["baseline"], table.attrs["steps"]
    r, (lo, hi) = table.loc[name], noise_band(table)
    median, notch = r["median ratio"], r["notch"]
    said = (
        f"{name} / {base}: median x{median:.2f} (x{median - notch:.2f}-{median + notch:.2f}) over {n} paired steps "
        f"(single steps x{r['low']:.2f}-{r['high']:.2f}); noise, two identical caches: x{lo:.2f}-{hi:.2f}"
    )
    side = "slower" if median - notch > hi else "faster" if median + notch < lo else ""
    if expect == "same":
        if not side:
            return f"{said}. Inside the noise: the same step time, as the lesson says."
        return f"{said}. Outside the noise, {side}: on this machine, this time, it did differ."
    if side == expect:
        return f"{said}. Outside the noise: {side}, as the lesson says."
    if not side:
        return (
            f"{said}. Inside the noise: this machine is too noisy (or too fast) to show it here; the exact counts "
            "and the recorded curve below show what it does."
        )
    return f"{said}. Outside the noise but {side}, not {expect}: see the exact counts and the recorded curve below."


def ratio_chart(steps: Any, table: Any) -> Any:
    """Every cache's per-step ratios to the baseline as a notched box (the notch: where its median may fall) with
    the single steps beside it, over the noise band (``noise_band``, grey) and 1. Returns a plotly figure."""
    from .style import KIND_COLORS, finish, go, title

    base, twin = table.attrs["baseline"], table.attrs["twin"]
    lo, hi = noise_band(table)
    fig = go().Figure()
    fig.add_hrect(y0=lo, y1=hi, fillcolor="#bbbbbb", opacity=0.35, line_width=0)
    fig.add_hline(y=1, line={"color": "#555", "width": 1})
    for name in table.index:
        kind = name.split("@")[0].split()[0]
        color = "#7f7f7f" if name == twin else KIND_COLORS.get(kind, "#9467bd")
        fig.add_box(
            y=steps[name] / steps[base], name=f"{name} / {base}", notched=True, boxpoints="all", jitter=0.4,
            pointpos=-1.6, marker={"color": color, "size": 4}, line={"color": color},
        )  # fmt: skip
    t = title(
        f"Each step's time over {base}'s, in the same round",
        f"{table.attrs['steps']} paired, interleaved steps a cache; boxes: quartiles, notch: where the median may fall",
        f"grey band: the noise, where the median of two identical caches ({twin} / {base}) may fall",
    )
    return finish(fig, t, yaxis_title="ratio (1: the same time)", showlegend=False, height=430)
