"""The slot protocol: what a cache does with one entry of the model's layout (one past input / present output pair,
``kvlab.core.layout.CacheEntry``), step by step.

A cache is a list of slots, one per entry, and the lifecycle they share (``kvlab.core.cache.Cache``); a cache kind
is the choice of a slot per entry. A new behaviour per layer (a rewind, a ring buffer, quantized KV, KV shared with
another layer) is a new kind of slot, not a branch in every cache. The cache calls its slots in this order (the
ONNX Runtime backend's slots: ``kvlab.ort.decode.slots``):

- ``allocate()``, at the cache's first use: every buffer the slot owns (the cache releases the slots allocated
  before one that fails: all or nothing);
- per step: ``binding_key(length)`` (equal keys: the binding made for the last one runs again; a slot whose
  outputs the runtime allocates anew every run says ``fresh_bindings`` instead, and its cache binds afresh),
  ``bind(binding, length)``: bind the past input and the present output of a step that starts at ``length``, and
  return the outputs bound in place with the buffer identity each must come back in; after the run,
  ``check(result, length)``: what is wrong with what the runtime returned ("" when nothing; no side effects), and
  ``commit(result)``: take the step's outputs, returning the tensors the runtime made for it; then ``settle()``
  (release what the commit replaced) or ``rollback()`` (undo the commit);
- ``crop(length, n)``: the rewind from ``length`` to the first ``n`` positions, made ready (whatever can fail, a
  fresh tensor or a named refusal, fails here) as a ``Crop`` the cache applies to every slot at once;
- ``receive(src)``: copy the same entry from a slot on another device (a handoff); ``reset()`` forgets the
  sequence and keeps the buffers; ``release()`` frees every buffer.

A cache's slots together, and what is done to all of them at once, are ``kvlab.core.steps``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import CacheStateError
from .layout import CacheEntry


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
    ``undoable`` False: a run that fails after it started leaves the slot changed (a state rewritten in place).
    ``fresh_bindings`` True: the runtime allocates the slot's output anew every run, so no binding runs twice."""

    steps = True
    undoable = True
    fresh_bindings = False

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

    def binding_key(self, length: int) -> Hashable:
        return ()

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

    def can_crop(self, length: int, n: int) -> bool:
        """Whether ``crop(length, n)`` would succeed (a slot of per-position contents rewinds; a state does not)."""
        return True

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
