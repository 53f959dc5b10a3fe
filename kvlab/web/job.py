"""What the browser runner is asked to do, checked before any browser starts: a ``Job`` (model, prompt ids, new
tokens, caches, repetitions) and its JSON form, the one thing the page reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.cache_layout import check_max_cache_len
from ..core.devices import BUFFER_CACHE_MODES, DEFAULT_VALIDATION
from ..core.errors import CapacityError, ConfigError, ModelError, check_choice, check_flag, check_int
from ..core.generation import check_new_tokens, positions_needed
from ..core.labels import CacheSpec
from ..ort.decode.greedy import AUTO, NEXT, TOKENS_PER_READ, auto_reduction, greedy_graph, ids_dtype, reduction_of
from ..ort.models.graph import load_graph
from ..ort.models.model import Model, load
from ..ort.runtime.options import VALIDATION_MODES

KV_DTYPES = ("float32", "float16")
TRANSFORMERS_GRAPH = "model.transformers-js.onnx"
DYNAMIC_IMPLS = ("auto", "transformers.js", "onnxruntime-web")
CAPTURED = "graph"  # CacheSpec.variant of a static cache whose decode steps replay a captured graph
# native ONNX Runtime's WebGPU EP's Dawn toggles for validation mode "disabled" that apply to every backend
SKIP_VALIDATION_TOGGLES = ("skip_validation", "disable_robustness")


def dawn_toggles(validation_mode: str) -> tuple[str, ...]:
    """The Dawn toggles a host kvlab starts enables for a job in ``validation_mode``: ``SKIP_VALIDATION_TOGGLES``
    for "disabled" (Dawn's validation off, as native ONNX Runtime opens its device then), none for another mode
    (Dawn validates every call). ConfigError for a mode not in ``VALIDATION_MODES``."""
    check_choice(validation_mode, VALIDATION_MODES, "validation mode ")
    return SKIP_VALIDATION_TOGGLES if validation_mode == "disabled" else ()


def parse_cache(spec: str | CacheSpec, needed: int, context: int) -> CacheSpec:
    """A cache name ("dynamic", "static", "static@N", "captured", "captured@N") or CacheSpec as a CacheSpec sized and
    checked for a run of ``needed`` positions on a model of ``context``: "static" is sized to fit, rounded up to 256
    as ``kvlab generate`` does; "captured" is a static cache whose decode steps replay a captured graph (variant
    ``CAPTURED``). ConfigError for a bad name or a size beyond the context, CapacityError for one below ``needed``."""
    if isinstance(spec, CacheSpec):
        kind, size, variant = spec.kind, spec.max_cache_len, spec.variant
    else:
        kind, at, text = spec.partition("@") if isinstance(spec, str) else ("", "", "")
        if kind not in ("dynamic", "static", "captured") or (at and kind == "dynamic"):
            raise ConfigError(
                f"cache {spec!r} is not valid; choose 'dynamic', 'static', 'static@N', 'captured' or 'captured@N' "
                "(N a positive int)"
            )
        if at and not (text.isascii() and text.isdigit()):  # "²" and "٣" are digits to str.isdigit, not to int()
            raise ConfigError(f"cache {spec!r}: the size after '{kind}@' must be a positive int, e.g. '{kind}@512'")
        size = int(text) if at else None
        kind, variant = ("static", CAPTURED) if kind == "captured" else (kind, "")
    if kind == "dynamic":
        return CacheSpec("dynamic")
    if kind != "static" or variant not in ("", CAPTURED):
        raise ConfigError(f"cache kind {kind!r} {variant!r} is not valid; choose one of ('dynamic', 'static')")
    size = min(context, -(-needed // 256) * 256) if size is None else check_max_cache_len(size)
    if size > context:
        raise ConfigError(f"max_cache_len={size} is larger than the model's context length ({context})")
    if size < needed:
        raise CapacityError(f"{needed} positions are needed but max_cache_len is {size}")
    return CacheSpec("static", size, variant)


def model_files(model: Model) -> list[Path]:
    """The decoder graph and the external data files it names, in that order; ModelError when one is missing."""
    graph = load_graph(model.onnx_path)
    names = []
    for init in graph.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location" and entry.value not in names:
                names.append(entry.value)
    files = [model.onnx_path] + [model.info.path / n for n in names]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ModelError(f"model {model.name}: {missing[0]} (named by {model.onnx_path.name}) is missing")
    return files


def check_model(model: Model) -> None:
    """ModelError, saying why, for a model the browser runner cannot drive: fixed-size states, or a KV dtype other
    than float32/float16."""
    info = model.info
    states = [e for e in info.entries if not e.grows]
    if states:
        e = states[0]
        raise ModelError(
            f"model {info.name}: the browser runner holds growing key/value caches only; {e.past!r} is a fixed-size "
            f"{e.role} state (read by {e.op}); run it natively with kvlab.generate"
        )
    if info.dtype_name not in KV_DTYPES:
        raise ModelError(f"model {info.name}: KV dtype {info.dtype_name} is not valid here; choose one of {KV_DTYPES}")


@dataclass
class Job:
    """One browser run: each cache generates ``max_new_tokens`` greedy tokens after ``prompt_ids``, ``reps``
    times (interleaved: A B A B), after one unrecorded warm-up round when ``warmup``."""

    model: Model
    prompt_ids: list[int]
    max_new_tokens: int
    caches: list[CacheSpec]
    reps: int = 1
    warmup: bool = True
    dynamic_impl: str = "auto"
    buffer_cache_mode: str = ""  # the WebGPU EP's storage buffer cache mode; "" = onnxruntime-web's default (bucket)
    validation_mode: str = DEFAULT_VALIDATION  # the WebGPU EP's validation mode (``VALIDATION_MODES``), as native
    files: list[Path] = field(default_factory=list)
    transformers_graph: bytes = b""  # the decoder graph with concrete past shapes (``concrete_past_shapes``)
    concrete: dict[str, int] = field(default_factory=dict)  # the dimension names it made concrete
    reduction: str = ""  # the greedy graph's reduction (``kvlab.ort.decode.greedy``); "": the token chosen on the host
    greedy_file: Path | None = None  # the greedy graph kvlab's own runs open, beside model.onnx (reduction != "")
    tokens_per_read: int = 1  # decode steps whose tokens are read back together (with the token on the device)
    stop_tokens: list[int] = field(default_factory=list)  # a generation ends after the first of these

    @property
    def served(self) -> dict[str, Path | bytes]:
        """Every file the page may ask for, by name: the model's, the greedy graph, the graph made here for
        transformers.js (as bytes)."""
        files: dict[str, Path | bytes] = {f.name: f for f in self.files}
        if self.greedy_file is not None:
            files[self.greedy_file.name] = self.greedy_file
        if self.transformers_graph:
            files[TRANSFORMERS_GRAPH] = self.transformers_graph
        return files

    def to_json(self) -> dict[str, Any]:
        """What the page receives: the model's geometry and files (the decoder graph and its external data, by name
        and size: served or sent as bytes; the greedy graph where the token stays on the device), the prompt, the
        caches and the options."""
        info = self.model.info
        return {
            "version": 1,
            "model": {
                "name": info.name,
                "dtype": info.dtype_name,
                "vocab_size": info.vocab_size,
                "input_ids": info.input_names["input_ids"],
                "attention_mask": info.input_names["attention_mask"],
                "position_ids": info.input_names.get("position_ids"),
                "logits": info.logits_name,
                "logits_dtype": np.dtype(info.logits_dtype).name,
                "entries": [
                    {"past": e.past, "present": e.present, "kv_heads": e.dims[1], "head_dim": e.dims[3]}
                    for e in info.entries
                ],
                "files": [{"name": f.name, "size": f.stat().st_size} for f in self.files],
                "transformers_config": {  # a Hugging Face config.json for transformers.js, from what kvlab read
                    "model_type": info.model_type,
                    "num_hidden_layers": info.num_layers,
                    "num_attention_heads": info.num_heads or info.num_kv_heads,
                    "num_key_value_heads": info.num_kv_heads,
                    "head_dim": info.head_dim,
                    "vocab_size": info.vocab_size,
                    "max_position_embeddings": info.context_length,
                    "eos_token_id": list(info.eos_token_ids),
                },
                "transformers_graph": (
                    {"name": TRANSFORMERS_GRAPH, "size": len(self.transformers_graph), "concrete": self.concrete}
                    if self.transformers_graph
                    else None
                ),
                "step_length_inputs": (
                    step_length_inputs(self.model) if any(c.variant == CAPTURED for c in self.caches) else ""
                ),
                "greedy": (
                    {
                        "name": self.greedy_file.name,
                        "size": self.greedy_file.stat().st_size,
                        "reduction": self.reduction,
                        "next": NEXT,
                        "ids_dtype": str(ids_dtype(self.reduction)),
                    }
                    if self.greedy_file is not None
                    else None
                ),
            },
            "tokens_per_read": self.tokens_per_read,
            "stop_tokens": self.stop_tokens,
            "prompt_ids": self.prompt_ids,
            "max_new_tokens": self.max_new_tokens,
            "caches": [
                {"kind": c.kind, "max_cache_len": c.max_cache_len, "name": c.name, "variant": c.variant}
                for c in self.caches
            ],
            "reps": self.reps,
            "warmup": self.warmup,
            "dynamic_impl": self.dynamic_impl,
            "buffer_cache_mode": self.buffer_cache_mode,
            "validation_mode": self.validation_mode,
        }


def concrete_past_shapes(model: Model) -> tuple[bytes, dict[str, int]]:
    """The decoder graph (weights still external, in the same files) with every symbolic past-input dimension
    but batch and length made concrete, and which dimension names were replaced by what. transformers.js makes its
    first, empty past from the graph's input shapes with every other symbolic dimension 0, which GroupQueryAttention
    refuses (docs/browser-runner.md); only this shape metadata changes, nodes and weights are the model's own."""
    graph = load_graph(model.onnx_path)
    entries = {e.past: e for e in model.info.entries}
    replaced: dict[str, int] = {}
    for value in graph.graph.input:
        entry = entries.get(value.name)
        if entry is None:
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if axis in (0, 2) or not dim.dim_param:
                continue
            replaced[dim.dim_param] = int(entry.dims[axis])
            dim.dim_value = int(entry.dims[axis])
    return graph.SerializeToString(), replaced


