"""Greedy decoding with the token kept on the device (``Stepper(..., token_on_device=True)``).

The model's graph gains an output, ``NEXT``: the greedy token (an argmax over the last position's logits), written
into a device tensor that the next step reads as its input ids, so the token never travels host -> device. The host
reads the tokens back when it needs them, after every step or after a burst of steps (``Stepper.decode``): a step
not read back does not wait for the GPU, so the host prepares the next one while the GPU runs (what that buys:
data/token-on-the-device/). The graph with that output is written beside the model's (``greedy_graph``; the weights
stay in the model's own file).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import ConfigError, ModelError, check_choice, check_int
from ..models.graph import derived_graph
from ..runtime.session import DeviceTensor, release_all, zeros_all

NEXT = "kvlab_next_token"  # [1, 1] on the device (int64; int32 for "rows"): the next step's input ids


REDUCTIONS = ("blocks", "single", "rows")  # how the greedy graph finds the largest logit (``greedy_graph``)
SUFFIXES = {r: f".kvlab-next-{r}.onnx" for r in REDUCTIONS}  # the greedy graphs, beside model.onnx
AUTO = "auto"  # the token on the device where that pays (``auto_reduction``), else on the host
AUTO_MAX_VOCAB = 1024  # "auto" on a hardware adapter: "single" up to this vocabulary, "rows" above it
TOKENS_PER_READ = 8  # greedy steps "auto" runs before reading their tokens back (``Stepper.decode``)
MAX_TOKENS_PER_READ = 4096  # the most steps read back together: a larger count is a typo rather than a burst


def auto_reduction(vocab_size: int, adapter_kind: str, device_name: str) -> str:
    """What ``token_on_device="auto"`` runs: "single" on the CPU EP and on a hardware WebGPU adapter up to
    ``AUTO_MAX_VOCAB``, "rows" on a hardware adapter above it, "" (the host chooses) on a software adapter."""
    if device_name == "cpu":
        return "single"
    if device_name != "webgpu" or adapter_kind != "hardware":
        return ""
    return "single" if vocab_size <= AUTO_MAX_VOCAB else "rows"


def reduction_for(token_on_device: object, vocab_size: int, device: Any) -> str:
    """``reduction_of``, with "auto" resolved for this vocabulary on this device (``auto_reduction``)."""
    if isinstance(token_on_device, str) and token_on_device == AUTO:
        return auto_reduction(vocab_size, device.label.adapter.kind, device.name)
    return reduction_of(token_on_device)


def tokens_per_read_for(asked: int | str, reduction: str, cache: Any) -> int:
    """How many greedy steps are read back together: 0 with the token on the host; "auto": ``TOKENS_PER_READ`` where the
    cache keeps tokens on the device, else 1. ConfigError for a bad count, or one above 1 with nothing to read later."""
    bursts = bool(reduction) and getattr(cache, "burst_reads", False)
    if isinstance(asked, str) and asked == AUTO:
        return (TOKENS_PER_READ if bursts else 1) if reduction else 0
    asked = check_int(asked, "tokens_per_read", 1, MAX_TOKENS_PER_READ, note=' (or "auto")')
    if asked > 1 and not bursts:
        kind = cache.__name__ if isinstance(cache, type) else type(cache).__name__
        why = "the token is chosen on the host" if not reduction else f"a {kind} reads each token back"
        raise ConfigError(f"tokens_per_read={asked} reads back tokens kept on the device, but {why}: use 1 or 'auto'")
    return asked if reduction else 0


def reduction_of(token_on_device: object) -> str:
    """The reduction a ``token_on_device`` setting asks for: "" for False, "blocks" for True, or the one named ("auto":
    ``reduction_for``). ConfigError for anything else."""
    if token_on_device is False:
        return ""
    if token_on_device is True:
        return "blocks"
    if isinstance(token_on_device, str) and token_on_device in REDUCTIONS:
        return token_on_device
    raise ConfigError(
        f"token_on_device={token_on_device!r} must be True or False, {AUTO!r}, or a reduction of the greedy graph: "
        f"{', '.join(map(repr, REDUCTIONS))}"
    )


def argmax_blocks(vocab: int) -> tuple[int, int]:
    """(blocks, block size) for a two-stage argmax over ``vocab`` logits: a power-of-two block size near the
    square root, so both stages reduce a few hundred values at most."""
    size = 1 << max(0, math.ceil(math.log2(math.sqrt(vocab))))
    return -(-vocab // size), size


def ids_dtype(reduction: str) -> np.dtype:
    """The input ids' type in the greedy graph of ``reduction``: int32 for "rows" (its graph takes them as int32, so
    that the token it writes never passes through an int64 op, which WebGPU runs on the CPU EP), else int64."""
    return np.dtype(np.int32 if reduction == "rows" else np.int64)


def greedy_graph(model: Any, reduction: str = "blocks") -> Path:
    """The model's graph plus the output ``NEXT`` (the greedy token, for device memory), beside ``model.onnx``
    (rewritten when the model is newer); returns its path. The logits are cast to float32 first; ties go to the lowest
    index, as numpy's argmax does. ``reduction``: "blocks" (default: an ArgMax per block of the vocabulary, then
    among the blocks), "single" (one ArgMax), "rows" (the row of a [blocks, size] view holding the largest logit,
    then the largest within it, every op on the GPU; the input ids become int32: ``ids_dtype``). Raises ConfigError
    for another reduction, ModelError when the model's directory is not writeable or (for "rows") its input ids feed
    anything but a Gather's indices."""
    check_choice(reduction, REDUCTIONS, "reduction=")

    def edit(m: Any) -> None:
        greedy_nodes(m.graph, model, reduction)

    return derived_graph(model, SUFFIXES[reduction], edit, "greedy graph")


