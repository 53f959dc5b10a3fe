"""kvlab.lab.noise: caches stepped in turns give paired per-step times; the verdict says what the numbers support,
the noise measured by an identical twin, and never more."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import kvlab
from kvlab.lab import noise


def test_paired_steps_take_every_cache_in_turns_with_the_same_tokens(toy):
    ids = toy.tokens_of("The cache keeps the keys and values.", 24)
    caches = {"static@64": kvlab.StaticCache(64), "static@64 again": kvlab.StaticCache(64),
              "dynamic": kvlab.DynamicCache()}  # fmt: skip
    steps = noise.paired_steps(toy, caches, ids, steps=6, twin_of="static@64")
    assert list(steps.columns) == ["position", "static@64", "static@64 again", "dynamic"]
    assert steps.position.tolist() == list(range(25, 31)) and (steps.drop(columns="position") > 0).all().all()
    with pytest.raises(kvlab.KvlabError):  # disposed at the end
        kvlab.generate(toy, [1, 2], cache=caches["dynamic"], max_new_tokens=1)


def frame(**columns: list[float]) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    return pd.DataFrame({"position": range(100, 100 + n), **columns})


def test_the_verdict_follows_the_numbers_not_the_lesson():
    rng = np.random.default_rng(0)
    base = 50 + rng.normal(0, 1, 24)
    quiet = frame(a=base, twin=base * (1 + rng.normal(0, 0.01, 24)), same=base * 1.005, slow=base * 1.5)
    table = noise.ratios(quiet, baseline="a", twin="twin")
    assert "Inside the noise: the same step time" in noise.verdict(table, "same", "same")
    assert "Outside the noise: slower, as the lesson says" in noise.verdict(table, "slow", "slower")
    assert "Outside the noise, slower: on this machine" in noise.verdict(table, "slow", "same")
    assert "Outside the noise but slower, not faster" in noise.verdict(table, "slow", "faster")
    pattern = np.tile([0.5, 1.6, 0.8, 1.2, 0.7, 1.4], 4)  # a loud machine: single steps x0.5-1.6 around 1
    loud = frame(a=base, twin=base * pattern, slow=base * 1.05 * np.roll(pattern, 1))
    table = noise.ratios(loud, baseline="a", twin="twin")
    assert "too noisy" in noise.verdict(table, "slow", "slower")  # a 5% effect under a x0.5-1.6 noise
    lo, hi = noise.noise_band(table)
    assert lo <= 1 <= hi
    with pytest.raises(ValueError, match="'bigger'"):
        noise.verdict(table, "slow", "bigger")


def test_the_chart_draws_a_box_per_cache_over_the_noise_band():
    base = np.linspace(40, 60, 12)
    steps = frame(a=base, twin=base * 1.02, slow=base * 1.4)
    fig = noise.ratio_chart(steps, noise.ratios(steps, baseline="a", twin="twin"))
    assert [t.type for t in fig.data] == ["box", "box"] and all(t.notched for t in fig.data)
    assert fig.layout.shapes[0].y0 <= 1 <= fig.layout.shapes[0].y1  # the band takes in 1
