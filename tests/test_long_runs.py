"""Long runs: 10,000 decode steps with one StaticCache on the CPU EP (four generations of 2,500 through the same
cache: the toy model's context is 4,096), 1,000 on WebGPU (SwiftShader: 80 ms a step), and a DynamicCache's
growth per step. The process's resident memory (VmRSS, from /proc: a whole-process figure, so a proxy for kvlab's
own) and the device's live tensors (an exact count) are sampled every 250 steps and printed; after a warm-up they
must stay flat."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvlab import DynamicCache, StaticCache, Stepper, open_device

PROMPT = np.arange(5, 13)  # 8 tokens
EVERY = 250
RSS_SLACK = 4 << 20  # bytes of RSS growth allowed after warm-up (the allocator's own bookkeeping)


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def decode(toy, cache, dev, steps: int, samples: list[tuple[int, int, int, int]], done: int = 0) -> None:
    """One generation of ``steps`` decode steps after the prompt; appends (step, rss, live tensors, cache bytes)."""
    with Stepper(toy, cache, dev, len(PROMPT) + steps) as stepper:
        _, record = stepper.step(PROMPT, logits_out="none")
        for i in range(1, steps + 1):
            _, record = stepper.step(np.array([record.token]), logits_out="none")
            if i % EVERY == 0:
                samples.append((done + i, rss(), dev.live_tensors, cache.live_bytes))


def report(title: str, samples: list[tuple[int, int, int, int]]) -> None:
    print(f"\n{title}")
    print("   step    RSS MiB  live tensors  cache bytes")
    for step, r, live, held in samples:
        print(f"{step:7d} {r / 2**20:10.1f} {live:13d} {held:12d}")


@pytest.mark.parametrize("device, generations, steps", [("cpu", 4, 2500), ("webgpu", 1, 1000)])
def test_a_static_cache_runs_flat_for_thousands_of_steps(toy, device, generations, steps):
    dev = open_device(device)
    samples: list[tuple[int, int, int, int]] = []
    with StaticCache(2560) as cache:
        for g in range(generations):
            decode(toy, cache, dev, steps, samples, done=g * steps)
    report(f"StaticCache(2560), toy, {device} ({dev.label}): {generations * steps} decode steps", samples)
    warm = samples[1:]  # after the first 250 steps
    assert len({live for _, _, live, _ in warm}) == 1, "live device tensors changed"
    assert len({held for _, _, _, held in warm}) == 1, "the cache's bytes changed"
    growth = max(r for _, r, _, _ in warm) - warm[0][1]
    print(f"RSS growth after warm-up: {growth / 2**20:.2f} MiB over {samples[-1][0] - warm[0][0]} steps")
    assert growth < RSS_SLACK


def test_a_dynamic_cache_grows_by_one_token_of_kv_per_step(toy):
    dev = open_device("cpu")
    before = dev.live_tensors  # tensors other caches in this process hold (none once every test disposes its own)
    samples: list[tuple[int, int, int, int]] = []
    per_token = toy.info.layout.bytes_per_token  # key + value, every layer
    with DynamicCache() as cache:
        decode(toy, cache, dev, 2000, samples)
    report(f"DynamicCache, toy, cpu: 2000 decode steps ({per_token} bytes of KV per token)", samples)
    for step, _, live, held in samples:
        assert held == (len(PROMPT) + step) * per_token  # exact: the presents held after the step
        assert live - before == toy.info.layout.tensors  # each step's presents replace the last's
    per_step = (samples[-1][3] - samples[0][3]) / (samples[-1][0] - samples[0][0])
    print(f"DynamicCache growth: {per_step:.0f} bytes of KV per decode step")
