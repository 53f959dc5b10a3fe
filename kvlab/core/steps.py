"""What a cache holds and how one step changes it, for every cache kind and backend: a cache's slots together
(``CacheState``: one per entry of the model's layout, ``kvlab.core.slots``; what is done to all of them at once
outside a step, all or nothing) and the per-step transaction over them (``CacheSteps``). Its life is
``kvlab.core.cache.Cache``.

Per step (the loop in ``kvlab.ort.decode.stepper`` does exactly this):

1. ``binding(session, n_new)``: check that ``n_new`` more tokens fit (no side effects) and return the step's
   binding with every slot's past input and present output bound;
2. the loop binds the token ids, the attention mask and the logits, and runs it;
3. ``commit(result, n_new)``: only after a successful run; checks what the runtime returned, then advances;
4. the loop records the step and calls its hooks; then ``settle()`` makes the step final, or, when a hook raised
   (Ctrl-C included), ``rollback(n_new)`` undoes the commit.
   A failed run, check or hook leaves the cache as it was before the step, so the step can be retried.
"""

from __future__ import annotations

from typing import Any

from .errors import CacheStateError, ConfigError, InPlaceError
from .guards import OneAtATime, atomic
from .records import CacheStep
from .slots import Crop, Slot

BOUND, COMMITTED = "bound", "committed"  # where the step in flight is (between steps: "")


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
        self._fresh_bindings = False  # whether a slot's outputs are the runtime's, new every run
        self._bytes_per_token = 0  # of every slot's entry, as the slots hold them (packed KV is smaller)
        self._state_bytes = 0  # one copy of each fixed-size state
        self.seq_length = 0  # tokens held

    def _hold(self, slots: list[Slot]) -> None:
        """Hold these slots (one per entry of the model's layout), and what they need per token."""
        self.slots, self._stepping = slots, [s for s in slots if s.steps]
        self._fresh_bindings = any(s.fresh_bindings for s in slots)  # then every step binds afresh
        self._bytes_per_token = sum(s.entry.bytes_per_token for s in slots)
        self._state_bytes = sum(s.entry.nbytes(0) for s in slots if not s.entry.grows)

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
        return self.seq_length * self._bytes_per_token + self._state_bytes if self.seq_length else 0

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

    def can_crop(self, n: int, length: int | None = None) -> bool:
        """Whether ``crop(n)`` could rewind every slot to ``n`` positions, now or once the sequence is ``length``
        long (a state slot cannot rewind; no side effects)."""
        length = self.seq_length if length is None else length
        return all(s.can_crop(length, n) for s in self.slots)

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


