"""mobius's own static cache (kvlab.ort.checks.mobius_static: ``CausalLMTask(static_cache=True)``) on kv-shared-toy,
real sessions against transformers' Gemma 4 greedy tokens: what its graph takes from the runtime, its tokens within
and beyond the sliding window on the CPU EP, and why neither WebGPU package runs it."""

from __future__ import annotations

import pytest
from test_kv_shared import PROMPT, SHORT, SHORT_NEW

import kvlab
from kvlab import ConfigError, DeviceError
from kvlab.ort.checks.mobius_static import MobiusStatic, build_static
from kvlab.ort.checks.references import transformers_greedy


@pytest.fixture(scope="module")
def model():
    return kvlab.load("kv-shared-toy", progress=False)


@pytest.fixture(scope="module")
def static_dir(model):
    return build_static(model, 64)


def test_its_buffers_are_inputs_of_the_cache_owning_layers_alone(static_dir):
    runner = MobiusStatic(static_dir, "cpu")
    assert runner.caches == {
        f"{kind}_cache.{i}": (1, 64, 2 * head) for i, head in enumerate((16, 16, 32, 16)) for kind in ("key", "value")
    }
    names = {i.name for i in runner.session.ort.get_inputs()} - set(runner.caches)
    assert names == {"input_ids", "position_ids", "write_indices", "nonpad_kv_seqlen"}  # no attention mask


def test_within_the_window_it_is_token_identical_to_transformers_on_cpu(model, static_dir):
    run = MobiusStatic(static_dir, "cpu").generate(SHORT, SHORT_NEW)
    assert run.token_ids == transformers_greedy(model, SHORT, SHORT_NEW)
    assert len(run.seconds) == SHORT_NEW and run.step_ms > 0


def test_beyond_the_window_its_tokens_differ_from_transformers(model, static_dir):
    """mobius 0.1.0's static graph, measured: a 16-token prompt gives the first two tokens right (query positions
    15 and 16), then differs; the opset-24 Attention it calls is exact on one node (docs/kv-shared.md). When mobius
    fixes it this test says so."""
    prompt = PROMPT[:16]
    got = MobiusStatic(static_dir, "cpu").generate(prompt, 6).token_ids
    want = transformers_greedy(model, prompt, 6)
    assert got[:2] == want[:2] and got != want


def test_neither_webgpu_package_has_its_attention(static_dir):
    with pytest.raises(DeviceError, match=r"did not take these nodes .*'Attention:model/layers.0/self_attn/Attention_"):
        MobiusStatic(static_dir, "webgpu")


def test_a_sequence_longer_than_its_buffers_is_refused(static_dir):
    with pytest.raises(ConfigError, match=r"60 prompt \+ 8 new tokens exceed this graph's max_seq_len 64"):
        MobiusStatic(static_dir, "cpu").generate([5] * 60, 8)
    with pytest.raises(ConfigError, match=r"max_seq_len=0 must be a positive int"):
        build_static(None, 0)
