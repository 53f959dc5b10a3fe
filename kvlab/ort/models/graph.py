"""Reading an ONNX decoder graph without its weights (who makes each tensor, who reads it, attributes, dtypes), and
writing a graph kvlab derived from one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import ConfigError, ModelError
from ...core.paths import write_atomic

# ONNX TensorProto element types kvlab meets in KV caches
FLOAT16 = 10  # TensorProto.FLOAT16
ONNX_DTYPES: dict[int, Any] = {1: np.dtype(np.float32), FLOAT16: np.dtype(np.float16), 16: "bfloat16"}


def load_graph(onnx_file: Path) -> Any:
    """The ModelProto of ``onnx_file`` without its external weights; ModelError when it is unreadable."""
    import onnx

    try:
        return onnx.load(str(onnx_file), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError and others
        raise ModelError(f"{onnx_file} is not a readable ONNX model: {exc}") from exc


DERIVED = ".kvlab-"  # in the name of every graph kvlab derives and writes beside a model's (``derived_graph``)


def files_stamp(graph: Path) -> tuple[tuple[str, int, int, int], ...]:
    """What identifies the files a session of ``graph`` reads: (name, size, mtime in ns, inode) of ``graph`` and of
    every ".onnx" file beside it kvlab did not derive; a file replaced or written in place changes it. Unreadable files
    are left out."""
    stamp = []
    for f in [graph, *(p for p in graph.parent.iterdir() if ".onnx" in p.name and DERIVED not in p.name)]:
        try:
            st = f.stat()
        except OSError:
            continue
        stamp.append((f.name, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(sorted(set(stamp)))


def changed_files(then: tuple, now: tuple) -> str:
    """How the files of two ``files_stamp``s differ, for a message ("" when they do not)."""
    old, new = {s[0]: s[1:] for s in then}, {s[0]: s[1:] for s in now}
    parts = []
    for name in sorted(old.keys() | new.keys()):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if a is None or b is None:
            parts.append(f"{name} {'appeared' if a is None else 'is gone'}")
        else:
            how = [w for w, x, y in zip(("size", "modified", "replaced"), a, b) if x != y]
            parts.append(f"{name} {'/'.join(how)}" + (f" ({a[0]} -> {b[0]} bytes)" if a[0] != b[0] else ""))
    return ", ".join(parts)


def rewrite_file(onnx_file: Path, edit: Callable[[Any], list[str]]) -> list[str]:
    """Apply ``edit`` to the graph of ``onnx_file`` and save it in place (its weights stay where they are);
    returns what ``edit`` returns: one line per change."""
    import onnx

    graph = load_graph(Path(onnx_file))
    done = edit(graph)
    onnx.save(graph, str(onnx_file))
    return done


def derived_graph(model: Any, suffix: str, edit: Callable[[Any], Any], what: str) -> Path:
    """A graph derived from ``model``'s by ``edit`` (weights referenced where they are), written atomically beside its
    model.onnx as ``model<suffix>`` (again when the model is newer); returns its path. ModelError, naming ``what``, when
    the directory is not writable."""
    src = Path(model.onnx_path)
    dst = src.with_name(src.name.removesuffix(".onnx") + suffix)
    # fresh when written after the graph last changed (its ctime moves also for a file replaced by an older one)
    if dst.is_file() and dst.stat().st_mtime_ns >= src.stat().st_ctime_ns:
        return dst
    m = load_graph(src)
    edit(m)
    try:
        write_atomic(dst, m.SerializeToString())
    except ConfigError as exc:  # write_atomic's: the bytes, the reason, the room
        raise ModelError(
            f"kvlab writes model {model.name}'s {what} beside its model.onnx, in {dst.parent}, which failed "
            f"({exc}); copy the model directory somewhere writable and load it from there"
        ) from exc
    return dst


def producers(model: Any) -> dict[str, Any]:
    """Tensor name -> the node that makes it."""
    return {out: node for node in model.graph.node for out in node.output}


def uses(model: Any) -> dict[str, list[tuple[Any, int]]]:
    """Tensor name -> every (node, input index) that reads it."""
    out: dict[str, list[tuple[Any, int]]] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            out.setdefault(name, []).append((node, i))
    return out


def attr(node: Any, name: str, default: Any = None) -> Any:
    """The value of ``node``'s attribute ``name`` (an int, a float, a string, a list ...), or ``default``."""
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def elem_type(value_info: Any) -> int:
    """The ONNX element type (TensorProto's number) of a graph input or output."""
    return value_info.type.tensor_type.elem_type


def projection_width(model: Any, name: str, through: tuple[str, ...] = ("Add",)) -> int | None:
    """The output width of the MatMul (its weight's last dimension) or MatMulNBits (its N) that makes ``name``,
    followed back through at most 8 ``through`` ops (by their first input); None when it is made another way."""
    made_by, inits = producers(model), {t.name: t for t in model.graph.initializer}
    for _ in range(8):
        node = made_by.get(name)
        if node is None:
            return None
        if node.op_type == "MatMulNBits":
            return attr(node, "N")
        if node.op_type == "MatMul":
            weight = inits.get(node.input[1]) if len(node.input) > 1 else None
            return int(weight.dims[-1]) if weight is not None and len(weight.dims) == 2 else None
        if node.op_type not in through:
            return None
        name = node.input[0]
    return None


def weight_format(model: Any) -> str:
    """What the projections' weights are: "int<bits>" for MatMulNBits, else the dtype of MatMul weight initializers."""
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            return f"int{attr(node, 'bits', 4)}"
    types = {inits[n.input[1]].data_type for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits}
    names = sorted(np.dtype(ONNX_DTYPES[t]).name for t in types if t in ONNX_DTYPES and ONNX_DTYPES[t] != "bfloat16")
    return "+".join(names) or "unknown"
