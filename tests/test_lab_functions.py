"""The kvlab.lab functions the notebooks call that tests/test_lab_tables.py and tests/test_lab_memory.py leave out,
each against a reference worked out here from other sources (the checkpoint's config.json, the records, numpy): on
real runs of the toy model on the CPU EP, its built folder and the recorded profiles of data/where-a-cpu-step-goes."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest

import kvlab
from kvlab.core.errors import ConfigError
from kvlab.lab.graph_edits import with_constant_of_shape
from kvlab.lab.layer_kinds import decode_step_times, held_against_report, layer_kinds, memory_at_lengths, static_gains
from kvlab.lab.memory import KV_FORMATS, format_of, per_token_sources
from kvlab.lab.tables import low_decode_ms, text_until_eos
from kvlab.ort import Stepper
from kvlab.presets.recipes import checkpoint_dir

ARCH = {"toy": "llama (tiny)"}


@pytest.fixture(scope="module")
def config(toy) -> dict:
    """The toy checkpoint's config.json, read here: the reference for the layout-derived numbers."""
    return json.loads((checkpoint_dir("toy") / "config.json").read_text())


def kv_per_token(config: dict) -> int:
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 4  # float32


def test_low_decode_ms_is_the_10th_percentile_of_the_decode_steps(toy):
    with kvlab.DynamicCache() as cache:
        g = kvlab.generate(toy, [5, 6, 7], cache=cache, device="cpu", max_new_tokens=12, stop_on_eos=False,
                           token_on_device=False)  # fmt: skip
    decode = [r.wall_ms for r in g.records if r.phase == "decode"]  # each step timed on its own
    assert len(decode) == 11 and np.percentile(decode, 10) < np.median(decode)
    assert low_decode_ms(g) == pytest.approx(np.percentile(decode, 10))
    with kvlab.DynamicCache() as cache:
        assert math.isnan(low_decode_ms(kvlab.generate(toy, [5, 6], cache=cache, device="cpu", max_new_tokens=1)))


def test_text_until_eos_keeps_the_first_end_token_and_nothing_after(toy, config):
    eos = config["eos_token_id"]
    assert tuple(toy.info.eos_token_ids) == (eos,)
    ids = [5, 6, eos, 7, eos, 8]
    assert text_until_eos(toy, ids) == toy.decode([5, 6, eos])
    assert text_until_eos(toy, [5, 6, 7]) == toy.decode([5, 6, 7])  # no end token: all of them
    assert text_until_eos(toy, [eos, 5]) == toy.decode([eos])
    assert text_until_eos(toy, ids) != toy.decode(ids)  # the tokens after the end token are left out


def test_every_format_is_named_without_its_runtime():
    assert format_of("int8") == "HQQ 8 bits" and format_of("int4") == "optimum-quanto 4 bits"
    assert format_of("fp8") == "float8_e4m3, one scale per tensor"
    assert format_of("float16") == "an fp16 build of the model" and format_of("model") == "the model's own dtype"
    for p, (_, text) in KV_FORMATS.items():
        name = format_of(p)
        assert name and name in text and "PyTorch" not in name and "Runtime" not in name and "(" not in name
    with pytest.raises(ConfigError, match="kv_precision"):
        format_of("INT8")


def test_layer_kinds_read_each_layer_from_the_layout(toy, config):
    table = layer_kinds({"toy": toy}, ARCH)
    layers = config["num_hidden_layers"]
    assert table.loc["toy"].to_dict() == {
        "architecture": "llama (tiny)",
        "layers (F full, S sliding, L linear, C conv)": " ".join(["F"] * layers),
        "growing layers": layers,
        "KV bytes / token": kv_per_token(config),
        "fixed state bytes": 0,
    }
    with pytest.raises(KeyError):
        layer_kinds({"toy": toy}, {})