def greedy_nodes(g: Any, model: Any, reduction: str) -> None:
    """The nodes and the output from the model's logits to ``NEXT`` [1, 1] by ``reduction``."""
    from onnx import helper

    _last_logits_f32(g, model.info.logits_name)
    _finite_check(g)
    if reduction == "single":
        _single_argmax(g, model.info.vocab_size)
    elif reduction == "rows":
        _row_argmax(g, model.info.vocab_size)
        _ids_as_int32(g, model)
    else:
        _two_stage_argmax(g, model.info.vocab_size)
    token_type = helper.np_dtype_to_tensor_dtype(ids_dtype(reduction))  # the token is the next step's input ids
    g.output.append(helper.make_tensor_value_info(NEXT, token_type, [1, 1]))


def not_a_token(token: int, vocab_size: int) -> bool:
    """Whether a token the greedy graph wrote says its logits held NaN or Inf (``_finite_check``): -1, or
    ``vocab_size`` for the "single" reduction."""
    return not 0 <= token < vocab_size


def non_finite(step: int, position: int, model: str, counts: str = "NaN or Inf") -> ModelError:
    """The error of a step whose logits held NaN or Inf (``counts`` says how many, where the host saw them)."""
    return ModelError(
        f"model {model} gave non-finite logits at step {step} (position {position}): {counts}; its weights or its "
        "arithmetic (float16 overflow?) are broken, so no token can be chosen"
    )


def _finite_check(g: Any) -> None:
    """Nodes from ``kvlab_last_logits_f32`` to ``kvlab_finite`` [1, 1] bool: whether every logit is finite (the sum
    of x - x equals itself only then). The reductions write a token outside the vocabulary where it is false
    (``not_a_token``), so the host, which reads only the token, sees it."""
    from onnx import helper

    node = helper.make_node
    g.node.extend(
        [
            node("Sub", ["kvlab_last_logits_f32", "kvlab_last_logits_f32"], ["kvlab_zeros"], name="kvlab/finite_sub"),
            node("ReduceSum", ["kvlab_zeros"], ["kvlab_zero_sum"], keepdims=1, name="kvlab/finite_sum"),  # [1, 1]
            node("Equal", ["kvlab_zero_sum", "kvlab_zero_sum"], ["kvlab_finite"], name="kvlab/finite"),
        ]
    )