def step_length_inputs(model: Model) -> str:
    """Where the model's attention reads the step's length, which changes every step, in words: the
    GroupQueryAttention nodes' seqlens_k and total_sequence_length inputs (its inputs 5 and 6), made from the
    attention mask; "" for a model without them. The page's capture check names them when a captured replay does
    not follow them (``kvlab/web/js/captured.mjs``)."""
    graph = load_graph(model.onnx_path)
    nodes = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention" and len(n.input) > 6]
    if not nodes:
        return ""
    more = f" (and {len(nodes) - 1} more)" if len(nodes) > 1 else ""
    first = nodes[0]
    return (
        f"GroupQueryAttention {first.name!r}{more} takes it from the mask as seqlens_k ({first.input[5]!r}) and "
        f"total_sequence_length ({first.input[6]!r})"
    )


def page_reduction(model: Model, token_on_device: bool | str) -> str:
    """The greedy graph's reduction the page runs: as native ``reduction_of`` takes ``token_on_device`` ("" for
    False: the token chosen by the page, from the logits; "blocks" for True; a reduction named), with "auto" as a
    hardware adapter's native run chooses it (``auto_reduction``), "blocks" where the model's input ids cannot
    become the int32 ids "rows" needs. ConfigError for anything else."""
    if not (isinstance(token_on_device, str) and token_on_device == AUTO):
        return reduction_of(token_on_device)
    reduction = auto_reduction(model.info.vocab_size, "hardware", "webgpu")
    if reduction == "rows":
        try:
            greedy_graph(model, "rows")
        except ModelError:
            return "blocks"
    return reduction


