"""``CapturedStaticCache(max_cache_len)``: a StaticCache whose one-token steps run as captured WebGPU graphs, recorded
at the first two of them and replayed at every later one (the host no longer walks the graph or allocates per step).

What capture needs, and how this cache gives it:

- Fixed shapes and buffers: every input and output is a device tensor allocated once and written in place: two
  pairs of ``input_ids`` [1, 1] and ``attention_mask`` [1, max_cache_len] (``capture_binding``: a step reads one
  pair, its graph writes the next into the other), the KV buffers (past and present, as in ``StaticCache``) and
  the logits. No host value is bound under capture.
- A model whose total length is the number of ones in the mask (``kvlab.load(name, graph_capture=True)``); a
  standard build takes it from the mask's length and is refused, naming the Shape node (``capture_problem``).
- Every node on WebGPU, else the session is refused, naming the nodes the CPU EP took (``open_capture_session``).
- Multi-token steps (the prefill) run on the capturing session uncaptured (``gpu_graph_id=-1``).

The graphs are captured once per cache and session and kept across generations; ``dispose`` releases them with the
buffers."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ....core.errors import ConfigError, DeviceError, ModelError
from ....core.guards import atomic
from ...models.graph import load_graph, uses
from ...runtime.session import Session
from .capture_binding import CapturedBindings, CapturedToken
from .replay_graph import captured_graph
from .shared_kv import shared_capture_problem
from .static import StaticCache

CAPTURE_OPTIONS = {"enableGraphCapture": "1"}  # the session option (both packages)
DIAGNOSIS_OPTIONS = {"enableInt64": "1"}  # without capture, the int64 mask Cast that capture moves to WebGPU
CAPTURED_REDUCTIONS = ("single", "blocks")  # the greedy graphs whose token is the model's int64 ids
VARIANT = "graph"  # CacheSpec.variant: static@N graph
NOT_CAPTURABLE = "cannot use the graph capture feature"  # ONNX Runtime's refusal at session creation (both)
_GRAPH_IDS = itertools.count(1)  # two graph ids per cache (one per pair of step buffers), unique in the process


def capture_problem(info: Any) -> str:
    """Why the model ``info`` describes cannot be captured with a fixed, zero-padded mask ("" when it can)."""
    if not info.shares_buffers:
        return info.sharing_problem
    if info.layout.states:
        return (
            f"its layers keep fixed-size states ({info.layout.states[0].past!r}, ...), which a static cache swaps "
            "between two buffers every step, while a captured graph replays the same buffers"
        )
    if "position_ids" in info.input_names:
        return (
            f"it takes position_ids as an input ({info.input_names['position_ids']!r}), which kvlab feeds from "
            "the host; a builder model derives positions from the mask. Rebuild it with the onnxruntime-genai "
            "builder and --extra_options enable_webgpu_graph=true"
        )
    graph = load_graph(info.onnx_path)
    read_by = uses(graph)
    frontier, seen = [info.input_names.get("attention_mask", "attention_mask")], set()
    while frontier:  # the mask and what casts of it feed
        name = frontier.pop()
        seen.add(name)
        for node, _ in read_by.get(name, []):
            if node.op_type == "Shape":
                return (
                    f"its attention takes the total length from the attention mask's length (Shape node "
                    f"{node.name!r}), so a fixed [1, max_cache_len] mask would make it attend to max_cache_len "
                    "positions. Build it for capture: kvlab.load(name, graph_capture=True), or the "
                    "onnxruntime-genai builder with --extra_options enable_webgpu_graph=true (its total length "
                    "is the number of ones in the mask)"
                )
            if node.op_type == "Cast":
                frontier += [o for o in node.output if o not in seen]
    return ""


def open_capture_session(device: Any, model: Any, reduction: str = "") -> Session:
    """The capturing session of ``model``'s captured graph on ``device`` (cached by the device); where ONNX Runtime
    refuses it, the same graph without the next mask (the host then writes it every step); where it refuses that too, a
    DeviceError naming the nodes it placed on the CPU EP."""
    label = f"model {model.name}, graph capture" + (f", greedy token on the device ({reduction})" if reduction else "")
    graphs = dict.fromkeys(captured_graph(model, reduction, shift_mask=s) for s in (True, False))
    for path in graphs:
        try:
            return device.session(path, label, CAPTURE_OPTIONS)
        except DeviceError as exc:
            if NOT_CAPTURABLE not in str(exc):
                raise
            refusal = exc
    try:
        cpu = device.session(path, f"model {model.name}, capture diagnosis", DIAGNOSIS_OPTIONS).cpu_nodes
    finally:
        device.forget(path, DIAGNOSIS_OPTIONS)
    ops = sorted({n.split(":", 1)[0] for n in cpu})
    named = ", ".join(
        f"{n.split(':', 1)[0]} {n.split(':', 1)[1]!r}" if n.split(":", 1)[1] else n.split(":", 1)[0] for n in cpu[:6]
    )
    raise DeviceError(
        f"graph capture refused for model {model.name} on {device.label.runtime}: a captured graph must run "
        f"entirely on WebGPU, and ONNX Runtime places {len(cpu)} node(s) on the CPU EP ({named}"
        f"{' ...' if len(cpu) > 6 else ''}; op types {ops}: no WebGPU kernel for them in this package). Remove "
        "or replace them, or run this model with a plain StaticCache"
    ) from refusal


@dataclass(frozen=True)
class CaptureCost:
    """What capture cost a generation, from its records' wall times (a proxy): ``capture_ms`` over both capturing
    steps beyond a replay's, ``replay_ms`` a replay's median, and against an uncaptured step of ``uncaptured_ms``,
    ``pays_off_after``: the decode tokens after which the replays paid the capture back (None: never, or not given)."""

    capture_ms: float
    replay_ms: float
    uncaptured_ms: float | None = None
    pays_off_after: int | None = None

    def __str__(self) -> str:
        head = f"capture cost {self.capture_ms:.1f} ms over its two capturing steps (a replay {self.replay_ms:.2f} ms)"
        if self.uncaptured_ms is None:
            return head
        if self.pays_off_after is None:
            return f"{head}; it does not pay here: an uncaptured step is {self.uncaptured_ms:.2f} ms"
        return f"{head}; it pays for itself after {self.pays_off_after} tokens (uncaptured {self.uncaptured_ms:.2f} ms)"


def capture_cost(records: Sequence[Any], uncaptured_ms: float | None = None) -> CaptureCost:
    """``CaptureCost`` of a CapturedStaticCache's generation from its ``records`` (the first two one-token decode steps
    capture, the later ones replay), against an uncaptured step of ``uncaptured_ms``. ConfigError with fewer than three
    decode steps."""
    steps = [r.wall_ms for r in records if r.phase == "decode" and r.n_tokens == 1]
    if len(steps) < 3:
        raise ConfigError(f"capture_cost needs at least 3 decode steps (2 capture, 1 replays); got {len(steps)}")
    replay = float(np.median(steps[2:]))
    cost = max(0.0, steps[0] + steps[1] - 2 * replay)
    saving = None if uncaptured_ms is None else uncaptured_ms - replay
    after = math.ceil(cost / saving) if saving is not None and saving > 0 else None
    return CaptureCost(cost, replay, uncaptured_ms, after)


class CapturedStaticCache(StaticCache):
    """A StaticCache whose one-token steps run as captured WebGPU graphs (see the module docstring): the first two
    decode steps capture, every later one replays; multi-token steps run uncaptured on the same session. Greedy
    tokens equal a plain StaticCache's. Raises DeviceError off WebGPU (or when ONNX Runtime refuses to capture),
    ModelError for a model that cannot be captured, and what a StaticCache raises."""

    reductions = CAPTURED_REDUCTIONS
    variant = VARIANT
    burst_reads = False  # a captured step copies its token to the host with each replay

    def __init__(self, max_cache_len: int, check_every: int | None = None):
        super().__init__(max_cache_len, check_every)
        self.graph_ids = (next(_GRAPH_IDS), next(_GRAPH_IDS))
        self.bindings = CapturedBindings(self.graph_ids)

    @property
    def captures(self) -> int:
        """Graphs captured by this cache: 0 before its first decode step, 1 after it, 2 from the second on."""
        return sum(b.runs > 0 for b in self.bindings.captures or ())

    @property
    def replays(self) -> int:
        """Decode steps that replayed a captured graph (every one-token step after the two capturing ones)."""
        return sum(max(0, b.runs - 1) for b in self.bindings.captures or ())

    @property
    def host_writes(self) -> int:
        """Copies from the host into the step's ids and mask buffers since they were made (exact): the first decode
        step's two, then the ids where the buffer does not hold the host's token, and the mask where the graph cannot
        shift it."""
        buffers = self.bindings.buffers
        return buffers.host_writes if buffers is not None else 0

    def empty_like(self) -> StaticCache:
        """The other side of a handoff (e.g. a CPU prefill): a plain StaticCache of the same size."""
        return StaticCache(self.max_cache_len, self.check_every)

    def session(self, device: Any, model: Any, reduction: str = "") -> Session:
        """The capturing session of the model's captured graph, with the greedy token of ``reduction`` ("": none).
        Raises ConfigError for a reduction outside ``CAPTURED_REDUCTIONS``, then DeviceError or ModelError."""
        if reduction and reduction not in CAPTURED_REDUCTIONS:
            raise ConfigError(
                f"a captured step keeps the greedy token on the device with reduction "
                f"{' or '.join(map(repr, CAPTURED_REDUCTIONS))}, not {reduction!r} (its ids are int32)"
            )
        _check_capturable(model.info, device)
        session = open_capture_session(device, model, reduction)  # first: the nodes the CPU EP takes, named
        problem = shared_capture_problem(model.info, device.backend)
        if problem:
            raise DeviceError(f"graph capture refused for model {model.name}: {problem}")
        return session

    def device_token(self, device: Any, dtype: Any, size: int = 2) -> CapturedToken:
        """The greedy token in the step's own ids buffers (``capture_binding.CapturedToken``)."""
        return CapturedToken(self.bindings.buffers)

    def _attach(self, info: Any, device: Any) -> None:
        _check_capturable(info, device)
        super()._attach(info, device)

    def _allocate(self) -> None:
        """The KV buffers and the step buffers, all or nothing."""
        had = self.allocated
        super()._allocate()
        if had:
            return
        try:
            self.bindings.allocate(self._device, self._info, self.max_cache_len)
        except BaseException:
            with atomic():
                self._release_all()
            raise


def _check_capturable(info: Any, device: Any) -> None:
    """DeviceError on a device other than WebGPU, ModelError for a model ``capture_problem`` refuses."""
    if device.name != "webgpu":
        raise DeviceError(
            f"graph capture records WebGPU command buffers; device {device.name!r} has none: use "
            "device 'webgpu', or a plain StaticCache on the CPU"
        )
    problem = capture_problem(info)
    if problem:
        raise ModelError(f"model {info.name} cannot be captured: {problem}")
