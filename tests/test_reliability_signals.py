"""A real Ctrl-C (SIGINT, raised in this process) at every line kvlab runs in a generation, and in a conversation's
turn, with every cache kind the toy model takes on the CPU EP: afterwards the cache is not in use, no device tensor
is counted live without an owner, and the same cache generates the uninterrupted run's tokens again.

A trace function counts the line events of kvlab's own files and raises SIGINT at the first time each distinct
(line, calling line) runs; the signal goes through Python's handler as a terminal's Ctrl-C does (so a block that
defers it, ``kvlab.core.guards.atomic``, defers it here too)."""

from __future__ import annotations

import gc
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kvlab
from kvlab import Conversation, DynamicCache, StaticCache, generate, open_device

PKG = str(Path(kvlab.__file__).parent)
PROMPT, NEW = [5, 6, 7], 3
KINDS: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "static": (lambda: StaticCache(16), {"token_on_device": False}),
    "dynamic": (DynamicCache, {"token_on_device": False}),
    "static, token on the device, bursts": (lambda: StaticCache(16), {"token_on_device": True, "tokens_per_read": 2}),
    "dynamic, token on the device": (DynamicCache, {"token_on_device": True}),
}
# the files where a cache's hold, a stepper's block and a tensor's count begin and end: the fast tier's lines
OWNERSHIP = ("core/guards.py", "core/cache.py", "ort/runtime/session.py", "ort/decode/stepper.py")


def _traced(files: tuple[str, ...]) -> Callable[..., Any]:
    """The global trace function's filter: kvlab's frames of ``files``."""
    return lambda frame: frame.f_code.co_filename.startswith(PKG) and frame.f_code.co_filename.endswith(files)


def _points(run: Callable[[], Any], files: tuple[str, ...]) -> list[int]:
    """The line-event counts (of kvlab's ``files``) at which each distinct (line, calling line) first runs."""
    seen: dict[tuple, int] = {}
    count = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            caller = frame.f_back
            where = (frame.f_code.co_filename, frame.f_lineno, caller and caller.f_code.co_filename)
            seen.setdefault((*where, caller and caller.f_lineno), count)
        return local

    traced = _traced(files)
    sys.settrace(lambda frame, event, arg: local if traced(frame) else None)
    try:
        run()
    finally:
        sys.settrace(None)
    return sorted(seen.values())


def _interrupted(at: int, run: Callable[[], Any], files: tuple[str, ...]) -> bool:
    """Run ``run`` with a real SIGINT raised at the ``at``-th line event of kvlab's ``files``; whether a
    KeyboardInterrupt came."""
    count = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            if count == at:
                sys.settrace(None)
                signal.raise_signal(signal.SIGINT)
                return None
        return local

    traced = _traced(files)
    sys.settrace(lambda frame, event, arg: local if traced(frame) else None)
    try:
        run()
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def _sweep(run_with: Callable[[Any], Any], make: Callable[[], Any], files: tuple[str, ...]) -> None:
    """SIGINT at every point of ``run_with(cache)``; after each: the cache free, the same tokens again, and the
    device's live tensors back to the baseline once the cache is disposed."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    dev = open_device("cpu")
    cache = make()
    reference = run_with(cache)
    cache.dispose()
    gc.collect()
    baseline = dev.live_tensors
    cache = make()
    points = _points(lambda: run_with(cache), files)
    cache.dispose()
    assert len(points) > 20
    problems = []
    for at in points:
        cache = make()
        try:
            hit = _interrupted(at, lambda cache=cache: run_with(cache), files)
        except KeyboardInterrupt:  # landed after the run returned, in this loop
            hit = True
        found = []
        if cache.in_use:
            found.append("the cache stayed in use")
        try:
            again = run_with(cache)
            if again != reference:
                found.append(f"then {again} instead of {reference}")
            cache.dispose()
        except kvlab.KvlabError as exc:
            found.append(f"then {exc}")
        if dev.live_tensors != baseline:
            gc.collect()  # a tensor dropped without release stops counting when collected
        if dev.live_tensors != baseline:
            found.append(f"{dev.live_tensors - baseline} tensors counted live with no owner")
            baseline = dev.live_tensors
        if found or not hit:
            problems.append((at, found or ["no KeyboardInterrupt"]))
    assert not problems, problems[:5]


def _generation(toy: kvlab.Model, options: dict[str, Any]) -> Callable[[Any], Any]:
    return lambda cache: generate(toy, PROMPT, max_new_tokens=NEW, stop_on_eos=False, cache=cache, **options).token_ids


def _turns(toy: kvlab.Model) -> Callable[[Any], Any]:
    """Two turns of a conversation on the cache (the second reuses the first's positions)."""

    def run(cache: Any) -> list[int]:
        with Conversation(toy, cache) as chat:
            chat.say([5, 6, 7], 2, stop_on_eos=False)
            return chat.say([8, 9], 2, stop_on_eos=False).token_ids

    return run


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_ctrl_c_at_every_line_of_a_caches_hold_and_release(toy, kind):
    make, options = KINDS[kind]
    _sweep(_generation(toy, options), make, OWNERSHIP)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_ctrl_c_at_every_line_of_a_generation(toy, kind):
    make, options = KINDS[kind]
    _sweep(_generation(toy, options), make, (".py",))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_ctrl_c_at_every_line_of_a_conversations_turns(toy, kind):
    _sweep(_turns(toy), KINDS[kind][0], (".py",))
