"""Which of kvlab's caches run a model on which device, and why not (``verdicts``: the judge
``kvlab.ort.models.describe`` asks, set when this module is imported, as ``kvlab.ort`` does), and the engine of
``kvlab inspect DIR`` (``report``). Opens no session and no device: what the installed ONNX Runtime package can
load is read from the op schemas it registers (``kvlab.ort.runtime.preflight.schema_problems``), what each cache
needs of a graph from the cache's own checks (``kvlab.ort.decode``)."""

from __future__ import annotations

import os
from typing import Any

from ..decode.caches.captured import capture_problem
from ..decode.caches.ring import sliding_windows
from ..decode.caches.shared_kv import shared_capture_problem
from ..models import describe
from ..models.describe import Verdict
from ..models.graph import load_graph
from ..models.model import load
from ..runtime.device import backend
from ..runtime.preflight import schema_problems

RING_ATTRIBUTE = "sliding_window_cache"  # what a GroupQueryAttention that evicts in place takes
RING_ON_WEBGPU = (
    "no WebGPU GroupQueryAttention evicts in place: the built-in EP does not know sliding_window_cache, the plugin "
    "EP refuses it when the kernel is created (kvlab.ort.decode.caches.ring)"
)


def verdicts(info: Any) -> list[Verdict]:
    """A ``Verdict`` per cache and device for the model ``info`` with the installed ONNX Runtime package ("" where it
    runs, else why not), from the graph (not its weights) and the package's op schemas."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    b = backend()
    runtime = " ".join(b.label_for("cpu"))  # the package whose op schemas (and CPU EP) these are
    gaps = schema_problems(load_graph(info.onnx_path))
    out = []
    for device in ("cpu", "webgpu"):
        if gaps:
            why = f"{runtime} cannot load the graph: {gaps[0]}"
            out += [Verdict(c, device, why) for c in ("dynamic", "static", "ring", "captured")]
            continue
        out.append(Verdict("dynamic", device))
        out.append(Verdict("static", device, info.sharing_problem))
        if info.sharing_problem:
            ring = info.sharing_problem
        elif not sliding_windows(info):
            ring = "no sliding-window layer: a ring holds a sliding layer's window (use a StaticCache)"
        elif device == "webgpu":
            ring = RING_ON_WEBGPU
        elif not any(
            s.name == "GroupQueryAttention" and RING_ATTRIBUTE in s.attributes for s in C.get_all_operator_schema()
        ):
            ring = f"{runtime}'s GroupQueryAttention has no {RING_ATTRIBUTE}: it cannot evict in place"
        else:
            ring = ""
        out.append(Verdict("ring", device, ring))
        captured = (
            "graph capture is a WebGPU EP feature"
            if device == "cpu"
            else capture_problem(info) or shared_capture_problem(info, b)
        )
        out.append(Verdict("captured", device, captured))
    return out


def report(path: str | os.PathLike, dtype: str | None = None) -> str:
    """What ``kvlab inspect DIR`` prints: ``Model.describe`` of the directory ``path`` (``dtype``: a transformers.js
    variant). Raises what ``kvlab.load`` raises (ModelError, ConfigError)."""
    return load(path, dtype=dtype).describe()


describe.judge = verdicts
