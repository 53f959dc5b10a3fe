"""kvlab.lab.tables, kvlab.lab.runs.dynamic_static_pairs and kvlab.lab.timeline: what the lessons' cells call instead
of munging records themselves, on real generations of the toy model on the CPU EP."""

from __future__ import annotations

import numpy as np
import pytest

import kvlab
from kvlab.lab import plots
from kvlab.lab.runs import dynamic_static_pairs
from kvlab.lab.tables import adapter_report, agreement, cache_summary, comparisons, op_shares, precision_drift
from kvlab.lab.timeline import TensorTimeline


@pytest.fixture(scope="module")
def runs(toy):
    """Two rounds of (dynamic, static) runs, interleaved as a browser sends them back."""
    out = []
    for _ in range(2):
        for make in (kvlab.DynamicCache, lambda: kvlab.StaticCache(32)):
            with make() as cache:
                out.append(kvlab.generate(toy, [5, 6, 7, 8], cache=cache, device="cpu", max_new_tokens=5))
    return out


def test_the_summary_counts_what_each_cache_allocates_per_decode_step(toy, runs):
    table = cache_summary(runs[:2])
    tensors = 2 * toy.info.num_layers
    assert list(table.index) == ["dynamic", "static@32"]
    assert table.loc["dynamic", "KV tensors per decode step"] == tensors
    assert table.loc["static@32", "KV tensors per decode step"] == 0
    assert (table["context"] == 4).all()
    with pytest.raises(ValueError, match="no decode step"):
        with kvlab.DynamicCache() as cache:
            cache_summary([kvlab.generate(toy, [5, 6], cache=cache, device="cpu", max_new_tokens=1)])


def test_pairs_match_the_nth_dynamic_run_with_the_nth_static_one(runs):
    pairs = dynamic_static_pairs(runs[::-1])
    assert [(d.label.cache.kind, s.label.cache.kind) for d, s in pairs] == [("dynamic", "static")] * 2
    assert pairs[0] == (runs[2], runs[3]) and dynamic_static_pairs(runs[:1]) == []


def test_the_adapter_report_names_the_adapter_or_its_absence_and_every_problem():
    gpu = {"description": "G", "kind": "software", "backend": "vulkan", "reason": "only one", "shader_f16": None,
           "memory_bytes": 2**31, "source": "probe"}  # fmt: skip
    text = adapter_report({"adapter": gpu, "problems": [{"problem": "p", "fix": "f"}]}, "C")
    assert text.splitlines()[:2] == ["cpu    : C", "webgpu : G (software), on vulkan"]
    assert "memory : 2.0 GiB | found by probe" in text and "PROBLEM: p\n   fix : f" in text
    assert adapter_report({"adapter": None, "problems": []}, "C").endswith("no adapter (see `kvlab doctor`)")


def test_precision_drift_measures_each_precision_against_the_reference():
    ref = np.array([[0.0, 1.0, 0.5], [2.0, 0.0, 0.0]])
    other = ref + np.array([[0.0, 0.0, 0.25], [0.0, 2.5, 0.0]])  # position 1's argmax moves
    table = precision_drift({"fp32": ref, "fp16": other}, reference="fp32").data
    assert table.to_dict("records") == [
        {"precision": "fp16", "max |logit diff|, median over positions": 1.375, "worst position": 2.5,
         "argmax equal to fp32's": "1/2"}
    ]  # fmt: skip
    with pytest.raises(KeyError):
        precision_drift({"fp16": other}, reference="fp32")


def test_comparisons_read_the_tokens_as_agreement():
    assert agreement([1, 2, 3], [1, 2, 3]) == "identical" and agreement([1, 2, 3], [1, 9, 3]) == "differs from token 1"
    table = comparisons([("a vs b", "here", [1, 2], [1, 3], "close")]).data
    assert table.to_dict("records") == [
        {"compared": "a vs b", "on": "here", "tokens": "differs from token 1", "logits": "close"}
    ]


def test_the_timeline_counts_live_tensors_at_every_event(toy):
    device = kvlab.open_device("cpu")
    timeline = TensorTimeline(device)
    with pytest.raises(ValueError, match="no event"):
        timeline.figure("toy")
    cache = kvlab.StaticCache(16)
    timeline.mark("created")
    kvlab.generate(toy, [1, 2, 3], cache=cache, device=device, max_new_tokens=3, on_step=timeline.marking("run"))
    cache.dispose()
    timeline.mark("disposed")
    events = dict(timeline.events)
    assert events["created"] == 0 and events["run: step 0 (prefill)"] > 0
    assert events["disposed"] == 0 and len(timeline.events) == 5
    fig = timeline.figure("toy · cpu")
    assert list(fig.data[0].y) == [n for _, n in timeline.events]
    assert list(fig.layout.xaxis.ticktext) == ["created", "disposed"]


def test_op_shares_sum_the_other_operators_and_leave_out_the_run():
    live = [{"op": "MatMul", "share": 0.5}, {"op": "Add", "share": 0.1}, {"op": "Mul", "share": 0.2},
            {"op": "(run)", "share": 1.0}]  # fmt: skip
    share = op_shares({"live": live, "recorded": [{"op": "MatMul", "share": 0.9}]}, main=["MatMul"])
    got = {(r.profile, r.part): round(r.share, 6) for r in share.itertuples()}
    assert got == {("live", "MatMul"): 0.5, ("live", "other ops"): 0.3, ("recorded", "MatMul"): 0.9}
    fig = plots.op_share_bars(share, "time by operator", "toy")
    assert [t.name for t in fig.data] == ["MatMul", "other ops"] and "time by operator" in fig.layout.title.text
