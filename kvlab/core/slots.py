"""The slot protocol: what a cache does with one entry of the model's layout (one past input / present output pair,
``kvlab.core.layout.CacheEntry``), step by step.

A cache is a list of slots, one per entry, and the lifecycle they share (``kvlab.core.cache.Cache``); a cache kind
is the choice of a slot per entry. A new behaviour per layer (a rewind, a ring buffer, quantized KV, KV shared with
another layer) is a new kind of slot, not a branch in every cache. The cache calls its slots in this order (the
ONNX Runtime backend's slots: ``kvlab.ort.decode.slots``):

- ``allocate()``, at the cache's first use: every buffer the slot owns (the cache releases the slots allocated
  before one that fails: all or nothing);
- per step: ``binding_key(length)`` (equal keys: the binding made for the last one runs again; None: bind afresh),
  ``bind(binding, length)``: bind the past input and the present output of a step that starts at ``length``, and
  return the outputs bound in place with the buffer identity each must come back in; after the run,
  ``check(result, length)``: what is wrong with what the runtime returned ("" when nothing; no side effects), and
  ``commit(result)``: take the step's outputs, returning the tensors the runtime made for it; then ``settle()``
  (release what the commit replaced) or ``rollback()`` (undo the commit);
- ``crop(length, n)``: the rewind from ``length`` to the first ``n`` positions, made ready (whatever can fail, a
  fresh tensor or a named refusal, fails here) as a ``Crop`` the cache applies to every slot at once;
- ``receive(src)``: copy the same entry from a slot on another device (a handoff); ``reset()`` forgets the
  sequence and keeps the buffers; ``release()`` frees every buffer.

``CacheState`` is a cache's slots together: what they hold, and what is done to all of them at once outside a step
(allocating, resetting, releasing, cropping, receiving), all or nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import CacheStateError, ConfigError
from .guards import atomic
from .layout import CacheEntry
from .records import CacheStep


def _nothing() -> None:
    pass


@dataclass
class Crop:
    """A slot's rewind, made ready: ``apply()`` makes it (it cannot fail); ``made``: the fresh tensors it installs,
    released by the cache when another slot's crop fails."""

    apply: Callable[[], None] = _nothing
    made: list[Any] = field(default_factory=list)