def make_job(
    model: Model | str,
    prompt_ids: Sequence[int] | np.ndarray,
    *,
    max_new_tokens: int = 16,
    caches: Sequence[str | CacheSpec] = ("dynamic", "static"),
    reps: int = 1,
    warmup: bool = True,
    dynamic_impl: str = "auto",
    buffer_cache_mode: str = "",
    validation_mode: str = DEFAULT_VALIDATION,
    token_on_device: bool | str = AUTO,
    tokens_per_read: int | str = AUTO,
    stop_tokens: Sequence[int] = (),
) -> Job:
    """A checked ``Job`` for ``model`` (a loaded kvlab ``Model`` or a name): caches as ``parse_cache`` takes them.
    Every bad value raises a kvlab error naming it and what would be valid; a model the runner cannot drive
    (``check_model``; presents that cannot share the past's buffer, for a static cache) is refused with the reason.
    ``validation_mode``: the page opens onnxruntime-web's WebGPU EP in it (one of ``VALIDATION_MODES``; "disabled"
    by default, as kvlab's native WebGPU device), and a host kvlab starts makes its device with ``dawn_toggles``.

    A "captured" cache needs a model built for capture (``kvlab.load(name, graph_capture=True)``) whose step reads
    no dynamic input (ModelError) and the token on the device (ConfigError). ``token_on_device``: kvlab's own runs
    open the greedy graph (``page_reduction``) and keep the token on the GPU, reading ``tokens_per_read`` steps'
    tokens back together ("auto": ``TOKENS_PER_READ``); False: the page reads the logits every step and takes the
    argmax itself. ``stop_tokens``: a generation ends after the first of them (the steps a burst ran past it
    undone, as native); none: every generation runs ``max_new_tokens`` steps."""
    model = load(model)
    check_model(model)
    if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__len__"):
        raise ConfigError(f"prompt_ids must be a list of token ids, got {prompt_ids!r:.60}")
    if len(prompt_ids) == 0:
        raise ConfigError("the prompt is empty (0 tokens); give at least one token id")
    ids = model.check_ids(prompt_ids)
    new = check_new_tokens(max_new_tokens)
    needed = positions_needed(int(ids.size), new)
    context = model.info.context_length
    if needed > context:
        raise CapacityError(f"{needed} positions are needed but model {model.name} holds at most {context}")
    if isinstance(caches, (str, CacheSpec)):
        caches = [caches]
    specs = [parse_cache(c, needed, context) for c in caches]
    if not specs:
        raise ConfigError("caches is empty; give at least one of 'dynamic', 'static', 'static@N'")
    if len({s.name for s in specs}) != len(specs):
        raise ConfigError(f"caches {[s.name for s in specs]} name one cache twice; give each once")
    if any(s.kind == "static" for s in specs) and not model.info.shares_buffers:
        raise ModelError(f"model {model.name} cannot run a static cache: {model.info.sharing_problem}")
    reps = check_int(reps, "reps", 1)  # a Python int: the job goes to the page as JSON
    check_flag("warmup", warmup)
    check_choice(dynamic_impl, DYNAMIC_IMPLS, "dynamic_impl=")
    if buffer_cache_mode != "":  # not a falsy 0 or None either: "" is onnxruntime-web's default
        check_choice(buffer_cache_mode, BUFFER_CACHE_MODES, "buffer cache mode ")
    check_choice(validation_mode, VALIDATION_MODES, "validation mode ")
    files = model_files(model)
    reduction = page_reduction(model, token_on_device)
    if isinstance(tokens_per_read, str) and tokens_per_read == AUTO:
        tokens_per_read = TOKENS_PER_READ if reduction else 1
    per_read = check_int(tokens_per_read, "tokens_per_read", 1, note=' (or "auto")')
    if per_read > 1 and not reduction:
        raise ConfigError(f"tokens_per_read={per_read} reads back tokens kept on the GPU, but token_on_device is False")
    stops = [int(t) for t in model.check_ids(list(stop_tokens))] if len(stop_tokens) else []
    if any(s.variant == CAPTURED for s in specs):  # a captured step keeps every input and output on the GPU
        from ..ort.decode.caches.captured import capture_problem

        problem = capture_problem(model.info)  # a dynamic input such as position ids, or a Shape read of the mask
        if problem:
            raise ModelError(f"model {model.name} cannot run a captured cache in the page: {problem}")
        if not reduction:
            raise ConfigError(
                "a captured cache keeps every input and output on the GPU: token_on_device must not be False"
            )
    job = Job(model, [int(i) for i in ids], new, specs, reps, warmup, dynamic_impl, buffer_cache_mode, validation_mode)
    job.files, job.reduction, job.tokens_per_read, job.stop_tokens = files, reduction, per_read, stops
    job.greedy_file = greedy_graph(model, reduction) if reduction else None
    if dynamic_impl != "onnxruntime-web" and any(s.kind == "dynamic" for s in specs):
        job.transformers_graph, job.concrete = concrete_past_shapes(model)
    return job
