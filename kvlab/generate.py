"""The generation loop: prefill, then decode one token at a time, with one hook call per step."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .caches import Cache, DynamicCache, StaticCache
from .errors import ConfigError
from .instrument import StepHook, StepRecord, frame, rss_bytes
from .models import Model, load
from .runtime import Device, open_device


@dataclass(frozen=True)
class Sampling:
    """Greedy by default; ``do_sample=True`` draws from the softmax (temperature, top-k, top-p), seeded."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1.0 = no nucleus cut
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ConfigError(f"temperature={self.temperature!r} must be > 0")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k={self.top_k!r} must be an int >= 0 (0 disables it)")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p!r} must be in (0, 1]")

    def chooser(self) -> Callable[[np.ndarray], int]:
        if not self.do_sample:
            return lambda logits: int(np.argmax(logits))
        rng = np.random.default_rng(self.seed)

        def sample(logits: np.ndarray) -> int:
            z = logits.astype(np.float64) / self.temperature
            if self.top_k:
                z[z < np.partition(z, -self.top_k)[-self.top_k]] = -np.inf
            p = np.exp(z - z.max())
            p /= p.sum()
            if self.top_p < 1:
                order = np.argsort(-p)
                keep = np.cumsum(p[order]) - p[order] < self.top_p  # smallest set reaching top_p
                p[order[~keep]] = 0
                p /= p.sum()
            return int(rng.choice(p.size, p=p))

        return sample


@dataclass
class Generation:
    """The result of ``generate``: text, token ids and one record per step."""

    model: str
    device: str  # device and adapter label
    cache: str  # "dynamic" or "static(max_cache_len=N)"
    dtype: str
    prompt_ids: list[int]
    token_ids: list[int]  # generated tokens (an EOS that stopped generation included)
    text: str
    stop_reason: str  # "eos" or "max_new_tokens"
    prefill_device: str = ""  # set when the prefill ran on another device (a handoff)
    records: list[StepRecord] = field(default_factory=list)

    def frame(self):
        """Per-step records as a pandas DataFrame (columns documented in kvlab.instrument.COLUMNS)."""
        return frame(self.records)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items()}

    def decode_ms(self) -> float:
        """Median wall time of the decode steps (ms); NaN with no decode step."""
        walls = [r.wall_ms for r in self.records if r.phase == "decode"]
        return float(np.median(walls)) if walls else float("nan")


def cache_label(cache: Cache) -> str:
    return f"static(max_cache_len={cache.max_cache_len})" if isinstance(cache, StaticCache) else cache.kind


class Stepper:
    """One model + one cache + one device, stepped by hand: ``step(tokens)`` runs one forward pass.

    It holds the cache for its lifetime (``with Stepper(...) as s:``). A step that fails leaves the cache
    as it was, so it can simply be called again."""

    def __init__(self, model: Model, cache: Cache, device: Device, needed: int,
                 hooks: Sequence[StepHook] = ()):
        self.model, self.cache, self.device, self.hooks = model, cache, device, list(hooks)
        self.session = model.session(device)
        self.needed = needed
        self._mask = np.ones((1, needed), np.int64)  # all ones; the first (position + n) are fed each step
        self._decode_logits = np.empty((1, 1, model.info.vocab_size), np.float32)
        self._use = cache.use(model.info, device, needed)
        self.steps = 0

    def __enter__(self) -> "Stepper":
        self._use.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._use.__exit__(*exc)

    def step(self, tokens: np.ndarray, choose: Callable[[np.ndarray], int] | None = None,
             logits_out: str = "last") -> tuple[np.ndarray | None, StepRecord]:
        """Feed ``tokens`` [n]; returns a copy of the logits ("last": [vocab], "all": [n, vocab], "none": None)
        and the step's record."""
        start = time.perf_counter()
        if logits_out not in ("last", "all", "none"):
            raise ConfigError(f"logits_out={logits_out!r} is not valid; choose 'last', 'all' or 'none'")
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        info, n, position = self.model.info, int(tokens.shape[0]), self.cache.seq_length
        if position + n > self.needed:
            raise ConfigError(f"step of {n} tokens at position {position} exceeds the {self.needed} positions this "
                              "stepper was opened for")
        logits = self._decode_logits if n == 1 else np.empty((1, n, info.vocab_size), np.float32)
        b = self.cache.binding(self.session, n)
        b.input(info.input_names["input_ids"], tokens.reshape(1, n))
        b.input(info.input_names["attention_mask"], self._mask[:, : position + n])
        b.output(info.logits_name, logits)
        result = b.run()
        alloc = self.cache.commit(result, n)  # raises (and does not advance) if the run misbehaved
        out = {"all": logits[0], "last": logits[0, -1], "none": None}[logits_out]
        out = None if out is None else out.copy()
        token = (choose or (lambda z: int(np.argmax(z))))(logits[0, -1])
        wall = (time.perf_counter() - start) * 1e3
        record = StepRecord(
            step=self.steps, phase="prefill" if position == 0 else "decode", device=self.device.name,
            position=position, n_tokens=n, token=token, wall_ms=wall, run_ms=result.seconds * 1e3,
            overhead_ms=wall - result.seconds * 1e3, cache_tensors_allocated=alloc.allocated_tensors,
            cache_bytes_allocated=alloc.allocated_bytes, new_buffers=alloc.new_buffers,
            live_cache_bytes=alloc.live_bytes, used_cache_bytes=self.cache.used_bytes, copy_bytes=0,
            rss_bytes=rss_bytes())
        self.steps += 1
        self._emit(record)
        return out, record

    def receive(self, src: Cache) -> StepRecord:
        """Take over the sequence another stepper's cache holds (a prefill on another device): a 'handoff' step."""
        start = time.perf_counter()
        alloc, copied = self.cache.receive(src)
        wall = (time.perf_counter() - start) * 1e3
        record = StepRecord(
            step=0, phase="handoff", device=f"{src._device.name}->{self.device.name}",
            position=0, n_tokens=src.seq_length, token=-1, wall_ms=wall, run_ms=0.0, overhead_ms=wall,
            cache_tensors_allocated=alloc.allocated_tensors, cache_bytes_allocated=alloc.allocated_bytes,
            new_buffers=alloc.new_buffers, live_cache_bytes=alloc.live_bytes, used_cache_bytes=self.cache.used_bytes,
            copy_bytes=copied, rss_bytes=rss_bytes())
        self.steps = 1  # the next step is the first decode step
        self._emit(record)
        return record

    def _emit(self, record: StepRecord) -> None:
        for hook in self.hooks:
            hook(record)


