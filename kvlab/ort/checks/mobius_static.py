"""mobius's own static cache (``CausalLMTask(static_cache=True, max_seq_len=N)``) for a ``TinyKVShared`` preset, built
and run beside kvlab's ``StaticCache``: its graph takes each layer's buffer as an input ``key_cache.i`` and returns the
buffer with the step's keys scattered in as a new output, fed back at the next step (docs/kv-shared.md compares the
two)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import ConfigError, check_int
from ...presets.recipes import building
from ..models.mobius import export
from ..runtime.device import open_device
from ..runtime.session import release_all, zeros_all
from .references import hf_checkpoint


def build_static(model: Any, max_seq_len: int, out: Path | None = None) -> Path:
    """mobius's static-cache export of ``model``'s checkpoint into ``out`` (default beside it), atomically; reused when
    built. ConfigError for a bad ``max_seq_len``, ModelError for a model kvlab did not build."""
    max_seq_len = check_int(max_seq_len, "max_seq_len", 1)
    out = Path(out or model.info.path.parent / f"{model.info.path.name}-mobius-static-{max_seq_len}")
    if not (out / "model.onnx").is_file():
        from mobius.tasks import CausalLMTask

        with building(out, "model.onnx") as tmp:
            export(hf_checkpoint(model), tmp, CausalLMTask(static_cache=True, max_seq_len=max_seq_len))
    return out


@dataclass
class StaticRun:
    """A greedy generation on mobius's static graph: its tokens and each run's seconds (the first: the prefill)."""

    token_ids: list[int]
    seconds: list[float] = field(default_factory=list)

    @property
    def step_ms(self) -> float:
        """The median one-token step, in milliseconds."""
        return float(np.median(self.seconds[1:]) * 1e3) if len(self.seconds) > 1 else float("nan")


class MobiusStatic:
    """mobius's static-cache graph at ``path`` on ``device``: ``generate`` runs it greedily, its updated buffers fed
    back at every step. Raises what ``Device.session`` raises."""

    def __init__(self, path: Path, device: str = "cpu"):
        self.device = open_device(device)
        self.session = self.device.session(Path(path) / "model.onnx", f"mobius static cache, {path.name}")
        inputs = self.session.ort.get_inputs()
        self.caches = {i.name: (1, *i.shape[1:]) for i in inputs if "_cache." in i.name}
        self.max_seq_len = int(next(iter(self.caches.values()))[1])

    def generate(self, prompt: list[int], max_new_tokens: int) -> StaticRun:
        """Greedy tokens for ``prompt``, buffers released after; ConfigError past max_seq_len."""
        if len(prompt) + max_new_tokens > self.max_seq_len:
            raise ConfigError(
                f"{len(prompt)} prompt + {max_new_tokens} new tokens exceed this graph's max_seq_len "
                f"{self.max_seq_len} (its cache buffers are that long)"
            )
        buffers = dict(zip(self.caches, zeros_all(self.device, [(s, np.float32) for s in self.caches.values()])))
        run, ids, pos = StaticRun([]), list(prompt), 0
        try:
            for _ in range(max_new_tokens):
                logits, seconds, buffers = self._step(ids, pos, buffers)
                pos += len(ids)
                ids = [int(logits[0, -1].argmax())]
                run.token_ids.append(ids[0])
                run.seconds.append(seconds)
        finally:
            release_all(list(buffers.values()))
        return run

    def _step(self, ids: list[int], pos: int, buffers: dict) -> tuple[np.ndarray, float, dict]:
        b = self.session.binding()
        n = len(ids)
        b.input("input_ids", np.array([ids], np.int64))
        b.input("position_ids", np.arange(pos, pos + n, dtype=np.int64)[None])
        b.input("write_indices", np.array([pos], np.int64))
        b.input("nonpad_kv_seqlen", np.array([pos + n], np.int64))
        for name, t in buffers.items():
            b.input(name, t)
        logits = np.empty((1, n, self.session.ort.get_outputs()[0].shape[2]), np.float32)
        b.output("logits", logits)
        for name in buffers:
            b.output_new("updated_" + name)
        start = time.perf_counter()
        result = b.run()
        seconds = time.perf_counter() - start
        for t in buffers.values():
            t.release()
        return logits, seconds, {name: result.new["updated_" + name] for name in buffers}
