"""The slot protocol: what a cache does with one entry of the model's layout (``CacheEntry``), step by step.

A cache (``kvlab.core.cache.Cache``) is a list of slots, one per entry; a cache kind is the choice of a slot per entry,
and a new behaviour per layer is a new kind of slot. The cache calls ``allocate`` at its first use; per step
``binding_key``, ``bind``, then after the run ``check`` and ``commit``, then ``settle`` or ``rollback``; outside a step
``crop``, ``receive``, ``reset`` and ``release``."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .cache_layout import CacheEntry
from .errors import CacheStateError


def _nothing() -> None:
    pass


@dataclass
class Crop:
    """A slot's rewind, made ready: ``apply()`` makes it and cannot fail; ``made``: the fresh tensors it installs,
    released by the cache when another slot's crop fails."""

    apply: Callable[[], None] = _nothing
    made: list[Any] = field(default_factory=list)


class Slot:
    """One entry of a cache. ``steps`` False: nothing to do per step (a fixed buffer written in place). ``undoable``
    False: a failed run leaves the slot changed. ``fresh_bindings`` True: the runtime allocates its output every run."""

    steps = True
    undoable = True
    fresh_bindings = False

    def __init__(self, entry: CacheEntry):
        self.entry = entry

    @property
    def tensors(self) -> tuple[Any, ...]:
        """The tensors holding the entry now (empty before ``allocate`` and after ``release``)."""
        raise NotImplementedError

    def allocate(self) -> list[Any]:
        """Allocate what the slot owns for good; returns the tensors made (the cache releases them when a later
        slot's allocation fails)."""
        return []

    def binding_key(self, length: int) -> Hashable:
        """What the slot's binding depends on at a step from ``length``: equal keys run the last binding again."""
        return ()

    def bind(self, binding: Any, length: int) -> Mapping[str, int]:
        """Bind the past input and the present output of a step that starts at ``length``; returns the outputs
        bound in place, each with the buffer identity it must come back in."""
        raise NotImplementedError

    def check(self, result: Any, length: int) -> str:
        """What is wrong with what the run returned for this entry at ``length`` ("": nothing). No side effects."""
        return ""

    def commit(self, result: Any) -> list[Any]:
        """Take the step's output (it cannot fail); returns the tensors the runtime made for the entry."""
        return []

    def settle(self) -> None:
        """The committed step is final: release what the commit replaced."""

    def rollback(self) -> None:
        """Undo the last commit: the entry as before that step (where ``undoable``)."""

    def crop(self, length: int, n: int) -> Crop:
        """The rewind from ``length`` to the first ``n`` positions, made ready (what can fail fails here; nothing
        changes until the cache applies it). Default: a state refuses unless ``n`` is 0 (a reset); a buffer keeps its
        positions."""
        if not self.can_crop(length, n):
            e = self.entry
            raise CacheStateError(
                f"cannot crop to {n} of {length} positions: layer {e.layer}'s {e.role} state ({e.past!r}) sums up "
                "every position it has seen and cannot be rewound; that needs a snapshot of the state at position "
                f"{n} (crop(0) or reset() starts over)"
            )
        return Crop(self.reset)

    def can_crop(self, length: int, n: int) -> bool:
        """Whether ``crop(length, n)`` would succeed: a slot of per-position contents rewinds, a state only starts
        over (``n`` 0). No side effects."""
        return self.entry.grows or not n

    def receive(self, src: Slot) -> tuple[list[Any], int]:
        """Copy ``src``'s contents (the same entry, on another device); returns the tensors made and the bytes
        copied. On failure the cache forgets the sequence (what was copied is never read)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the sequence; the buffers stay."""

    def release(self) -> None:
        """Free every buffer (idempotent); ``allocate`` may follow."""
