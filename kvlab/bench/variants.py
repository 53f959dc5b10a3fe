"""What one benchmark row compares: its variants (kvlab's caches, onnxruntime-genai, the matmuls-only floor), each
named by fields, and one run of each."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.cache import Cache
from ..core.frames import decode_median
from ..core.generation import positions_needed
from ..core.labels import CacheSpec
from ..core.records import StepHook, StepRecord
from ..ort import CapturedStaticCache, Device, DynamicCache, Model, StaticCache, Stepper, generate, open_device
from ..ort.checks.references import genai_decode, genai_model
from ..ort.decode.greedy import AUTO, reduction_for
from ..ort.runtime import memory
from .weights import run_matmuls_only

Checks = tuple[int | None, ...]  # the static caches' check_every values (None: the cache's default)
SMALL_PAGES = "4KiB-pages"  # the cache variant decoded from weights left in 4 KiB pages
KVLAB, GENAI, MATMULS_ONLY = "kvlab", "genai", "matmuls only"  # runners
GENAI_GRAPH = "genai graph"  # onnxruntime-genai with WebGPU graph capture (the model built for capture)


@dataclass(frozen=True)
class Variant:
    """One line of a benchmark: who runs it, with which cache, and whether that cache is sized to the row."""

    runner: str  # KVLAB, GENAI or MATMULS_ONLY
    cache: CacheSpec | None = None  # kvlab's runs only
    fitted: bool = False  # a static cache of exactly context + new tokens - 1 positions
    token_on_device: str = ""  # kvlab's greedy token kept on the device: the greedy graph's reduction ("blocks",
    #                            "single"; kvlab.ort.decode.greedy), or "" for the token chosen on the host

    @property
    def packed_kv(self) -> bool:
        """Whether this cache holds packed (quantized) KV: ``kv-int8`` / ``kv-int4`` in its variant."""
        return self.cache is not None and "kv-" in self.cache.variant

    @property
    def name(self) -> str:
        """The row's label: the cache's name (or the runner's), and how the token is chosen where on the device."""
        name = str(self.cache) if self.cache is not None else self.runner
        return f"{name} token-on-device ({self.token_on_device})" if self.token_on_device else name

    def fields(self) -> dict[str, Any]:
        """The row fields that name it (what plots and reports select by)."""
        c = self.cache
        return {
            "variant": self.name,
            "runner": self.runner,
            "cache_kind": c.kind if c else "",
            "max_cache_len": c.max_cache_len if c else None,
            "fitted": self.fitted,
            "cache_variant": c.variant if c else "",
            "token_on_device": bool(self.token_on_device),
            "greedy_reduction": self.token_on_device,
            "tokens_per_read": int(bool(self.token_on_device)),  # each step's token read back on its own (run())
        }


@dataclass
class Run:
    """One generation of one variant."""

    token_ids: list[int] | None  # None: a run that makes no tokens (the matmuls-only floor)
    decode_ms: float  # median wall time of the decode steps
    overhead_ms: float = float("nan")  # median Python time per decode step (outside the runtime's calls)
    tensors_per_step: float = float("nan")  # median cache tensors the runtime allocated per decode step
    new_buffers_per_step: float = float("nan")
    bytes_per_step: float = float("nan")
    cpu_ms: float = float("nan")  # median CPU time of the whole process per decode step (on a software adapter
    #                               this includes the emulated GPU's work, done on this process's threads)
    thread_cpu_ms: float = float("nan")  # median CPU time of the thread that runs the loop per decode step: the
    #                                     host-side work of issuing a step (and what waiting for it costs there)


class CpuClock:
    """Stamps the process's and the calling thread's CPU time at every step (a step hook for kvlab's loop, a
    per-token callback for genai's): consecutive stamps of decode steps give each step's CPU time."""

    def __init__(self) -> None:
        self.stamps: list[tuple[str, float, float]] = []

    def __call__(self, record: StepRecord | None = None) -> None:
        self.stamps.append((record.phase if record is not None else "decode", time.process_time(), time.thread_time()))

    def medians(self) -> tuple[float, float]:
        """(process, thread) CPU ms per decode step: medians over steps that follow a stamped step."""
        pairs = [(b[1] - a[1], b[2] - a[2]) for a, b in zip(self.stamps, self.stamps[1:]) if b[0] == "decode"]
        if not pairs:
            return float("nan"), float("nan")
        return tuple(float(np.median([p[i] for p in pairs])) * 1e3 for i in (0, 1))  # type: ignore[return-value]


def run_of(tokens: list[int], records: list[StepRecord], clock: CpuClock | None = None) -> Run:
    """A ``Run`` from a kvlab generation's tokens and records: medians over its decode steps."""
    cpu, thread = clock.medians() if clock is not None else (float("nan"), float("nan"))
    columns = ("wall_ms", "overhead_ms", "cache_tensors_allocated", "new_buffers", "cache_bytes_allocated")
    return Run(tokens, *(decode_median(records, c) for c in columns), cpu, thread)


def run_kvlab(
    model: Model,
    ids: np.ndarray,
    make_cache: Callable[[], Cache],
    device: str | Device,
    new: int,
    hooks: Sequence[StepHook] = (),
    token_on_device: bool | str = False,
) -> Run:
    """One kvlab generation of ``new`` tokens after ``ids`` with a fresh cache from ``make_cache`` (disposed after).
    Each step's token is read back on its own (``tokens_per_read=1``): a step's figures (its CPU time, its Python
    time) are its own; data/kvlab-vs-genai-on-a-gpu/lockstep.py measures the steps read back in bursts."""
    clock = CpuClock()
    with make_cache() as cache:
        g = generate(
            model,
            ids,
            cache=cache,
            device=device,
            max_new_tokens=new,
            stop_on_eos=False,
            on_step=[clock, *hooks],
            token_on_device=token_on_device,
            tokens_per_read=1,
        )
    return run_of(g.token_ids, g.records, clock)


@dataclass
class Prefilled:
    """A prefill kept for reuse: every run of a variant hands it off to the decode device and decodes (the same
    path as ``generate(prefill_device=...)``, without recomputing a quadratic prefill per run)."""

    cache: Cache
    first_token: int


def run_handoff(
    model: Model,
    pre: Prefilled,
    make_cache: Callable[[], Cache],
    device: str,
    new: int,
    hooks: Sequence[StepHook] = (),
    token_on_device: bool | str = False,
) -> Run:
    """One generation that hands ``pre``'s prefill off to a fresh cache on ``device`` and decodes there."""
    records: list[StepRecord] = []
    clock = CpuClock()
    needed = positions_needed(pre.cache.seq_length, new)
    with (
        make_cache() as cache,
        Stepper(
            model, cache, open_device(device), needed, [clock, records.append, *hooks], token_on_device=token_on_device
        ) as st,
    ):
        st.receive(pre.cache)
        tokens = [pre.first_token]
        while len(tokens) < new:
            tokens.append(st.step(np.array([tokens[-1]], np.int64), logits_out="none")[1].token)
    return run_of(tokens, records, clock)


class GenaiPeer:
    """onnxruntime-genai on the same model directory and prompt, on the same device (its own prefill there);
    times each decode step. On WebGPU, ``options`` are WebGPU EP options for its sessions (``genai_model``): with
    onnxruntime-webgpu genai loads its own copy of ONNX Runtime, so its WebGPU context is its own and takes the
    options of its config and these, not kvlab's device's; with the plugin EP its sessions join kvlab's context."""

    def __init__(
        self,
        model: Model,
        device: str = "cpu",
        graph_capture: bool | None = None,
        options: dict[str, str] | None = None,
    ):
        import onnxruntime_genai as og

        # like for like on the CPU: its weights in huge pages too, when kvlab's CPU device puts its own there
        with memory.collapsing(device == "cpu" and open_device("cpu").huge_pages) as self.huge_pages:
            self.model = genai_model(model, device, graph_capture, options)
        self.options = dict(options or {})
        self.version = getattr(og, "__version__", "?")

    def run(self, ids: np.ndarray, new: int, hooks: Sequence[Callable[[], None]] = ()) -> Run:
        """One genai generation of ``new`` tokens after ``ids``; ``hooks`` are called after every token."""
        clock = CpuClock()
        clock()  # before the first call (it samples the prefill's logits, then every call runs one decode step)
        tokens, times = genai_decode(self.model, ids, new, on_token=lambda: [clock(), *[h() for h in hooks]])
        clock.stamps = clock.stamps[1:]  # the first call samples the prefill's logits (no forward pass): left out
        cpu, thread = clock.medians()
        return Run(tokens, float(np.median(times[1:])), cpu_ms=cpu, thread_cpu_ms=thread)


@dataclass
class Setting:
    """What the variants of a row share: the model, device, prompt and its peers."""

    model: Model
    device: str
    ids: np.ndarray
    new: int
    genai: GenaiPeer | None = None
    small: Device | None = None  # the 4 KiB-pages twin's device
    floor: Path | None = None  # the matmuls-only graph
    prefill: str | None = None  # prefill once per cache kind on this device and hand off to each run (None: each
    #                             run prefills on its own device)
    graph_model: Model | None = None  # the model built for capture: kvlab's captured static caches run it
    genai_graph: GenaiPeer | None = None  # genai with graph capture, on that model
    kv_precisions: tuple[str, ...] = ()  # each cache again with its KV packed so (caches/kv_precision.py)


def variants(
    s: Setting, static_lens: list[int], fit: bool, check_every: Checks = (None,), token_on_device: bool = False
) -> tuple[dict[Variant, Callable[..., Run]], list[Prefilled]]:
    """Variant -> a function doing one run (``hooks=``: step hooks for kvlab's runs, per-token callbacks for
    genai's), in run order. With a prefill device, each cache kind's prefill is made once here (returned too, for
    disposal). ``token_on_device``: each static cache also with the greedy token kept on the device, right after
    its twin, by the reduction the default (``token_on_device="auto"``) picks for this vocabulary on this adapter,
    or in blocks where the default keeps the token on the host. ``s.kv_precisions``: each cache also with its KV
    packed, right after its twin (those prefill on their own device)."""
    fitted = positions_needed(len(s.ids), s.new)
    lens = sorted({n for n in static_lens if fitted <= n <= s.model.info.context_length} | ({fitted} if fit else set()))
    lens = lens or [fitted]
    caches: dict[Variant, tuple[Callable[[], Cache], Model]] = {
        Variant(KVLAB, CacheSpec("dynamic")): (DynamicCache, s.model)
    }
    for p in s.kv_precisions:  # each packed twin right after its twin: pairs close in time
        caches[Variant(KVLAB, DynamicCache(p).spec)] = (lambda p=p: DynamicCache(p), s.model)
    for n in lens:
        for k in check_every:
            make = lambda n=n, k=k: StaticCache(n, check_every=k)  # noqa: E731
            caches[Variant(KVLAB, make().spec, n == fitted)] = (make, s.model)
            for p in s.kv_precisions:
                packed = lambda n=n, k=k, p=p: StaticCache(n, check_every=k, kv_precision=p)  # noqa: E731
                caches[Variant(KVLAB, packed().spec, n == fitted)] = (packed, s.model)
            if token_on_device:
                reduction = reduction_for(AUTO, s.model.info.vocab_size, open_device(s.device)) or "blocks"
                caches[Variant(KVLAB, make().spec, n == fitted, token_on_device=reduction)] = (make, s.model)
            if s.graph_model is not None:  # right after its uncaptured twin: pairs close in time
                make = lambda n=n, k=k: CapturedStaticCache(n, check_every=k)  # noqa: E731
                caches[Variant(KVLAB, make().spec, n == fitted)] = (make, s.graph_model)
    out: dict[Variant, Callable[..., Run]] = {}
    kept: list[Prefilled] = []
    floor = (lambda hooks=(): Run(None, run_matmuls_only(s.floor, s.device, s.new))) if s.floor is not None else None
    for v, (make, model) in caches.items():
        tok = v.token_on_device or False  # the reduction, or the host path
        # the prefill side is the cache's twin (a captured cache's: a plain static one); packed KV exists on its
        # own device only, so those caches prefill there
        if s.prefill is not None and not v.packed_kv:
            cache = make().empty_like()  # the prefill, made once on its device (sweep disposes of it)
            with Stepper(model, cache, open_device(s.prefill), len(s.ids)) as st:
                kept.append(Prefilled(cache, st.step(s.ids, logits_out="none")[1].token))
            out[v] = lambda hooks=(), make=make, pre=kept[-1], m=model, tok=tok: run_handoff(
                m, pre, make, s.device, s.new, hooks, tok
            )
        else:
            out[v] = lambda hooks=(), make=make, m=model, tok=tok: run_kvlab(
                m, s.ids, make, s.device, s.new, hooks, tok
            )
        if floor and v.fitted:  # right after the fitted static cache: pairs close in time
            out[Variant(MATMULS_ONLY)] = floor
    if s.small is not None:  # after the open device's session exists, so its collapse cannot reach this one's memory
        twin = Variant(KVLAB, CacheSpec("static", fitted, SMALL_PAGES), True)
        out[twin] = lambda hooks=(): run_kvlab(s.model, s.ids, lambda: StaticCache(fitted), s.small, s.new, hooks)
    if s.genai is not None:
        out[Variant(GENAI)] = lambda hooks=(): s.genai.run(s.ids, s.new, hooks)
    if s.genai_graph is not None:
        out[Variant(GENAI_GRAPH)] = lambda hooks=(): s.genai_graph.run(s.ids, s.new, hooks)
    if floor:
        out.setdefault(Variant(MATMULS_ONLY), floor)  # last, when no static cache is sized to fit
    return out, kept