def _single_argmax(g: Any, vocab: int) -> None:
    """Nodes from ``kvlab_last_logits_f32`` [1, vocab] to ``NEXT`` [1, 1] int64: one ArgMax over the logits and -inf, or
    over a one-hot of that extra value where a logit is not finite (the token is then ``vocab``)."""
    from onnx import TensorProto, helper, numpy_helper

    flag = np.zeros((1, vocab + 1), np.float32)
    flag[0, vocab] = 1.0
    g.initializer.extend(
        [
            helper.make_tensor("kvlab_minus_inf", TensorProto.FLOAT, [1, 1], [-math.inf]),
            numpy_helper.from_array(flag, "kvlab_not_finite"),
        ]
    )
    node = helper.make_node
    g.node.extend(
        [
            node("Concat", ["kvlab_last_logits_f32", "kvlab_minus_inf"], ["kvlab_padded_one"], axis=-1),
            node("Where", ["kvlab_finite", "kvlab_padded_one", "kvlab_not_finite"], ["kvlab_guarded"]),
            node("ArgMax", ["kvlab_guarded"], [NEXT], axis=-1, keepdims=1),
        ]
    )
    for n, name in zip(g.node[-3:], ("pad", "guard", "argmax")):
        n.name = f"kvlab/{name}"


def _or_minus_one(g: Any, token_f32: str) -> str:
    """A node giving ``token_f32`` where the logits are finite and -1 where not; returns its output's name."""
    from onnx import TensorProto, helper

    g.initializer.append(helper.make_tensor("kvlab_minus_one", TensorProto.FLOAT, [], [-1.0]))
    where = helper.make_node("Where", ["kvlab_finite", token_f32, "kvlab_minus_one"], ["kvlab_checked"])
    where.name = "kvlab/checked"
    g.node.append(where)
    return "kvlab_checked"


def _two_stage_argmax(g: Any, vocab: int) -> None:
    """Nodes from ``kvlab_last_logits_f32`` [1, vocab] to ``NEXT`` [1, 1] int64: the largest logit per block, then
    among the blocks, and the smallest position holding it (positions as float32: exact below 2**24) found the same
    way, all in float32 ops (WebGPU runs few int64 ops), cast to int64 at the end."""
    from onnx import TensorProto, helper, numpy_helper

    blocks, size = argmax_blocks(vocab)
    positions = np.arange(blocks * size, dtype=np.float32).reshape(blocks, size)
    positions[positions >= vocab] = np.inf  # padding: never the answer
    g.initializer.extend(
        [
            numpy_helper.from_array(positions, "kvlab_argmax_positions"),
            helper.make_tensor("kvlab_argmax_pads", TensorProto.INT64, [4], [0, 0, 0, blocks * size - vocab]),
            helper.make_tensor("kvlab_argmax_view", TensorProto.INT64, [2], [blocks, size]),
            helper.make_tensor("kvlab_argmax_fill", TensorProto.FLOAT, [], [-math.inf]),
            helper.make_tensor("kvlab_argmax_inf", TensorProto.FLOAT, [], [math.inf]),
            helper.make_tensor("kvlab_axis1", TensorProto.INT64, [1], [1]),
            helper.make_tensor("kvlab_axis0", TensorProto.INT64, [1], [0]),
        ]
    )
    node = helper.make_node
    g.node.extend(
        [
            node("Pad", ["kvlab_last_logits_f32", "kvlab_argmax_pads", "kvlab_argmax_fill"], ["kvlab_padded"]),
            node("Reshape", ["kvlab_padded", "kvlab_argmax_view"], ["kvlab_blocks"]),  # [blocks, size]
            node("ReduceMax", ["kvlab_blocks", "kvlab_axis1"], ["kvlab_block_max"]),  # [blocks, 1]
            node("ReduceMax", ["kvlab_block_max", "kvlab_axis0"], ["kvlab_max"]),  # [1, 1]: the largest logit
            node("Equal", ["kvlab_blocks", "kvlab_max"], ["kvlab_is_max"]),
            node("Where", ["kvlab_is_max", "kvlab_argmax_positions", "kvlab_argmax_inf"], ["kvlab_where"]),
            node("ReduceMin", ["kvlab_where", "kvlab_axis1"], ["kvlab_block_first"]),  # [blocks, 1]
            node("ReduceMin", ["kvlab_block_first", "kvlab_axis0"], ["kvlab_first"]),  # [1, 1]: its lowest index
        ]
    )
    for n in g.node[-8:]:
        n.name = f"kvlab/argmax_{n.output[0].removeprefix('kvlab_')}"
    checked = _or_minus_one(g, "kvlab_first")
    g.node.append(node("Cast", [checked], [NEXT], to=TensorProto.INT64, name="kvlab/to_int64"))


