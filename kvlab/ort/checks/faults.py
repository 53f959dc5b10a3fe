"""FAULT INJECTION, for tests and lessons: make one boundary of a step fail on purpose, at a chosen call.

``fault(point, at_call)`` wraps one kvlab or ONNX Runtime entry point for a ``with`` block and raises at its
``at_call``-th call; everything else stays the real runtime. Points:

- ``"run"``: a session's run raises before running (as a device loss would);
- ``"after-run"``: the run completes, then raises before the cache commits (its outputs exist, unowned);
- ``"allocate"``: a device allocation raises; ``"wrap"``: wrapping a runtime value as a ``DeviceTensor`` raises;
- ``"in-place"``: the run reports one present as written elsewhere (the in-place check fails);
- ``"copy"``: a tensor copy between devices raises; ``"commit"``: the cache's commit raises on entry.

``raising_hook(at_call)`` is a step hook that raises at its ``at_call``-th record. The default error is an
``Injected`` RuntimeError naming the point; pass ``error=KeyboardInterrupt()`` for an interrupt."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ...core.errors import check_choice, check_int
from ..decode.caches.dynamic import DynamicCache
from ..decode.caches.static import StaticCache
from ..runtime.builtin import HELPER_LABEL
from ..runtime.device import Device, backend
from ..runtime.session import Binding, DeviceTensor, RunResult

POINTS = ("run", "after-run", "allocate", "wrap", "in-place", "copy", "commit")


class Injected(RuntimeError):
    """The error a fault raises by default."""


def _targets(point: str) -> list[tuple[type, str]]:
    return {
        "run": [(Binding, "run")],
        "after-run": [(Binding, "run")],
        "in-place": [(Binding, "run")],
        "allocate": [(Device, "zeros")],
        "wrap": [(DeviceTensor, "__init__")],
        "copy": [(type(backend()), "copy")],
        "commit": [(DynamicCache, "commit"), (StaticCache, "commit")],
    }[point]


@contextmanager
def fault(point: str, at_call: int = 1, error: BaseException | None = None) -> Iterator[dict[str, int]]:
    """Inside the block, the ``at_call``-th call of ``point`` fails with ``error``; yields ``{"calls": n, "raised": 0 or
    1}``. ConfigError for an unknown point or an ``at_call`` that is not a positive int."""
    check_choice(point, POINTS, "fault point ")
    at_call = check_int(at_call, "at_call", 1)
    state = {"calls": 0, "raised": 0}
    exc = error if error is not None else Injected(f"injected fault: {point} (call {at_call})")
    saved = [(cls, name, cls.__dict__.get(name)) for cls, name in _targets(point)]  # None: inherited

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(self, Binding) and self.session.label == HELPER_LABEL:
                return real(self, *args, **kwargs)  # an allocation's run: the "allocate" point covers those
            after = point in ("after-run", "in-place")  # these fail once the run is done
            result: RunResult | None = real(self, *args, **kwargs) if after else None
            state["calls"] += 1
            if state["calls"] == at_call:
                state["raised"] += 1
                if point != "in-place":
                    raise exc
                name = next(iter(result.returned_ptrs), None)
                if name is not None:
                    result.returned_ptrs[name] += 64
            return result if after else real(self, *args, **kwargs)

        return wrapper

    for cls, name, _ in saved:
        setattr(cls, name, wrap(getattr(cls, name)))
    try:
        yield state
    finally:
        for cls, name, original in saved:
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)


def raising_hook(at_call: int, error: BaseException | None = None) -> Callable[[Any], None]:
    """A step hook that raises at its ``at_call``-th record (a hook with a bug in it)."""
    calls = {"n": 0}

    def hook(record: Any) -> None:
        calls["n"] += 1
        if calls["n"] == at_call:
            raise error if error is not None else Injected(f"injected fault: hook (record {at_call})")

    return hook
