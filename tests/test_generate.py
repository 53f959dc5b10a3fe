"""Generation: both caches agree token for token, and agree with trusted references."""

from __future__ import annotations

import pytest

from kvlab import COLUMNS, ConfigError, DynamicCache, Recorder, Sampling, StaticCache, generate
from kvlab.ort.checks.references import genai_greedy, transformers_greedy

NEW = 24


@pytest.fixture(scope="module")
def smol_runs(smollm2, long_prompt):
    """SmolLM2 on the CPU EP, a prompt of a few hundred tokens, both caches, greedy."""
    with StaticCache(1024) as s:
        static = generate(smollm2, long_prompt, cache=s, max_new_tokens=NEW, stop_on_eos=False)
    with DynamicCache() as d:
        dynamic = generate(smollm2, long_prompt, cache=d, max_new_tokens=NEW, stop_on_eos=False)
    return static, dynamic


def test_static_and_dynamic_are_token_identical_on_smollm2(smol_runs, long_prompt):
    static, dynamic = smol_runs
    assert len(long_prompt) > 250
    assert static.token_ids == dynamic.token_ids and len(static.token_ids) == NEW


def test_kvlab_matches_onnxruntime_genai(smollm2, long_prompt, smol_runs):
    assert genai_greedy(smollm2, long_prompt, NEW) == smol_runs[0].token_ids


def test_kvlab_matches_onnxruntime_genai_on_a_chat_prompt(smollm2, long_prompt):
    """A second prompt: the long text as a chat turn (template applied), both caches."""
    ids = smollm2.encode([{"role": "user", "content": "Summarize: " + smollm2.decode(long_prompt[:200])}])
    want = genai_greedy(smollm2, ids, 16)
    for cache in (StaticCache(512), DynamicCache()):
        with cache:
            assert generate(smollm2, ids, cache=cache, max_new_tokens=16, stop_on_eos=False).token_ids == want


def test_kvlab_matches_transformers(smollm2, long_prompt, smol_runs):
    assert transformers_greedy(smollm2, long_prompt, NEW) == smol_runs[0].token_ids


def test_chat_answer_is_right(smollm2):
    with StaticCache(128) as c:
        g = generate(
            smollm2, [{"role": "user", "content": "What is the capital of France?"}], cache=c, max_new_tokens=30
        )
    assert g.text == "The capital of France is Paris." and g.stop_reason == "eos"
    assert g.token_ids[-1] in smollm2.info.eos_token_ids


def test_toy_on_webgpu_both_caches_identical(toy):
    ids = toy.encode("A toy model on WebGPU, decoding step by step.")
    with StaticCache(128) as s, DynamicCache() as d:
        a = generate(toy, ids, cache=s, device="webgpu", max_new_tokens=12, stop_on_eos=False)
        b = generate(toy, ids, cache=d, device="webgpu", max_new_tokens=12, stop_on_eos=False)
    assert a.token_ids == b.token_ids
    assert a.label.device.name == "webgpu"
    assert "SwiftShader" in a.label.device.adapter.name or a.label.device.adapter.kind == "hardware"


def test_records_have_every_documented_column(smol_runs):
    static, dynamic = smol_runs
    f = static.frame()
    assert list(f.columns) == list(COLUMNS) and len(f) == NEW
    assert list(f.phase) == ["prefill"] + ["decode"] * (NEW - 1)
    assert list(f.position[1:]) == list(range(len(static.prompt_ids), len(static.prompt_ids) + NEW - 1))
    assert (f.cache_tensors_allocated[1:] == 0).all() and (f.cache_bytes_allocated[1:] == 0).all()
    d = dynamic.frame()
    per_token = 46080  # SmolLM2 KV bytes per token
    assert (d.cache_tensors_allocated == 60).all()
    assert list(d.cache_bytes_allocated) == [per_token * (len(dynamic.prompt_ids) + i) for i in range(NEW)]
    assert (f.overhead_ms >= 0).all() and (f.run_ms > 0).all() and (f.rss_bytes > 0).all()


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_the_default_cache_is_disposed_when_generation_ends(toy, device):
    from kvlab import open_device

    dev = open_device(device)
    before = dev.live_tensors
    generate(toy, [1, 2, 3], device=device, max_new_tokens=3)
    assert dev.live_tensors == before


def test_hooks_and_recorder_see_every_step(toy):
    rec, seen = Recorder(), []
    g = generate(toy, [1, 2, 3], max_new_tokens=5, stop_on_eos=False, on_step=[rec, lambda r: seen.append(r.step)])
    assert seen == [0, 1, 2, 3, 4] and rec.records == g.records and len(rec.frame()) == 5


def test_seeded_sampling_is_reproducible_and_differs_from_greedy(toy):
    s = Sampling(do_sample=True, temperature=1.5, top_k=50, top_p=0.95, seed=7)
    a = generate(toy, [1, 2, 3], max_new_tokens=16, sampling=s, stop_on_eos=False)
    with StaticCache(32) as c:
        b = generate(toy, [1, 2, 3], cache=c, max_new_tokens=16, sampling=s, stop_on_eos=False)
    greedy = generate(toy, [1, 2, 3], max_new_tokens=16, stop_on_eos=False)
    assert a.token_ids == b.token_ids != greedy.token_ids


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("", "the prompt is empty"),
        ([], "prompt must be text, chat messages or token ids"),
        ([1, 2, 99999], r"token id 99999 is outside the vocabulary \[0, 512\)"),
        ([{"role": "user"}], "must be a dict with 'role' and 'content'"),
    ],
)
def test_bad_prompts(toy, prompt, message):
    c = StaticCache(16)
    with pytest.raises(ConfigError, match=message):
        generate(toy, prompt, cache=c, max_new_tokens=2)
    assert not c.allocated


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_max_new_tokens(toy, bad):
    with pytest.raises(ConfigError, match=rf"max_new_tokens={bad!r} must be a positive int"):
        generate(toy, [1], max_new_tokens=bad)


def test_eos_stops_generation(toy):
    """The random toy rarely emits its EOS, so declare its first greedy token as EOS (same weights, same
    session) and check the loop stops right after producing it, and only when stop_on_eos is on."""
    from dataclasses import replace

    from kvlab import Model

    probe = generate(toy, [1, 2, 3], max_new_tokens=40, stop_on_eos=False)
    first = probe.token_ids[0]
    eos_model = Model(replace(toy.info, eos_token_ids=(first,)))
    g = generate(eos_model, [1, 2, 3], max_new_tokens=40)
    assert g.token_ids == [first] and g.stop_reason == "eos"
    assert probe.stop_reason == "max_new_tokens" and len(probe.token_ids) == 40
