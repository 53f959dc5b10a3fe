"""The PyTorch backend on CPU (the toy random Llama and SmolLM2 with real weights): kvlab's contract, cache parity,
the graph runner's device-side step (eager and traced), errors. CUDA-only checks skip without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch backend needs torch (kvlab[build])")
pytest.importorskip("transformers", reason="the PyTorch backend needs transformers (kvlab[build])")

from conftest import run_python  # noqa: E402

import kvlab  # noqa: E402
from kvlab import CapacityError, ConfigError, DeviceError  # noqa: E402
from kvlab import pytorch as tb  # noqa: E402
from kvlab.core.labels import CacheSpec  # noqa: E402
from kvlab.pytorch import fuse  # noqa: E402
from kvlab.pytorch import graphs as tg  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not CUDA,
    reason="CUDA graph capture needs a CUDA GPU; this machine has none (recorded on one: data/pytorch-cuda-graphs)",
)
PROMPT = list(range(3, 40))  # 37 token ids, valid in every vocabulary here


@pytest.fixture(scope="module")
def ttoy() -> tb.TorchModel:
    return tb.load("toy")


@pytest.fixture(scope="module")
def toy_dynamic(ttoy) -> kvlab.Generation:
    return tb.generate(ttoy, PROMPT, cache="dynamic", max_new_tokens=16, stop_on_eos=False, count_cpu_allocs=True)


def test_backend_reexports_the_graph_runner():
    assert tb.GraphRunner is tg.GraphRunner and tb.fuse_modules is fuse.fuse_modules
    with pytest.raises(AttributeError, match="no attribute 'Graph'"):
        tb.Graph  # noqa: B018


def test_import_pulls_neither_onnxruntime_nor_tokenizers():
    out = run_python(
        "import sys, kvlab.pytorch; "
        "print(sorted(m for m in ('onnxruntime', 'onnxruntime_genai', 'tokenizers', 'torch') "
        "if m in sys.modules))"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_generation_and_records_keep_kvlabs_contract(ttoy, toy_dynamic):
    g = toy_dynamic
    assert isinstance(g, kvlab.Generation) and g.label.cache == CacheSpec("dynamic") and g.label.device.name == "cpu"
    assert len(g.token_ids) == 16 and g.stop_reason == "max_new_tokens" and g.prompt_ids == PROMPT
    f = g.frame()
    assert list(f.columns) == [*kvlab.COLUMNS, *tb.ALLOC_COLUMNS]
    assert list(f.phase) == ["prefill"] + ["decode"] * 15
    assert list(f.position) == [0] + list(range(len(PROMPT), len(PROMPT) + 15))
    assert list(f.token) == g.token_ids
    layers = ttoy.config.num_hidden_layers
    assert (f.cache_tensors_allocated == 2 * layers).all()  # concatenation: every K and V is new each step
    assert (f.used_cache_bytes == (f.position + f.n_tokens) * ttoy.bytes_per_token).all()
    assert (f.live_cache_bytes == f.used_cache_bytes).all()  # dynamic: exactly what the tokens need
    assert (f.alloc_requests > 0).all() and (f.segments == -1).all()  # CPU: op-output proxy, no segments
    assert (f.wall_ms >= f.run_ms).all()


def test_static_cache_gives_identical_tokens_and_allocates_once(ttoy, toy_dynamic):
    s = tb.generate(ttoy, PROMPT, cache="static", max_new_tokens=16, stop_on_eos=False)
    assert (s.frame().alloc_requests == -1).all()  # the CPU proxy is opt-in
    assert s.token_ids == toy_dynamic.token_ids
    assert s.label.cache == CacheSpec("static", len(PROMPT) + 15)
    f = s.frame()
    assert f.cache_tensors_allocated.iloc[0] == 2 * ttoy.config.num_hidden_layers
    assert (f.cache_tensors_allocated.iloc[1:] == 0).all() and (f.new_buffers.iloc[1:] == 0).all()
    assert f.live_cache_bytes.nunique() == 1  # the whole buffer, from the first step on
    k = tb.generate(ttoy, PROMPT, cache=kvlab.StaticCache(max_cache_len=64), max_new_tokens=16, stop_on_eos=False)
    assert k.token_ids == toy_dynamic.token_ids and k.label.cache == CacheSpec("static", 64)
    d = tb.generate(ttoy, PROMPT, cache=kvlab.DynamicCache(), max_new_tokens=4, stop_on_eos=False)
    assert d.token_ids == toy_dynamic.token_ids[:4]


def test_hooks_see_every_step_and_seeded_sampling_is_reproducible(ttoy, toy_dynamic):
    seen = []
    rec = kvlab.Recorder()
    g = tb.generate(ttoy, PROMPT, max_new_tokens=5, stop_on_eos=False, on_step=[seen.append, rec])
    assert [r.step for r in seen] == [0, 1, 2, 3, 4] and len(rec.records) == 5
    assert g.token_ids == toy_dynamic.token_ids[:5]
    sampling = kvlab.Sampling(do_sample=True, temperature=1.5, seed=7)
    a = tb.generate(ttoy, PROMPT, max_new_tokens=12, sampling=sampling, stop_on_eos=False)
    b = tb.generate(ttoy, PROMPT, max_new_tokens=12, sampling=sampling, stop_on_eos=False)
    assert a.token_ids == b.token_ids != toy_dynamic.token_ids[:12]


def test_graph_runner_step_matches_eager_and_survives_reset(ttoy, toy_dynamic):
    runner = tg.GraphRunner(ttoy, 64, mode="eager")
    ptrs = list(runner.kv_ptrs)
    assert runner.decode_greedy(PROMPT, 16) == toy_dynamic.token_ids
    g = runner.generate(PROMPT, max_new_tokens=16, stop_on_eos=False)  # second generation, same buffers
    assert g.token_ids == toy_dynamic.token_ids and g.label.cache == CacheSpec("static", 64, "graph-eager")
    assert [t.data_ptr() for t in runner.kv_tensors()] == ptrs
    f = g.frame()
    assert list(f.columns) == [*kvlab.COLUMNS, *tb.ALLOC_COLUMNS] and (f.cache_tensors_allocated == 0).all()
    other = list(range(100, 120))
    assert runner.decode_greedy(other, 8) == tb.generate(ttoy, other, max_new_tokens=8, stop_on_eos=False).token_ids
    s = runner.generate(PROMPT, max_new_tokens=6, stop_on_eos=False, sampling=kvlab.Sampling(do_sample=True, seed=3))
    e = tb.generate(ttoy, PROMPT, max_new_tokens=6, stop_on_eos=False, sampling=kvlab.Sampling(do_sample=True, seed=3))
    assert s.token_ids == e.token_ids


def test_traced_fused_step_matches_eager(toy_dynamic):
    """torch.compile(fullgraph=True) must trace the whole step (no graph break, no host sync); backend "eager"
    checks exactly that on CPU, quickly. fuse_modules must not change the tokens."""
    model = tb.load("toy")  # fuse_modules rewrites the model: a fresh copy
    runner = tg.GraphRunner(model, 64, mode="compile", compile_backend="eager", fuse=True, keep_logits=False)
    assert runner.fused == {"qkv": 2, "gate_up": 2, "rms_norm": 5}
    assert runner.decode_greedy(PROMPT, 16) == toy_dynamic.token_ids
    assert fuse.fuse_modules(model)["qkv"] == 0  # idempotent


@pytest.mark.parametrize("n", [49152, 128256, 512, 97])
def test_two_stage_argmax_traces_and_matches_argmax(n):
    cols = tg.argmax_cols(n)
    traced = torch.compile(lambda x: tg.two_stage_argmax(x, cols), backend="eager", fullgraph=True)
    gen = torch.Generator().manual_seed(n)
    for _ in range(3):
        x = torch.randn(n, generator=gen)
        assert int(traced(x)) == int(x.argmax())
    x = torch.zeros(n)
    x[n // 2] = x[n - 1] = 1.0  # a tie: the first index wins, as argmax
    assert int(tg.two_stage_argmax(x, cols)) == n // 2


def test_smollm2_torch_matches_ort_static_cache(smollm2):
    """Cross-framework parity: kvlab's ONNX Runtime StaticCache (CPU EP) and the PyTorch path (dynamic, static,
    graph runner step) give the same greedy tokens on SmolLM2-135M with its real weights."""
    with kvlab.StaticCache(max_cache_len=128) as cache:
        ort = kvlab.generate(
            smollm2,
            "What is the capital of France?",
            chat=True,
            cache=cache,
            device="cpu",
            max_new_tokens=12,
            stop_on_eos=False,
        )
    model = tb.load("smollm2")
    assert model.encode("What is the capital of France?", chat=True) == ort.prompt_ids
    dyn = tb.generate(model, ort.prompt_ids, cache="dynamic", max_new_tokens=12, stop_on_eos=False)
    sta = tb.generate(model, ort.prompt_ids, cache="static", max_new_tokens=12, stop_on_eos=False)
    run = tg.GraphRunner(model, 64, mode="eager").decode_greedy(ort.prompt_ids, 12)
    assert dyn.token_ids == sta.token_ids == run == ort.token_ids
    assert "Paris" in dyn.text


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda m: tb.generate(m, PROMPT, cache="paged"), ConfigError, "cache='paged'"),
        (lambda m: tb.generate(m, PROMPT, max_new_tokens=0), ConfigError, "max_new_tokens=0"),
        (lambda m: tb.generate(m, PROMPT, cache=kvlab.StaticCache(max_cache_len=8)), CapacityError, "max_cache_len=8"),
        (lambda m: tb.generate(m, [3, 999999]), ConfigError, "outside the vocabulary"),
        (lambda m: tb.generate("toy", PROMPT), ConfigError, "TorchModel"),
        (lambda m: tg.GraphRunner(m, 64, mode="turbo"), ConfigError, "mode='turbo'"),
        (lambda m: tg.GraphRunner(m, 1, mode="eager"), ConfigError, "max_cache_len=1"),
        (lambda m: tg.GraphRunner(m, 10**6, mode="eager"), ConfigError, "max_position_embeddings"),
        (lambda m: tg.GraphRunner(m, 16, mode="eager").decode_greedy(PROMPT, 4), CapacityError, "max_cache_len=16"),
        (
            lambda m: tg.GraphRunner(m, 64, mode="eager", keep_logits=False).generate(
                PROMPT, max_new_tokens=4, sampling=kvlab.Sampling(do_sample=True)
            ),
            ConfigError,
            "keep_logits=True",
        ),
    ],
)
def test_bad_inputs_are_named(ttoy, call, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(ttoy)


@pytest.mark.skipif(CUDA, reason="checks the CPU refusal of graph capture")
def test_capture_on_cpu_is_refused(ttoy):
    with pytest.raises(DeviceError, match="mode='capture'"):
        tg.GraphRunner(ttoy, 64, mode="capture")


def test_bad_load_arguments():
    with pytest.raises(ConfigError, match="dtype='float8'"):
        tb.random_model("tiny", dtype="float8")
    with pytest.raises(ConfigError, match="shape='gpt5'"):
        tb.random_model("gpt5")
    with pytest.raises(ConfigError, match="device='tpu'"):
        tb.random_model("tiny", device="tpu")
    with pytest.raises(ConfigError, match="attn_implementation='flash'"):
        tb.load("toy", attn_implementation="flash")
    with pytest.raises(kvlab.ModelError, match="neither a built-in model"):
        tb.load("/nonexistent/dir")
    with pytest.raises(ConfigError, match="no tokenizer"):
        tb.generate(tb.random_model("tiny"), "hello")


@needs_cuda
def test_cuda_graph_runner_matches_eager_with_zero_allocations():
    model = tb.random_model("tiny", device="cuda", dtype="float32", std=0.08)
    ref = tb.generate(model, PROMPT, max_new_tokens=24, stop_on_eos=False)
    for mode in ("capture", "compile"):
        runner = tg.GraphRunner(model, 96, mode=mode)
        assert runner.decode_greedy(PROMPT, 24) == ref.token_ids
        g = runner.generate(PROMPT, max_new_tokens=24, stop_on_eos=False)  # after reset: the same graph
        assert g.token_ids == ref.token_ids
        decode = g.frame().query("phase == 'decode'")
        assert (decode.alloc_requests == 0).all() and (decode.segments == 0).all()


@needs_cuda
def test_cuda_fused_compiled_graph_matches_eager():
    model = tb.random_model("tiny", device="cuda", dtype="float32", std=0.08)
    ref = tb.generate(model, PROMPT, max_new_tokens=24, stop_on_eos=False)
    runner = tg.GraphRunner(
        model, 96, mode="compile", fuse=True, keep_logits=False, compile_mode="max-autotune-no-cudagraphs"
    )
    assert runner.decode_greedy(PROMPT, 24) == ref.token_ids
    assert (
        runner.decode_greedy(PROMPT[:20], 24)
        == tb.generate(model, PROMPT[:20], max_new_tokens=24, stop_on_eos=False).token_ids
    )


def test_records_are_numpy_free_ints(toy_dynamic):
    r = toy_dynamic.records[1]
    assert all(
        isinstance(getattr(r, c), (int, float, str)) and not isinstance(getattr(r, c), np.generic)
        for c in [*kvlab.COLUMNS, *tb.ALLOC_COLUMNS]
    )