class CacheSteps(CacheState):
    """The per-step contract (see the module docstring): one transaction over every slot."""

    # Which buffers the runtime wrote are compared with the bound ones (``check_every``): None: every in-place output
    # at a binding's first run, then one a run, in turn (a spot check); N: every one at every N-th run.
    check_every: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self._bindings: dict[Any, tuple[Any, dict[str, int], tuple[str, ...]]] = {}  # key -> a binding, its
        #                                                              in-place outputs and their names in order
        self._expected: dict[str, int] = {}  # the step's in-place outputs -> the buffer each must come back in
        self._step = ""  # BOUND, COMMITTED, or "" between steps
        self._lost = ""  # why the slots no longer match seq_length (until reset)
        self._runs = 0
        self._user = OneAtATime()  # the generation using the cache (``Cache.use``)
        self._disposed = False
        self._fits = 0  # positions the current use checked: a step within them needs no capacity check

    @property
    def capacity(self) -> int | None:
        """The most positions this cache holds (None: no limit of its own; the model's context length applies)."""
        return None

    @property
    def lost(self) -> str:
        """Why the slots no longer match ``seq_length`` ("" when they do): the cache refuses steps until a reset."""
        return self._lost

    def check_capacity(self, positions: int) -> None:
        """Raise CapacityError when ``positions`` positions do not fit. No side effects."""

    def binding(self, session: Any, n_new: int) -> Any:
        """The step's binding, every slot bound. Raises CacheStateError (outside ``use``, a sequence the slots lost)
        and CapacityError; nothing changes then."""
        self._check_usable()
        if self._step == BOUND and not all(s.undoable for s in self.slots):
            self._lost = self._lost_because(
                "a step failed after binding its states in place (its run may have overwritten them)"
            )
        if self._lost:
            raise CacheStateError(self._lost)
        if self.seq_length + n_new > self._fits:
            self.check_capacity(self.seq_length + n_new)
        b, self._expected, names = self._bind(session, n_new)
        if self.check_every is not None:
            b.read_back = self._runs % self.check_every == 0
        else:  # a binding whose outputs are all pre-bound runs on the buffers its first run returned
            b.read_back = not b.ran
            b.spot_check = names[self._runs % len(names)] if names and b.ran else ""
        self._step = BOUND
        return b

    def _check_alive(self) -> None:
        if self._disposed:
            raise CacheStateError(f"this {self.kind} cache was disposed; create a new one")

    def _check_usable(self) -> None:
        self._check_alive()
        if not self._user.held:
            raise CacheStateError(f"the {self.kind} cache has no buffers: use it through generate() / cache.use()")

    def _bind(self, session: Any, n_new: int) -> tuple[Any, dict[str, int], tuple[str, ...]]:
        """A binding of every slot, made once per key and kept (made for this step alone when a slot's outputs are
        the runtime's)."""
        key = None if self._fresh_bindings else (id(session), *(s.binding_key(self.seq_length) for s in self._stepping))
        found = self._bindings.get(key) if key is not None else None
        if found is None:
            b, expected = session.binding(), {}
            for slot in self.slots:
                expected.update(slot.bind(b, self.seq_length))
            found = (b, expected, tuple(expected))
            if key is not None:
                self._bindings[key] = found
        return found

    def commit(self, result: Any, n_new: int) -> CacheStep:
        """Check what the run returned (InPlaceError, nothing changed), then advance every slot and the length."""
        self.settle()  # a step committed and never settled (its loop stopped between the two) is final
        length, returned = self.seq_length + n_new, result.returned_ptrs
        self._runs += 1
        expected = self._expected
        if returned and not (expected.items() <= returned.items() or returned.items() <= expected.items()):
            # every in-place output read back (one at a spot check) came back in its buffer: one C comparison
            name = next((n for n, ptr in expected.items() if returned.get(n, ptr) != ptr), next(iter(expected)))
            raise InPlaceError(
                f"{name} was not written in place: the runtime returned buffer "
                f"{returned.get(name) or 0:#x}, the cache bound {self._expected[name]:#x}; the cache "
                f"length stays {self.seq_length}"
            )
        problem = next(filter(None, (s.check(result, length) for s in self._stepping)), "")
        if problem:
            raise InPlaceError(problem)
        with atomic():
            made = [t for s in self._stepping for t in s.commit(result)]
            self._taken, self._fresh = self._fresh, []
            self.seq_length, self._step = length, COMMITTED
        return self._report(self._taken + made)

    def settle(self) -> None:
        """The step the last commit advanced by is final: release what it replaced."""
        for slot in self._stepping:
            slot.settle()
        self._step, self._taken = "", []

    def rollback(self, n_new: int) -> None:
        """Undo the last commit (its step failed after it): the sequence is as it was before that step."""
        with atomic():
            for slot in self._stepping:
                slot.rollback()
            self.seq_length -= n_new
            self._step, self._fresh, self._taken = "", self._taken, []  # the retry reports the allocation again
        if not all(s.undoable for s in self.slots):  # the step's own error propagates; the next one fails
            self._lost = self._lost_because("a step was rolled back after its run had overwritten them")

    def _lost_because(self, why: str) -> str:
        return (
            f"this {self.kind} cache's states were updated in place and no longer match its {self.seq_length} "
            f"tokens: {why}; that cannot be undone. Reset the cache (generate() does) or use "
            "StaticCache(states='swap'), whose failed steps leave the states as they were"
        )

    def _reset(self) -> None:
        super()._reset()
        self._step, self._lost = "", ""

    def _release_all(self) -> None:
        self._bindings.clear()
        self._expected = {}
        super()._release_all()
