"""Ring buffers for sliding layers: ``RingStaticCache(n)`` on sliding-toy (gemma3 arch, window 16, 6 sliding + 2
full layers, KV [1, 2, n, 32] fp32: 256 bytes per position per key or value). On onnxruntime 1.31.1's CPU EP (the
plugin environment) the sliding layers' buffers are their window and the tokens are transformers' own and a plain
StaticCache's, over prompts shorter and longer than the window and 60 new tokens; the bytes are exact, step by
step. Where the runtime cannot evict inside GroupQueryAttention (onnxruntime-webgpu 1.27, the WebGPU plugin EP) the
cache is refused with the runtime's own error, nothing allocated. Real sessions, real transformers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kvlab
from kvlab import CacheStateError, ConfigError, StaticCache, generate, open_device
from kvlab.core.cache_layout import SlidingWindow
from kvlab.ort import RingStaticCache
from kvlab.ort.checks.faults import Injected, raising_hook
from kvlab.ort.checks.references import transformers_greedy
from kvlab.ort.models.rewrites import ring_graph
from kvlab.ort.runtime.plugin import installed as on_the_plugin_ep

WINDOW, N, NEW = 16, 128, 60
LONG = [int(x) for x in np.random.default_rng(0).integers(3, 259, 40)]  # longer than the window
SHORT = LONG[:5]
ROW = 2 * 32 * 4  # one position of one key or value: 2 heads x 32, float32
SLIDING, FULL = (0, 1, 2, 4, 5, 6), (3, 7)


@pytest.fixture(scope="module")
def model():
    return kvlab.load("sliding-toy", progress=False)


@pytest.fixture(scope="module")
def reference(model):
    """transformers' own greedy tokens (its generate and DynamicCache, whose sliding layers keep window - 1
    positions) for both prompts; torch on one thread: the toy is tiny, and two threads on the shared 2-core machine
    took 12-20 s for what one does in 0.3 s (measured)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {len(p): transformers_greedy(model, p, NEW) for p in (LONG, SHORT)}
    finally:
        torch.set_num_threads(threads)


def needs_the_ring_runtime() -> None:
    """Skip where GroupQueryAttention cannot evict (called in the test's body, so the tier rule marks it
    ``package``: the full run repeats it in .venv-plugin)."""
    if not on_the_plugin_ep():
        pytest.skip("evicting inside GroupQueryAttention needs onnxruntime 1.31.1 (.venv-plugin)")


def used(length: int) -> int:
    """The bytes a ring cache's buffers hold at ``length``: a sliding layer its newest min(length, 16)."""
    return 2 * ROW * (len(SLIDING) * min(length, WINDOW) + len(FULL) * length)


def run(model, cache, prompt, new=NEW):
    with cache:
        return generate(model, prompt, cache=cache, device="cpu", max_new_tokens=new, stop_on_eos=False)


def test_the_ring_graph_marks_the_sliding_layers_alone(model):
    g = onnx.load(str(ring_graph(model)), load_external_data=False).graph
    marked = {}
    for node in (n for n in g.node if n.op_type == "GroupQueryAttention"):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        marked[int(node.name.split("layers.")[1].split("/")[0])] = attrs.get("sliding_window_cache", 0)
        assert attrs["local_window_size"] == (WINDOW if attrs.get("sliding_window_cache") else -1)
    assert marked == {i: int(i in SLIDING) for i in range(8)}
    assert ring_graph(model) == ring_graph(model)  # written once


def test_the_label_names_the_ring_and_makes_one_again():
    for cache in (RingStaticCache(64), RingStaticCache(64, states="in-place")):
        again = kvlab.make_cache(cache.spec)
        assert type(again) is RingStaticCache and again.spec == cache.spec
    assert str(RingStaticCache(64).spec) == "static@64 ring"
    assert type(kvlab.make_cache(StaticCache(64).spec)) is StaticCache


def test_a_model_without_sliding_layers_is_refused(toy):
    with pytest.raises(ConfigError, match=r"model toy has none .*use StaticCache"):
        generate(toy, [1, 2, 3], cache=RingStaticCache(64), device="cpu", max_new_tokens=2)


@pytest.mark.parametrize("prompt", [LONG, SHORT], ids=["prompt-40", "prompt-5"])
def test_tokens_equal_transformers_and_a_plain_static_cache(model, prompt, request):
    """60 new tokens past a window of 16: the ring wraps several times (a 40-token prefill already evicts)."""
    needs_the_ring_runtime()
    ring = run(model, RingStaticCache(N), prompt)
    assert ring.token_ids == run(model, StaticCache(N), prompt).token_ids
    assert ring.token_ids == request.getfixturevalue("reference")[len(prompt)]
    assert str(ring.label.cache) == f"static@{N} ring"


@pytest.mark.parametrize("name", ["sliding-toy", "gemma2-toy", "mistral-toy"])
def test_every_sliding_preset_equals_a_plain_static_cache(name):
    """The three sliding presets (3 of 4, 1 of 2 and 8 of 8 layers sliding, window 16; Mistral's window put back by
    kvlab's rewrite): the same tokens, 40 + 60 positions; once past the window, the sliding layers hold 16."""
    needs_the_ring_runtime()
    model = kvlab.load(name, progress=False)
    ring = run(model, RingStaticCache(N), LONG)
    assert ring.token_ids == run(model, StaticCache(N), LONG).token_ids
    sliding = sum(isinstance(layer.kind, SlidingWindow) for layer in model.info.layout.layers)
    full = 8 - sliding
    last = ring.records[-1]
    length = last.position + last.n_tokens
    assert last.used_cache_bytes == 2 * ROW * (sliding * WINDOW + full * length)
    assert last.live_cache_bytes == 2 * ROW * (sliding * WINDOW + full * N)


