"""The onnxruntime-genai model builder (0.18) with the config shims newer transformers (5.x) need, same command line:
``python -m kvlab.ort.models.builder_shims -i HF_DIR -o OUT -p fp32 -e webgpu -c CACHE [--extra_options ...]``.

The shims change the builder's view of the Hugging Face config only (the weights load unchanged):

- Gemma 3: transformers 5 saves ``rope_parameters`` per layer type ({"full_attention": {...}, "sliding_attention":
  {...}}) and no ``rope_local_base_freq``; the builder reads ``rope_parameters["rope_type"]`` and
  ``rope_local_base_freq``. The shim gives it the full layers' parameters and the sliding layers' theta as
  ``rope_local_base_freq``.
"""

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
    """The builder's own command line, with ``shim`` applied to the config it reads."""
    import onnxruntime_genai.models.builder as builder

    original = builder.get_hf_details

    def get_hf_details(*args: Any, **kwargs: Any) -> Any:
        details = original(*args, **kwargs)
        for line in shim(details["hf_config"]):
            print(f"kvlab shim: {line}")
        return details

    builder.get_hf_details = get_hf_details
    a = builder.get_args()
    extra = builder.parse_extra_options(
        a.model_name,
        a.input,
        a.output,
        a.precision,
        a.execution_provider,
        a.cache_dir,
        a.extra_options,
        builder_config_version=a.builder_config_version,
        target_options=a.target_options,
        drafter_options=a.drafter_options,
        speculative_options=a.speculative_options,
        runtime_config=a.runtime_config,
        search=a.search,
    )
    builder.create_model(a.model_name, a.input, a.output, a.precision, a.execution_provider, a.cache_dir, **extra)


if __name__ == "__main__":
    main()
