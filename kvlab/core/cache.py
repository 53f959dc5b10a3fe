"""The cache contract: a cache is a list of slots (``kvlab.core.slots``), one per entry of the model's layout, and
the transactions and lifecycle they share, the same for every cache kind and backend. Three layers, each a class:
what a cache holds (``CacheState``), how a step changes it (``CacheSteps``), and its life (``Cache``).

Per step (the loop in ``kvlab.ort.decode.stepper`` does exactly this):

1. ``binding(session, n_new)``: check that ``n_new`` more tokens fit (no side effects) and return the step's
   binding with every slot's past input and present output bound;
2. the loop binds the token ids, the attention mask and the logits, and runs it;
3. ``commit(result, n_new)``: only after a successful run; checks what the runtime returned, then advances;
4. the loop records the step and calls its hooks; then ``settle()`` makes the step final, or, when a hook raised
   (Ctrl-C included), ``rollback(n_new)`` undoes the commit.
   A failed run, check or hook leaves the cache as it was before the step, so the step can be retried.

Lifecycle: ``use(info, device, positions)`` holds the cache for one generation (one at a time; capacity checked;
buffers allocated lazily, all or nothing); ``crop(n)`` keeps the first ``n`` positions; ``reset()`` forgets the
sequence; ``dispose()`` releases everything, once; ``receive(other)`` takes over a sequence another cache of the
same kind holds on another device.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import CacheStateError, CapacityError, InPlaceError, check_int
from .guards import OneAtATime, atomic
from .labels import CacheSpec
from .records import CacheStep
from .slots import CacheState, Slot

BOUND, COMMITTED = "bound", "committed"  # where the step in flight is (between steps: "")


class CacheSteps(CacheState):
    """The per-step contract (see the module docstring): one transaction over every slot."""

    check_every = 1  # compare the buffers the runtime wrote with the bound ones every this many runs

    def __init__(self) -> None:
        super().__init__()
        self._bindings: dict[Any, tuple[Any, dict[str, int]]] = {}  # key -> a binding and its in-place outputs
        self._expected: dict[str, int] = {}  # the step's in-place outputs -> the buffer each must come back in
        self._step = ""  # BOUND, COMMITTED, or "" between steps
        self._lost = ""  # why the slots no longer match seq_length (until reset)
        self._runs = 0

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
        self.check_capacity(self.seq_length + n_new)
        b, self._expected = self._bind(session, n_new)
        b.read_back = self._runs % self.check_every == 0
        self._step = BOUND
        return b

    def _check_usable(self) -> None:
        raise NotImplementedError

    def _bind(self, session: Any, n_new: int) -> tuple[Any, dict[str, int]]:
        """A binding of every slot, made once per key and kept (a slot without a key: made for this step alone)."""
        parts = [s.binding_key(self.seq_length) for s in self._stepping]
        key = None if None in parts else (id(session), *parts)
        found = self._bindings.get(key)
        if found is None:
            b, expected = session.binding(), {}
            for slot in self.slots:
                expected.update(slot.bind(b, self.seq_length))
            found = (b, expected)
            if key is not None:
                self._bindings[key] = found
        return found

    def commit(self, result: Any, n_new: int) -> CacheStep:
        """Check what the run returned (InPlaceError, nothing changed), then advance every slot and the length."""
        self.settle()  # a step committed and never settled (its loop stopped between the two) is final
        length, returned = self.seq_length + n_new, result.returned_ptrs
        self._runs += 1
        if returned is not None and not self._expected.items() <= returned.items():  # one C comparison
            name = next(n for n, ptr in self._expected.items() if returned.get(n) != ptr)
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


class Cache(CacheSteps):
    """A cache's life: bound to one model layout and device, one generation at a time, reset, crop, dispose, and
    the handoff. A cache kind says which slot holds each entry (``_slot``)."""

    kind = "cache"

    def __init__(self) -> None:
        super().__init__()
        self._user = OneAtATime()  # the generation using the cache (``use``)
        self._disposed = False
        self.epoch = 0  # uses so far: who remembers it knows whether another use came between two of its own

    @property
    def spec(self) -> CacheSpec:
        """Kind and size, as data (``str(cache.spec)`` names it)."""
        return CacheSpec(self.kind)

    @property
    def disposed(self) -> bool:
        return self._disposed

    @property
    def in_use(self) -> bool:
        return self._user.held

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()

    @contextmanager
    def use(self, info: Any, device: Any, positions: int, keep: bool = False) -> Iterator[Cache]:
        """Hold the cache for one generation of ``positions`` positions of the model ``info`` describes (its
        ``name`` and ``layout``) on ``device``, starting from an empty sequence; ``keep=True``: from the sequence it
        holds (a conversation's next turn; ``positions`` counts the held ones too). Every use counts in ``epoch``.
        Raises CacheStateError (disposed, in use, bound to another model or device) and CapacityError
        (``positions`` do not fit)."""
        self._check_alive()
        busy = CacheStateError(
            f"this {self.kind} cache is in use by another generation; a cache serves one "
            "generation at a time (make one cache per concurrent generation)"
        )
        with self._user.hold(lambda: busy):
            self._attach(info, device)
            if positions > info.context_length:
                raise CapacityError(
                    f"{positions} positions are needed but model {info.name} holds at most "
                    f"{info.context_length} (its context length: its rotary table ends there); "
                    "shorten the prompt or max_new_tokens"
                )
            self.check_capacity(positions)
            if not keep:
                self._reset()
            self.epoch += 1
            self._allocate()
            yield self

    def _attach(self, info: Any, device: Any) -> None:
        """Serve this model on this device (a kind checks first what it cannot serve); the slots, at the first use."""
        mine = self._info
        if mine is not None and (mine.layout != info.layout or self._device is not device):
            raise CacheStateError(
                f"this cache is bound to model {mine.name} on {self._device.name} ({mine.layout})"
                f"; it cannot serve {info.name} on {device.name} ({info.layout}). Use a new cache."
            )
        if mine is None:
            self.slots = [self._slot(entry, device) for entry in info.layout.entries]
            self._stepping = [s for s in self.slots if s.steps]
        self._info, self._device = info, device

    def _slot(self, entry: Any, device: Any) -> Slot:
        """The slot that holds ``entry`` on ``device``: what makes a cache kind."""
        raise NotImplementedError

    def _check_alive(self) -> None:
        if self._disposed:
            raise CacheStateError(f"this {self.kind} cache was disposed; create a new one")

    def _check_usable(self) -> None:
        self._check_alive()
        if not self._user.held:
            raise CacheStateError(f"the {self.kind} cache has no buffers: use it through generate() / cache.use()")

    def reset(self) -> None:
        """Forget the sequence (the length goes to 0); CacheStateError while disposed or in use."""
        self._check_alive()
        if self._user.held:
            raise CacheStateError(f"cannot reset this {self.kind} cache while a generation is using it")
        self._reset()

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions (0 <= n <= seq_length) and forget the rest, in every slot or in none: a
        growing KV slot keeps copies of its first ``n`` positions, a fixed one its buffer (later steps overwrite the
        rest); a state refuses, it cannot be rewound without a snapshot (``crop(0)`` starts it over). Raises
        ConfigError (``n`` out of range) and CacheStateError (disposed, in use by another thread, between a step's
        commit and its settle, a slot that cannot rewind); nothing changes then."""
        self._check_alive()
        n = check_int(n, "n", 0, self.seq_length, subject=f"crop({n!r}): n", note=" (the positions held)")
        if self._user.mine:  # inside this thread's own use
            self._crop_now(n)
            return
        with self._user.hold(lambda: CacheStateError(f"cannot crop this {self.kind} cache: another thread uses it")):
            self._crop_now(n)

    def _crop_now(self, n: int) -> None:
        if self._step == COMMITTED:
            raise CacheStateError("cannot crop in the middle of a step (between its commit and its settle)")
        if self._lost and n:
            raise CacheStateError(self._lost)
        if n < self.seq_length:
            self._crop(n)
        if not n:  # a sequence started over reads no state: what a failed step left in them is never read
            self._lost, self._step = "", ""

    def dispose(self) -> None:
        """Release every buffer. Idempotent; any later use is a CacheStateError (as is disposing while in use)."""
        if self._disposed:
            return
        if self._user.held:
            raise CacheStateError(f"cannot dispose this {self.kind} cache while a generation is using it")
        self._release_all()
        self._disposed = True
        self._seen.clear()

    def empty_like(self) -> Cache:
        """A new, empty cache of the same kind and size that can hand its sequence to this one (``receive``): the
        other side of a handoff (e.g. a CPU prefill)."""
        raise NotImplementedError

    def twin(self) -> Cache:
        """``empty_like()``, by the name it had first."""
        return self.empty_like()

    def receive(self, src: Cache) -> tuple[CacheStep, int]:
        """Take over the sequence ``src`` holds on another device (e.g. a CPU prefill): copy it into this cache.
        Returns the step's allocations and the bytes copied. On any failure nothing is half-copied: this cache stays
        empty (length 0) and reusable. Raises CacheStateError (outside ``use``, not empty, an empty or lost
        source), ConfigError (another kind, size or layout), DeviceError (no copy path), CapacityError."""
        self._check_alive()
        if not self._user.held:
            raise CacheStateError("receive() runs inside cache.use() (generate does it)")
        self._check_source(src)
        self._device.check_copy_from(src._device)
        self.check_capacity(src.seq_length)
        return self._receive(src)
