"""A state-machine property test of the cache lifecycle (hypothesis): random sequences of generations (complete,
too long, failing at a random step with an error or a KeyboardInterrupt, by FAULT INJECTION from
kvlab.ort.checks.faults), hand-stepped runs, a second generation attempted from another thread while one holds the
cache, resets and disposals, on a real cache, model and device. After every step the real cache is compared with a
small reference model of the allowed states: its length, whether it holds buffers, whether it is disposed, how many
device tensors are alive, and the tokens (a prefix of one uninterrupted greedy run)."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvlab
from kvlab import CacheStateError, CapacityError, DynamicCache, StaticCache, Stepper, generate, open_device
from kvlab.ort.checks.faults import Injected, fault, raising_hook

PROMPT = [5, 6, 7, 8]
MAX_LEN = 24  # the static cache's size: a generation of more than 21 new tokens does not fit
KINDS = {"dynamic": DynamicCache, "static": lambda: StaticCache(MAX_LEN)}
RULES = ("generation", "past_the_context", "failing_generation", "by_hand", "reset", "dispose", "use_after_dispose")
ERRORS = {"error": lambda: Injected("injected"), "KeyboardInterrupt": KeyboardInterrupt}


class Reference:
    """What the cache must be: ``length`` tokens held, ``holds`` buffers, ``disposed``."""

    def __init__(self, kind: str):
        self.kind, self.length, self.holds, self.disposed = kind, 0, False, False

    def ran(self, n_steps_committed: int) -> None:
        """A generation from an empty sequence committed this many steps (prefill = step 1)."""
        self.length = 0 if n_steps_committed == 0 else len(PROMPT) + n_steps_committed - 1
        self.holds = self.kind == "static" or self.length > 0

    def fits(self, new_tokens: int) -> bool:
        return self.kind == "dynamic" or len(PROMPT) + new_tokens - 1 <= MAX_LEN


def lifecycle_machine(toy: kvlab.Model, device: str, kind: str, reference: list[int], ran: Counter) -> type:
    dev = open_device(device)
    per_holding = 2 * toy.info.num_layers  # a key and a value tensor per layer

    class Lifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            ran["sequences"] += 1
            self.baseline = dev.live_tensors
            self.cache = KINDS[kind]()
            self.ref = Reference(kind)

        def _generate(self, new_tokens: int, **kw) -> kvlab.Generation:
            return generate(
                toy, PROMPT, cache=self.cache, device=dev, max_new_tokens=new_tokens, stop_on_eos=False, **kw
            )

        @precondition(lambda self: not self.ref.disposed)
        @rule(new_tokens=st.integers(1, MAX_LEN))
        def generation(self, new_tokens):
            ran["generation"] += 1
            if not self.ref.fits(new_tokens):
                with pytest.raises(CapacityError):
                    self._generate(new_tokens)
                return  # refused before anything changed
            g = self._generate(new_tokens)
            assert g.token_ids == reference[:new_tokens]
            self.ref.ran(new_tokens)

        @precondition(lambda self: not self.ref.disposed)
        @rule()
        def past_the_context(self):
            ran["past_the_context"] += 1
            with pytest.raises(CapacityError):
                self._generate(toy.info.context_length)

        @precondition(lambda self: not self.ref.disposed)
        @rule(
            data=st.data(),
            point=st.sampled_from(["run", "after-run", "commit", "hook"]),
            error=st.sampled_from(list(ERRORS)),
        )
        def failing_generation(self, data, point, error):
            ran["failing_generation"] += 1
            new_tokens = data.draw(st.integers(1, 21))
            at = data.draw(st.integers(1, new_tokens))  # the step that fails
            exc = ERRORS[error]()
            with pytest.raises(type(exc)) as info:
                if point == "hook":
                    self._generate(new_tokens, on_step=raising_hook(at, exc))
                else:
                    with fault(point, at_call=at, error=exc):
                        self._generate(new_tokens)
            partial = getattr(info.value, "partial", None)  # attached when a step before the failure made a token
            assert (partial.token_ids if partial else []) == reference[: at - 1]
            assert (partial is None) == (at == 1)
            self.ref.ran(at - 1)

        @precondition(lambda self: not self.ref.disposed)
        @rule(steps=st.integers(1, 6), threaded=st.booleans())
        def by_hand(self, steps, threaded):
            """Step by hand; optionally, while the stepper holds the cache, another thread's generation is
            refused and changes nothing."""
            ran["by_hand"] += 1
            tokens, feed = [], np.array(PROMPT)
            with Stepper(toy, self.cache, dev, len(PROMPT) + steps) as stepper:
                for i in range(steps):
                    _, record = stepper.step(feed)
                    tokens.append(record.token)
                    feed = np.array([record.token])
                    if threaded and i == 0:
                        refused = []

                        def other(refused=refused) -> None:
                            try:
                                self._generate(2)
                            except CacheStateError as exc:
                                refused.append(exc)

                        t = threading.Thread(target=other)
                        t.start()
                        t.join()
                        assert len(refused) == 1 and self.cache.seq_length == len(PROMPT)
            assert tokens == reference[:steps]
            self.ref.ran(steps)

        @rule()
        def reset(self):
            ran["reset"] += 1
            if self.ref.disposed:
                with pytest.raises(CacheStateError):
                    self.cache.reset()
                return
            self.cache.reset()
            self.ref.length = 0
            self.ref.holds = kind == "static" and self.ref.holds

        @rule(now=st.integers(0, 3))
        def dispose(self, now):
            if now:  # one draw in four: a disposed cache ends what a sequence can exercise
                return
            ran["dispose"] += 1
            self.cache.dispose()  # idempotent
            self.ref.disposed, self.ref.holds, self.ref.length = True, False, 0

        @precondition(lambda self: self.ref.disposed)
        @rule()
        def use_after_dispose(self):
            ran["use_after_dispose"] += 1
            with pytest.raises(CacheStateError):
                self._generate(1)

        @invariant()
        def matches_the_reference(self):
            assert self.cache.disposed == self.ref.disposed
            if not self.ref.disposed:
                assert self.cache.seq_length == self.ref.length
                assert not self.cache.in_use
            assert dev.live_tensors - self.baseline == (per_holding if self.ref.holds else 0)

        def teardown(self):
            self.cache.dispose()
            assert dev.live_tensors == self.baseline

    return Lifecycle


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_the_cache_lifecycle_against_a_reference_model(toy, device, kind):
    reference = generate(toy, PROMPT, device=device, max_new_tokens=MAX_LEN, stop_on_eos=False).token_ids
    ran: Counter = Counter()
    machine = lifecycle_machine(toy, device, kind, reference, ran)
    examples = settings().max_examples  # sequences: the profile's (tests/tiers.py: few in the fast tier)
    machine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=16,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    machine.TestCase().runTest()
    print(f"{device} {kind}: {dict(ran)}")
    assert ran["sequences"] >= examples and all(ran[r] > 0 for r in RULES), ran
