"""Prefill on the CPU EP, copy the KV to WebGPU, decode there: same tokens as an all-CPU run."""

from __future__ import annotations

import numpy as np
import pytest

import kvlab
from kvlab import CacheStateError, ConfigError, DeviceError, DynamicCache, StaticCache, Stepper, generate, open_device

KINDS = {"static": lambda: StaticCache(512), "dynamic": DynamicCache}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name, n_prompt, new", [("toy", 300, 8), ("kv-heavy", 400, 3)])
def test_handoff_tokens_equal_an_all_cpu_run(name, n_prompt, new, kind):
    model = kvlab.load(name)
    ids = [3 + (i * 7) % 256 for i in range(n_prompt)]
    with KINDS[kind]() as c:
        ref = generate(model, ids, cache=c, device="cpu", max_new_tokens=new, stop_on_eos=False)
    dev = open_device("webgpu")
    before = dev.live_tensors
    with KINDS[kind]() as c:
        g = generate(model, ids, cache=c, device="webgpu", prefill_device="cpu", max_new_tokens=new, stop_on_eos=False)
    assert g.token_ids == ref.token_ids
    assert dev.live_tensors == before  # the device cache was disposed, the CPU twin too
    f = g.frame()
    assert list(f.phase) == ["prefill", "handoff"] + ["decode"] * (new - 1)
    assert list(f.device) == ["cpu", "webgpu"] + ["webgpu"] * (new - 1)
    assert list(f.copied_from) == ["", "cpu"] + [""] * (new - 1)
    hand = f.iloc[1]
    per_token = model.info.bytes_per_token
    expected = per_token * (512 if kind == "static" else n_prompt)  # whole static buffers vs exact presents
    assert hand.copy_bytes == expected and hand.n_tokens == n_prompt and hand.token == -1
    assert list(f.position[2:]) == list(range(n_prompt, n_prompt + new - 1))
    assert g.label.prefill_device.name == "cpu" and g.label.device.name == "webgpu"


def test_handoff_on_smollm2(smollm2, long_prompt):
    """Real weights: a CPU prefill of ~300 tokens, then three decode steps on WebGPU (SwiftShader: ~4 s each)."""
    with StaticCache(512) as c:
        ref = generate(smollm2, long_prompt, cache=c, device="cpu", max_new_tokens=4, stop_on_eos=False)
    with StaticCache(512) as c:
        g = generate(
            smollm2, long_prompt, cache=c, device="webgpu", prefill_device="cpu", max_new_tokens=4, stop_on_eos=False
        )
    assert g.token_ids == ref.token_ids


def test_layout_mismatch_is_refused_and_nothing_is_left(toy, kv_heavy):
    dev = open_device("webgpu")
    before = dev.live_tensors
    c = StaticCache(64)
    with pytest.raises(
        ConfigError, match=r"cannot hand off KV of toy on cpu .* to kv-heavy on webgpu .* must be equal"
    ):
        generate(
            kv_heavy, [1, 2, 3], cache=c, device="webgpu", prefill_device="cpu", prefill_model=toy, max_new_tokens=2
        )
    assert c.seq_length == 0 and dev.live_tensors == before + 24  # allocated, empty, reusable
    g = generate(
        kv_heavy, [1, 2, 3], cache=c, device="webgpu", prefill_device="cpu", max_new_tokens=2, stop_on_eos=False
    )
    assert len(g.token_ids) == 2
    c.dispose()
    assert dev.live_tensors == before


def test_a_cache_holding_a_sequence_cannot_receive(toy):
    cpu, gpu = open_device("cpu"), open_device("webgpu")
    with DynamicCache() as src, DynamicCache() as dst:
        with Stepper(toy, src, cpu, 8) as a, Stepper(toy, dst, gpu, 8) as b:
            a.step(np.array([1, 2, 3]))
            b.step(np.array([4, 5]))
            with pytest.raises(CacheStateError, match="already holds a sequence of 2 tokens"):
                b.receive(src)
            assert dst.seq_length == 2


def test_kinds_must_match(toy):
    cpu, gpu = open_device("cpu"), open_device("webgpu")
    with DynamicCache() as src, StaticCache(16) as dst:
        with Stepper(toy, src, cpu, 8) as a, Stepper(toy, dst, gpu, 8) as b:
            a.step(np.array([1, 2, 3]))
            with pytest.raises(ConfigError, match="a static cache cannot receive a dynamic cache's KV"):
                b.receive(src)


def test_a_device_without_the_copy_path(toy, monkeypatch):
    """Fault injection (labelled): the backend is told it cannot copy cpu->webgpu (a future EP might not);
    the handoff must refuse before copying anything."""
    gpu = open_device("webgpu")
    monkeypatch.setattr(type(gpu.backend), "copy_paths", frozenset({("cpu", "cpu")}))
    c = DynamicCache()
    with pytest.raises(DeviceError, match="cannot copy tensors from cpu to webgpu"):
        generate(toy, [1, 2, 3], cache=c, device="webgpu", prefill_device="cpu", max_new_tokens=2)
    assert c.seq_length == 0 and c.live_bytes == 0


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_failed_copy_leaves_the_device_cache_empty_and_reusable(toy, kind, monkeypatch):
    """Fault injection (labelled): the third tensor copy fails (as a device loss would)."""
    from kvlab.ort.decode.caches import dynamic, static

    gpu = open_device("webgpu")
    before = gpu.live_tensors
    real, calls = static.copy_tensor, {"n": 0}

    def flaky(src, dst):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected: copy failed")
        real(src, dst)

    for slots in (static, dynamic):  # the slots' own copies (FixedKV's, GrowingKV's)
        monkeypatch.setattr(slots, "copy_tensor", flaky)
    c = KINDS[kind]()
    with pytest.raises(RuntimeError, match="injected"):
        generate(toy, [5, 6, 7, 8], cache=c, device="webgpu", prefill_device="cpu", max_new_tokens=3)
    assert c.seq_length == 0 and c.live_bytes == (c.max_cache_len * toy.info.bytes_per_token if kind == "static" else 0)
    for slots in (static, dynamic):
        monkeypatch.setattr(slots, "copy_tensor", real)
    ref = generate(toy, [5, 6, 7, 8], device="cpu", max_new_tokens=3, stop_on_eos=False)
    g = generate(toy, [5, 6, 7, 8], cache=c, device="webgpu", prefill_device="cpu", max_new_tokens=3, stop_on_eos=False)
    assert g.token_ids == ref.token_ids
    c.dispose()
    assert gpu.live_tensors == before


def test_prefill_model_needs_another_device(toy):
    with pytest.raises(ConfigError, match="prefill_model needs a prefill_device other than the decode device"):
        generate(toy, [1], device="cpu", prefill_model=toy, max_new_tokens=1)