def _last_logits_f32(g: Any, logits: str) -> None:
    """Nodes from ``logits`` [1, n, vocab] to ``kvlab_last_logits_f32`` [1, vocab]: the last position's."""
    from onnx import TensorProto, helper

    g.initializer.append(helper.make_tensor("kvlab_last_position", TensorProto.INT64, [], [-1]))
    g.node.extend(
        [
            helper.make_node(
                "Gather", [logits, "kvlab_last_position"], ["kvlab_last_logits"], axis=1, name="kvlab/last_logits"
            ),  # [1, vocab]
            helper.make_node(
                "Cast", ["kvlab_last_logits"], ["kvlab_last_logits_f32"], to=TensorProto.FLOAT, name="kvlab/f32"
            ),
        ]
    )


def _row_argmax(g: Any, vocab: int) -> None:
    """Nodes from ``kvlab_last_logits_f32`` [1, vocab] to ``NEXT`` [1, 1] int32: the first row of a [blocks, size] view
    (padded with -inf) holding the largest value, then that row's first largest; its position (a float32 table) is
    cast to int32. ArgMax's int64 outputs are used only as Gather indices, which WebGPU runs on the GPU."""
    from onnx import TensorProto, helper, numpy_helper

    blocks, size = argmax_blocks(vocab)
    positions = np.arange(blocks * size, dtype=np.float32).reshape(blocks, size)
    g.initializer.extend(
        [
            numpy_helper.from_array(positions, "kvlab_row_positions_table"),
            helper.make_tensor("kvlab_row_view", TensorProto.INT64, [2], [blocks, size]),
            helper.make_tensor("kvlab_row_axis1", TensorProto.INT64, [1], [1]),
        ]
    )
    node, flat, start = helper.make_node, "kvlab_last_logits_f32", len(g.node)
    if blocks * size != vocab:
        g.initializer.extend(
            [
                helper.make_tensor("kvlab_row_pads", TensorProto.INT64, [4], [0, 0, 0, blocks * size - vocab]),
                helper.make_tensor("kvlab_row_fill", TensorProto.FLOAT, [], [-math.inf]),
            ]
        )
        g.node.append(node("Pad", [flat, "kvlab_row_pads", "kvlab_row_fill"], ["kvlab_row_padded"]))
        flat = "kvlab_row_padded"
    g.node.extend(
        [
            node("Reshape", [flat, "kvlab_row_view"], ["kvlab_rows"]),  # [blocks, size]
            node("ReduceMax", ["kvlab_rows", "kvlab_row_axis1"], ["kvlab_row_max"]),  # [blocks, 1]
            node("ArgMax", ["kvlab_row_max"], ["kvlab_row"], axis=0, keepdims=0),  # [1]: the first row with the max
            node("Gather", ["kvlab_rows", "kvlab_row"], ["kvlab_row_logits"], axis=0),  # [1, size]
            node("Gather", ["kvlab_row_positions_table", "kvlab_row"], ["kvlab_row_positions"], axis=0),  # [1, size]
            node("ArgMax", ["kvlab_row_logits"], ["kvlab_in_row"], axis=1, keepdims=1),  # [1, 1]: its first max
            node("GatherElements", ["kvlab_row_positions", "kvlab_in_row"], ["kvlab_token_f32"], axis=1),  # [1, 1]
        ]
    )
    for n in g.node[start:]:
        n.name = f"kvlab/rows_{n.output[0].removeprefix('kvlab_')}"
    checked = _or_minus_one(g, "kvlab_token_f32")
    g.node.append(node("Cast", [checked], [NEXT], to=TensorProto.INT32, name="kvlab/to_int32"))


