"""The onnxruntime-genai model builder with the config shims newer transformers needs, same command line: ``python -m
kvlab.ort.models.builder_shims -i HF_DIR -o OUT -p fp32 -e webgpu -c CACHE [--extra_options ...]``. The shims change
only the builder's view of the Hugging Face config: for Gemma 3 (``rope_parameters`` per layer type), the full layers'
parameters and the sliding layers' theta as ``rope_local_base_freq``."""

from __future__ import annotations

from typing import Any


def shim(config: Any) -> list[str]:
    """Apply the shims to a transformers config (and its text config); returns what was changed."""
    done = []
    for c in (config, getattr(config, "text_config", None)):
        if c is None:
            continue
        rope = getattr(c, "rope_parameters", None)
        if (
            str(getattr(c, "model_type", "")).startswith("gemma3")
            and isinstance(rope, dict)
            and "full_attention" in rope
        ):
            c.rope_local_base_freq = rope["sliding_attention"]["rope_theta"]
            c.rope_parameters = dict(rope["full_attention"])
            done.append(f"gemma3: rope_parameters <- full_attention's, rope_local_base_freq = {c.rope_local_base_freq}")
    return done


def main() -> None:
    """The builder's own command line, run as its ``__main__``, with ``shim`` applied to the first config it reads
    (its ``get_hf_details``; later reads, such as transformers' own while loading the weights, stay as saved)."""
    import runpy

    from transformers import AutoConfig

    original = AutoConfig.from_pretrained

    def first_read(*args: Any, **kwargs: Any) -> Any:
        AutoConfig.from_pretrained = original
        config = original(*args, **kwargs)
        for line in shim(config):
            print(f"kvlab shim: {line}")
        return config

    AutoConfig.from_pretrained = first_read
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
