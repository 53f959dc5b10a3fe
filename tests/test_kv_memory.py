"""KV precision as a cache setting on PyTorch (the ONNX Runtime caches': tests/test_kv_packed.py): bad settings,
quantized KV running for real (transformers' QuantizedCache with HQQ and optimum-quanto), its exact bytes, and the
recorded quality rows of data/kv-quality/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import kvlab
from kvlab.pytorch import quantized as q

pytest.importorskip("torch")
QUALITY = Path(__file__).resolve().parents[1] / "data" / "kv-quality" / "kv-quality.json"
sys.path.insert(0, str(QUALITY.parent))
import kv_quality  # noqa: E402  (the recording's own script, imported by path)


def test_pytorch_kv_precision_settings_are_checked():
    with pytest.raises(kvlab.ConfigError, match=r"kv_precision='int3' is not valid on PyTorch; choose one of"):
        q.QuantizedKV("int3")
    with pytest.raises(kvlab.ConfigError, match=r"QuantizedKV.group_size=0 must be a positive int"):
        q.QuantizedKV("int4", group_size=0)
    with pytest.raises(kvlab.ConfigError, match=r"with cache='static'.*Use cache='quantized'"):
        q.quantized_setting("static", "int8")
    with pytest.raises(kvlab.ConfigError, match=r"contradicts"):
        q.quantized_setting(q.QuantizedKV("int4"), "int8")
    assert q.quantized_setting("quantized", None) == q.QuantizedKV("int8")
    assert q.quantized_setting("dynamic", None) is None


@pytest.fixture(scope="module")
def tiny():
    return kvlab.pytorch.random_model("tiny", seed=1, std=0.1)  # std 0.1: logits peaked enough to tell precisions apart


def test_int8_and_int4_kv_run_for_real_and_cost_what_they_should(tiny):
    """Teacher-forced over 384 random tokens in chunks of 128 (so later chunks attend to a quantized past): int8
    stays within KL 1e-4 of the float32 KV and keeps >= 98% of the top-1 tokens; int4 loses ten times more (measured
    here: 3.7e-6 and 1.1e-3); the bytes held, measured, are what the formats imply (each 128-token chunk empties the
    residual window): 512, 144 (1 byte + 2 float32 per 64 values) and 80 per token."""
    ids = np.random.default_rng(0).integers(3, 500, 385).tolist()
    settings = {"full": None, "int8": q.QuantizedKV("int8"), "int4": q.QuantizedKV("int4")}
    got = kv_quality.teacher_forced(tiny, ids, settings, chunk=128)
    assert got["full"]["kl_mean"] == 0 and got["full"]["top1_agreement"] == 1
    assert got["int8"]["kl_mean"] < 1e-4 and got["int8"]["top1_agreement"] >= 0.98
    assert got["int4"]["kl_mean"] > 10 * got["int8"]["kl_mean"]
    for name, s in settings.items():
        assert got[name]["kv_bytes_per_token"] == kv_quality.predicted_bytes_per_token(tiny.config, s)
    assert [got[k]["kv_bytes_per_token"] for k in settings] == [512, 144, 80]


def test_generate_with_a_quantized_cache_records_its_real_bytes(tiny):
    g = kvlab.pytorch.generate(tiny, list(range(3, 203)), cache="quantized", kv_precision="int4", max_new_tokens=4)
    assert g.label.cache.kind == "quantized" and g.label.cache.variant == "int4 quanto g64 r128"
    # 203 positions held: the 200-token prompt quantized at its first step, 3 decode tokens in the residual window
    assert 0 < g.records[-1].live_cache_bytes < 203 * tiny.bytes_per_token / 3


def test_smollm2_answers_the_same_with_int8_and_int4_kv():
    """Real weights: SmolLM2's greedy answer is token-identical with float32, int8 (HQQ) and int4 (quanto) KV."""
    model = kvlab.pytorch.load("smollm2")
    runs = {
        p: kvlab.pytorch.generate(
            model, "What is the capital of France?", chat=True, max_new_tokens=12, cache="quantized", kv_precision=p
        )
        for p in ("int8", "int4")
    }
    full = kvlab.pytorch.generate(model, "What is the capital of France?", chat=True, max_new_tokens=12)
    assert full.text == "The capital of France is Paris."
    assert all(g.token_ids == full.token_ids for g in runs.values())


def test_quantized_cache_refuses_a_model_with_sliding_layers():
    model = kvlab.pytorch.load("sliding-toy")
    with pytest.raises(kvlab.ModelError, match=r"QuantizedCache holds full-attention layers only.*sliding_attention"):
        kvlab.pytorch.generate(model, [5, 6, 7], cache="quantized", kv_precision="int8", max_new_tokens=2)


def test_the_recorded_quality_rows():
    """data/kv-quality/kv-quality.json: >= 4096 tokens of real text, every row's fields, the reference row exact,
    and bytes per token as measured below the float32 KV's."""
    result = json.loads(QUALITY.read_text())
    assert result["n_tokens"] >= 4096 and result["environment"]["transformers_version"]
    rows = {r["kv_precision"]: r for r in result["rows"]}
    assert {"float32", "int8", "int4"} <= set(rows)
    for r in rows.values():
        assert set(kv_quality.ROW_FIELDS) <= set(r)
    ref = rows["float32"]
    assert ref["top1_agreement"] == 1 and ref["kl_mean"] == 0 and ref["first_divergent_token"] is None
    assert ref["kv_bytes_per_token"] == ref["predicted_bytes_per_token"] == 46080
    assert ref["kv_bytes_per_token"] > rows["int8"]["kv_bytes_per_token"] > rows["int4"]["kv_bytes_per_token"]
    assert rows["int8"]["kl_mean"] < rows["int4"]["kl_mean"]
