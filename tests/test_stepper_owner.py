"""A ``Stepper`` is one ``with`` block, entered once, stepped one step at a time: a step outside the block, a
second entry, or a step from a second thread while one runs is a CacheStateError naming what happened (two
threads stepping one Stepper at once used to record two runs at one position, on one shared binding)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kvlab import CacheStateError, StaticCache, Stepper

PROMPT = [5, 6, 7, 8]


def test_a_step_before_the_with_block_is_refused(toy):
    with StaticCache(32) as cache:
        s = Stepper(toy, cache, "cpu", 16)
        with pytest.raises(CacheStateError, match=r"Stepper.step\(\) was called before its with block"):
            s.step(PROMPT)
        assert cache.seq_length == 0 and not cache.in_use


def test_a_step_or_handoff_after_the_with_block_is_refused(toy):
    with StaticCache(32) as cache:
        with Stepper(toy, cache, "cpu", 16) as s:
            s.step(PROMPT)
        with pytest.raises(CacheStateError, match=r"Stepper.step\(\) was called after its with block ended"):
            s.step([9])
        with pytest.raises(CacheStateError, match=r"Stepper.receive\(\) was called after its with block ended"):
            s.receive(cache)
        assert cache.seq_length == len(PROMPT)


def test_a_stepper_is_entered_once(toy):
    with StaticCache(32) as cache:
        s = Stepper(toy, cache, "cpu", 16)
        with s:
            with pytest.raises(CacheStateError, match=r"entered already \(its with block is still open\)"), s:
                pass
            s.step(PROMPT)  # the refusal left the open block as it was
            assert cache.in_use
        assert not cache.in_use
        with pytest.raises(CacheStateError, match=r"entered already \(its with block has ended\).*new Stepper"), s:
            pass
        assert not cache.in_use


def test_a_failed_entry_leaves_the_stepper_to_be_entered_again(toy):
    """Entering fails while another generation holds the cache; once it is free, the same stepper enters."""
    with StaticCache(32) as cache:
        first, second = Stepper(toy, cache, "cpu", 16), Stepper(toy, cache, "cpu", 16)
        with first, pytest.raises(CacheStateError, match="serves one generation at a time"), second:
            pass
        with second:
            second.step(PROMPT)


def test_a_step_from_a_second_thread_while_one_runs_is_refused(toy):
    """Thread A's step waits in its hook (after its commit) until thread B has tried to step the same stepper:
    B's step is refused, A's completes, and the records have one position each."""
    at_hook, tried = threading.Barrier(2, timeout=60), threading.Event()
    records, errors = [], []

    def hook(record) -> None:
        records.append(record)
        if threading.current_thread().name == "A" and len(records) == 2:
            at_hook.wait()  # B may try now: A's step is in progress
            tried.wait(60)

    def a() -> None:
        s.step([9])

    def b() -> None:
        at_hook.wait()
        try:
            s.step([10])
        except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
            errors.append(exc)
        finally:
            tried.set()

    with StaticCache(32) as cache, Stepper(toy, cache, "cpu", 16, hooks=[hook]) as s:
        s.step(PROMPT)
        threads = [threading.Thread(target=a, name="A"), threading.Thread(target=b, name="B")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(errors) == 1 and isinstance(errors[0], CacheStateError), errors
        assert "while another thread's call runs on this Stepper" in str(errors[0])
        assert [r.position for r in records] == [0, len(PROMPT)]
        assert cache.seq_length == len(PROMPT) + 1


def test_two_threads_stepping_at_once_never_share_a_position(toy):
    """Two threads step one stepper as fast as they can: every step either runs alone or is refused, so the
    records' positions are all different and end at the cache's length."""
    start = threading.Barrier(2, timeout=60)
    records, refused = [], []

    def run() -> None:
        start.wait()
        for _ in range(40):
            try:
                s.step([int(np.random.randint(3, 500))])
            except CacheStateError:
                refused.append(1)

    with StaticCache(128) as cache, Stepper(toy, cache, "cpu", 100, hooks=[records.append]) as s:
        s.step(PROMPT)
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        positions = [r.position for r in records]
        assert len(positions) == len(set(positions)) == 81 - len(refused)
        assert cache.seq_length == len(PROMPT) + len(positions) - 1
