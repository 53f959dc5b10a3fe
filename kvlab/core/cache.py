"""A cache: one slot per entry of the model's layout, one step transaction over them, and its life.

A cache kind is a choice of slot per entry (``Cache._slot``; the slot protocol: ``kvlab.core.slots``). A generation
loop (``kvlab.ort.decode.stepper``) steps a cache so:

1. ``binding(session, n_new)``: check that ``n_new`` more positions fit (nothing changes if not) and return the
   step's binding, every slot's past input and present output bound;
2. the loop binds the token ids, the attention mask and the logits, and runs the binding;
3. ``commit(result, n_new)``, only after a successful run: check what the runtime returned, then advance;
4. the loop records the step; ``settle()`` makes it final, or ``rollback(n_new)`` undoes the commit (a hook or
   Ctrl-C failed the step after it).

A failed run, check or hook leaves the cache as it was before the step, so the step can be run again. The cache
calls three small collaborators for its bookkeeping: ``Bindings`` (a step's binding, made once and run again),
``InPlaceProof`` (the presents came back in the buffers bound for them) and ``Allocations`` (what each step
allocated: a ``CacheStep``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .errors import CacheStateError, CapacityError, ConfigError, InPlaceError, check_int
from .guards import OneAtATime, atomic
from .labels import CacheSpec
from .records import CacheStep
from .slots import Crop, Slot

BOUND, COMMITTED = "bound", "committed"  # where the step in flight is ("" between steps)


class Cache:
    """A cache of one model's layout on one device, used by one generation at a time (see the module docstring).
    A cache kind chooses the slot of each entry (``_slot``) and may limit the positions (``check_capacity``)."""

    kind = "cache"

    def __init__(self, check_every: int | None = None) -> None:
        self.slots: list[Slot] = []  # one per entry of the model's layout, from the first use on
        self.seq_length = 0  # positions held
        self.epoch = 0  # uses so far: who remembers it knows whether another use came between two of its own
        self.bindings = Bindings()
        self.proof = InPlaceProof(check_every)
        self.allocations = Allocations(lambda: self.live_bytes)
        self._stepping: list[Slot] = []  # the slots with something to do every step
        self._info: Any = None  # the model served: its name and layout (a kvlab.ort.ModelInfo)
        self._device: Any = None
        self._bytes_per_token = 0  # of every entry, as the slots hold them
        self._state_bytes = 0  # one copy of each fixed-size state
        self._step = ""  # BOUND, COMMITTED, or "" between steps
        self._lost = ""  # why the slots no longer match seq_length, until a reset
        self._user = OneAtATime()  # the generation using the cache
        self._disposed = False
        self._fits = 0  # positions the current use checked: a step within them needs no capacity check

    # -- what it holds
    @property
    def spec(self) -> CacheSpec:
        """Kind and size, as data (``str(cache.spec)`` names it)."""
        return CacheSpec(self.kind)

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
        """Bytes of the tensors held now (exact, as requested from the runtime)."""
        return sum(t.nbytes for t in self.tensors)

    def used_bytes_at(self, length: int) -> int:
        """Bytes ``length`` held positions need: length x bytes per token (as the slots hold them: packed KV is
        smaller), plus one copy of each fixed-size state once a sequence is held."""
        return length * self._bytes_per_token + self._state_bytes if length else 0

    def held_bytes_by_layer(self) -> dict[int, int]:
        """{layer: bytes of the tensors that hold its entries now}, from the tensors' own runtime shapes."""
        out: dict[int, int] = {}
        for slot in (s for s in self.slots if s.tensors):
            out[slot.entry.layer] = out.get(slot.entry.layer, 0) + sum(t.nbytes for t in slot.tensors)
        return out

    @property
    def capacity(self) -> int | None:
        """The most positions this cache holds (None: no limit of its own; the model's context length applies)."""
        return None

    def check_capacity(self, positions: int) -> None:
        """Raise CapacityError when ``positions`` positions do not fit this cache. No side effects."""

    @property
    def lost(self) -> str:
        """Why the slots no longer match ``seq_length`` ("" when they do); until a reset the cache refuses steps."""
        return self._lost

    @property
    def disposed(self) -> bool:
        """Whether ``dispose()`` released the cache (for good)."""
        return self._disposed

    @property
    def in_use(self) -> bool:
        """Whether a generation holds the cache now (``use``)."""
        return self._user.held

    def can_crop(self, n: int, length: int | None = None) -> bool:
        """Whether ``crop(n)`` could rewind every slot to ``n`` positions, now or once the sequence is ``length``
        long (a state cannot rewind). No side effects."""
        length = self.seq_length if length is None else length
        return all(s.can_crop(length, n) for s in self.slots)

    # -- one step, a transaction
    def binding(self, session: Any, n_new: int) -> Any:
        """The binding of a step of ``n_new`` positions on ``session``, every slot bound. Raises CacheStateError
        (outside ``use``, a sequence the slots lost) and CapacityError (``n_new`` more do not fit); nothing changes
        then. Leaves the step bound: ``commit`` follows a successful run."""
        self._check_usable()
        if self._step == BOUND and not all(s.undoable for s in self.slots):
            self._lost = self._lost_because(
                "a step failed after binding its states in place (its run may have overwritten them)"
            )
        if self._lost:
            raise CacheStateError(self._lost)
        if self.seq_length + n_new > self._fits:
            self.check_capacity(self.seq_length + n_new)
        b, expected, names = self.bindings.get(session, n_new, self.slots, self._stepping, self.seq_length)
        self.proof.arm(b, expected, names)
        self._step = BOUND
        return b

    def commit(self, result: Any, n_new: int) -> CacheStep:
        """Take the step's run ``result``: check that every present came back where it was bound and with the
        right shape (InPlaceError otherwise, and nothing changes), then advance every slot and ``seq_length`` by
        ``n_new``, in one block Ctrl-C cannot split. Returns what the step allocated. The step stays open until
        ``settle`` or ``rollback``."""
        self.settle()  # a step committed and never settled (its loop stopped between the two) is final
        length = self.seq_length + n_new
        self.proof.check(result.returned_ptrs, self.seq_length)
        problem = next(filter(None, (s.check(result, length) for s in self._stepping)), "")
        if problem:
            raise InPlaceError(problem)
        with atomic():
            made = [t for s in self._stepping for t in s.commit(result)]
            taken = self.allocations.take()
            self.seq_length, self._step = length, COMMITTED
        return self.allocations.report(taken + made)

    def settle(self) -> None:
        """Make the last committed step final: every slot releases what its commit replaced. Never raises."""
        for slot in self._stepping:
            slot.settle()
        self._step = ""
        self.allocations.settle()

    def rollback(self, n_new: int) -> None:
        """Undo the last commit (of ``n_new`` positions; its step failed after it): every slot and ``seq_length``
        as before that step. Where a slot cannot undo its run (a state rewritten in place), the cache is lost
        until a reset (``lost``): the next step raises CacheStateError."""
        with atomic():
            for slot in self._stepping:
                slot.rollback()
            self.seq_length -= n_new
            self._step = ""
            self.allocations.rollback()
        if not all(s.undoable for s in self.slots):
            self._lost = self._lost_because("a step was rolled back after its run had overwritten them")

    # -- its life
    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()

    @contextmanager
    def use(self, info: Any, device: Any, positions: int, keep: bool = False) -> Iterator[Cache]:
        """Hold the cache for one generation of ``positions`` positions of the model ``info`` describes on ``device``:
        from an empty sequence, or, ``keep=True``, from the one it holds (counted in ``positions``). The first use binds
        the cache to that layout and device; every use allocates what is missing, all or nothing, and counts in
        ``epoch``. Raises CacheStateError (disposed, in use, bound to another model or device, ``keep`` of another
        model's sequence) and CapacityError (``positions`` do not fit); nothing changes then."""
        self._check_alive()
        busy = CacheStateError(
            f"this {self.kind} cache is in use by another generation; a cache serves one "
            "generation at a time (make one cache per concurrent generation)"
        )
        with self._user.hold(lambda: busy):
            held = self._info
            if keep and self.seq_length and held is not None and held.name != info.name:
                raise CacheStateError(
                    f"this cache holds {self.seq_length} positions of model {held.name}'s KV; continuing them with "
                    f"model {info.name} (keep=True) would mix two models' keys and values: reset the cache, or "
                    f"continue with {held.name}"
                )
            self._attach(info, device)
            if positions > info.context_length:
                raise CapacityError(
                    f"{positions} positions are needed but model {info.name} holds at most "
                    f"{info.context_length} (its context length: its rotary table ends there); "
                    "shorten the prompt or max_new_tokens"
                )
            self.check_capacity(positions)
            self._fits = positions
            if not keep:
                self._reset()
            self.epoch += 1
            self._allocate()
            yield self

    def reset(self) -> None:
        """Forget the sequence (``seq_length`` 0); the buffers stay. CacheStateError while disposed or in use."""
        self._check_alive()
        if self._user.held:
            raise CacheStateError(f"cannot reset this {self.kind} cache while a generation is using it")
        self._reset()

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions (0 <= n <= seq_length) in every slot or in none: a growing KV slot keeps
        a copy of them, a fixed one its buffer (later steps overwrite the rest); a state cannot rewind (``crop(0)``
        starts it over). Raises ConfigError (``n`` out of range) and CacheStateError (disposed, used by another
        thread, between a step's commit and its settle, a slot that cannot rewind); nothing changes then."""
        self._check_alive()
        n = check_int(n, "n", 0, self.seq_length, subject=f"crop({n!r}): n", note=" (the positions held)")
        if self._user.mine:  # inside this thread's own use
            self._crop(n)
            return
        with self._user.hold(lambda: CacheStateError(f"cannot crop this {self.kind} cache: another thread uses it")):
            self._crop(n)

    def dispose(self) -> None:
        """Release every buffer, once (a second call does nothing); any later use is a CacheStateError. Raises
        CacheStateError while a generation uses the cache (nothing released then)."""
        if self._disposed:
            return
        if self._user.held:
            raise CacheStateError(f"cannot dispose this {self.kind} cache while a generation is using it")
        self._release_all()
        self._disposed = True
        self.allocations.seen.clear()

    def empty_like(self) -> Cache:
        """A new, empty cache that can hand its sequence to this one (``receive``): a handoff's other side."""
        raise NotImplementedError

    def receive(self, src: Cache) -> tuple[CacheStep, int]:
        """Take over the sequence ``src`` holds on another device (e.g. a CPU prefill): copy it into this cache,
        inside ``use``. Returns what the copy allocated and the bytes copied. Raises CacheStateError (outside
        ``use``, not empty, an empty or lost source), ConfigError (another kind, size or layout), DeviceError (no
        copy path) and CapacityError; on any failure this cache is left empty (length 0) and reusable."""
        self._check_alive()
        if not self._user.held:
            raise CacheStateError("receive() runs inside cache.use() (generate does it)")
        self._check_source(src)
        self._device.check_copy_from(src._device)
        self.check_capacity(src.seq_length)
        made, copied = [], 0
        try:
            for mine, theirs in zip(self.slots, src.slots):
                fresh, n = mine.receive(theirs)
                made, copied = made + fresh, copied + n
        except BaseException:
            self._reset()  # what was copied is never read: the first step starts from zeros
            raise
        taken = self.allocations.take()
        self.allocations.settle()
        self.seq_length = src.seq_length
        return self.allocations.report(taken + made), copied

    # -- what a cache kind chooses
    def _slot(self, entry: Any, device: Any) -> Slot:
        """The slot that holds ``entry`` on ``device``: what makes a cache kind."""
        raise NotImplementedError

    def _attach(self, info: Any, device: Any) -> None:
        """Serve this model's layout on this device (a kind checks first what it cannot serve); at the first use,
        make the slots. CacheStateError for another layout or device than the first."""
        mine = self._info
        if mine is not None and (mine.layout != info.layout or self._device is not device):
            raise CacheStateError(
                f"this cache is bound to model {mine.name} on {self._device.name} ({mine.layout})"
                f"; it cannot serve {info.name} on {device.name} ({info.layout}). Use a new cache."
            )
        if mine is None:
            self.slots = [self._slot(entry, device) for entry in info.layout.entries]
            self._stepping = [s for s in self.slots if s.steps]
            self.bindings.fresh = any(s.fresh_bindings for s in self.slots)
            self._bytes_per_token = sum(s.entry.bytes_per_token for s in self.slots)
            self._state_bytes = sum(s.entry.nbytes(0) for s in self.slots if not s.entry.grows)
        self._info, self._device = info, device

    def _check_source(self, src: Cache) -> None:
        """What ``receive`` refuses before copying anything (a kind adds its own)."""
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

    def _lost_because(self, why: str) -> str:
        """The message of a cache whose slots no longer match its tokens, ``why`` saying what happened."""
        return (
            f"this {self.kind} cache's states were updated in place and no longer match its {self.seq_length} "
            f"tokens: {why}; that cannot be undone. Reset the cache (generate() does) or use "
            "StaticCache(states='swap'), whose failed steps leave the states as they were"
        )

    # -- helpers
    def _check_alive(self) -> None:
        if self._disposed:
            raise CacheStateError(f"this {self.kind} cache was disposed; create a new one")

    def _check_usable(self) -> None:
        self._check_alive()
        if not self._user.held:
            raise CacheStateError(f"the {self.kind} cache has no buffers: use it through generate() / cache.use()")

    def _allocate(self) -> None:
        """Every slot's buffers, all or nothing, reported by the next step (nothing when they are there already)."""
        if any(s.tensors for s in self.slots):
            self.allocations.allocated([])
            return
        made: list[Any] = []
        try:
            for slot in self.slots:
                made += slot.allocate()
        except BaseException:
            self._release_all()
            raise
        self.allocations.allocated(made)

    def _reset(self) -> None:
        """Every slot forgets the sequence (its buffers stay); the cache is usable again."""
        for slot in self.slots:
            slot.reset()
        self.seq_length, self._step, self._lost = 0, "", ""

    def _release_all(self) -> None:
        """Every buffer and binding released; the cache holds nothing (its slots stay, to allocate again)."""
        self.bindings.clear()
        for slot in self.slots:
            slot.release()
        self.allocations.clear()
        self.seq_length = 0

    def _crop(self, n: int) -> None:
        """``crop(n)`` once its argument and thread are checked: every slot's crop made ready, then applied in one
        block; or none applied, and what was made for them released."""
        if self._step == COMMITTED:
            raise CacheStateError("cannot crop in the middle of a step (between its commit and its settle)")
        if self._lost and n:
            raise CacheStateError(self._lost)
        if n < self.seq_length:
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
        if not n:  # a sequence started over reads no state: what a failed step left in them is never read
            self._lost, self._step = "", ""


class Bindings:
    """A step's binding of every slot, made once per key (each stepping slot's ``binding_key`` at the step's
    length, and the session) and run again; made afresh every step where a slot's outputs are the runtime's
    (``fresh``)."""

    def __init__(self) -> None:
        self.fresh = False
        self._made: dict[Any, tuple[Any, dict[str, int], tuple[str, ...]]] = {}

    def get(
        self, session: Any, n_new: int, slots: list[Slot], stepping: list[Slot], length: int
    ) -> tuple[Any, dict[str, int], tuple[str, ...]]:
        """(binding, the outputs bound in place -> the buffer each must come back in, their names in order) for a
        step of ``n_new`` positions from ``length``."""
        key = None if self.fresh else (id(session), *(s.binding_key(length) for s in stepping))
        found = self._made.get(key) if key is not None else None
        if found is None:
            b, expected = session.binding(), {}
            for slot in slots:
                expected.update(slot.bind(b, length))
            found = (b, expected, tuple(expected))
            if key is not None:
                self._made[key] = found
        return found

    def clear(self) -> None:
        """Forget every binding kept (their buffers are about to go)."""
        self._made.clear()


def check_every_of(value: object) -> int | None:
    """``check_every`` checked: None (a spot check a step) or a positive int; ConfigError otherwise."""
    note = " (1: check every step), or None (every present at a binding's first run, then one a step)"
    return None if value is None else check_int(value, "check_every", 1, note=note)


def check_every_text(check_every: int | None) -> str:
    """How ``check_every`` reads the presents back, in words, for labels."""
    if check_every is None:
        return "presents checked in place one a step"
    if check_every == 1:
        return "every present checked every step"
    return f"every present checked every {check_every} steps"


class InPlaceProof:
    """The proof that the runtime wrote in place: after a run, the buffer each present bound in place came back
    in is compared with the one bound (the binding reads them back: one wrapper call each). ``check_every``: None
    reads all of them at a binding's first run (a binding that runs again runs on the buffers its first run
    returned), then one a run, in turn; N reads all of them every N-th run. ConfigError for another value."""

    def __init__(self, check_every: int | None = None) -> None:
        self.check_every = check_every_of(check_every)
        self.runs = 0  # runs checked so far
        self.expected: dict[str, int] = {}  # the step's in-place outputs -> the buffer each must come back in

    def arm(self, binding: Any, expected: dict[str, int], names: tuple[str, ...]) -> None:
        """Tell ``binding`` what its run reads back (``read_back``: every in-place output; ``spot_check``: one of
        ``names``), and remember the buffers ``expected``."""
        self.expected = expected
        if self.check_every is not None:
            binding.read_back = self.runs % self.check_every == 0
        else:
            binding.read_back = not binding.ran
            binding.spot_check = names[self.runs % len(names)] if names and binding.ran else ""

    def check(self, returned: dict[str, int], length: int) -> None:
        """Count the run; InPlaceError naming the first output that came back in another buffer than bound
        (``returned``: what the run read back), saying that the cache stays at ``length``."""
        self.runs += 1
        expected = self.expected
        if returned and not (expected.items() <= returned.items() or returned.items() <= expected.items()):
            name = next((n for n, ptr in expected.items() if returned.get(n, ptr) != ptr), next(iter(expected)))
            raise InPlaceError(
                f"{name} was not written in place: the runtime returned buffer {returned.get(name) or 0:#x}, "
                f"the cache bound {expected[name]:#x}; the cache length stays {length}"
            )


class Allocations:
    """What each step allocated, reported as a ``CacheStep``: the tensors made (the runtime's new presents, or
    the cache's own allocation, reported by the step after it), their bytes, the buffers never seen before (by
    identity: a proxy) and the bytes alive after it (``live_bytes()``)."""

    def __init__(self, live_bytes: Callable[[], int]) -> None:
        self.seen: set[int] = set()  # the buffer identities held so far
        self.pending: list[Any] = []  # tensors allocated and not reported by a step yet
        self.taken: list[Any] = []  # those the last commit reported (its rollback gives them back)
        self._live_bytes = live_bytes
        self._steady: CacheStep | None = None  # what a step that makes nothing reports

    def allocated(self, made: list[Any]) -> None:
        """The cache allocated ``made``: the next step reports them."""
        self.pending = made

    def take(self) -> list[Any]:
        """What a step reports besides its own tensors: the allocation before it."""
        self.taken, self.pending = self.pending, []
        return self.taken

    def settle(self) -> None:
        """The step that took them is final."""
        self.taken = []

    def rollback(self) -> None:
        """The step that took them was undone: the next one reports them again."""
        self.pending, self.taken = self.taken, []

    def clear(self) -> None:
        """The cache released everything: nothing pending, and the live bytes counted again at the next step."""
        self.pending, self.taken, self._steady = [], [], None

    def report(self, made: list[Any]) -> CacheStep:
        """The step's ``CacheStep``; the live bytes are counted again only when it made anything."""
        if made or self._steady is None:
            fresh = {t.data_ptr for t in made} - self.seen
            self.seen |= fresh
            self._steady = CacheStep(live_bytes=self._live_bytes())
            return CacheStep(len(made), sum(t.nbytes for t in made), len(fresh), self._steady.live_bytes)
        return self._steady
