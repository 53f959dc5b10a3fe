"""The built-in models as ONNX: each preset's checkpoint exported in a precision (``kvlab.presets.PRECISIONS``) by the
onnxruntime-genai model builder (GroupQueryAttention for every layer, ``-e webgpu``; then ``fold_attention_scale``
where that is exact), or by mobius for what the builder cannot export (``kvlab.ort.models.mobius``). Built into the
user cache dir on first use, one directory per model, precision and build, atomically; never committed."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from ...core.errors import ConfigError, ModelError
from ...presets import cache_dir, check_precision, ensure_checkpoint, recipe
from ...presets.recipes import TinyArch, TinyKVShared, building, recipe_key
from . import mobius
from .graph import load_graph, producers, rewrite_file, uses
from .rewrites import for_ort127

# the version of the build code per kind of recipe, in its directory's key: bump one to rebuild those models
BUILDER_VERSION = 2  # the builder's Llamas (2: scale folded)
VERSIONS = {TinyArch: 1, TinyKVShared: 2}  # TinyKVShared 2: the graph-capture build rewritten
# builder options per architecture: Gemma 3's and LFM2's q/k norms stay separate nodes (docs/known-limits.md)
ARCH_OPTIONS: dict[str, tuple[str, ...]] = {"gemma3": ("fuse_qk_norm_gqa=false",), "lfm2": ("fuse_qk_norm_gqa=false",)}
# the builder's option for graph capture: the total length is the mask's ones, not its length (a fixed mask buffer)
GRAPH_CAPTURE_OPTION = "enable_webgpu_graph=true"
DONE = "kvlab_recipe.json"  # written last: its presence marks a finished build


def model_dir(name: str, precision: str = "fp32", graph_capture: bool = False) -> Path:
    """Where the built-in model ``name`` in ``precision`` is (or will be) built: one directory per recipe, precision,
    build and version of the build code. ConfigError for an unknown name or precision."""
    spec = recipe(name)
    more = {"webgpu_graph": True} if graph_capture else {}  # the standard build keeps its key
    key = recipe_key(spec, VERSIONS.get(type(spec), BUILDER_VERSION), precision=check_precision(precision), **more)
    return cache_dir() / "models" / f"{name}-{precision}{'-graph' if graph_capture else ''}-{key}"


def ensure_built(name: str, precision: str = "fp32", progress: bool = True, graph_capture: bool = False) -> Path:
    """The directory of a built-in model in a precision (``graph_capture``: the capture build), built first when
    missing, atomically. Raises ConfigError for an unknown name or precision, ModelError when the build fails."""
    out = model_dir(name, precision, graph_capture)
    if not (out / DONE).is_file():
        build(name, out, precision, progress=progress, graph_capture=graph_capture)
    return out


def build(name: str, out: Path, precision: str = "fp32", progress: bool = True, graph_capture: bool = False) -> None:
    """Build the built-in model ``name`` into ``out``: its checkpoint, the exporter's graph, kvlab's rewrites, and
    ``kvlab_recipe.json`` last. ModelError: a missing dependency or a failed export; ConfigError: a precision mobius
    lacks."""
    from tqdm.auto import tqdm

    spec = recipe(name)
    if isinstance(spec, TinyKVShared) and precision != "fp32":
        raise ConfigError(f"model {name!r} is built by mobius in precision 'fp32' only, not {precision!r}")
    needs = ("mobius",) if isinstance(spec, TinyKVShared) else ("onnxruntime_genai", "onnxscript")
    missing = [m for m in ("torch", "transformers", *needs) if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelError(
            f"building model {name!r} needs {missing}; run `bash scripts/setup.sh` (or pip install "
            "'kvlab[build]' and `pip install --no-deps onnxruntime-genai`, or 'kvlab[mobius]')"
        )
    what = f"{precision}, for graph capture" if graph_capture else precision
    steps = tqdm(total=2, desc=f"kvlab: building {name} ({what})", disable=not progress, leave=False)
    steps.set_postfix_str("the PyTorch checkpoint")
    hf = ensure_checkpoint(name)
    steps.update()
    steps.set_postfix_str("exporting ONNX")
    record = {"name": name, "precision": precision, "kind": type(spec).__name__, **asdict(spec), "hf_dir": str(hf)}
    with building(out, DONE) as tmp:
        if isinstance(spec, TinyKVShared):  # the builder has no KV sharing: the third exporter
            record |= _export_with_mobius(name, hf, tmp, graph_capture)
        else:
            arch = spec.arch if isinstance(spec, TinyArch) else None
            export(hf, tmp, name, precision, arch, [GRAPH_CAPTURE_OPTION] if graph_capture else [])
            sliding = [i for i, t in enumerate(getattr(spec, "layer_types", ())) if t == "sliding_attention"]
            rewrites = rewrite_file(tmp / "model.onnx", lambda m: for_ort127(m, spec.window, sliding)) if arch else []
            record |= {
                "graph_capture": graph_capture,
                "attention_scale_folded_layers": fold_attention_scale(tmp / "model.onnx"),
            }
            record |= {"graph_rewrites": rewrites} if arch else {}
        (tmp / DONE).write_text(json.dumps(record, indent=1))
    steps.update()
    steps.close()


def _export_with_mobius(name: str, hf: Path, out: Path, graph_capture: bool) -> dict:
    """mobius's export of ``hf`` into ``out``, repaired (and rewritten for capture), with the checkpoint's config
    and tokenizer; what the build record says of it. ModelError when mobius fails."""
    import shutil

    version = mobius.mobius_version()
    try:
        mobius.export(hf, out)
    except Exception as exc:  # noqa: BLE001 - mobius raises whatever its passes raise
        raise ModelError(f"mobius-onnx {version} failed to export {name!r}: {type(exc).__name__}: {exc}") from exc
    rewrites = mobius.repair(out / "model.onnx")
    if graph_capture:
        rewrites += rewrite_file(out / "model.onnx", mobius.for_capture)
    for file in ("config.json", *mobius.TOKENIZER_FILES):
        if (hf / file).is_file():
            shutil.copy(hf / file, out / file)
    exporter = f"mobius-onnx {version} (execution_provider={mobius.EXECUTION_PROVIDER!r})"
    return {"exporter": exporter, "graph_capture": graph_capture, "graph_rewrites": rewrites}


def export(
    hf: Path,
    out: Path,
    name: str,
    precision: str = "fp32",
    arch: str | None = None,
    extra_options: Iterable[str] = (),
    execution_provider: str = "webgpu",
    shims: bool | None = None,
) -> None:
    """The onnxruntime-genai model builder, in a subprocess (offline), for ``execution_provider`` (the builder's ``-e``)
    with ``arch``'s ``ARCH_OPTIONS`` and then ``extra_options`` ("key=value"); with kvlab's config shims
    (``builder_shims``) where ``shims`` says (None: for an ``arch`` beyond the Llama family). ModelError (with the
    builder's stderr) when it fails."""
    shims = bool(arch) if shims is None else shims
    with tempfile.TemporaryDirectory() as scratch:
        module = "kvlab.ort.models.builder_shims" if shims else "onnxruntime_genai.models.builder"
        cmd = [sys.executable, "-m", module, "-i", str(hf), "-o", str(out), "-p", precision, "-e", execution_provider]
        options = [*ARCH_OPTIONS.get(arch or "", ()), *extra_options]
        cmd += ["-c", scratch, *(["--extra_options", *options] if options else [])]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        if shims:  # this kvlab's shims, wherever it is imported from
            root = str(Path(__file__).resolve().parents[3])
            env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise ModelError(
            f"the model builder failed for {name!r} in {precision} (exit {run.returncode}):\n{run.stderr[-2000:]}"
        )


def fold_attention_scale(onnx_file: Path) -> int:
    """Fold each GroupQueryAttention node's softmax scale into the query columns of the MatMul feeding it (the node's
    ``scale`` set to 1) in ``onnx_file`` and its weights file, so the CPU EP's attention reads K^T in place; returns how
    many nodes were folded. Only where exact: a power-of-two scale, and a query straight from a MatMul whose float32
    weight feeds nothing else."""
    import numpy as np
    import onnx
    from onnx import external_data_helper, numpy_helper

    model = load_graph(onnx_file)
    inits = {t.name: t for t in model.graph.initializer}
    made_by, read_by = producers(model), uses(model)
    folded = 0
    for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        attrs = {a.name: a for a in node.attribute}
        mm = made_by.get(node.input[0])
        weight = inits.get(mm.input[1]) if mm is not None and mm.op_type == "MatMul" else None
        if (
            weight is None
            or len(weight.dims) != 2
            or weight.data_type != onnx.TensorProto.FLOAT
            or len(read_by[mm.input[1]]) != 1
            or len(read_by[node.input[0]]) != 1
        ):
            continue
        heads, kv_heads = attrs["num_heads"].i, attrs["kv_num_heads"].i
        packed = len(node.input) < 2 or not node.input[1]  # query, key and value in one tensor
        head_size = weight.dims[1] // (heads + 2 * kv_heads if packed else heads)
        scale = attrs["scale"].f if "scale" in attrs and attrs["scale"].f else 1 / math.sqrt(head_size)
        if math.frexp(scale)[0] != 0.5:  # not a power of two: folding would round differently
            continue
        q_columns = slice(0, heads * head_size)
        if external_data_helper.uses_external_data(weight):
            info = external_data_helper.ExternalDataInfo(weight)
            data = np.memmap(onnx_file.parent / info.location, np.float32, "r+", info.offset or 0, tuple(weight.dims))
            data[:, q_columns] *= np.float32(scale)
            data.flush()
            del data
        else:
            array = numpy_helper.to_array(weight).copy()
            array[:, q_columns] *= np.float32(scale)
            weight.CopyFrom(numpy_helper.from_array(array, weight.name))
        if "scale" in attrs:
            attrs["scale"].f = 1.0
        else:
            node.attribute.append(onnx.helper.make_attribute("scale", 1.0))
        folded += 1
    onnx.save(model, str(onnx_file))
    return folded
