"""``Conversation``: a chat that keeps its cache between turns on ONNX Runtime. Each turn opens a ``Stepper`` that
keeps the sequence the cache holds (``keep=True``) and prefills only the positions it lacks; the history, the plan
of a turn and its capacity check are backend-neutral (``kvlab.core.conversation``).

Prompt lookup (``lookup_steps``; the drafts and their verification: ``kvlab.core.lookup``): each decode step of a
greedy turn feeds the last token and the drafts found in the conversation in one multi-token step, then crops the
cache to the positions the model confirmed. Meant for a StaticCache, whose crop only moves its length; a
DynamicCache crops by copying its kept positions (correct, and slower).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ...core.conversation import History, Turn, TurnPlan, chat_delta, plan_turn
from ...core.errors import CacheStateError, ConfigError, ModelError, check_flag, check_int
from ...core.generation import attach_partial, check_new_tokens, check_sampling, stop_reason
from ...core.guards import OneAtATime, atomic, atomic_enter
from ...core.labels import RunLabel
from ...core.lookup import PromptLookup, propose, verify
from ...core.records import StepHook, StepRecord, hook_list
from ..models.model import Model, load
from ..runtime.device import Device, open_device
from .caches.dynamic import DynamicCache
from .caches.ort_cache import OrtCache
from .stepper import Stepper

NOT_EXACT = (
    "this package's multi-token steps are wrong on this device (onnxruntime-webgpu 1.27 on a software adapter: "
    "kvlab.ort.runtime.builtin), so drafts cannot be verified in one step: the turn ran one token a step"
)
NO_CROP = (
    "the model's layers keep states (conv, recurrent), which cannot be cropped back after rejected drafts: the turn "
    "ran one token a step"
)


class Conversation:
    """A conversation with ``model`` on ``device`` whose ``cache`` (default: a DynamicCache of its own, disposed by
    ``close()``) is kept between turns: ``say(message)`` feeds only the positions the cache does not hold and
    returns the turn (``kvlab.core.conversation.Turn``). ``rewind(n)`` keeps the first ``n`` positions,
    ``rewind_turn()`` goes back to the start of the last turn. ``system``: a system prompt for text turns.
    ``on_step``: hooks for every step's record.

    KV caches crop on a rewind; a cache whose layers keep states (conv, recurrent) cannot, so a rewind empties it,
    as does a failed turn whose steps may have changed its states, and the next turn prefills the whole history
    (its records say ``reused`` 0). A failed turn (an error or Ctrl-C at any step) otherwise leaves the history and
    the cache as after the previous turn; a turn that does not fit is a CapacityError before any work. Raises
    ConfigError for a bad argument, CacheStateError once closed, or when another thread's call runs on the same
    conversation (one call at a time; nothing changes then)."""

    def __init__(
        self,
        model: Model | str,
        cache: OrtCache | None = None,
        device: Device | str = "cpu",
        system: str | None = None,
        on_step: StepHook | Iterable[StepHook] | None = None,
    ):
        self.model, self.device = load(model), open_device(device)
        if cache is not None and not isinstance(cache, OrtCache):
            raise ConfigError(f"cache must be a kvlab cache (DynamicCache(), StaticCache(n)), got {cache!r:.60}")
        if system is not None and not isinstance(system, str):
            raise ConfigError(f"system={system!r:.60} must be a str (the system prompt) or None")
        try:  # refused here, by name: at the first turn the tokenizer's error would name the message instead
            (system or "").encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(
                f"system={system!r:.60} is not valid Unicode text ({exc.reason} at {exc.start}); give valid text"
            ) from exc
        self._own, self.cache = cache is None, DynamicCache() if cache is None else cache
        self.history = History(messages=[{"role": "system", "content": system}] if system else [])
        self.hooks = hook_list(on_step)
        self._epoch = -1  # the cache's epoch after this conversation last used it: another use in between is seen
        self._closed = False
        self._calls, self._running = OneAtATime(), ""  # the call running now, one thread at a time
        self._frame: Any = None  # the frame of the call holding ``_calls``

    def _call(self, what: str) -> Any:
        """The hold of one public call ``what``: refused while another thread's call runs on this conversation. A
        hold whose call ended without releasing it (its frame runs no more on its thread) is given back first."""
        if self._calls.held and self._abandoned():
            self._calls.give_back()

        def refusal() -> CacheStateError:
            other = next((t.name for t in threading.enumerate() if t.ident == self._calls.owner), "another thread")
            return CacheStateError(
                f"Conversation.{what}() was called while {other} runs Conversation.{self._running or 'a call'}() on "
                "this conversation; a conversation takes one call at a time (give each thread its own Conversation)"
            )

        return _Running(self, what, self._calls.hold(refusal))

    def _abandoned(self) -> bool:
        """Whether the call holding ``_calls`` ended without releasing it: its frame is on its thread's stack no
        more (a frame not recorded yet, or a thread between two calls, is not abandoned)."""
        frame, owner = self._frame, self._calls.owner
        if frame is None or owner is None:
            return False
        running = sys._current_frames().get(owner)
        while running is not None:
            if running is frame:
                return False
            running = running.f_back
        return True

    def __enter__(self) -> Conversation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the conversation: its own cache is disposed (once; a cache given to it stays the caller's).
        CacheStateError while another thread's call runs on it."""
        with self._call("close"):
            if not self._closed and self._own:
                self.cache.dispose()
            self._closed = True

    @property
    def ids(self) -> list[int]:
        """Every position of the conversation so far (inputs and replies)."""
        return list(self.history.ids)

    @property
    def turns(self) -> list[Turn]:
        """The turns so far, in order."""
        return list(self.history.turns)

    @property
    def held(self) -> int:
        """Positions of the history the cache holds now (0 when another use of the cache came in between)."""
        c = self.cache
        if c.disposed or c.epoch != self._epoch or c.seq_length > len(self.history.ids):
            return 0
        return c.seq_length

    @property
    def capacity(self) -> tuple[int, str]:
        """The most positions a conversation may reach, and what sets it."""
        context, cap = self.model.info.context_length, self.cache.capacity
        if cap is not None and cap < context:
            return cap, f"max_cache_len of the {self.cache.kind} cache"
        return context, f"model {self.model.name}'s context length"

    def say(
        self,
        message: str | Any,
        max_new_tokens: int = 32,
        *,
        sampling: Any = None,
        stop_on_eos: bool = True,
        lookup: PromptLookup | None = None,
        prefill_chunk: int | None = None,
    ) -> Turn:
        """One turn: ``message`` (text, rendered with the model's chat template after the conversation so far; or
        token ids, taken as they are), then up to ``max_new_tokens`` tokens of reply. ``lookup``: greedy
        prompt-lookup decoding (``kvlab.core.lookup``; ``Turn.lookup`` says why a turn ran one token a step).
        ``prefill_chunk``: feed the positions the cache lacks in steps of at most this many (None:
        ``default_prefill_chunk(device)``). Raises ConfigError,
        ModelError (no chat template for a text turn), CapacityError (before any work), and what a step raises (the
        conversation is then as before the turn; ``exc.partial``: the tokens made until then)."""
        with self._call("say"):
            self._check_open()
            new_tokens = check_new_tokens(max_new_tokens)
            check_flag("stop_on_eos", stop_on_eos)
            choose = check_sampling(sampling, self.model.info.vocab_size).chooser()
            if lookup is not None and not isinstance(lookup, PromptLookup):
                raise ConfigError(
                    f"lookup={lookup!r:.60} must be a kvlab.PromptLookup (e.g. PromptLookup(k=5)) or None"
                )
            if lookup is not None and sampling is not None and sampling.do_sample:
                raise ConfigError("prompt lookup verifies drafts greedily; sampling (do_sample=True) needs lookup=None")
            chunk = default_prefill_chunk(self.device)
            chunk = chunk if prefill_chunk is None else check_new_tokens(prefill_chunk, "prefill_chunk")
            new_ids, user = self._input(message)
            plan = plan_turn(self.history, self.held, new_ids, new_tokens, *self.capacity)
            text = message if isinstance(message, str) else None
            turn = self._steps(plan, new_ids, text, new_tokens, choose, stop_on_eos, lookup, chunk)
            self.history.add(turn, user)
            return turn

    def rewind(self, n: int) -> None:
        """Keep the first ``n`` positions of the conversation (0 <= n <= len(ids)); the cache keeps what it holds of
        them (a state cache empties, see the class docstring). ConfigError for another ``n``; nothing changes then."""
        with self._call("rewind"):
            self._rewind(n)

    def _rewind(self, n: int) -> None:
        self._check_open()
        h = self.history
        n = check_int(n, "n", 0, len(h.ids), subject=f"rewind({n!r}): n", note=" (the positions of the history)")
        if n < self.held:
            self.cache.crop(0 if self.model.info.layout.states else n)
        h.rewind(n, self.model.decode)

    def rewind_turn(self) -> Turn:
        """Go back to the start of the last turn and return it; ConfigError when there is no turn."""
        with self._call("rewind_turn"):
            self._check_open()
            if not self.history.turns:
                raise ConfigError("rewind_turn(): the conversation has no turn yet")
            last = self.history.turns[-1]
            self._rewind(last.start)
            return last

    def _check_open(self) -> None:
        if self._closed:
            raise CacheStateError("this conversation was closed; start a new kvlab.Conversation")

    def _input(self, message: Any) -> tuple[list[int], str]:
        """The turn's token ids and user text; ConfigError (ModelError: no chat template) when it cannot be fed."""
        m = self.model
        if isinstance(message, str):
            if m.chat_template is None:
                raise ModelError(f"model {m.name} has no chat template; say the turn as token ids (model.encode(text))")
            last = self.history.ids[-1:] if self.history.turns else []
            closed = m.tokenizer.id_to_token(last[0]) if last and last[0] in m.info.eos_token_ids else ""
            text = chat_delta(m.apply_chat_template, self.history.messages, message, closed)
            try:
                ids = m.tokenizer.encode(text, add_special_tokens=False).ids
            except Exception as exc:  # the tokenizers library raises a bare Exception (e.g. a lone surrogate)
                raise ConfigError(
                    f"the tokenizer refused the message {message!r:.40} ({exc}); give valid text"
                ) from exc
            if not ids:  # a template that renders nothing new for this message
                raise ModelError(
                    f"the chat template of model {m.name} rendered nothing for turn {len(self.history.turns) + 1}'s "
                    f"message ({len(self.history.messages) + 1} message(s) in all); fix the template, or say the turn "
                    "as token ids"
                )
            return ids, message
        if isinstance(message, (list, tuple, np.ndarray)) and len(message):
            ids = m.check_ids(message).tolist()
            return ids, m.decode(ids)
        raise ConfigError(f"message must be text or a non-empty list of token ids, got {message!r:.60}")

    def _steps(
        self,
        plan: TurnPlan,
        new_ids: list[int],
        message: str | None,
        new_tokens: int,
        choose: Any,
        eos: bool,
        lookup: PromptLookup | None,
        chunk: int | None,
    ) -> Turn:
        """The turn's steps on a stepper that keeps the cache's sequence; on any failure the cache goes back
        (``_restore``) and the error carries the tokens made (``exc.partial``)."""
        records: list[StepRecord] = []
        tokens: list[int] = []
        prompt, index = [*self.history.ids, *new_ids], len(self.history.turns) + 1
        why = ""
        if lookup is not None and self.model.info.layout.states:
            why = NO_CROP
        elif lookup is not None and default_prefill_chunk(self.device):
            why = NOT_EXACT

        def stop() -> str | None:
            return stop_reason(tokens, new_tokens, eos, self.model.info.eos_token_ids)

        def turn(reason: str) -> Turn:
            m = self.model
            return Turn(
                RunLabel(m.name, m.info.dtype_name, self.device.label, self.cache.spec),
                prompt,
                list(tokens),
                m.decode(tokens),
                reason,
                list(records),
                index=index,
                start=len(self.history.ids),
                message=message,
                reused=plan.reused,
                prefilled=len(plan.feed),
                drafted=sum(r.drafted for r in records),
                accepted=sum(r.accepted for r in records),
                lookup=why,
            )

        stepper = Stepper(self.model, self.cache, self.device, plan.positions, [*self.hooks, records.append], keep=True)
        used = False  # whether this turn's use of the cache began: a refused one (the cache in use) is not ours
        try:
            with stepper:
                used = True
                try:
                    if self.cache.seq_length != plan.reused:  # another use's sequence: none of it is ours
                        self.cache.crop(0)
                    for i in range(0, len(plan.feed), chunk or len(plan.feed)):
                        part, reused = plan.feed[i : i + (chunk or len(plan.feed))], 0 if i else plan.reused
                        _, rec = stepper.step(part, choose, "none", phase="prefill", turn=index, reused=reused)
                    tokens.append(rec.token)
                    if lookup is not None and not why:
                        lookup_steps(stepper, prompt, tokens, new_tokens, stop, lookup, {"turn": index})
                    while not stop():
                        _, rec = stepper.step(np.array(tokens[-1:], np.int64), choose, "none", turn=index)
                        tokens.append(rec.token)
                except BaseException:
                    self._restore(plan.reused)
                    raise
        except BaseException as exc:
            if tokens:
                attach_partial(exc, turn("error"))
            raise
        finally:
            if used:
                self._epoch = self.cache.epoch
        return turn(stop() or "")

    def _restore(self, held: int) -> None:
        """The cache back at ``held`` positions after a failed turn; a state cache whose states a failed step may
        have overwritten, or one a crop fails on, empties."""
        cache, states = self.cache, self.model.info.layout.states
        undone = all(s.undoable for s in cache.slots) or not states
        if cache.seq_length == held and not cache.lost and undone:
            return
        try:
            cache.crop(0 if states else held)
        except Exception:  # noqa: BLE001 - the turn's own error propagates; an empty cache is always reachable
            cache.settle()  # a step stopped between its commit and its settle is final: now it can be cropped
            cache.crop(0)


