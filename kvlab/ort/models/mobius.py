"""The third exporter: mobius (``mobius-onnx``, ONNX Runtime's onnxscript model definitions), for what the
onnxruntime-genai builder cannot export: Gemma 4 with KV sharing (``kv-shared-toy``, a ``TinyKVShared`` recipe).

A mobius Gemma 4 graph gives each KV-shared layer a GroupQueryAttention node with empty keys and values whose past
inputs are the presents of the layer it borrows from; kvlab reads such a layer as ``SharedKV`` (no entry of its
own, ``kvlab.ort.models.layers``). Two things in mobius 0.1.0's graph are repaired here (``repair``) and named
when a graph still has them (``problems``, at load time):

- every layer is declared a ``past_key_values.N`` pair, the KV-shared ones too, though nothing reads theirs
  (ONNX Runtime still asks for them at every run);
- every KV input and output is declared with the sliding layers' head size, while Gemma 4's full-attention layers
  have heads of ``global_head_dim``: ONNX Runtime refuses the right tensors ("Got invalid dimensions").

mobius's own config reader fails on transformers 5.24's Gemma 4 config (``AmbiguousGlobalPerLayerAttributeError``:
``head_dim`` is per layer there); ``mobius_config`` reads it with the per-layer access allowed and takes
``global_head_dim`` from the full-attention layers' own config.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ...core.errors import ConfigError, ModelError
from .graph import load_graph, producers, uses

PRODUCER = "mobius"  # the ONNX producer_name of a mobius export
EXECUTION_PROVIDER = "webgpu"  # mobius's target: GroupQueryAttention, float32 and float16
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
REPAIR_HINT = "kvlab.ort.models.mobius.repair(<dir>/model.onnx) fixes both in place"
# the ops between a key projection and the GroupQueryAttention reading its output (mobius: Reshape, the per-head
# k norm, Reshape)
_PASS_THROUGH = ("Reshape", "RMSNormalization", "SimplifiedLayerNormalization", "Cast", "Mul", "Add")


def mobius_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("mobius-onnx")
    except metadata.PackageNotFoundError as exc:
        raise ModelError(
            "building a KV-shared model needs mobius-onnx (ONNX Runtime's model definitions): "
            "`pip install 'kvlab[mobius]'` (or `pip install mobius-onnx==0.1.0`)"
        ) from exc


def mobius_config(hf: Any) -> Any:
    """mobius's ``Gemma4Config`` of a transformers ``Gemma4TextConfig`` whose head size differs per layer."""
    import mobius

    if getattr(hf, "model_type", None) != "gemma4_text":
        raise ModelError(f"kvlab exports only Gemma 4 text (gemma4_text) through mobius, not {hf.model_type!r}")
    hf.allow_global_per_layer_attribute_access = True  # mobius reads head_dim globally: the sliding layers' one
    config = mobius.Gemma4Config.from_transformers(hf)
    per_layer = getattr(hf, "per_layer_config", None)
    full = [i for i, t in enumerate(hf.layer_types) if t == "full_attention"]
    if per_layer is not None and full:
        config = replace(config, global_head_dim=int(per_layer[full[0]].head_dim))
    return config


def export(hf_dir: Path, out: Path, task: Any = "text-generation") -> None:
    """mobius's export of the checkpoint ``hf_dir`` for WebGPU in float32 as ``task`` (a mobius task or its
    name), its weights applied, into ``out``."""
    import mobius
    import transformers
    from mobius._registry import registry
    from safetensors.torch import load_file

    hf = transformers.AutoConfig.from_pretrained(hf_dir)
    config = mobius_config(hf)
    module = registry.get(hf.model_type)(config)
    package = mobius.build_from_module(module, config, task, execution_provider=EXECUTION_PROVIDER)
    weights = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    if hasattr(module, "preprocess_weights"):
        weights = module.preprocess_weights(weights)
    package.apply_weights(weights, prefix_map=getattr(module, "weight_prefix_map", None))
    package.save(str(out), progress_bar=False)


def key_width(made_by: dict, inits: dict, node: Any) -> int | None:
    """The output width of the projection that makes a GroupQueryAttention node's keys (input 1), through the ops
    mobius puts between them; None when it is made some other way."""
    name = node.input[1] if len(node.input) > 1 else ""
    for _ in range(8):
        producer = made_by.get(name)
        if producer is None:
            return None
        if producer.op_type == "MatMul" and producer.input[1] in inits:
            return int(inits[producer.input[1]].dims[-1])
        if producer.op_type == "MatMulNBits":
            return next((int(a.i) for a in producer.attribute if a.name == "N"), None)
        if producer.op_type not in _PASS_THROUGH:
            return None
        name = producer.input[0]
    return None


