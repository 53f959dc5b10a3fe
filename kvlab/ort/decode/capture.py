"""WebGPU graph capture of the decode step: ``CapturedStaticCache(max_cache_len)``, a StaticCache whose one-token
steps run as one captured graph, recorded at the first of them and replayed at every later one, so the host no
longer walks the graph, chooses kernels or allocates per step.

What capture needs, and how this cache gives it:

- Fixed shapes and buffers: every input and output of the captured run is a device tensor allocated once and
  written in place: ``input_ids`` [1, 1], ``attention_mask`` [1, max_cache_len] (zero padded: the ones count the
  valid positions), the KV buffers (bound as past and present, as in ``StaticCache``) and the logits
  [1, 1, vocab], read back after each replay. No host value is ever bound under capture (one package refuses it,
  the other replays wrong tokens: ``kvlab.ort.runtime.builtin``, ``kvlab.ort.runtime.plugin``).
- A model whose total length is the number of ones in the mask: the builder's ``enable_webgpu_graph=true``
  (``kvlab.load(name, graph_capture=True)``). A standard build takes it from the mask's length (Shape), so a fixed
  mask would attend to max_cache_len positions: refused, naming the Shape node (``capture_problem``).
- Every node on WebGPU: ONNX Runtime refuses to open a capturing session otherwise; kvlab then opens the model
  without capture to name the nodes the CPU EP took (``open_capture_session``).
- The session opened with ``enableGraphCapture=1``; multi-token steps (the prefill) run on it uncaptured (run option
  ``gpu_graph_id=-1``), one-token steps under this cache's own graph id.

Lifecycle: the graph is captured once per cache (and session) and kept across generations (``reset`` and a new
``generate`` replay it); ``dispose`` releases it with the buffers (``Backend.release_graph``, or, where the package
cannot release one graph, by letting go of the capturing session, which owns it).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

from ...core.errors import ConfigError, DeviceError, ModelError
from ...core.guards import atomic
from ...core.labels import CacheSpec
from ..models.graph import load_graph, uses
from ..runtime.session import Binding, RunResult, Session
from ..runtime.tensors import DeviceTensor, release_all, zeros_all
from .caches import StaticCache
from .shared import shared_capture_problem

CAPTURE_OPTIONS = {"enableGraphCapture": "1"}  # the session option (both packages)
DIAGNOSIS_OPTIONS = {"enableInt64": "1"}  # without capture, the int64 mask Cast that capture moves to WebGPU
GRAPH_ID_KEY = "gpu_graph_id"  # the run option naming a captured graph; "-1" runs without capture
SKIP = -1
VARIANT = "graph"  # CacheSpec.variant: static@N graph
NOT_CAPTURABLE = "cannot use the graph capture feature"  # ONNX Runtime's refusal at session creation (both)
_GRAPH_IDS = itertools.count(1)  # one graph id per cache, unique in the process


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


def open_capture_session(device: Any, model: Any) -> Session:
    """The capturing session of ``model`` on ``device`` (cached by the device); when ONNX Runtime refuses to
    capture, a DeviceError naming the nodes it placed on the CPU EP (the diagnosis session is not kept)."""
    label = f"model {model.name}, graph capture"
    try:
        return device.session(model.onnx_path, label, CAPTURE_OPTIONS)
    except DeviceError as exc:
        if NOT_CAPTURABLE not in str(exc):
            raise
        try:
            cpu = device.session(model.onnx_path, f"model {model.name}, capture diagnosis", DIAGNOSIS_OPTIONS).cpu_nodes
        finally:
            device.forget(model.onnx_path, DIAGNOSIS_OPTIONS)
        ops = sorted({n.split(":", 1)[0] for n in cpu})
        named = ", ".join(
            f"{n.split(':', 1)[0]} {n.split(':', 1)[1]!r}" if n.split(":", 1)[1] else n.split(":", 1)[0]
            for n in cpu[:6]
        )
        raise DeviceError(
            f"graph capture refused for model {model.name} on {device.label.runtime}: a captured graph must run "
            f"entirely on WebGPU, and ONNX Runtime places {len(cpu)} node(s) on the CPU EP ({named}"
            f"{' ...' if len(cpu) > 6 else ''}; op types {ops}: no WebGPU kernel for them in this package). Remove "
            "or replace them, or run this model with a plain StaticCache"
        ) from exc


def run_options(ort: Any, graph_id: int) -> Any:
    """ONNX Runtime RunOptions naming the captured graph ``graph_id`` (``SKIP``: run uncaptured)."""
    ro = ort.RunOptions()
    ro.add_run_config_entry(GRAPH_ID_KEY, str(graph_id))
    return ro


class CaptureBinding(Binding):
    """The pinned binding of a captured decode step: every input and output a fixed device tensor. ``input``
    writes the step's values into them in place; ``output`` of the logits names the host array they are copied
    into after each run (the copy waits for the GPU, so it is timed with the run, as an uncaptured run's own copy
    of its logits to the host is)."""

    def __init__(self, session: Session, cache: CapturedStaticCache):
        super().__init__(session)
        info, pinned = cache._info, cache._step_tensors
        self._ids_name, self._mask_name = info.input_names["input_ids"], info.input_names["attention_mask"]
        self._names = {self._ids_name: pinned["input_ids"], self._mask_name: pinned["attention_mask"]}
        self._logits_name, self._logits = info.logits_name, pinned["logits"]
        self._mask = np.zeros(pinned["attention_mask"].shape, np.int64)  # host mirror of the device mask
        self._host_logits: tuple[int, Any] | None = None  # (id of the array, its OrtValue)
        self._pinning = True  # while the buffers are bound for good (below): input and output bind as usual
        self.expected: dict[str, int] = {}  # the KV outputs written in place, and their buffers
        for slot in cache.slots:
            self.expected.update(slot.bind(self, cache.seq_length))
        self.spot_names = tuple(self.expected)  # the in-place outputs a spot check reads in turn
        for name, t in self._names.items():
            super().input(name, t)
        super().output(self._logits_name, self._logits)
        self._pinning = False
        self.run_options = run_options(session.device.backend.ort, cache.graph_id)
        self.runs = 0  # successful runs: the first one captured the graph, every later one replayed it

    @property
    def read_back(self) -> bool:
        """Whether this run reads back the presents' buffer identities: as the cache's ``check_every`` has it for
        the capturing run and the first replay, never after: a replay runs the recorded command buffers on the
        buffers bound at the capture, which nothing can rebind, so its answer is known (about 0.1-0.2 ms a step
        saved on an NVIDIA H200 machine: data/gpu/capture/read-back/)."""
        return self._read_back and self.runs < 2

    @read_back.setter
    def read_back(self, due: bool) -> None:
        self._read_back = due

    @property
    def spot_check(self) -> str:
        """The one present a run reads back otherwise (the cache's spot check): likewise none after the first
        replay."""
        return self._spot_check if self.runs < 2 else ""

    @spot_check.setter
    def spot_check(self, name: str) -> None:
        self._spot_check = name

    def input(self, name: str, value: np.ndarray | DeviceTensor) -> None:
        if self._pinning:
            super().input(name, value)
            return
        target = self._names.get(name)
        if target is None or isinstance(value, DeviceTensor):
            raise DeviceError(f"a captured step takes only {sorted(self._names)} from the host, not {name!r}")
        if name == self._ids_name:
            if value.shape != target.shape:
                raise ConfigError(f"a captured step feeds one token ([1, 1] ids), not {value.shape}")
            self._write(target, np.ascontiguousarray(value, np.int64))
            return
        if value.ndim != 2 or value.shape[0] != 1 or value.shape[1] > self._mask.shape[1]:
            raise ConfigError(f"{name} of shape {value.shape} does not fit the captured step's {target.shape}")
        n = value.shape[1]  # the mask: the step's ones, zero padded to max_cache_len
        self._mask[0, :n] = value[0]
        self._mask[0, n:] = 0
        self._write(target, self._mask)

    def _write(self, target: DeviceTensor, host: np.ndarray) -> None:
        """Copy host values into a fed device tensor: the runtime's time (the step's ``run_ms``), as an
        uncaptured binding's copy of a host input is."""
        start = time.perf_counter()
        self._backend.write(target.ortvalue(), host)
        self._bind_seconds += time.perf_counter() - start

    def output(self, name: str, target: DeviceTensor | np.ndarray) -> None:
        if self._pinning:
            super().output(name, target)
            return
        if name != self._logits_name or isinstance(target, DeviceTensor):
            raise DeviceError(f"a captured step writes {self._logits_name!r} to the host, not {name!r}")
        if target.shape != self._logits.shape or target.dtype != self._logits.dtype or not target.flags.c_contiguous:
            raise ConfigError(
                f"the captured step's logits are {self._logits.shape} {self._logits.dtype}; the host "
                f"array bound is {target.shape} {target.dtype}"
            )
        if self._host_logits is None or self._host_logits[0] != id(target):
            self._host_logits = (id(target), (target, self._backend.host_value(target)))

    def output_new(self, name: str) -> None:
        raise DeviceError(f"a captured step allocates nothing: {name!r} must be a fixed device tensor")

    def run(self) -> RunResult:
        result = super().run()  # the capture (first run) or a replay, then the presents' identities
        if self._host_logits is not None:
            start = time.perf_counter()
            self._backend.copy(self._logits.ortvalue(), self._host_logits[1][1])
            result.seconds += time.perf_counter() - start
        self.runs += 1
        return result


class CapturedStaticCache(StaticCache):
    """A StaticCache whose one-token steps run as one captured WebGPU graph (see the module docstring). Prefill
    and other multi-token steps run uncaptured on the same session. Greedy tokens equal a plain StaticCache's.
    Raises DeviceError on a device other than WebGPU (or when ONNX Runtime refuses to capture), ModelError for a
    model that cannot be captured, and what a StaticCache raises."""

    def __init__(self, max_cache_len: int, check_every: int | None = None):
        super().__init__(max_cache_len, check_every)
        self.graph_id = next(_GRAPH_IDS)
        self._step_tensors: dict[str, DeviceTensor] = {}  # input_ids, attention_mask, logits: fixed device tensors
        self._capture: CaptureBinding | None = None
        self._session: Session | None = None  # the capturing session the graph belongs to

    @property
    def spec(self) -> CacheSpec:
        checked = f"+checked/{self.check_every}" if self.check_every is not None else ""
        return CacheSpec(self.kind, self.max_cache_len, VARIANT + checked)

    @property
    def captures(self) -> int:
        """Graphs captured by this cache (0 before its first decode step, then 1 until disposed)."""
        return int(self._capture is not None and self._capture.runs > 0)

    @property
    def replays(self) -> int:
        """Decode steps that replayed the captured graph (every one-token step after the capturing one)."""
        return max(0, self._capture.runs - 1) if self._capture is not None else 0

    @property
    def step_tensors(self) -> tuple[DeviceTensor, ...]:
        """The fixed device tensors of the captured step besides the KV buffers: ids, mask, logits."""
        return tuple(self._step_tensors.values())

    feed_tensors = step_tensors  # the name it had first

    def empty_like(self) -> StaticCache:
        """The other side of a handoff (e.g. a CPU prefill): a plain StaticCache of the same size."""
        return StaticCache(self.max_cache_len, self.check_every)

    def session(self, device: Any, model: Any) -> Session:
        """The capturing session (checked first: device, then model; DeviceError, ModelError)."""
        if device.name != "webgpu":
            raise DeviceError(
                f"graph capture records WebGPU command buffers; device {device.name!r} has none: use "
                "device 'webgpu', or a plain StaticCache on the CPU"
            )
        problem = capture_problem(model.info)
        if problem:
            raise ModelError(f"model {model.name} cannot be captured: {problem}")
        session = open_capture_session(device, model)  # first: the nodes the CPU EP takes, named
        problem = shared_capture_problem(model.info, device.backend)
        if problem:
            raise DeviceError(f"graph capture refused for model {model.name}: {problem}")
        return session

    def _attach(self, info: Any, device: Any) -> None:
        if device.name != "webgpu":
            raise DeviceError(f"graph capture needs device 'webgpu', not {device.name!r}")
        problem = capture_problem(info)
        if problem:
            raise ModelError(f"model {info.name} cannot be captured: {problem}")
        super()._attach(info, device)

    def _allocate(self) -> None:
        """The KV buffers and the three step tensors, all or nothing."""
        had = self.allocated
        super()._allocate()
        if had:
            return
        info = self._info
        try:
            made = zeros_all(
                self._device,
                [
                    ((1, 1), np.int64),
                    ((1, self.max_cache_len), np.int64),
                    ((1, 1, info.vocab_size), np.dtype(info.logits_dtype)),
                ],
            )
        except BaseException:
            with atomic():
                StaticCache._release_all(self)
            raise
        self._step_tensors = dict(zip(("input_ids", "attention_mask", "logits"), made))

    def _bind(self, session: Session, n_new: int) -> tuple[Binding, dict[str, int], tuple[str, ...]]:
        if n_new != 1:  # the prefill (or any multi-token step): uncaptured, on the same session
            b, expected, names = super()._bind(session, n_new)
            if b.run_options is None:
                b.run_options = run_options(session.device.backend.ort, SKIP)
            return b, expected, names
        if self._capture is None or self._capture.session is not session:
            if self._capture is not None:  # another session (the device was reopened): the old graph goes
                self._release_graph()
            self._capture, self._session = CaptureBinding(session, self), session
        return self._capture, self._capture.expected, self._capture.spot_names

    def _release_graph(self) -> None:
        capture, session = self._capture, self._session
        self._capture = self._session = None
        if capture is None or session is None or not capture.runs:
            return
        if not session.device.backend.release_graph(session.ort, self.graph_id):
            # the package cannot release one graph: the capturing session owns it, so the device lets go of that
            # session (freed once nothing else holds it: a later capture cache opens a new one)
            session.device.drop(session)

    def _release_all(self) -> None:
        self._release_graph()
        release_all(list(self._step_tensors.values()))
        self._step_tensors = {}
        super()._release_all()