def default_prefill_chunk(device: Device) -> int | None:
    """How a turn feeds what the cache lacks on ``device``: None (in one step), or 1 (one token a step) where the
    package's multi-token steps are wrong (``Backend.multi_token_exact``)."""
    return None if device.backend.multi_token_exact(device.name, device.adapter.kind) else 1


def lookup_steps(
    stepper: Stepper,
    prompt: list[int],
    tokens: list[int],
    new_tokens: int,
    stop: Callable[[], Any],
    lookup: PromptLookup,
    columns: dict[str, Any],
) -> None:
    """Greedy decode steps after a prefill of ``prompt`` until ``stop()`` names a reason: each verifies up to
    ``lookup.k`` drafts (never past ``new_tokens``) in one "verify" step (a plain decode step without drafts), appends
    the accepted drafts and the next token to ``tokens`` and crops the cache to them. A next token within the margin
    (-1: ``kvlab.core.lookup.verify``) leaves that position to the next step, fed alone."""
    cache, eos = stepper.cache, stepper.model.info.eos_token_ids
    margin, alone = lookup.margin_for(stepper.model.info.logits_dtype), False
    while not stop():
        room = new_tokens - len(tokens) - 1  # the step yields its accepted drafts and one token more
        drafts = [] if alone else propose([*prompt, *tokens], min(lookup.k, room), lookup.ngram, eos)
        if not drafts:
            _, rec = stepper.step(np.array(tokens[-1:], np.int64), None, "none", **columns)
            tokens.append(rec.token)
            alone = False
            continue

        def pick(logits: np.ndarray, drafts: list[int] = drafts) -> tuple[int, dict[str, int]]:
            accepted, token = verify(logits, drafts, margin)
            return token, {"accepted": accepted}

        fed = np.array([tokens[-1], *drafts], np.int64)
        _, rec = stepper.step(fed, None, "none", pick=pick, phase="verify", drafted=len(drafts), **columns)
        alone = rec.token < 0  # a near-tie: the next step decides that position with one token
        tokens += [*drafts[: rec.accepted], *([] if alone else [rec.token])]
        cache.crop(len(prompt) + len(tokens) - 1)  # the last token is fed by the next step


class _Running:
    """A conversation's hold for one call, naming the call while it runs (for another thread's refusal)."""

    __slots__ = ("_conversation", "_held", "_what")

    def __init__(self, conversation: Conversation, what: str, held: Any):
        self._conversation, self._what, self._held = conversation, what, held

    def __enter__(self) -> None:
        frame = sys._getframe(1)  # the public call's frame, while it runs

        def take() -> None:  # held and named together: a Ctrl-C lands after
            self._held.__enter__()
            self._conversation._running, self._conversation._frame = self._what, frame

        atomic_enter(take, self.__exit__)

    def __exit__(self, *exc: object) -> None:
        with atomic():
            self._conversation._running, self._conversation._frame = "", None
            self._held.__exit__(*exc)
