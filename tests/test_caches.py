"""Cache lifecycle and the StaticCache's guarantees, on real sessions (CPU EP and WebGPU)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kvlab
from kvlab import (
    CacheStateError,
    CapacityError,
    ConfigError,
    DynamicCache,
    InPlaceError,
    ModelError,
    StaticCache,
    Stepper,
    generate,
    open_device,
)
from kvlab.ort.runtime.session import Binding

CACHES = {"dynamic": lambda: DynamicCache(), "static": lambda: StaticCache(64)}


@pytest.fixture(params=list(CACHES))
def cache(request):
    c = CACHES[request.param]()
    yield c
    c.dispose()


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_every_cache_generates_and_releases_everything(toy, cache, device):
    dev = open_device(device)
    before = dev.live_tensors
    g = generate(toy, [5, 6, 7, 8], cache=cache, device=device, max_new_tokens=6, stop_on_eos=False)
    assert len(g.token_ids) == 6 and cache.seq_length == 4 + 6 - 1
    assert dev.live_tensors > before
    cache.dispose()
    assert dev.live_tensors == before and cache.disposed


def test_reset_keeps_length_zero_and_generation_repeats(toy, cache):
    a = generate(toy, [9, 10, 11], cache=cache, max_new_tokens=5, stop_on_eos=False)
    cache.reset()
    assert cache.seq_length == 0
    b = generate(toy, [9, 10, 11], cache=cache, max_new_tokens=5, stop_on_eos=False)
    assert a.token_ids == b.token_ids


def test_dispose_is_idempotent_and_final(toy, cache):
    generate(toy, [1, 2], cache=cache, max_new_tokens=2)
    cache.dispose()
    cache.dispose()
    with pytest.raises(CacheStateError, match="disposed"):
        generate(toy, [1, 2], cache=cache, max_new_tokens=2)
    with pytest.raises(CacheStateError, match="disposed"):
        cache.reset()


def test_context_manager_disposes(toy):
    dev = open_device("cpu")
    before = dev.live_tensors
    with StaticCache(32) as c:
        generate(toy, [1, 2, 3], cache=c, max_new_tokens=3)
        assert c.allocated
    assert c.disposed and dev.live_tensors == before


def test_concurrent_use_is_refused(toy, cache):
    """While one generation holds the cache (inside its hook), a second one from another thread is refused."""
    errors: list[Exception] = []

    def hook(record):
        if record.step == 1:
            t = threading.Thread(target=lambda: _try(errors, lambda: generate(toy, [1], cache=cache, max_new_tokens=1)))
            t.start()
            t.join()
            _try(errors, cache.reset)
            _try(errors, cache.dispose)

    generate(toy, [1, 2, 3], cache=cache, max_new_tokens=4, stop_on_eos=False, on_step=hook)
    assert [type(e) for e in errors] == [CacheStateError] * 3
    assert "in use" in str(errors[0]) and "while a generation is using it" in str(errors[1])
    generate(toy, [1, 2, 3], cache=cache, max_new_tokens=2)  # released afterwards


def _try(errors, fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)


def test_cache_is_bound_to_one_model_layout(toy, kv_heavy, cache):
    generate(toy, [1, 2], cache=cache, max_new_tokens=2)
    with pytest.raises(CacheStateError, match="bound to model toy"):
        generate(kv_heavy, [1, 2], cache=cache, max_new_tokens=2)


# ------------------------------------------------------------------------------------------ StaticCache only
def test_static_allocates_lazily_on_first_use(toy):
    dev = open_device("cpu")
    before = dev.live_tensors
    c = StaticCache(32)
    assert not c.allocated and dev.live_tensors == before
    g = generate(toy, [1, 2, 3], cache=c, max_new_tokens=3)
    assert c.allocated and dev.live_tensors == before + 2 * toy.info.num_layers
    assert g.records[0].cache_tensors_allocated == 2 * toy.info.num_layers  # the one-time allocation
    assert all(r.cache_tensors_allocated == 0 for r in g.records[1:])
    c.dispose()


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_static_allocation_is_all_or_nothing(toy, device, monkeypatch):
    """Fault injection (labelled): the 3rd device allocation fails. A real allocation failure cannot be produced
    on demand, so Device.zeros is wrapped to raise; everything else is the real runtime."""
    dev = open_device(device)
    before = dev.live_tensors
    real, calls = type(dev).zeros, {"n": 0}

    def flaky(self, shape, dtype):
        calls["n"] += 1
        if calls["n"] == 3:
            raise MemoryError("injected: out of device memory")
        return real(self, shape, dtype)

    monkeypatch.setattr(type(dev), "zeros", flaky)
    c = StaticCache(32)
    with pytest.raises(MemoryError, match="injected"):
        generate(toy, [1, 2, 3], cache=c, device=device, max_new_tokens=3)
    assert not c.allocated and dev.live_tensors == before and c.seq_length == 0
    monkeypatch.setattr(type(dev), "zeros", real)
    g = generate(toy, [1, 2, 3], cache=c, device=device, max_new_tokens=3)  # the retry works
    assert c.allocated and len(g.token_ids) == 3
    c.dispose()


def test_static_capacity_is_exact_and_checked_before_inference(toy, monkeypatch):
    runs = {"n": 0}
    real_run = Binding.run

    def counting(self):
        runs["n"] += 1
        return real_run(self)

    monkeypatch.setattr(Binding, "run", counting)
    c = StaticCache(10)
    generate(toy, [1, 2, 3, 4], cache=c, max_new_tokens=7, stop_on_eos=False)  # 4 + 7 - 1 = 10 positions: fits
    c.dispose()
    c = StaticCache(10)
    runs["n"] = 0
    with pytest.raises(CapacityError, match=r"11 positions are needed but max_cache_len is 10"):
        generate(toy, [1, 2, 3, 4], cache=c, max_new_tokens=8)
    assert runs["n"] == 0 and not c.allocated  # nothing ran, nothing allocated


def test_prompt_longer_than_cache(toy):
    c = StaticCache(8)
    with pytest.raises(CapacityError, match="max_cache_len is 8"):
        generate(toy, list(range(3, 20)), cache=c, max_new_tokens=1)
    assert not c.allocated


def test_static_binds_one_buffer_as_past_and_present(toy):
    with StaticCache(16) as c, Stepper(toy, c, open_device("cpu"), 8) as s:
        b = c.binding(s.session, 1)
        assert b.bound_outputs == {
            name: buf.data_ptr for name, buf in zip((e.present for e in toy.info.entries), c.tensors)
        }
        ptrs = [buf.data_ptr for buf in c.tensors]
        s.step(np.array([1, 2, 3]))
        s.step(np.array([4]))
        assert [buf.data_ptr for buf in c.tensors] == ptrs


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_static_writes_in_place_on_device(toy, device):
    """The tokens the runtime wrote into the shared buffer are the ones a DynamicCache got as presents."""
    dev = open_device(device)
    with StaticCache(16) as s, DynamicCache() as d, Stepper(toy, s, dev, 6) as a, Stepper(toy, d, dev, 6) as b:
        for toks in ([3, 4, 5], [6], [7]):
            a.step(np.array(toks))
            b.step(np.array(toks))
        static_k = s.tensors[0].numpy()[:, :, :5]
        dynamic_k = d.tensors[0].numpy()
    np.testing.assert_allclose(static_k, dynamic_k, atol=1e-5)


def test_failed_identity_check_does_not_advance(toy, monkeypatch):
    """Fault injection (labelled): the runtime's answer is altered so a present looks re-allocated. The real
    runtime always writes in place with a shared GQA buffer, so this is the only way to exercise the guard."""
    with StaticCache(16) as c, Stepper(toy, c, open_device("cpu"), 8) as s:
        s.step(np.array([1, 2, 3]))
        real_run = Binding.run

        def lying(self):
            result = real_run(self)
            name = next(iter(result.returned_ptrs))
            result.returned_ptrs[name] += 64
            return result

        monkeypatch.setattr(Binding, "run", lying)
        with pytest.raises(InPlaceError, match="not written in place.*length stays 3"):
            s.step(np.array([4]))
        assert c.seq_length == 3
        monkeypatch.setattr(Binding, "run", real_run)
        s.step(np.array([4]))
        assert c.seq_length == 4


def test_a_present_of_the_wrong_shape_does_not_advance(toy, monkeypatch):
    """Fault injection (labelled): the runtime's answer is altered so one growing present comes back a position
    short (ONNX Runtime returns what the graph computes, so this is the only way to reach the check). The step is
    refused naming the present and both shapes, nothing is left allocated, and the retried step goes on."""
    dev = open_device("cpu")
    with DynamicCache() as c, Stepper(toy, c, dev, 8) as s:
        s.step(np.array([1, 2, 3]))
        live, real_run = len(dev.live), Binding.run

        def short(self):
            result = real_run(self)
            name, made = next(iter(result.new.items()))
            b, h, n, d = made.shape
            result.new[name] = dev.zeros((b, h, n - 1, d), made.dtype)
            made.release()
            return result

        monkeypatch.setattr(Binding, "run", short)
        with pytest.raises(InPlaceError, match=r"present\.0\.key came back with shape \(1, \d+, 3, \d+\), expected"):
            s.step(np.array([4]))
        assert (c.seq_length, len(dev.live)) == (3, live)
        monkeypatch.setattr(Binding, "run", real_run)
        s.step(np.array([4]))
        assert c.seq_length == 4


@pytest.mark.parametrize("kind", list(CACHES))
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_failed_run_leaves_the_cache_and_can_be_retried(toy, kind, device, monkeypatch):
    """Fault injection (labelled): session.run raises once (as a device loss would). The length stays, and the
    retried step gives the same tokens as a run without the fault."""
    dev = open_device(device)
    with CACHES[kind]() as c:
        ref = generate(toy, [5, 6, 7], cache=c, device=device, max_new_tokens=4, stop_on_eos=False)
    real_run, state = Binding.run, {"fail": False}

    def flaky(self):
        if state["fail"]:
            state["fail"] = False
            raise RuntimeError("injected: device lost")
        return real_run(self)

    monkeypatch.setattr(Binding, "run", flaky)
    with CACHES[kind]() as c, Stepper(toy, c, dev, 6) as s:
        tokens = [s.step(np.array([5, 6, 7]))[1].token]
        state["fail"] = True
        with pytest.raises(RuntimeError, match="injected"):
            s.step(np.array([tokens[-1]]))
        assert c.seq_length == 3
        for _ in range(3):
            tokens.append(s.step(np.array([tokens[-1]]))[1].token)
    assert tokens == ref.token_ids


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4096", None])
def test_max_cache_len_validation(bad):
    with pytest.raises(ConfigError, match=rf"max_cache_len={bad!r}.*positive int"):
        StaticCache(bad)


def test_max_cache_len_above_model_context(toy):
    c = StaticCache(toy.info.context_length + 1)
    with pytest.raises(ConfigError, match=rf"larger than model toy's context length {toy.info.context_length}"):
        generate(toy, [1], cache=c, max_new_tokens=1)
    assert not c.allocated


def test_memory_report_before_allocation(smollm2):
    r = StaticCache(4096).memory_report(smollm2.info)
    # 30 layers x (K and V) x 3 KV heads x 64 head dim x 4 bytes
    assert r.bytes_per_token == 30 * 2 * 3 * 64 * 4 == 46080
    assert r.total_bytes == 46080 * 4096 and r.tensors == 60 and r.tensor_shape == (1, 3, 4096, 64)
    assert "180.0 MiB at max_cache_len=4096" in str(r)


def test_static_refuses_a_model_without_gqa(tmp_path):
    from conftest import write_concat_kv_model

    model = kvlab.load(write_concat_kv_model(tmp_path / "concat"))
    assert not model.info.shares_buffers
    with DynamicCache() as d:
        g = generate(model, [1, 2, 3], cache=d, max_new_tokens=3, stop_on_eos=False)  # dynamic runs it
    assert len(g.token_ids) == 3
    c = StaticCache(16)
    with pytest.raises(ModelError, match=r"present outputs do not come from a GroupQueryAttention node.*'Concat'"):
        generate(model, [1, 2, 3], cache=c, max_new_tokens=3)
    assert not c.allocated


def test_batch_size_above_one_is_refused(toy):
    with pytest.raises(ConfigError, match="batch size 2 is not supported"):
        generate(toy, np.array([[1, 2], [3, 4]]), cache=StaticCache(8), max_new_tokens=1)


def test_a_cache_is_composed_not_a_chain():
    """A StaticCache is at most three classes deep before ``object``; its in-place proof, its allocation accounting
    and its bindings are objects it holds and calls, not classes it inherits from."""
    from kvlab.core.cache import Allocations, Bindings, InPlaceProof

    assert len(StaticCache.__mro__) - 1 <= 3, StaticCache.__mro__
    cache = StaticCache(64)
    for part, kind in ((cache.proof, InPlaceProof), (cache.allocations, Allocations), (cache.bindings, Bindings)):
        assert isinstance(part, kind) and kind not in StaticCache.__mro__


@pytest.mark.parametrize(
    ("kind", "point"),
    [(k, p) for k in CACHES for p in ("run", "after-run", "commit", "hook")] + [("static", "in-place")],
)
def test_a_failed_step_leaves_the_same_buffers_and_length(toy, kind, point):
    """Fault injection (labelled, kvlab.ort.checks.faults): a step that fails at its run, after it, at the commit,
    at the in-place check (a static cache's) or in a hook (after the commit: rolled back) leaves the cache holding
    the very same tensors (by identity) and length, and no tensor more or less on the device; the retried step
    goes on."""
    from kvlab.ort.checks.faults import Injected, fault, raising_hook

    dev = open_device("cpu")
    with CACHES[kind]() as c:
        failing_hook = raising_hook(2) if point == "hook" else None
        with Stepper(toy, c, dev, 8, [failing_hook] if failing_hook else ()) as s:
            _, first = s.step([1, 2, 3])
            held, live = [t.data_ptr for t in c.tensors], dev.live_tensors
            with pytest.raises((Injected, InPlaceError)):
                if point == "hook":
                    s.step([first.token])
                else:
                    with fault(point):
                        s.step([first.token])
            assert c.seq_length == 3 and [t.data_ptr for t in c.tensors] == held and dev.live_tensors == live
            if point != "hook":  # the hook fails once; a retry from the same state goes on
                s.step([first.token])
                assert c.seq_length == 4


def test_the_in_place_proof_reads_back_as_check_every_says(toy, monkeypatch):
    """``check_every=None``: every present at a binding's first run (a static cache's one binding serves the prefill
    and every decode step), then one a run, in turn; ``check_every=2``: every present at every second run, none
    between. ConfigError for a bad value, and the label's words."""
    from kvlab.core.cache import check_every_text

    seen: list[tuple[bool, str]] = []
    real_run = Binding.run

    def observed(self):
        seen.append((self.read_back, self.spot_check))
        return real_run(self)

    monkeypatch.setattr(Binding, "run", observed)
    presents = [e.present for e in toy.info.entries]
    with StaticCache(64) as c:
        generate(toy, [1, 2, 3], cache=c, max_new_tokens=5, stop_on_eos=False)
    assert [r for r, _ in seen] == [True, False, False, False, False]
    assert [name for _, name in seen] == ["", *(presents[i % len(presents)] for i in range(1, 5))]
    seen.clear()
    with StaticCache(64, check_every=2) as c:
        generate(toy, [1, 2, 3], cache=c, max_new_tokens=5, stop_on_eos=False)
    assert [r for r, _ in seen] == [True, False, True, False, True]
    with pytest.raises(ConfigError, match=r"check_every=0 must be a positive int \(1: check every step\)"):
        StaticCache(64, check_every=0)
    assert check_every_text(None) == "presents checked in place one a step"
    assert check_every_text(2) == "every present checked every 2 steps"
