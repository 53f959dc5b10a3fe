"""Per-step records, the hooks that receive them, and their column docs (exact counter, proxy or label)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


def column(meaning: str, kind: str, default: Any = MISSING) -> Any:
    """A ``StepRecord`` field with its doc: its meaning and whether it is "exact", a "proxy" or a "label" (``COLUMNS``).
    One with a ``default`` is keyword-only."""
    doc = {"meaning": meaning, "kind": kind}
    return field(metadata=doc) if default is MISSING else field(default=default, kw_only=True, metadata=doc)


@dataclass
class StepRecord:
    """One step: a row of ``Generation.frame()``. Each field says what it means and how exact it is."""

    step: int = column("0 for the prefill (and the handoff that moves it), then 1, 2, ... per decode step", "exact")
    phase: str = column(
        "'prefill', 'handoff' (the prefill's KV copied to the decode device), 'decode', or 'verify' (a decode step "
        "that also checks tokens proposed by prompt lookup)",
        "label",
    )
    device: str = column(
        "device that ran the step ('cpu', 'webgpu' or 'cuda'; for a handoff, the one copied to)", "label"
    )
    copied_from: str = column("for a handoff, the device the KV was copied from; '' otherwise", "label")
    position: int = column("cache length before the step: the position of the first token fed", "exact")
    n_tokens: int = column("tokens fed in this step", "exact")
    token: int = column(
        "the token chosen from this step's logits (-1 for a handoff, and for a verify step that left its next "
        "position to a one-token step: a near-tie within prompt lookup's margin)",
        "exact",
    )
    wall_ms: float = column(
        "wall time of the whole step (binding, run, cache commit, sampling); for steps read back together "
        "(read_with > 0), their burst's wall time, reading back included, divided by the steps it ran",
        "exact",
    )
    run_ms: float = column(
        "wall time inside the runtime: its run, and its binding of the step's inputs (where it copies "
        "host inputs to the device); for steps read back together, their burst's runs divided by its steps",
        "exact",
    )
    overhead_ms: float = column("wall_ms - run_ms: Python's own time in the step", "exact")
    cache_tensors_allocated: int = column(
        "KV tensors created this step: by the runtime (dynamic presents) or by kvlab's "
        "one-time lazy allocation (static); 0 means every present was written in place",
        "exact",
    )
    cache_bytes_allocated: int = column(
        "bytes of those tensors as requested (the WebGPU pool rounds up to its buckets)", "exact"
    )
    new_buffers: int = column(
        "of those, buffers whose identity (data_ptr) this cache had never seen: identity-based; a "
        "destroyed buffer's handle can be reused, so this is a lower bound on fresh buffers",
        "proxy",
    )
    live_cache_bytes: int = column("bytes of KV tensors alive after the step (as requested)", "exact")
    used_cache_bytes: int = column("bytes the tokens held need: cache length x bytes per token", "exact")
    copy_bytes: int = column("bytes copied between devices in this step (handoff only)", "exact")
    rss_bytes: int = column(
        "process resident memory after the step (on SwiftShader, GPU memory is host memory too); "
        "includes everything else the process holds",
        "proxy",
    )
    turn: int = column("the conversation turn the step belongs to (1, 2, ...); 0 outside a conversation", "exact", 0)
    reused: int = column(
        "on a conversation turn's first step: cache positions kept from before the turn and not fed again; 0 on "
        "every other step",
        "exact",
        0,
    )
    prefilled: int = column(
        "positions a prefill step fed (its n_tokens); 0 on decode, verify and handoff steps", "exact", 0
    )
    drafted: int = column("tokens prompt lookup proposed and this step verified (0 without lookup)", "exact", 0)
    accepted: int = column(
        "of those, the tokens the model's own greedy choice confirmed, kept in the cache; the step also yields the "
        "model's next token after them (unless its token is -1)",
        "exact",
        0,
    )
    read_with: int = column(
        "decode steps whose greedy tokens stayed on the device and were read back to the host together, this one "
        "among them (Stepper.decode); 0 for a step read back on its own",
        "exact",
        0,
    )


# column -> (meaning, "exact" | "proxy" | "label")
COLUMNS: dict[str, tuple[str, str]] = {f.name: (f.metadata["meaning"], f.metadata["kind"]) for f in fields(StepRecord)}

StepHook = Callable[[StepRecord], None]


@dataclass(frozen=True)
class CacheStep:
    """What one step did to the cache's memory (see COLUMNS for exactness)."""

    allocated_tensors: int = 0  # cache tensors created this step (by the runtime, or by kvlab's lazy allocation)
    allocated_bytes: int = 0  # their bytes, as requested
    new_buffers: int = 0  # of those, buffers whose identity (data_ptr) this cache had never seen
    live_bytes: int = 0  # bytes of cache tensors alive after the step


def step_record(
    *,
    step: int,
    phase: str,
    device: str,
    position: int,
    n_tokens: int,
    token: int,
    wall_ms: float,
    run_ms: float,
    memory: CacheStep,
    used_cache_bytes: int,
    copy_bytes: int = 0,
    copied_from: str = "",
    kind: type[StepRecord] = StepRecord,
    **extra: Any,
) -> StepRecord:
    """The one way a record is made: overhead and RSS derived here; ``extra`` fills a subclass's own columns."""
    return kind(
        step=step,
        phase=phase,
        device=device,
        copied_from=copied_from,
        position=position,
        n_tokens=n_tokens,
        token=token,
        wall_ms=wall_ms,
        run_ms=run_ms,
        overhead_ms=wall_ms - run_ms,
        cache_tensors_allocated=memory.allocated_tensors,
        cache_bytes_allocated=memory.allocated_bytes,
        new_buffers=memory.new_buffers,
        live_cache_bytes=memory.live_bytes,
        used_cache_bytes=used_cache_bytes,
        copy_bytes=copy_bytes,
        rss_bytes=rss_bytes(),
        **extra,
    )


def hook_list(on_step: StepHook | Iterable[StepHook] | None) -> list[StepHook]:
    """``on_step`` as a list of hooks (one hook, several, or none); ConfigError for one that is not callable."""
    if on_step is None:
        return []
    if callable(on_step):
        return [on_step]
    try:
        hooks = list(on_step)
    except TypeError:
        hooks = [on_step]
    bad = [h for h in hooks if not callable(h)]
    if bad:
        from .errors import ConfigError

        raise ConfigError(
            f"on_step hook {bad[0]!r} is not callable; give a function of one StepRecord (or a list of them)"
        )
    return hooks


_STATM: int | None = None
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096  # statm counts pages


def rss_bytes() -> int:
    """Resident set size of this process (Linux: /proc/self/statm through a kept-open fd)."""
    global _STATM
    if _STATM is None and os.path.exists("/proc/self/statm"):
        _STATM = os.open("/proc/self/statm", os.O_RDONLY)
    if _STATM is not None:
        return int(os.pread(_STATM, 128, 0).split()[1]) * _PAGE
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss
