"""The bindings of a captured cache (``kvlab.ort.decode.caches.captured``) and the fixed buffers they pin.

A captured graph replays on the buffers bound when it was captured, so a one-token step's inputs live in two pairs
of fixed device tensors (``StepBuffers``): the step that reads ``ids[p]`` and ``mask[p]`` writes the next token
(``NEXT``) and the next mask (``NEXT_MASK``) into ``ids[1 - p]`` and ``mask[1 - p]`` (never into what it reads: a
failed step must be retryable), one captured graph per ``p`` (``CaptureBinding``). ``CapturedBindings`` is the
cache's bindings collaborator: the two pinned bindings for one-token steps, a plain one for the others."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ....core.cache import Bindings
from ....core.errors import ConfigError, DeviceError
from ....core.slots import Slot
from ...runtime.session import Binding, DeviceTensor, RunResult, Session, release_all, zeros_all
from ..greedy import NEXT
from .replay_graph import NEXT_MASK

GRAPH_ID_KEY = "gpu_graph_id"  # the run option naming a captured graph
SKIP = -1  # the graph id that runs a step uncaptured


def run_options(ort: Any, graph_id: int) -> Any:
    """ONNX Runtime RunOptions naming the captured graph ``graph_id`` (``SKIP``: run uncaptured)."""
    ro = ort.RunOptions()
    ro.add_run_config_entry(GRAPH_ID_KEY, str(graph_id))
    return ro


class StepBuffers:
    """The fixed device tensors of a captured step besides the KV buffers: two ``ids`` [1, 1] and two ``mask`` [1,
    max_cache_len], and ``logits``. ``token[i]`` / ``ones[i]`` say what ``ids[i]`` / ``mask[i]`` hold (None: not known),
    so a value already there is not written again; ``parity`` is the pair the next step reads."""

    def __init__(self, device: Any, max_cache_len: int, vocab: int, logits_dtype: Any):
        shapes = [((1, 1), np.int64)] * 2 + [((1, max_cache_len), np.int64)] * 2
        made = zeros_all(device, shapes + [((1, 1, vocab), np.dtype(logits_dtype))])
        self.ids, self.mask, self.logits = made[:2], made[2:4], made[4]
        self.token: list[int | None] = [None, None]
        self.ones: list[int | None] = [None, None]
        self.parity = 0
        self.host_writes = 0  # copies from the host into these buffers (exact: counted at each copy)
        self.host_mask = np.zeros((1, max_cache_len), np.int64)  # a mask written from the host is built here

    def release(self) -> None:
        """Release every buffer."""
        release_all([*self.ids, *self.mask, self.logits])


class CapturedBindings(Bindings):
    """A captured cache's bindings: a one-token step runs one of two ``CaptureBinding`` s (one per pair of step
    buffers, captured at its first run and replayed after); any other step a plain binding, run uncaptured. It owns
    the step buffers (``allocate``) and the graphs (released by ``clear``)."""

    def __init__(self, graph_ids: tuple[int, int]):
        super().__init__()
        self.graph_ids = graph_ids
        self.buffers: StepBuffers | None = None
        self.captures: tuple[CaptureBinding, ...] | None = None  # one per pair of step buffers
        self._info: Any = None  # the model served
        self._session: Session | None = None  # the capturing session the graphs belong to

    def allocate(self, device: Any, info: Any, max_cache_len: int) -> None:
        """The step buffers for the model ``info`` describes (raises what the allocation raises, holding none)."""
        self._info = info
        self.buffers = StepBuffers(device, max_cache_len, info.vocab_size, info.logits_dtype)

    def get(
        self, session: Session, n_new: int, slots: list[Slot], stepping: list[Slot], length: int
    ) -> tuple[Binding, dict[str, int], tuple[str, ...]]:
        """As ``Bindings.get``: a one-token step's pinned binding (the pair of step buffers it reads: captured at its
        first run, replayed after), made once per session; any other step's plain binding, run uncaptured."""
        if n_new != 1:  # the prefill (or any multi-token step): uncaptured, on the same session
            b, expected, names = super().get(session, n_new, slots, stepping, length)
            if b.run_options is None:
                b.run_options = run_options(session.device.backend.ort, SKIP)
            return b, expected, names
        if self.captures is None or self._session is not session:  # another session: the old graphs go
            self._release_graphs()
            self.captures = tuple(CaptureBinding(session, self, slots, length, parity) for parity in (0, 1))
            self._session = session
        capture = self.captures[self.buffers.parity]
        return capture, capture.expected, capture.spot_names

    def clear(self) -> None:
        """The graphs and the step buffers released, and every plain binding forgotten."""
        self._release_graphs()
        if self.buffers is not None:
            self.buffers.release()
            self.buffers = None
        super().clear()

    def _release_graphs(self) -> None:
        """Release the captured graphs; where the package cannot release one graph, the device lets go of the
        capturing session that owns them (freed once nothing else holds it)."""
        captures, session = self.captures or (), self._session
        self.captures = self._session = None
        ran = [b for b in captures if b.runs]
        released = session is None or all(
            session.device.backend.release_graph(session.ort, self.graph_ids[b.parity]) for b in ran
        )
        if not released:
            session.device.drop(session)


class CaptureBinding(Binding):
    """The pinned binding of the captured step that reads pair ``parity`` of the step buffers: every input and output a
    fixed device tensor. ``input`` writes a host value into the pair read only where it is not there already; ``output``
    of the logits (or ``NEXT``) to a host array copies them there after the run, timed with it."""

    def __init__(self, session: Session, owner: CapturedBindings, slots: list[Slot], length: int, parity: int):
        super().__init__(session)
        info, buffers = owner._info, owner.buffers
        self.parity, self._buffers = parity, buffers
        self._ids_name, self._mask_name = info.input_names["input_ids"], info.input_names["attention_mask"]
        self._sources = {info.logits_name: buffers.logits}  # outputs a host array may receive, after the run
        graph_outputs = {o.name for o in session.ort.get_outputs()}
        self._graph_writes = {NEXT: NEXT in graph_outputs, NEXT_MASK: NEXT_MASK in graph_outputs}
        if self._graph_writes[NEXT]:
            self._sources[NEXT] = buffers.ids[1 - parity]
        self._to_host: dict[str, tuple[int, Any]] = {}  # output name -> (id of the host array, its OrtValue)
        self._due: list[str] = []  # the host copies this run makes
        self._pinning = True  # while the buffers are bound for good (below): input and output bind as usual
        self.expected: dict[str, int] = {}  # the KV outputs written in place, and their buffers
        for slot in slots:
            self.expected.update(slot.bind(self, length))
        self.spot_names = tuple(self.expected)  # the in-place outputs a spot check reads in turn
        super().input(self._ids_name, buffers.ids[parity])
        super().input(self._mask_name, buffers.mask[parity])
        super().output(info.logits_name, buffers.logits)
        if self._graph_writes[NEXT]:
            super().output(NEXT, buffers.ids[1 - parity])
        if self._graph_writes[NEXT_MASK]:
            super().output(NEXT_MASK, buffers.mask[1 - parity])
        self._pinning = False
        self.run_options = run_options(session.device.backend.ort, owner.graph_ids[parity])
        self.runs = 0  # successful runs: the first one captured the graph, every later one replayed it

    def input(self, name: str, value: np.ndarray | DeviceTensor) -> None:
        """The ids (a host [1, 1] array, or the device tensor that holds them) or the mask (a host [1, n] array,
        zero padded here); DeviceError for another input, ConfigError for another shape."""
        if self._pinning:
            super().input(name, value)
            return
        b, p = self._buffers, self.parity
        if name == self._ids_name and value is b.ids[p]:
            return  # the ids the last step's graph wrote, already in place
        if name not in (self._ids_name, self._mask_name) or isinstance(value, DeviceTensor):
            raise DeviceError(
                f"a captured step takes only {sorted((self._ids_name, self._mask_name))} from the host (the ids also "
                f"from the device tensor that holds them), not {name!r}"
            )
        if name == self._ids_name:
            if value.shape != (1, 1):
                raise ConfigError(f"a captured step feeds one token ([1, 1] ids), not {value.shape}")
            if b.token[p] != int(value[0, 0]):
                b.token[p] = None
                self._write(b.ids[p], np.ascontiguousarray(value, np.int64))
                b.token[p] = int(value[0, 0])
            return
        if value.ndim != 2 or value.shape[0] != 1 or value.shape[1] > b.host_mask.shape[1]:
            raise ConfigError(f"{name} of shape {value.shape} does not fit the captured step's {b.mask[p].shape}")
        n = value.shape[1]  # the mask: the step's ones, zero padded to max_cache_len
        ones = n if value.all() else None
        if ones is None or b.ones[p] != ones:
            b.host_mask[0, :n], b.host_mask[0, n:], b.ones[p] = value[0], 0, None
            self._write(b.mask[p], b.host_mask)
            b.ones[p] = ones

    def _write(self, target: DeviceTensor, host: np.ndarray) -> None:
        """Copy host values into a step buffer: the runtime's time (the step's ``run_ms``), as an uncaptured
        binding's copy of a host input is."""
        start = time.perf_counter()
        self._backend.write(target.ortvalue(), host)
        self._bind_seconds += time.perf_counter() - start
        self._buffers.host_writes += 1

    def output(self, name: str, target: DeviceTensor | np.ndarray) -> None:
        """A host array to copy the logits (or ``NEXT``) into after the run; DeviceError for another output or a
        device tensor, ConfigError for an array of another shape or type."""
        if self._pinning:
            super().output(name, target)
            return
        source = self._sources.get(name)
        if source is None or isinstance(target, DeviceTensor):
            raise DeviceError(f"a captured step writes only {sorted(self._sources)} to the host, not {name!r}")
        if target.shape != source.shape or target.dtype != source.dtype or not target.flags.c_contiguous:
            raise ConfigError(
                f"the captured step's {name} is {source.shape} {source.dtype}; the host array bound is "
                f"{target.shape} {target.dtype}"
            )
        if self._to_host.get(name, (None,))[0] != id(target):
            self._to_host[name] = (id(target), (target, self._backend.host_value(target)))
        self._due.append(name)

    def output_new(self, name: str) -> None:
        """Refused: DeviceError (a captured step's outputs are fixed device tensors)."""
        raise DeviceError(f"a captured step allocates nothing: {name!r} must be a fixed device tensor")

    def run(self) -> RunResult:
        """The capture (first run) or a replay, then the host copies bound for this run; the pair it wrote is what the
        next step reads. The presents' buffers are read back for the in-place proof at the capture and the first replay
        only: a replay runs on the buffers bound at the capture, which nothing can rebind."""
        if self.runs >= 2:
            self.read_back, self.spot_check = False, ""
        b, p, due, self._due = self._buffers, self.parity, self._due, []
        if self._graph_writes[NEXT]:
            b.token[1 - p] = None
        if self._graph_writes[NEXT_MASK]:
            b.ones[1 - p] = None
        result = super().run()  # then the presents' identities, as the cache's proof asks
        start = time.perf_counter()
        for name in dict.fromkeys(due):
            self._backend.copy(self._sources[name].ortvalue(), self._to_host[name][1][1])
        result.seconds += time.perf_counter() - start
        if NEXT in due:
            b.token[1 - p] = int(self._to_host[NEXT][1][0][0, 0])
        if self._graph_writes[NEXT_MASK] and b.ones[p] is not None and b.ones[p] < b.host_mask.shape[1]:
            b.ones[1 - p] = b.ones[p] + 1
        b.parity = 1 - p
        self.runs += 1
        return result


class CapturedToken:
    """The greedy token under capture (what ``greedy.DeviceToken`` is uncaptured): the graph writes it into the ids
    buffer the next step reads, and a host copy comes back after each run. The buffers are the cache's."""

    burst_limit = 1  # the host copy comes back with each run: one step per read

    def __init__(self, buffers: StepBuffers):
        self.buffers = buffers
        self.host = np.zeros((1, 1), np.int64)

    def holding(self, tokens: np.ndarray) -> DeviceTensor | None:
        """The ids buffer the next step reads, where it holds these input ids (one token) already."""
        b = self.buffers
        return b.ids[b.parity] if tokens.shape[0] == 1 and b.token[b.parity] == int(tokens[0]) else None

    def bind_outputs(self, binding: Binding, ahead: int = 1) -> None:
        """The host copy of the token the step writes."""
        binding.output(NEXT, self.host)

    def read(self, steps: int = 1) -> list[int]:
        """The token the last step wrote (one step per read)."""
        return [int(self.host[0, 0])]

    def advance(self, steps: int = 1, token: int | None = None) -> None:
        """Nothing to do: the buffers say which token each holds."""

    def forget(self) -> None:
        """Nothing to do: the buffers say which token each holds."""

    def release(self) -> None:
        """Nothing to release: the buffers are the cache's."""