def _hooks(on_step: StepHook | Iterable[StepHook] | None) -> list[StepHook]:
    if on_step is None:
        return []
    if callable(on_step):
        return [on_step]
    return list(on_step)


def _done(tokens: list[int], max_new_tokens: int, stop_on_eos: bool, model: Model) -> bool:
    return len(tokens) >= max_new_tokens or (stop_on_eos and tokens[-1] in model.info.eos_token_ids)


def generate(model: Model | str, prompt: Any, *, cache: Cache | None = None, device: Device | str = "cpu",
             max_new_tokens: int = 32, chat: bool = False, sampling: Sampling | None = None,
             stop_on_eos: bool = True, on_step: StepHook | Iterable[StepHook] | None = None,
             prefill_device: Device | str | None = None, prefill_model: Model | str | None = None) -> Generation:
    """Generate up to ``max_new_tokens`` tokens after ``prompt`` (text, chat messages or token ids).

    The cache starts empty (``generate`` resets it; a StaticCache keeps its buffers). Default cache: dynamic.

    ``prefill_device="cpu"`` runs the prefill on the CPU EP (``prefill_model``, default the same model), copies
    the KV into ``cache`` on ``device`` (a 'handoff' step) and decodes there. With onnxruntime-webgpu 1.27 this
    is also more correct than a WebGPU prefill, whose logits are wrong from query position 4 on.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be a positive int")
    model = load(model)
    dev = open_device(device)
    ids = model.encode(prompt, chat=chat)
    own_cache = cache is None  # a default cache nobody else can reach: disposed when the generation ends
    cache = DynamicCache() if own_cache else cache
    if not isinstance(cache, Cache):
        raise ConfigError(f"cache must be a kvlab cache (DynamicCache(), StaticCache(n)), got {cache!r}")
    choose = (sampling or Sampling()).chooser()
    needed = len(ids) + int(max_new_tokens) - 1  # the last token is never fed back
    tokens: list[int] = []
    records: list[StepRecord] = []
    stop = "max_new_tokens"
    hooks = [records.append, *_hooks(on_step)]
    pre_dev = None if prefill_device is None else open_device(prefill_device)
    if pre_dev is None or pre_dev is dev:
        if prefill_model is not None:
            raise ConfigError("prefill_model needs a prefill_device other than the decode device")
        pre = None
    else:
        pre_model = model if prefill_model is None else load(prefill_model)
        pre = Stepper(pre_model, cache.twin(), pre_dev, len(ids), hooks)
    with cache if own_cache else nullcontext(), Stepper(model, cache, dev, needed, hooks) as stepper:
        feed = ids
        if pre is not None:
            with pre.cache, pre:
                _, record = pre.step(ids, choose, logits_out="none")
                stepper.receive(pre.cache)
            tokens.append(record.token)
            feed = np.array([record.token], np.int64)
        while not tokens or not _done(tokens, max_new_tokens, stop_on_eos, model):
            _, record = stepper.step(feed, choose, logits_out="none")
            tokens.append(record.token)
            feed = np.array([record.token], np.int64)
    if stop_on_eos and tokens[-1] in model.info.eos_token_ids:
        stop = "eos"
    return Generation(model=model.name, device=dev.label, cache=cache_label(cache), dtype=model.info.dtype_name,
                      prompt_ids=ids.tolist(), token_ids=tokens, text=model.decode(tokens), stop_reason=stop,
                      prefill_device=pre.device.label if pre else "", records=records)
