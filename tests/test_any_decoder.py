"""Any decoder a user brings: directories kvlab did not build, loaded as a new user would load them.

Fast: the tolerances (an input no node reads, another EP's provider options, no tokenizer files), the strictness (a
config that contradicts its graph), the transformers.js layout and its dtype rule, ``Model.describe`` and the engine
of ``kvlab inspect``, and the named refusal where the runtime lacks what a graph asks for; all made from the presets'
builds. Slow (the ``exporters`` fixture builds them): the matrix of tests/any_decoder.py, every case against
onnxruntime-genai on the same directory, and the table of docs/compatibility.md it renders.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from any_decoder import CASES, PAGE, Row, build_all, outcome, runtime, section, table
from conftest import write_concat_kv_model
from onnx import TensorProto, helper, numpy_helper

import kvlab
from kvlab import ConfigError, DeviceError, DynamicCache, ModelError, StaticCache, generate
from kvlab.ort.checks.inspect import report
from kvlab.ort.checks.references import genai_greedy
from kvlab.ort.models.describe import MAX_LINES, WIDTH
from kvlab.ort.runtime.device import backend
from kvlab.presets import ensure_checkpoint

PROMPT = [5, 17, 42, 99, 3, 250, 7, 11]


def tokens(model, cache=None) -> list[int]:
    with cache or DynamicCache() as c:
        return generate(model, PROMPT, cache=c, device="cpu", max_new_tokens=6, stop_on_eos=False).token_ids


def copy_dir(model, out: Path, graph_edit=None, config_edit=None, skip: tuple[str, ...] = ()) -> Path:
    """A copy of a model's directory, its graph changed by ``graph_edit`` and its
    genai_config by ``config_edit``, without the files named in ``skip``."""
    out.mkdir()
    for f in model.info.path.iterdir():
        if f.name in skip or "kvlab" in f.name:
            continue
        shutil.copy(f, out / f.name)  # (a link to the weights would be refused: they must be inside the model)
    if graph_edit:
        graph = onnx.load(str(out / "model.onnx"), load_external_data=False)
        graph_edit(graph)
        onnx.save(graph, str(out / "model.onnx"))
    if config_edit:
        config = json.loads((out / "genai_config.json").read_text())
        config_edit(config["model"])
        (out / "genai_config.json").write_text(json.dumps(config))
    return out


# ------------------------------------------------------------------------------------ tolerant where it costs nothing
def unread_position_ids(graph) -> None:
    graph.graph.input.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]))


def test_an_input_no_node_reads_is_left_unbound_and_reported(toy, tmp_path):
    """An LFM2-style export declares position_ids and never reads it: kvlab loads it (it used to refuse: 'graph
    inputs ['position_ids'] are not handled by kvlab'), binds nothing to it, and says so; the tokens are the toy's
    and onnxruntime-genai's on the same directory, with either cache."""
    d = copy_dir(toy, tmp_path / "m", graph_edit=unread_position_ids)
    m = kvlab.load(d)
    assert m.info.unread_inputs == ("position_ids",) and "position_ids" not in m.info.input_names
    expected = tokens(toy)
    assert tokens(m) == tokens(m, StaticCache(32)) == expected == genai_greedy(m, PROMPT, 6)
    assert "position_ids                         read by no node: left unbound" in m.describe()


def test_another_eps_provider_options_are_ignored_with_a_note(toy, tmp_path):
    def other_eps(model: dict) -> None:
        model["decoder"].setdefault("session_options", {})["provider_options"] = [
            {"cuda": {"enable_cuda_graph": "1"}},
            {"dml": {}},
        ]

    with pytest.warns(UserWarning, match=r"model m: genai_config.json sets provider options for cuda, dml; kvlab"):
        m = kvlab.load(copy_dir(toy, tmp_path / "m", config_edit=other_eps))
    note = (
        "genai_config.json sets provider options for cuda, dml; kvlab runs the CPU and WebGPU EPs, so it ignores them"
    )
    assert m.info.notes == (note,)
    assert tokens(m) == tokens(toy)
    assert "notes\n  genai_config.json sets provider options for cuda, dml" in m.describe()
    assert kvlab.load(toy.info.path).info.notes == ()  # the builder's own (an empty list for -e webgpu): no note


def test_a_directory_without_tokenizer_files_takes_token_ids_and_refuses_text_by_name(toy, tmp_path):
    skip = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
    m = kvlab.load(copy_dir(toy, tmp_path / "m", skip=skip))
    assert m.tokenizer is None and m.chat_template is None
    assert tokens(m) == tokens(m, StaticCache(32)) == tokens(toy)
    assert m.decode([72, 105]) == ""
    with pytest.raises(
        ModelError,
        match=r"model m has no tokenizer \(.* holds no tokenizer.json\), so the text "
        r"'hello' cannot become token ids; give the prompt as token ids",
    ):
        generate(m, "hello", max_new_tokens=2)
    assert "tokenizer: none (no tokenizer.json): prompts as token ids only" in m.describe()


# ------------------------------------------------------------------------------------------- strict where it matters
@pytest.mark.parametrize(
    "key, value, says",
    [
        ("num_hidden_layers", 3, r"says num_hidden_layers = 3, but model.onnx has KV inputs .* for 2 layers"),
        ("num_hidden_layers", 1, r"says num_hidden_layers = 1, but model.onnx has KV inputs .* for 2 layers"),
        ("num_attention_heads", 8, r"says num_attention_heads = 8, but '.*Attention' num_heads in model.onnx says 4"),
        ("num_key_value_heads", 1, r"says num_key_value_heads = 1, but input 'past_key_values.0.key' .* says 2"),
        ("head_size", 32, r"says head_size = 32, but the q\|k\|v projection feeding .* says 16"),
        ("context_length", 10**6, r"says context_length = 1000000, but the rotary table of .* holds 4096 positions"),
    ],
)
def test_a_config_that_contradicts_its_graph_is_refused_with_both_values(toy, tmp_path, key, value, says):
    def edit(model: dict) -> None:
        (model if key == "context_length" else model["decoder"])[key] = value

    with pytest.raises(ModelError, match=says):
        kvlab.load(copy_dir(toy, tmp_path / "m", config_edit=edit))


def test_a_rotary_table_groupqueryattention_cannot_take_is_refused_at_load(toy, tmp_path):
    """A partial rotary dimension of 8 (Nemotron's half of a head of 16) gives the rotary table 4 columns, which
    ONNX Runtime's GroupQueryAttention refuses at the first run (onnxruntime-genai too): kvlab names it at load."""

    def narrow_rotary(graph) -> None:
        for t in graph.graph.initializer:
            if t.name in ("cos_cache", "sin_cache"):
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t)[:, :4].copy(), t.name))

    d = copy_dir(toy, tmp_path / "m")
    graph = onnx.load(str(d / "model.onnx"))  # with its weights, written again below
    (d / "model.onnx.data").unlink()
    narrow_rotary(graph)
    onnx.save(graph, str(d / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    with pytest.raises(ModelError, match=r"the rotary table of '.*GroupQueryAttention' has 4 columns, for heads of 16"):
        kvlab.load(d)


# --------------------------------------------------------------------------------------------- transformers.js layout
@pytest.fixture(scope="module")
def transformers_js_dir(tmp_path_factory) -> Path:
    """An onnx-community directory of the toy: its checkpoint's config.json, generation_config.json and tokenizer
    files, and the builder's graphs as onnx/model.onnx (fp32), onnx/model_fp16.onnx and onnx/model_q4f16.onnx
    (int4 weights, float16 activations), each with its weights in <file>_data as transformers.js names them."""
    out = tmp_path_factory.mktemp("tjs") / "toy-ONNX"
    (out / "onnx").mkdir(parents=True)
    hf = ensure_checkpoint("toy")
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf / name, out / name)
    for precision, file in (("fp32", "model.onnx"), ("fp16", "model_fp16.onnx"), ("int4", "model_q4f16.onnx")):
        graph = onnx.load(str(kvlab.load("toy", precision=precision).onnx_path))
        onnx.save(graph, str(out / "onnx" / file), save_as_external_data=True, location=f"{file}_data")
    return out


def test_a_transformers_js_directory_loads_the_variant_transformers_js_would(transformers_js_dir):
    d = transformers_js_dir
    assert kvlab.load(d).info.decoder_file == "onnx/model.onnx"  # no dtype anywhere: fp32
    q = kvlab.load(d, dtype="q4f16")
    assert q.info.decoder_file == "onnx/model_q4f16.onnx" and q.info.precision.startswith("int4 weights, float16")
    int4 = kvlab.load("toy", precision="int4")
    assert tokens(q) == tokens(q, StaticCache(32)) == tokens(int4)  # the same graph: the same tokens
    assert kvlab.load(d, dtype="fp16").info.decoder_file == "onnx/model_fp16.onnx"
    with pytest.raises(
        ModelError,
        match=r"no onnx/model_q4.onnx, the file of dtype 'q4' .*one of \['fp32', 'fp16', "
        r"'q4f16'\]",
    ):
        kvlab.load(d, dtype="q4")
    with pytest.raises(ConfigError, match=r"dtype 'int3' is not a transformers.js dtype; choose one of \('fp32'"):
        kvlab.load(d, dtype="int3")
    with pytest.raises(ConfigError, match=r"dtype='q4f16' chooses among a transformers.js directory's"):
        kvlab.load(int4.info.path, dtype="q4f16")


def test_config_json_names_the_default_dtype_as_transformers_js_reads_it(transformers_js_dir, tmp_path):
    d = shutil.copytree(transformers_js_dir, tmp_path / "d", symlinks=True)
    config = json.loads((d / "config.json").read_text())
    for named, file in (
        ("fp16", "onnx/model_fp16.onnx"),
        ({"model": "q4f16"}, "onnx/model_q4f16.onnx"),
        ("auto", "onnx/model.onnx"),
    ):
        config["transformers.js_config"] = {"dtype": named}
        (d / "config.json").write_text(json.dumps(config))
        assert kvlab.load(d).info.decoder_file == file


# ---------------------------------------------------------------------------------------------- describe and inspect
KINDS = {
    "toy": ["KV, full attention", "GroupQueryAttention"],
    "conv-toy": ["conv state", "CausalConvWithState", "past.{0-1, 3-4, 6}.conv"],
    "gemma2-toy": ["KV, sliding window 16", "KV, full attention"],
    "hybrid-toy": ["conv + recurrent state", "LinearAttention", "position_ids"],
    "kv-shared-toy": ["shared: layer 3's KV (window 16)", "GroupQueryAttention (borrows)"],
}


@pytest.fixture(scope="module")
def models() -> dict[str, kvlab.Model]:
    return {name: kvlab.load(name, progress=False) for name in KINDS}


@pytest.mark.parametrize("name", KINDS)
def test_describe_fits_one_screen_and_names_every_layer_kind(models, name):
    text = models[name].describe()
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES and max(map(len, lines)) <= WIDTH, text
    for phrase in [*KINDS[name], "graph inputs: who feeds them", "input_ids", "  dynamic    runs"]:
        assert phrase in text, (phrase, text)
    assert report(models[name].info.path).splitlines()[1:] == lines[1:]  # (named by its directory there)


def test_describe_says_why_a_static_cache_cannot_run_and_what_would(tmp_path):
    m = kvlab.load(write_concat_kv_model(tmp_path / "concat"))
    text = m.describe()
    assert "  static     no [1]" in text and "[1] 2 present outputs do not come from a GroupQueryAttention node" in text
    assert "  ring       no [1]" in text  # a ring is a static cache too
    with pytest.raises(ModelError, match=r"'present.0.key' is made by 'Concat' node ''.*What works: a DynamicCache"):
        tokens(m, StaticCache(16))
    assert len(tokens(m)) == 6


def with_attribute(name: str, value: int):
    def edit(graph) -> None:
        for node in graph.graph.node:
            if node.op_type == "GroupQueryAttention":
                node.attribute.append(helper.make_attribute(name, value))

    return edit


def ring_on_sliding_layers(graph) -> None:
    for node in graph.graph.node:
        window = next((a.i for a in node.attribute if a.name == "local_window_size"), -1)
        if node.op_type == "GroupQueryAttention" and window > 0:
            node.attribute.append(helper.make_attribute("sliding_window_cache", 1))


def test_a_ring_buffer_the_builder_asks_for_is_run_plain(models, tmp_path):
    """The builder's -e cpu sets sliding_window_cache=1 on sliding layers: the op then evicts from a buffer of its
    window and refuses a shorter past (a DynamicCache's), and onnxruntime-webgpu 1.27 does not know the attribute.
    kvlab runs a plain copy of the graph beside it: past the window, both caches give the tokens of the same model
    built without it (gemma2-toy, window 16)."""
    source = models["gemma2-toy"]
    m = kvlab.load(copy_dir(source, tmp_path / "m", graph_edit=ring_on_sliding_layers))
    assert m.info.decoder_file == "model.kvlab-plain.onnx" and "asks GroupQueryAttention for a ring" in m.info.notes[0]
    prompt = PROMPT * 3  # 24 positions, then 6 more: past the window
    with DynamicCache() as d, StaticCache(64) as s:
        got = [generate(m, prompt, cache=c, max_new_tokens=6, stop_on_eos=False).token_ids for c in (d, s)]
    assert got[0] == got[1] == generate(source, prompt, max_new_tokens=6, stop_on_eos=False).token_ids
    assert "decoder model.kvlab-plain.onnx" in m.describe()


def schemas() -> dict:
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    return {s.name: s for s in C.get_all_operator_schema() if s.domain == "com.microsoft"}


def test_a_graph_asking_what_the_runtime_lacks_is_refused_naming_node_and_runtime(toy, tmp_path):
    """An attribute the installed runtime's schema does not have (and whose meaning kvlab cannot keep without it):
    kvlab names the runtime, the node and the attribute instead of ONNX Runtime's page of tensor names, and
    ``describe`` says no cache runs it."""
    m = kvlab.load(copy_dir(toy, tmp_path / "m", graph_edit=with_attribute("sliding_window_scale", 2)))
    package, version = backend().label_for("cpu")
    with pytest.raises(
        DeviceError,
        match=rf"{package} {version} cannot load this graph: its GroupQueryAttention has no attribute "
        r"'sliding_window_scale' \(node '/model/layers.0/attn/GroupQueryAttention' sets it.*kvlab's second environment",
    ):
        tokens(m)
    text = m.describe()
    assert "  dynamic    no [1]" in text and "cannot load the graph: its GroupQueryAttention has no" in text


# --------------------------------------------------------------------------------------------- the matrix (slow)
@pytest.fixture(scope="session")
def exporters() -> None:
    """Every case of the matrix exported (cached in the user cache dir; Optimum needs .venv-optimum)."""
    build_all(CASES)


def contract(row: Row, runtime: str) -> None:
    """What must hold of a case: where onnxruntime-genai runs it, kvlab's DynamicCache gives its tokens and its
    StaticCache too, or refuses naming the node (a graph whose attention does not share past and present); where
    genai cannot, kvlab runs it or refuses by name; no row has other tokens than genai's."""
    assert "tokens differ" not in row.dynamic + row.static, row
    if row.genai.startswith("export fails"):
        return
    if row.genai.startswith("runs"):
        assert row.dynamic == "tokens equal", row
        if row.shares_buffers:
            assert row.static == "tokens equal", row
        else:
            assert row.static.startswith("refused: StaticCache cannot use model") and "' node '" in row.static, row
        return
    for cell in (row.dynamic, row.static):
        assert cell.startswith(("runs", "refused")) or (
            cell.startswith("fails in ONNX Runtime") and cell.split(": ", 1)[1] in row.genai
        ), row
        if cell.startswith("refused"):
            named = (runtime, "StaticCache cannot use", "cannot run on the CPU EP")  # the runtime, the cache, the EP
            assert any(who in cell for who in named), row


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_matrix(exporters, case):
    contract(outcome(case), " ".join(backend().label_for(case.device)))


def test_the_compatibility_table_is_the_matrix(exporters):
    name = runtime()  # (named after backend())
    found = section(PAGE.read_text(), name)
    assert found is not None, f"{PAGE.name} has no table for {name}: run python tests/any_decoder.py"
    assert found == table([outcome(c) for c in CASES]), (
        f"the table for {name} is stale: run python tests/any_decoder.py"
    )
    assert np.all([outcome(c).dynamic != "-" for c in CASES if c.arch == "llama"])  # every llama case exported