def test_memory_at_lengths_is_the_bytes_per_token_times_the_length(toy, config):
    table = memory_at_lengths({"toy": toy}, (1024, 3072))
    per_token, mib = kv_per_token(config), 2**20
    layers = config["num_hidden_layers"]
    assert table.loc["toy"].to_dict() == {
        "growing layers": f"{layers} of {layers}",
        "1k: MiB": round(1024 * per_token / mib, 3),
        "3k: MiB": round(3072 * per_token / mib, 3),
        "3k: of it state, MiB": 0.0,
        "3k: ring buffer, MiB": round(3072 * per_token / mib, 3),  # full attention: a ring holds every position
    }


def test_per_token_sources_agree_with_the_checkpoint_config(toy, config):
    row = per_token_sources({"toy": toy}, ARCH).loc["toy"].to_dict()
    assert row == {
        "architecture": "llama (tiny)",
        "layers": config["num_hidden_layers"],
        "layers keeping KV": config["num_hidden_layers"],
        "KV heads": config["num_key_value_heads"],
        "head_dim": config["head_dim"],
        "dtype": config["dtype"],
        "predicted B/token (config)": kv_per_token(config),
        "memory report B/token (graph)": kv_per_token(config),
        "fixed state bytes": 0,
    }
    with pytest.raises(KeyError):
        per_token_sources({"toy": toy}, {})


def test_held_against_report_finds_each_cache_holding_what_was_reported(toy, config):
    device = kvlab.open_device("cpu")
    before = (device.live_bytes, device.live_tensors)
    prompt = [5, 6, 7, 8, 9]
    table = held_against_report({"toy": toy}, prompt, device, max_cache_len=64)
    per_token = kv_per_token(config)
    assert list(table.cache) == ["static@64", "dynamic"]  # no states: no in-place row
    static, dynamic = table.to_dict("records")
    assert static["bytes held"] == 64 * per_token
    # 8 tokens generated: the cache holds the prompt and every token fed back (the last one is never fed)
    assert dynamic["bytes held"] == (len(prompt) + 7) * per_token
    assert static["= device delta"] is True and dynamic["= device delta"] is True
    assert static["per layer = the report"] is True and dynamic["per layer = the report"] is True
    assert static["no new buffer after step 0"] is True and dynamic["no new buffer after step 0"] == "-"
    assert (device.live_bytes, device.live_tensors) == before  # every cache closed


@pytest.fixture(scope="module")
def timed(toy):
    return decode_step_times({"toy": toy}, [4, 9], new_tokens=3, rounds=2)


def test_decode_step_times_time_every_decode_step_of_every_cache(toy, timed, config):
    steps, held = timed
    assert sorted(steps) == [(c, "toy", k) for c in (4, 9) for k in ("dynamic", "static")]
    assert all(len(ms) == 2 * 3 and min(ms) > 0 for ms in steps.values())
    # the dynamic cache ends holding the prompt and the 3 tokens fed after it
    assert held == {(c, "toy"): (c + 3, (c + 3) * kv_per_token(config)) for c in (4, 9)}
    assert [len(toy.tokens_of("The KV cache keeps keys and values for every position. ", c)) for c in (4, 9)] == [4, 9]


def test_static_gains_compare_the_percentiles_of_each_cache(toy, timed, config):
    steps, _ = timed
    table = static_gains(steps, {"toy": "2 of 2"}, {"toy": toy})
    row = table.loc["toy"].to_dict()
    p10 = {key: np.percentile(ms, 10) for key, ms in steps.items()}
    saved = {c: round(p10[c, "toy", "dynamic"] - p10[c, "toy", "static"], 2) for c in (4, 9)}
    assert row["growing layers"] == "2 of 2" and row["KV bytes / token"] == kv_per_token(config)
    for c in (4, 9):
        assert row[f"{c}: dynamic ms"] == round(p10[c, "toy", "dynamic"], 2)
        assert row[f"{c}: static ms"] == round(p10[c, "toy", "static"], 2)
        assert row[f"{c}: saved ms/step"] == saved[c]
    gain = p10[9, "toy", "dynamic"] / p10[9, "toy", "static"] - 1
    median = np.median(steps[9, "toy", "dynamic"]) / np.median(steps[9, "toy", "static"]) - 1
    assert row["9: static gain"] == f"{gain:+.0%}" and row["9: median gain"] == f"{median:+.0%}"
    assert "4: static gain" not in row
    assert row["saved ms per 1k more tokens"] == round((saved[9] - saved[4]) / (5 / 1024), 2)
    with pytest.raises(ValueError, match="two contexts"):
        static_gains({k: v for k, v in steps.items() if k[0] == 4}, {"toy": "2 of 2"}, {"toy": toy})