class Slot:
    """One entry of a cache (see the module docstring). ``steps`` False: the slot's binding, commit, settle and
    rollback never change anything (a fixed buffer written in place), so the cache skips them every step.
    ``undoable`` False: a run that fails after it started leaves the slot changed (a state rewritten in place)."""

    steps = True
    undoable = True

    def __init__(self, entry: CacheEntry):
        self.entry = entry

    @property
    def tensors(self) -> tuple[Any, ...]:
        """The tensors holding the entry now."""
        raise NotImplementedError

    def bytes(self, length: int) -> tuple[int, int]:
        """(fixed, growing): the bytes the slot holds at a sequence of ``length``, whatever the length and growing
        with it."""
        raise NotImplementedError

    def allocate(self) -> list[Any]:
        """Allocate what the slot owns for good; returns the tensors made."""
        return []

    def binding_key(self, length: int) -> Hashable | None:
        return None

    def bind(self, binding: Any, length: int) -> Mapping[str, int]:
        raise NotImplementedError

    def check(self, result: Any, length: int) -> str:
        return ""

    def commit(self, result: Any) -> list[Any]:
        return []

    def settle(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def crop(self, length: int, n: int) -> Crop:
        raise NotImplementedError

    def receive(self, src: Slot) -> tuple[list[Any], int]:
        """Copy ``src``'s contents (the same entry, on another device); returns the tensors made and the bytes
        copied."""
        raise NotImplementedError

    def reset(self) -> None:
        pass

    def release(self) -> None:
        pass

    def refuse_crop(self, length: int, n: int) -> CacheStateError:
        """The named refusal of a slot whose contents sum up every position (a state): no rewind without a snapshot."""
        e = self.entry
        return CacheStateError(
            f"cannot crop to {n} of {length} positions: layer {e.layer}'s {e.role} state ({e.past!r}) sums up every "
            "position it has seen and cannot be rewound; that needs a snapshot of the state at position "
            f"{n} (crop(0) or reset() starts over)"
        )


class CacheState:
    """What a cache holds: a slot per entry of the model's layout on one device, the length of the sequence they
    hold, and the tensors allocated and not reported yet."""

    kind = "cache"

    def __init__(self) -> None:
        self.slots: list[Slot] = []  # one per entry of the model's layout, from the first use on
        self._stepping: list[Slot] = []  # those with something to do every step
        self._info: Any = None  # the model served: its name and cache layout (kvlab.ort.ModelInfo)
        self._device: Any = None
        self._seen: set[int] = set()  # buffer identities this cache has held (new_buffers counts the others)
        self._fresh: list[Any] = []  # tensors allocated and not reported by a step yet
        self._taken: list[Any] = []  # those the last commit reported (its rollback gives them back)
        self._steady: CacheStep | None = None  # what a step that makes nothing reports
        self.seq_length = 0  # tokens held

    @property
    def device(self) -> Any:
        """The device the cache's tensors live on (None before its first use)."""
        return self._device

    @property
    def tensors(self) -> tuple[Any, ...]:
        """The tensors held now, in the model's past-input order (a slot's buffers together)."""
        return tuple(t for s in self.slots for t in s.tensors)

    @property
    def live_bytes(self) -> int:
        """Bytes of cache tensors alive now (exact, as requested from the runtime)."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def used_bytes(self) -> int:
        """Bytes the held tokens need: seq_length x bytes per token, plus one copy of each fixed-size state (conv,
        recurrent) once a sequence is held; of the entries as the slots hold them (packed KV is smaller)."""
        if self._info is None or not self.seq_length:
            return 0
        per_token = sum(s.entry.bytes_per_token for s in self.slots)
        return self.seq_length * per_token + sum(s.entry.nbytes(0) for s in self.slots if not s.entry.grows)

    def held(self) -> list[tuple[Any, tuple[Any, ...]]]:
        """Each cache entry of the model (``kvlab.core.layout.CacheEntry``) with the tensor(s) holding it now."""
        return [(s.entry, s.tensors) for s in self.slots if s.tensors]

    def held_bytes_by_layer(self) -> dict[int, int]:
        """Bytes of the tensors held now, per layer, summed from the tensors themselves (their runtime shapes)."""
        out: dict[int, int] = {}
        for entry, tensors in self.held():
            out[entry.layer] = out.get(entry.layer, 0) + sum(t.nbytes for t in tensors)
        return out

    def _report(self, made: list[Any]) -> CacheStep:
        """What a step did to memory: the tensors it made, and the live bytes (counted again when it made any)."""
        if made or self._steady is None:
            fresh = {t.data_ptr for t in made} - self._seen
            self._seen |= fresh
            self._steady = CacheStep(live_bytes=self.live_bytes)
            return CacheStep(len(made), sum(t.nbytes for t in made), len(fresh), self._steady.live_bytes)
        return self._steady

    def _allocate(self) -> None:
        """Every slot's buffers, all or nothing, reported by the next step (nothing when they are there already)."""
        if any(s.tensors for s in self.slots):
            self._fresh = []
            return
        made: list[Any] = []
        try:
            for slot in self.slots:
                made += slot.allocate()
        except BaseException:
            self._release_all()
            raise
        self._fresh = made

    def _reset(self) -> None:
        for slot in self.slots:
            slot.reset()
        self.seq_length = 0

    def _release_all(self) -> None:
        for slot in self.slots:
            slot.release()
        self._fresh, self._taken, self._steady = [], [], None
        self.seq_length = 0

    def _crop(self, n: int) -> None:
        """Every slot's crop made ready, then applied in one block; or none applied (and what was made released)."""
        crops: list[Crop] = []
        try:
            for slot in self.slots:
                crops.append(slot.crop(self.seq_length, n))
        except BaseException:
            for t in (t for c in crops for t in c.made):
                t.release()
            raise
        with atomic():
            for c in crops:
                c.apply()
            self.seq_length = n

    def _receive(self, src: CacheState) -> tuple[CacheStep, int]:
        """Every slot copies its entry from ``src``'s; on a failure the sequence is forgotten (length 0)."""
        made, copied = [], 0
        try:
            for mine, theirs in zip(self.slots, src.slots):
                fresh, n = mine.receive(theirs)
                made, copied = made + fresh, copied + n
        except BaseException:
            self._reset()  # what was copied is never read: the first step starts from zeros
            raise
        taken, self._fresh = self._fresh, []
        self.seq_length = src.seq_length
        return self._report(taken + made), copied

    def _check_source(self, src: CacheState) -> None:
        if src.kind != self.kind:  # e.g. a captured static cache takes a plain one's (a CPU prefill)
            raise ConfigError(f"a {self.kind} cache cannot receive a {src.kind} cache's KV; use the same kind")
        if self.seq_length:
            raise CacheStateError(
                f"this cache already holds a sequence of {self.seq_length} tokens; a handoff needs an empty cache "
                "(reset it first)"
            )
        if not src.seq_length or src._info is None:
            raise CacheStateError("the source cache holds no sequence to hand off")
        if src._lost:
            raise CacheStateError(src._lost)
        theirs, mine = src._info, self._info
        if theirs.layout != mine.layout:
            raise ConfigError(
                f"cannot hand off KV of {theirs.name} on {src._device.name} ({theirs.layout}) to "
                f"{mine.name} on {self._device.name} ({mine.layout}): they must be equal"
            )
