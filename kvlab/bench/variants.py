"""What one benchmark row compares: its variants (kvlab's caches, onnxruntime-genai, the matmuls-only floor), each
named by fields, and one run of each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..core.cache import Cache
from ..core.generation import positions_needed
from ..core.labels import CacheSpec
from ..core.frames import decode_median
from ..core.records import StepRecord
from ..ort import Device, DynamicCache, Model, StaticCache, Stepper, generate, open_device
from ..ort import memory
from ..ort.device import private_device
from ..ort.references import genai_decode
from .weights import run_matmuls_only

SMALL_PAGES = "4KiB-pages"  # the cache variant decoded from weights left in 4 KiB pages
KVLAB, GENAI, MATMULS_ONLY = "kvlab", "genai", "matmuls only"  # runners


@dataclass(frozen=True)
class Variant:
    """One line of a benchmark: who runs it, with which cache, and whether that cache is sized to the row."""

    runner: str  # KVLAB, GENAI or MATMULS_ONLY
    cache: CacheSpec | None = None  # kvlab's runs only
    fitted: bool = False  # a static cache of exactly context + new tokens - 1 positions

    @property
    def name(self) -> str:
        return str(self.cache) if self.cache is not None else self.runner

    def fields(self) -> dict[str, Any]:
        """The row fields that name it (what plots and reports select by)."""
        c = self.cache
        return {"variant": self.name, "runner": self.runner, "cache_kind": c.kind if c else "",
                "max_cache_len": c.max_cache_len if c else None, "fitted": self.fitted,
                "cache_variant": c.variant if c else ""}


@dataclass
class Run:
    """One generation of one variant."""

    token_ids: list[int] | None  # None: a run that makes no tokens (the matmuls-only floor)
    decode_ms: float  # median wall time of the decode steps
    overhead_ms: float = float("nan")  # median Python time outside session.run per decode step
    tensors_per_step: float = float("nan")  # median cache tensors the runtime allocated per decode step
    new_buffers_per_step: float = float("nan")
    bytes_per_step: float = float("nan")


def run_of(tokens: list[int], records: list[StepRecord]) -> Run:
    med = lambda column: decode_median(records, column)  # noqa: E731
    return Run(tokens, med("wall_ms"), med("overhead_ms"), med("cache_tensors_allocated"), med("new_buffers"),
               med("cache_bytes_allocated"))


def small_pages_device() -> Device:
    """A private CPU device whose sessions' weights stay in 4 KiB pages, beside the open (huge-page) one: the
    same model and cache decoded from both, interleaved in one process, measure what huge pages change."""
    return private_device("cpu", huge_pages=False)


def run_kvlab(model: Model, ids: np.ndarray, make_cache: Callable[[], Cache], device: str | Device,
              new: int) -> Run:
    with make_cache() as cache:
        g = generate(model, ids, cache=cache, device=device, max_new_tokens=new, stop_on_eos=False)
    return run_of(g.token_ids, g.records)


@dataclass
class Prefilled:
    """A CPU prefill kept for reuse: every run of a variant hands it off to the device and decodes (the same
    path as ``generate(prefill_device="cpu")``, without recomputing a quadratic prefill per run)."""

    cache: Cache
    first_token: int


def prefill_on_cpu(model: Model, ids: np.ndarray, cache: Cache) -> Prefilled:
    with Stepper(model, cache, open_device("cpu"), len(ids)) as st:
        _, record = st.step(ids, logits_out="none")
    return Prefilled(cache, record.token)


def run_handoff(model: Model, pre: Prefilled, make_cache: Callable[[], Cache], device: str, new: int) -> Run:
    records: list[StepRecord] = []
    needed = positions_needed(pre.cache.seq_length, new)
    with make_cache() as cache, Stepper(model, cache, open_device(device), needed, [records.append]) as st:
        st.receive(pre.cache)
        tokens = [pre.first_token]
        while len(tokens) < new:
            tokens.append(st.step(np.array([tokens[-1]], np.int64), logits_out="none")[1].token)
    return run_of(tokens, records)


class GenaiPeer:
    """onnxruntime-genai on the same model directory and prompt (CPU EP); times each decode step."""

    def __init__(self, model: Model):
        import onnxruntime_genai as og

        config = og.Config(str(model.info.path))
        config.clear_providers()  # CPU EP
        # like for like: its weights in huge pages too, when kvlab's CPU device puts its own there
        with memory.collapsing(open_device("cpu").huge_pages) as self.huge_pages:
            self.model = og.Model(config)
        self.version = getattr(og, "__version__", "?")

    def run(self, ids: np.ndarray, new: int) -> Run:
        tokens, times = genai_decode(self.model, ids, new)
        # the first call samples the prefill's logits; each later one runs one decode forward pass first
        return Run(tokens, float(np.median(times[1:])))


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
    handoff: bool = False  # WebGPU: prefill on the CPU and hand off


def variants(s: Setting, static_lens: list[int], fit: bool) -> tuple[dict[Variant, Callable[[], Run]], list[Prefilled]]:
    """Variant -> a function doing one run, in run order. With the handoff, each cache kind's CPU prefill is made
    once here (returned too, for disposal)."""
    fitted = positions_needed(len(s.ids), s.new)
    lens = sorted({n for n in static_lens if fitted <= n <= s.model.info.context_length} | ({fitted} if fit else set()))
    lens = lens or [fitted]
    caches: dict[Variant, Callable[[], Cache]] = {Variant(KVLAB, CacheSpec("dynamic")): DynamicCache}
    caches.update({Variant(KVLAB, CacheSpec("static", n), n == fitted): (lambda n=n: StaticCache(n)) for n in lens})
    out: dict[Variant, Callable[[], Run]] = {}
    kept: list[Prefilled] = []
    floor = (lambda: Run(None, run_matmuls_only(s.floor, s.device, s.new))) if s.floor is not None else None
    for v, make in caches.items():
        if s.handoff:
            kept.append(prefill_on_cpu(s.model, s.ids, make()))
            out[v] = lambda make=make, pre=kept[-1]: run_handoff(s.model, pre, make, s.device, s.new)
        else:
            out[v] = lambda make=make: run_kvlab(s.model, s.ids, make, s.device, s.new)
        if floor and v.fitted:  # right after the fitted static cache: pairs close in time
            out[Variant(MATMULS_ONLY)] = floor
    if s.small is not None:  # after the open device's session exists, so its collapse cannot reach this one's memory
        twin = Variant(KVLAB, CacheSpec("static", fitted, SMALL_PAGES), True)
        out[twin] = lambda: run_kvlab(s.model, s.ids, lambda: StaticCache(fitted), s.small, s.new)
    if s.genai is not None:
        out[Variant(GENAI)] = lambda: s.genai.run(s.ids, s.new)
    if floor:
        out.setdefault(Variant(MATMULS_ONLY), floor)  # last, when no static cache is sized to fit
    return out, kept