def digest(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_the_constant_of_shape_copy_adds_three_nodes_and_keeps_the_tokens(toy, tmp_path):
    import onnx

    src = toy.info.path
    before = digest(src)
    out = with_constant_of_shape(src, tmp_path / "cos")
    assert out == tmp_path / "cos" and digest(src) == before
    original, edited = (onnx.load(str(p / "model.onnx")) for p in (src, out))
    added = [n for n in edited.graph.node if n.name.startswith("lesson/")]
    assert [n.op_type for n in added] == ["Shape", "ConstantOfShape", "Add"]
    assert len(edited.graph.node) == len(original.graph.node) + 3 and added[-1].output == ["logits"]
    runs, logits = [], []
    for model in (toy, kvlab.load(out)):
        with kvlab.DynamicCache() as cache:
            runs.append(kvlab.generate(model, [5, 6, 7], cache=cache, device="cpu", max_new_tokens=6))
        with kvlab.DynamicCache() as cache, Stepper(model, cache, "cpu", 8) as stepper:
            logits.append(np.asarray(stepper.step([5, 6, 7])[0]))
    assert runs[0].token_ids == runs[1].token_ids
    assert logits[0].shape == logits[1].shape and np.array_equal(logits[0], logits[1])  # + zeros: the same logits
    with pytest.raises(FileExistsError):
        with_constant_of_shape(src, out)
    renamed = onnx.load(str(out / "model.onnx"))  # weights inline: no node outputs logits
    for n in renamed.graph.node:
        n.output[:] = [o.replace("logits", "out") for o in n.output]
    (tmp_path / "no-logits").mkdir()
    onnx.save(renamed, str(tmp_path / "no-logits" / "model.onnx"))
    (tmp_path / "no-logits" / "model.onnx.data").write_bytes(b"")
    with pytest.raises(StopIteration):
        with_constant_of_shape(tmp_path / "no-logits", tmp_path / "no-logits-out")


def test_op_shares_of_the_recorded_profiles_sum_every_other_operator():
    import csv

    from kvlab.lab import recorded
    from kvlab.lab.plots import op_share_bars
    from kvlab.lab.tables import op_shares

    rec = recorded.load("where-a-cpu-step-goes")
    main = ["MatMul", "GroupQueryAttention", "(between nodes)"]
    names = ["ops_256.csv", "ops_3072.csv"]
    share = op_shares({name: rec.read(name) for name in names}, main)
    expected = {}
    for name in names:  # the CSV read here, without kvlab
        with (rec.folder / name).open(newline="") as f:
            for row in csv.DictReader(f):
                if row["op"] != "(run)":
                    key = (name, row["op"] if row["op"] in main else "other ops")
                    expected[key] = expected.get(key, 0.0) + float(row["share"])
    got = {(r.profile, r.part): r.share for r in share.itertuples()}
    assert got.keys() == expected.keys() and all(got[k] == pytest.approx(v, abs=1e-12) for k, v in expected.items())
    fig = op_share_bars(share, "time by operator", "SmolLM2 · CPU EP", "recorded")
    assert [t.name for t in fig.data][-1] == "other ops"
    for trace in fig.data:  # one bar segment per profile, labelled with its percentage
        mine = {p: v for (p, part), v in expected.items() if part == trace.name}
        assert dict(zip(trace.y, trace.x)) == pytest.approx(mine)
        assert list(trace.text) == [f"{mine[p]:.0%}" for p in trace.y]
