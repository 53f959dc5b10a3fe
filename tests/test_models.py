"""Loading builder directories, graph inspection, tokenizers and chat templates."""

from __future__ import annotations

import json
import shutil

import pytest

import kvlab
from kvlab import ModelError
from kvlab.ort.models.build import fold_attention_scale
from kvlab.presets import RECIPES, TinyLlama, byte_tokenizer


def test_smollm2_info(smollm2):
    i = smollm2.info
    assert (i.num_layers, i.num_heads, i.num_kv_heads, i.head_dim, i.vocab_size) == (30, 9, 3, 64, 49152)
    assert i.dtype_name == "float32" and i.shares_buffers and i.eos_token_ids == (2,)
    assert [e.past for e in i.entries[:2]] == ["past_key_values.0.key", "past_key_values.0.value"]
    assert [e.present for e in i.entries[-2:]] == ["present.29.key", "present.29.value"]
    assert i.context_length == 8192
    assert json.loads((i.path / "kvlab_recipe.json").read_text())["attention_scale_folded_layers"] == 30


def test_kv_heavy_crosses_the_webgpu_buckets(kv_heavy):
    """Each KV tensor grows 4 KiB per token: it crosses 4, 8, 12 and 16 MiB at 1024, 2048, 3072, 4096 tokens."""
    i = kv_heavy.info
    per_tensor = i.num_kv_heads * i.head_dim * 4
    assert per_tensor == 4096 and 2 * i.num_layers == 24
    assert i.context_length >= 4096 + 256


def test_chat_template_matches_transformers(smollm2):
    from transformers import AutoTokenizer

    from kvlab.ort.checks.references import hf_checkpoint

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Why cache keys?"},
    ]
    hf = AutoTokenizer.from_pretrained(hf_checkpoint(smollm2))
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert smollm2.apply_chat_template(messages) == want
    assert smollm2.encode(messages).tolist() == hf(want, add_special_tokens=False)["input_ids"]
    assert smollm2.encode("plain text").tolist() == hf("plain text")["input_ids"]


def test_byte_tokenizer_round_trips_any_text(toy):
    text = "Grüße, 世界! \t tabs\nand emoji 🚀"
    ids = toy.encode(text)
    assert toy.decode(ids) == text and max(ids) < 259


def _copy(model, tmp_path):
    return shutil.copytree(model.info.path, tmp_path / "m")


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("missing_dir", "is neither a built-in name .* nor an existing directory"),
        ("no_config", "has no genai_config.json: not an onnxruntime-genai model builder output"),
        ("bad_json", "genai_config.json is not valid JSON"),
        ("no_layers", "genai_config.json has no 'model.decoder.num_hidden_layers'"),
        ("no_onnx", "the decoder file 'model.onnx' named in genai_config.json is missing"),
        ("bad_onnx", "is not a readable ONNX model"),
        ("encoder", "has an encoder; kvlab supports decoder-only models"),
    ],
)
def test_malformed_model_dirs(toy, tmp_path, breakage, message):
    d = _copy(toy, tmp_path)
    cfg = json.loads((d / "genai_config.json").read_text())
    if breakage == "missing_dir":
        d = tmp_path / "nope"
    elif breakage == "no_config":
        (d / "genai_config.json").unlink()
    elif breakage == "bad_json":
        (d / "genai_config.json").write_text("{model: ")
    elif breakage == "no_layers":
        del cfg["model"]["decoder"]["num_hidden_layers"]
        (d / "genai_config.json").write_text(json.dumps(cfg))
    elif breakage == "no_onnx":
        (d / "model.onnx").unlink()
    elif breakage == "bad_onnx":
        (d / "model.onnx").write_bytes(b"not a protobuf at all" * 10)
    elif breakage == "encoder":
        cfg["model"]["type"] = "whisper"
        (d / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=message):
        kvlab.load(d)


def test_unknown_model_name():
    with pytest.raises(
        ModelError,
        match=r"'tiny' is neither a built-in name \(toy, kv-heavy, smollm2, phi4-kv, smollm2-shape, sliding-toy, "
        r"gemma2-toy, mistral-toy, hybrid-toy, conv-toy, kv-shared-toy\)",
    ):
        kvlab.load("tiny")


def test_user_directory_loads_like_a_builtin(toy, tmp_path):
    model = kvlab.load(_copy(toy, tmp_path))
    assert model.name == "m" and model.info.num_layers == toy.info.num_layers
    assert (
        kvlab.generate(model, [1, 2], max_new_tokens=3, stop_on_eos=False).token_ids
        == kvlab.generate(toy, [1, 2], max_new_tokens=3, stop_on_eos=False).token_ids
    )


