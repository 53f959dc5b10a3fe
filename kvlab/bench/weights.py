"""What a decode step's weights cost: the bytes it reads (the roofline's numerator), and the model's own matrix
products as a graph of their own (the "matmuls only" floor ONNX Runtime's MatMul kernel sets)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError
from ..ort import Device, Model, open_device
from ..ort.models.graph import load_graph, uses


def weight_bytes_by_op(model: Model) -> dict[str, int]:
    """Bytes of weights one decode step reads, by the op type that reads them: every initializer whole (a
    MatMulNBits' packed 4-bit weights, its scales and zero points count too), except tables a step reads one row
    of (embeddings only gathered from; GroupQueryAttention's rotary cos/sin caches, inputs 7 and 8)."""
    import onnx

    m = load_graph(model.onnx_path)
    read_by = {name: {(node.op_type, i) for node, i in readers} for name, readers in uses(m).items()}
    one_row = {("Gather", 0), ("GroupQueryAttention", 7), ("GroupQueryAttention", 8)}
    out: dict[str, int] = {}
    for init in m.graph.initializer:
        readers = read_by.get(init.name)
        if not readers:
            continue
        size = int(np.prod(init.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        if len(init.dims) == 2 and readers <= one_row:
            size //= int(init.dims[0])  # one row per token
        op = min(readers)[0]
        out[op] = out.get(op, 0) + size
    return out


def weight_bytes_per_token(model: Model) -> int:
    """Bytes of weights one decode step reads (``weight_bytes_by_op`` summed): the roofline's weight term."""
    return sum(weight_bytes_by_op(model).values())


def matmuls_only_model(model: Model, out: Path) -> tuple[Path, int]:
    """A graph of the model's MatMuls alone: the same weight tensors (read from a copy of the model's external
    data file in ``out``), each fed a constant row. Running it once costs what one decode step's matrix
    products cost with nothing around them: the floor ONNX Runtime's MatMul kernel sets, which the rest of a
    step (attention, norms, scheduling, Python) adds to. Returns its path and the weight bytes one run reads;
    ConfigError for a model with no fp32 MatMul weights."""
    import onnx
    from onnx import TensorProto, external_data_helper, helper

    src = load_graph(model.onnx_path)
    inits = {t.name: t for t in src.graph.initializer}
    nodes, weights, rows, outputs, nbytes = [], [], set(), [], 0
    for node in src.graph.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or len(w.dims) != 2 or w.data_type != TensorProto.FLOAT:
            continue
        k, n = w.dims
        y = f"y{len(nodes)}"
        rows.add(k)
        weights.append(w)
        nodes.append(helper.make_node("MatMul", [f"x{k}", w.name], [y]))
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, n]))
        nbytes += k * n * 4
    if not nodes:
        raise ConfigError(f"{model.name} has no fp32 MatMul with a weight initializer: no matmuls-only floor")
    graph = helper.make_graph(
        nodes,
        "matmuls_only",
        [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, k]) for k in sorted(rows)],
        outputs,
        weights,
    )
    floor = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=src.ir_version)
    out.mkdir(parents=True, exist_ok=True)
    for w in weights:  # ORT reads external data only from the model file's own directory: no links out of it,
        if external_data_helper.uses_external_data(w):  # and onnx refuses a data file with several hard links
            name = external_data_helper.ExternalDataInfo(w).location
            if not (out / name).exists():
                shutil.copyfile(Path(model.onnx_path).parent / name, out / name)
    path = out / "matmuls_only.onnx"
    onnx.save(floor, str(path))
    return path, nbytes


def run_matmuls_only(path: Path, device: str | Device, steps: int) -> float:
    """``steps`` runs of the matmuls-only graph, bound once like a static cache's decode step; the median wall
    time (ms) of the runs after the first."""
    session = open_device(device).session(path, "the matmuls-only floor")
    b = session.binding()
    for i in session.ort.get_inputs():
        b.input(i.name, np.full(i.shape, 0.01, np.float32))
    for o in session.ort.get_outputs():
        b.output(o.name, np.empty(o.shape, np.float32))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        b.run()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times[1:]))