def test_sliding_layers_bytes_stop_at_the_window(model):
    """Exact, per step: the buffers are allocated once (6 x 2 x 16 positions + 2 x 2 x 128); what they hold grows
    by 4,096 bytes a token up to the window (every layer), by 1,024 past it (the two full layers alone), where a
    plain StaticCache's grows by 4,096 throughout."""
    needs_the_ring_runtime()
    live = 2 * ROW * (len(SLIDING) * WINDOW + len(FULL) * N)
    g = run(model, RingStaticCache(N), [LONG[0]], new=40)
    lengths = [r.position + r.n_tokens for r in g.records]
    assert [r.used_cache_bytes for r in g.records] == [used(n) for n in lengths]
    assert {r.live_cache_bytes for r in g.records} == {live} == {180_224}
    assert g.records[0].cache_tensors_allocated == 16 and all(r.cache_tensors_allocated == 0 for r in g.records[1:])
    steps = np.diff([r.used_cache_bytes for r in g.records])
    assert set(steps[: WINDOW - 1]) == {4096} and set(steps[WINDOW:]) == {1024}
    plain = run(model, StaticCache(N), [LONG[0]], new=40)
    assert set(np.diff([r.used_cache_bytes for r in plain.records])) == {4096}
    assert plain.records[-1].live_cache_bytes == 2 * ROW * 8 * N == 524_288


def test_the_memory_report_is_the_buffers_held(model):
    needs_the_ring_runtime()
    cache = RingStaticCache(N)
    report = cache.memory_report(model.info)
    with cache:
        generate(model, LONG, cache=cache, device="cpu", max_new_tokens=4, stop_on_eos=False)
        held = cache.held_bytes_by_layer()
        assert held == {r.layer: r.total_bytes for r in report.layers}
        assert held == {i: 2 * ROW * (WINDOW if i in SLIDING else N) for i in range(8)}
        assert [t.shape for t in cache.tensors[:2]] == [(1, 2, WINDOW, 32)] * 2
    assert report.bytes_per_token == 2 * 2 * ROW and report.total_bytes == 180_224
    assert "2 of 8 layers grow" in str(report) and report.layers[0].kind == "sliding window (16), ring buffer"


def test_crop_within_the_window_and_refused_past_it(model):
    needs_the_ring_runtime()
    cache = RingStaticCache(N)
    with cache, kvlab.Stepper(model, cache, "cpu", N) as s:
        s.step(LONG[:10])
        cache.crop(6)  # nothing evicted yet: rows [0, 6) hold positions [0, 6)
        _, r = s.step(LONG[6:10])
        assert cache.seq_length == 10 and r.position == 6
        s.step(LONG[10:30])
        with pytest.raises(CacheStateError, match=r"holds only the newest 16 positions \(14 to 29\).*evicted"):
            cache.crop(20)
        assert cache.seq_length == 30
        cache.crop(0)
        _, first = s.step(LONG[:3])
    assert first.position == 0


def test_a_step_that_fails_after_its_run_cannot_be_undone(model):
    """A hook fails past the window: the ring already evicted, so the cache refuses to go on until it is reset; a
    new generation (which resets it) gives the plain cache's tokens again."""
    needs_the_ring_runtime()
    cache = RingStaticCache(N)
    with cache:
        with kvlab.Stepper(model, cache, "cpu", N, hooks=[raising_hook(21)]) as s:
            for t in LONG[:20]:
                s.step([t])
            with pytest.raises(Injected):
                s.step([LONG[20]])
            assert cache.seq_length == 20
            with pytest.raises(CacheStateError, match=r"ring cache's sliding-layer buffers were rewritten in place"):
                s.step([LONG[20]])
        again = generate(model, LONG, cache=cache, device="cpu", max_new_tokens=8, stop_on_eos=False)
    assert again.token_ids == run(model, StaticCache(N), LONG, new=8).token_ids


def test_a_handoff_is_refused(model):
    needs_the_ring_runtime()
    with StaticCache(N) as plain, kvlab.Stepper(model, plain, "cpu", N) as prefill:
        prefill.step(LONG)
        with RingStaticCache(N) as ring, kvlab.Stepper(model, ring, "cpu", N) as decode:
            with pytest.raises(ConfigError, match=r"RingStaticCache takes no handoff"):
                decode.receive(plain)
            assert ring.seq_length == 0


def test_onnxruntime_webgpu_127_refuses_with_its_reason(model):
    if on_the_plugin_ep():
        pytest.skip("onnxruntime-webgpu 1.27's refusal: runs in .venv")
    cache, dev = RingStaticCache(N), open_device("cpu")
    before = dev.live_tensors
    with pytest.raises(
        ConfigError,
        match=r"cannot run on cpu with onnxruntime-webgpu 1\.27\.0.*has no attribute 'sliding_window_cache'.*"
        r"StaticCache\(128\) of model sliding-toy reserves 524,288 bytes, its sliding layers holding every position "
        r"\(3,072 bytes a position\), where the ring would reserve 180,224\. "
        r"What works: RingStaticCache on device 'cpu' in the plugin environment",
    ):
        generate(model, LONG, cache=cache, device="cpu", max_new_tokens=2)
    assert cache.tensors == () and dev.live_tensors == before


def test_the_plugin_webgpu_ep_refuses_with_its_reason(model):
    needs_the_ring_runtime()
    with pytest.raises(ConfigError, match=r"onnxruntime-ep-webgpu 0\.4\.0.*sliding_window_cache=1 is not implemented"):
        generate(model, LONG, cache=RingStaticCache(N), device="webgpu", max_new_tokens=2)