def _kv_mismatches(graph: Any) -> list[tuple[Any, Any, int, int]]:
    """(value info, its node, declared head size, the one its key projection makes) for every KV input and
    present whose head size disagrees with the projection of the layer it belongs to."""
    made_by, inits = producers(graph), {t.name: t for t in graph.graph.initializer}
    inputs = {i.name: i for i in graph.graph.input}
    outputs = {o.name: o for o in graph.graph.output}
    out = []
    for node in (n for n in graph.graph.node if n.op_type == "GroupQueryAttention"):
        kv_heads = next((a.i for a in node.attribute if a.name == "kv_num_heads"), 0)
        width = key_width(made_by, inits, node)
        if not kv_heads or not width or width % kv_heads:
            continue
        for name in (*node.input[3:5], *node.output[1:3]):
            info = inputs.get(name) or outputs.get(name)
            dims = info.type.tensor_type.shape.dim if info is not None else []
            if len(dims) == 4 and dims[3].HasField("dim_value") and dims[3].dim_value != width // kv_heads:
                out.append((info, node, dims[3].dim_value, width // kv_heads))
    return out


def _unread(graph: Any) -> list[str]:
    read = uses(graph)
    return [i.name for i in graph.graph.input if i.name not in read]


def problems(graph: Any) -> list[str]:
    """What in a mobius graph kvlab cannot bind as it is (see the module docstring); [] when nothing."""
    found = []
    unread = _unread(graph)
    if unread:
        found.append(
            f"graph inputs {unread} are read by no node (the KV-shared layers' own pasts: those layers read "
            "another layer's presents), yet ONNX Runtime asks for them at every run"
        )
    for info, node, declared, real in _kv_mismatches(graph)[:1]:
        found.append(
            f"{info.name!r} is declared with heads of {declared}, but {node.name!r} writes heads of {real} (its key "
            "projection's width / kv_num_heads): ONNX Runtime would refuse the real tensors"
        )
    return found


def check(graph: Any, path: Path) -> None:
    """ModelError naming what a mobius graph needs repaired before kvlab can bind it (nothing for other graphs)."""
    if graph.producer_name != PRODUCER:
        return
    found = problems(graph)
    if found:
        raise ModelError(
            f"{path}: a mobius {graph.producer_version} export kvlab cannot bind: {'; '.join(found)}. {REPAIR_HINT}"
        )


def repair(onnx_file: Path) -> list[str]:
    """Fix what ``problems`` names, in place (the weights stay where they are); returns what changed."""
    import onnx

    graph = load_graph(Path(onnx_file))
    done = []
    unread = set(_unread(graph))
    if unread:
        keep = [i for i in graph.graph.input if i.name not in unread]
        del graph.graph.input[:]
        graph.graph.input.extend(keep)
        done.append(f"unread inputs dropped: {sorted(unread)}")
    for info, node, declared, real in _kv_mismatches(graph):
        info.type.tensor_type.shape.dim[3].dim_value = real
        done.append(f"{info.name}: head size {declared} -> {real} (as {node.name} writes it)")
    if done:
        del graph.graph.value_info[:]  # intermediate shapes inferred from the old declarations
        onnx.save(graph, str(onnx_file))
    return done


def rewrite_for_capture(onnx_file: Path) -> list[str]:
    """``kvlab.ort.models.capture_rewrites.for_capture`` on a repaired graph, in place; what changed."""
    import onnx

    from .capture_rewrites import for_capture

    graph = load_graph(Path(onnx_file))
    done = for_capture(graph)
    onnx.save(graph, str(onnx_file))
    return done


def build(name: str, out: Path, precision: str = "fp32", graph_capture: bool = False) -> None:
    """Build the built-in ``name`` (a ``TinyKVShared`` recipe) through mobius into ``out`` (atomic): its
    checkpoint, the graph (repaired; for ``graph_capture`` also rewritten for WebGPU graph capture), the
    checkpoint's config.json and tokenizer, ``kvlab_recipe.json`` last. ConfigError for a precision other than
    fp32, ModelError when mobius is missing or fails."""
    from ...presets import ensure_checkpoint, recipe
    from ...presets.recipes import building

    if precision != "fp32":
        raise ConfigError(f"model {name!r} is built by mobius in precision 'fp32' only, not {precision!r}")
    spec, version = recipe(name), mobius_version()
    hf_dir = ensure_checkpoint(name)
    with building(out, "kvlab_recipe.json") as tmp:
        try:
            export(hf_dir, tmp)
        except (ModelError, ConfigError):
            raise
        except Exception as exc:  # noqa: BLE001 - mobius raises whatever its passes raise
            raise ModelError(f"mobius-onnx {version} failed to export {name!r}: {type(exc).__name__}: {exc}") from exc
        rewrites = repair(tmp / "model.onnx")
        if graph_capture:
            rewrites += rewrite_for_capture(tmp / "model.onnx")
        for file in ("config.json", *TOKENIZER_FILES):
            if (hf_dir / file).is_file():
                shutil.copy(hf_dir / file, tmp / file)
        record = {
            "name": name,
            "precision": precision,
            "kind": type(spec).__name__,
            **asdict(spec),
            "hf_dir": str(hf_dir),
            "exporter": f"mobius-onnx {version} (execution_provider={EXECUTION_PROVIDER!r})",
            "graph_capture": graph_capture,
            "graph_rewrites": rewrites,
        }
        (tmp / "kvlab_recipe.json").write_text(json.dumps(record, indent=1))
