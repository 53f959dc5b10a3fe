"""Greedy decoding with the token kept on the device (``Stepper(..., token_on_device=True)``).

A decode step normally hands the host the logits, the host picks the token, and the next step's binding copies
that token back to the device: on a real GPU that copy costs more than all of kvlab's Python time
(``data/gpu/phases/``). Here the model's graph also outputs the greedy token (an ArgMax over the last position's
logits, ``NEXT``), written into a device tensor that the next step reads as its input ids, and a host copy of it
(``NEXT_HOST``, 8 bytes, copied back as the logits would be): the token never travels to the device. The graph with
those outputs is written beside the model's (``greedy_graph``; the weights are the model's own file, not copied).
Opt-in: ONNX Runtime's WebGPU ArgMax reduces the whole vocabulary in one GPU invocation, so it pays on a small
vocabulary and costs on a large one (``data/gpu/token/``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ModelError
from .caches import release_all, zeros_all
from .tensors import DeviceTensor

NEXT = "kvlab_next_token"  # [1, 1] int64 on the device: the next step's input ids
NEXT_HOST = "kvlab_next_token_host"  # the same token, bound to host memory
SUFFIX = ".kvlab-greedy.onnx"


def greedy_graph(model: Any) -> Path:
    """The model's graph plus the greedy token outputs, beside ``model.onnx`` (rewritten when the model is newer);
    returns its path. The logits are cast to float32 first (ArgMax has no float16 kernel on every EP); ties go to
    the lowest index, as numpy's argmax does. ModelError when the model's directory is not writeable."""
    src = Path(model.onnx_path)
    dst = src.with_name(src.name.removesuffix(".onnx") + SUFFIX)
    if dst.is_file() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    import onnx
    from onnx import TensorProto, helper

    m = onnx.load(str(src), load_external_data=False)  # weights stay where they are, referenced by relative path
    g = m.graph
    g.initializer.append(helper.make_tensor("kvlab_last_position", TensorProto.INT64, [], [-1]))
    g.node.extend(
        [
            helper.make_node(
                "Gather",
                [model.info.logits_name, "kvlab_last_position"],
                ["kvlab_last_logits"],
                axis=1,
                name="kvlab/last_logits",
            ),  # [1, vocab]
            helper.make_node(
                "Cast",
                ["kvlab_last_logits"],
                ["kvlab_last_logits_f32"],
                to=TensorProto.FLOAT,
                name="kvlab/last_logits_f32",
            ),
            helper.make_node("ArgMax", ["kvlab_last_logits_f32"], [NEXT], axis=-1, keepdims=1, name="kvlab/argmax"),
            helper.make_node("Identity", [NEXT], [NEXT_HOST], name="kvlab/next_token_host"),
        ]
    )
    g.output.extend([helper.make_tensor_value_info(n, TensorProto.INT64, [1, 1]) for n in (NEXT, NEXT_HOST)])
    tmp = dst.with_name(dst.name + f".{os.getpid()}.tmp")
    try:
        onnx.save(m, str(tmp))
        os.replace(tmp, dst)  # atomic: a concurrent reader sees the old file or the new one
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ModelError(
            f"token_on_device writes model {model.name}'s greedy graph beside its model.onnx, in "
            f"{dst.parent}, which failed ({exc.strerror or exc}); copy the model directory somewhere "
            "writable and load it from there"
        ) from exc
    return dst


class TokenFeed:
    """Two [1, 1] int64 device tensors, read and written in turn: ``current`` holds ``token`` (the last step's
    greedy token), the other receives the next one. It advances only after a step has fully succeeded, so a failed
    step is retried from the token it read."""

    def __init__(self, device: Any):
        self.tensors: list[DeviceTensor] = zeros_all(device, [((1, 1), np.dtype(np.int64))] * 2)
        self.host = np.zeros((1, 1), np.int64)  # the host copy of the token the last run wrote
        self.current = 0
        self.token: int | None = None  # the token tensors[current] holds (None: none yet, feed from the host)

    def holding(self, tokens: np.ndarray) -> DeviceTensor | None:
        """The device tensor that already holds this one-token feed, if one does."""
        if tokens.shape[0] == 1 and self.token is not None and int(tokens[0]) == self.token:
            return self.tensors[self.current]
        return None

    def bind_outputs(self, binding: Any) -> None:
        binding.output(NEXT, self.tensors[1 - self.current])
        binding.output(NEXT_HOST, self.host)

    def written(self) -> int:
        return int(self.host[0, 0])

    def advance(self) -> None:
        """The step that wrote the other tensor succeeded: it holds the token now."""
        self.current, self.token = 1 - self.current, self.written()

    def forget(self) -> None:
        """The next step's ids come from the host (a step that chose its token on the host ran in between)."""
        self.token = None

    def release(self) -> None:
        release_all(self.tensors)
        self.tensors, self.token = [], None