def test_recipes_are_validated():
    with pytest.raises(kvlab.ConfigError, match=r"TinyLlama.heads=6 must be a multiple of kv_heads=4"):
        TinyLlama(layers=1, hidden=64, heads=6, kv_heads=4, head_dim=16, intermediate=64, vocab=300, context=64)
    with pytest.raises(kvlab.ConfigError, match=r"TinyLlama.layers=0 must be a positive int"):
        TinyLlama(layers=0, hidden=64, heads=4, kv_heads=4, head_dim=16, intermediate=64, vocab=300, context=64)
    assert set(RECIPES) == {
        "toy",
        "kv-heavy",
        "smollm2",
        "phi4-kv",
        "smollm2-shape",
        "sliding-toy",
        "gemma2-toy",
        "mistral-toy",
        "hybrid-toy",
        "conv-toy",
        "kv-shared-toy",
    }
    assert byte_tokenizer(300).get_vocab_size() == 259


def test_a_missing_builtin_is_rebuilt(tmp_path, monkeypatch):
    """Built models live in the user cache dir; a fresh cache dir rebuilds (here the toy, ~20 s)."""
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path))
    model = kvlab.load("toy", progress=False)
    assert str(model.info.path).startswith(str(tmp_path)) and (model.info.path / "kvlab_recipe.json").is_file()
    a = kvlab.generate(model, [1, 2, 3], max_new_tokens=5, stop_on_eos=False).token_ids
    monkeypatch.delenv("KVLAB_CACHE_DIR")
    assert a == kvlab.generate(kvlab.load("toy"), [1, 2, 3], max_new_tokens=5, stop_on_eos=False).token_ids


def test_a_build_another_process_finished_first_is_kept(tmp_path, monkeypatch):
    """Two builds of one model at once (two notebooks, a notebook and a test run): the one that lands first stays,
    untouched for whoever is loading from it, the later one is discarded, no scratch directory is left; an
    unfinished directory (no marker) is replaced. The other process is played here by writing its finished
    directory while this build runs (fault injection: the race cannot be produced on demand)."""
    from kvlab.presets import recipes

    final = tmp_path / "model"
    with recipes.building(final, "done") as tmp:
        (tmp / "done").write_text("this build")
        final.mkdir()
        (final / "done").write_text("the other build")
        inode = final.stat().st_ino
    assert (final / "done").read_text() == "the other build" and final.stat().st_ino == inode
    assert [p.name for p in tmp_path.iterdir()] == ["model"]

    real_replace = recipes.os.replace

    def lands_just_before(src, dst):  # the other build's rename lands between the check and this rename
        final.mkdir()
        (final / "done").write_text("the other build, later")
        real_replace(src, dst)  # a directory onto a non-empty one: OSError

    (final / "done").unlink()  # unfinished, so this build goes on to its rename
    monkeypatch.setattr(recipes.os, "replace", lands_just_before)
    with recipes.building(final, "done") as tmp:
        (tmp / "done").write_text("this build")
    monkeypatch.undo()
    assert (final / "done").read_text() == "the other build, later"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]

    (final / "done").unlink()  # an unfinished build: replaced by this one
    with recipes.building(final, "done") as tmp:
        (tmp / "done").write_text("this build")
    assert sorted(p.name for p in final.iterdir()) == ["done"] and (final / "done").read_text() == "this build"