def _ids_as_int32(g: Any, model: Any) -> None:
    """Retype the graph's input ids to int32; ModelError when anything but a Gather's indices reads them."""
    from onnx import TensorProto

    name = model.info.input_names.get("input_ids")
    inputs = [i for i in g.input if i.name == name]
    if not inputs:
        return  # a graph without input ids (the tests' logits-only graph)
    readers = [n for n in g.node if name in n.input]
    if any(n.op_type != "Gather" or list(n.input).index(name) != 1 for n in readers):
        raise ModelError(
            f"token_on_device='rows' feeds model {model.name}'s input ids as int32, which only a Gather's indices "
            f"accept; {name!r} is also read by {sorted({n.op_type for n in readers})}: use 'blocks' or 'single'"
        )
    inputs[0].type.tensor_type.elem_type = TensorProto.INT32


class DeviceToken:
    """The greedy token kept on the device: a ring of ``size`` [1, 1] device tensors of the graph's id type. ``current``
    holds ``token`` (the next step's input ids); step k of a burst reads the tensor ``k - 1`` places after it and writes
    the one ``k`` places after (``target``), so a burst of up to ``size - 1`` steps keeps every token until read. It
    advances only after the steps it moves over succeeded."""

    def __init__(self, device: Any, dtype: Any = np.int64, size: int = 2):
        dtype = np.dtype(dtype)
        self.tensors: list[DeviceTensor] = zeros_all(device, [((1, 1), dtype)] * size)
        self.current = 0
        self.token: int | None = None  # the token tensors[current] holds (None: none yet, ids from the host)

    def holding(self, tokens: np.ndarray) -> DeviceTensor | None:
        """The device tensor that already holds these input ids (one token), if one does."""
        if tokens.shape[0] == 1 and self.token is not None and int(tokens[0]) == self.token:
            return self.tensors[self.current]
        return None

    @property
    def burst_limit(self) -> int:
        """The most steps whose tokens the ring keeps until they are read."""
        return len(self.tensors) - 1

    def target(self, ahead: int = 1) -> DeviceTensor:
        """The tensor the ``ahead``-th step from ``current`` writes its token into (and the next one reads)."""
        return self.tensors[(self.current + ahead) % len(self.tensors)]

    def bind_outputs(self, binding: Any, ahead: int = 1) -> None:
        """Bind the step's token output to the tensor ``ahead`` places along the ring."""
        binding.output(NEXT, self.target(ahead))

    def read(self, steps: int = 1) -> list[int]:
        """The tokens the next ``steps`` steps wrote, copied to the host (the copy waits for the GPU to finish them)."""
        return [int(self.target(k).numpy().reshape(-1)[0]) for k in range(1, steps + 1)]

    def advance(self, steps: int = 1, token: int | None = None) -> None:
        """The next ``steps`` steps succeeded: the last one's tensor holds the next input ids, ``token``."""
        self.current, self.token = (self.current + steps) % len(self.tensors), token

    def forget(self) -> None:
        """The next step's ids come from the host (a step that chose its token on the host ran in between)."""
        self.token = None

    def release(self) -> None:
        """Release the ring's tensors."""
        release_all(self.tensors)
        self.tensors, self.token = [], None
