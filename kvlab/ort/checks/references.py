"""Trusted references for kvlab's greedy tokens: onnxruntime-genai (the C++ static-KV loop) on the same ONNX
model, and Hugging Face transformers on PyTorch with the same weights."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...core.errors import ConfigError, ModelError
from ..models.model import Model
from ..runtime.device import backend, open_device


def genai_model(
    model: Model, device: str = "cpu", graph_capture: bool | None = None, options: dict[str, str] | None = None
) -> Any:
    """An onnxruntime-genai model of the same directory, on the CPU EP or WebGPU. WebGPU only: ``graph_capture``
    (True/False) overrides the genai_config.json's ``enableGraphCapture`` (None keeps it); ``options``: more EP options
    that override the config's. Raises ModelError when onnxruntime-genai is not installed, ConfigError for
    ``graph_capture`` or ``options`` off WebGPU."""
    try:
        import onnxruntime_genai as og
    except ImportError as exc:
        raise ModelError("onnxruntime-genai is not installed: pip install --no-deps onnxruntime-genai==0.18.0") from exc
    if (graph_capture is not None or options) and device != "webgpu":
        raise ConfigError(f"graph_capture and options apply to onnxruntime-genai on WebGPU, not on {device!r}")
    config = og.Config(str(model.info.path))
    config.clear_providers()  # the CPU EP
    if device == "webgpu":
        backend().prepare_genai(og, open_device("webgpu"))
        config.append_provider("webgpu")
        if graph_capture is not None:
            config.set_provider_option("webgpu", "enableGraphCapture", "1" if graph_capture else "0")
        for key, value in (options or {}).items():
            config.set_provider_option("webgpu", key, value)
    return og.Model(config)


def genai_decode(
    og_model: Any, prompt_ids: Sequence[int], max_new_tokens: int, on_token: Callable[[], Any] | None = None
) -> tuple[list[int], list[float]]:
    """Greedy tokens from onnxruntime-genai, and the wall time (ms) of each ``generate_next_token`` call (the first
    samples the prefill's logits); ``on_token`` is called after each (untimed)."""
    gen = genai_generator(og_model, prompt_ids, max_new_tokens)
    tokens: list[int] = []
    times: list[float] = []
    while not gen.is_done() and len(tokens) < max_new_tokens:
        start = time.perf_counter()
        gen.generate_next_token()
        times.append((time.perf_counter() - start) * 1e3)
        tokens.append(int(gen.get_next_tokens()[0]))
        if on_token is not None:
            on_token()
    return tokens, times


def genai_generator(og_model: Any, prompt_ids: Sequence[int], max_new_tokens: int) -> Any:
    """An onnxruntime-genai greedy generator that has run its prefill of ``prompt_ids`` and decodes exactly
    ``max_new_tokens`` tokens (no early stop: every token is compared)."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(og_model)
    total = len(prompt_ids) + max_new_tokens
    params.set_search_options(do_sample=False, max_length=total, min_length=total)
    gen = og.Generator(og_model, params)
    gen.append_tokens([list(map(int, prompt_ids))])  # the prefill runs here
    return gen


def genai_greedy(model: Model, prompt_ids: Sequence[int], max_new_tokens: int, device: str = "cpu") -> list[int]:
    """Greedy tokens from onnxruntime-genai on the model's directory."""
    return genai_decode(genai_model(model, device), prompt_ids, max_new_tokens)[0]


def hf_checkpoint(model: Model) -> Path:
    """The Hugging Face checkpoint a built-in model was built from; ModelError for a model kvlab did not build."""
    recipe = model.info.path / "kvlab_recipe.json"
    if not recipe.is_file():
        raise ModelError(f"{model.info.path} was not built by kvlab; there is no PyTorch checkpoint to compare with")
    return Path(json.loads(recipe.read_text())["hf_dir"])


def transformers_greedy(model: Model, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens from transformers (PyTorch, CPU, fp32, its default dynamic cache) on the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hf_checkpoint(model), dtype=torch.float32).eval()
    ids = torch.tensor([list(map(int, prompt_ids))])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, ids.shape[1] :].tolist()