def _write_attention_graph(out, head_dim: int, q_norm: bool = False):
    """One real GroupQueryAttention layer fed by a packed QKV MatMul (weights in an external file, as the
    builder writes them), with rotary embedding and a 20-token past in a shared buffer; optionally a q-norm-like
    LayerNormalization between them, where a folded scale would be normalized away."""
    import numpy as np
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    heads, kv_heads, hidden, past, length = 4, 2, 32, 20, 32
    rng = np.random.default_rng(head_dim)
    width = (heads + 2 * kv_heads) * head_dim
    nodes = [h.make_node("MatMul", ["x", "w"], ["qkv"])]
    if q_norm:
        nodes.append(h.make_node("LayerNormalization", ["qkv", "g"], ["qkv_n"], axis=-1))
    nodes.append(
        h.make_node(
            "GroupQueryAttention",
            ["qkv_n" if q_norm else "qkv", "", "", "pk", "pv", "seqlens_k", "total", "cos", "sin"],
            ["out", "pk_out", "pv_out"],
            domain="com.microsoft",
            num_heads=heads,
            kv_num_heads=kv_heads,
            do_rotary=1,
        )
    )
    kv = lambda name: h.make_tensor_value_info(name, T.FLOAT, [1, kv_heads, length, head_dim])  # noqa: E731
    # q and k of unit scale, so no one score saturates the softmax and a wrongly scaled query shows
    inits = [
        numpy_helper.from_array(rng.normal(0, hidden**-0.5, size=(hidden, width)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(size=(length, head_dim // 2)).astype(np.float32), "cos"),
        numpy_helper.from_array(rng.normal(size=(length, head_dim // 2)).astype(np.float32), "sin"),
    ]
    if q_norm:
        inits.append(numpy_helper.from_array(np.ones(width, np.float32), "g"))
    graph = h.make_graph(
        nodes,
        "gqa",
        [
            h.make_tensor_value_info("x", T.FLOAT, [1, 1, hidden]),
            kv("pk"),
            kv("pv"),
            h.make_tensor_value_info("seqlens_k", T.INT32, [1]),
            h.make_tensor_value_info("total", T.INT32, []),
        ],
        [h.make_tensor_value_info("out", T.FLOAT, [1, 1, heads * head_dim]), kv("pk_out"), kv("pv_out")],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    onnx.save(model, out, save_as_external_data=True, location="weights.data", size_threshold=0)
    feeds = {
        "x": rng.normal(size=(1, 1, hidden)).astype(np.float32),
        "pk": rng.normal(size=(1, kv_heads, length, head_dim)).astype(np.float32),
        "pv": rng.normal(size=(1, kv_heads, length, head_dim)).astype(np.float32),
        "seqlens_k": np.array([past], np.int32),
        "total": np.array(past + 1, np.int32),
    }
    return feeds


@pytest.mark.parametrize("head_dim, q_norm, folds", [(64, False, 1), (16, False, 1), (32, False, 0), (64, True, 0)])
def test_attention_scale_folding_is_exact_and_only_where_exact(tmp_path, head_dim, q_norm, folds):
    """Folding 1/sqrt(head_dim) into the query weights keeps the attention output (compared with ONNX Runtime
    on the graph as built); it is done only for power-of-two scales (64, 16) and a MatMul feeding GQA directly."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    path = tmp_path / "model.onnx"
    feeds = _write_attention_graph(path, head_dim, q_norm)
    run = lambda: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)  # noqa
    before, weights = run(), (tmp_path / "weights.data").read_bytes()
    assert fold_attention_scale(path) == folds
    after = run()
    scale = [
        a.f
        for a in next(n for n in onnx.load(str(path)).graph.node if n.op_type == "GroupQueryAttention").attribute
        if a.name == "scale"
    ]
    if folds:
        assert scale == [1.0] and (tmp_path / "weights.data").read_bytes() != weights
    else:
        assert scale == [] and (tmp_path / "weights.data").read_bytes() == weights
    for b, a in zip(before, after):  # the output and the updated KV (rotated keys)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_decoder_file_genai_config_names_is_the_one_inspected_and_run(toy, tmp_path):
    """genai_config.json may name its decoder anything: kvlab must inspect and run that file, even when a
    model.onnx of another model lies beside it (it once inspected one and ran the other)."""
    from conftest import write_concat_kv_model

    d = _copy(toy, tmp_path)
    (d / "model.onnx").rename(d / "decoder.onnx")
    shutil.copy(write_concat_kv_model(tmp_path / "other") / "model.onnx", d / "model.onnx")  # a decoy
    cfg = json.loads((d / "genai_config.json").read_text())
    cfg["model"]["decoder"]["filename"] = "decoder.onnx"
    (d / "genai_config.json").write_text(json.dumps(cfg))
    model = kvlab.load(d)
    assert model.onnx_path == d / "decoder.onnx" and model.info.shares_buffers
    with kvlab.StaticCache(16) as cache:
        got = kvlab.generate(model, [1, 2, 3], cache=cache, max_new_tokens=4, stop_on_eos=False).token_ids
    assert got == kvlab.generate(toy, [1, 2, 3], max_new_tokens=4, stop_on_eos=False).token_ids
    # the decoder's own graph, or the greedy graph kvlab derives from it (the token on the device)
    assert any(s.startswith(str(d / "decoder.")) for s in kvlab.open_device("cpu").sessions)
