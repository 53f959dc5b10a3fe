"""kvlab's CUDA-graph decode runner over a transformers StaticCache: prefill uncaptured, then one captured decode
step replayed per token (``mode="capture"``), optionally ``torch.compile``d first (``mode="compile"``);
``mode="eager"`` runs the same device-side step without a graph (CPU, tests). Records, hooks and sampling follow
kvlab's contract. A two-stage argmax stays on the device (captured with the step).

Recorded on an NVIDIA H200: ``data/h200/README.md``; the lesson: ``notebooks/05_pytorch_cuda_graphs.ipynb``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..core.errors import CapacityError, ConfigError, DeviceError, check_choice, check_int
from ..core.generation import Generation, Sampling, check_new_tokens, positions_needed
from ..core.labels import CacheSpec
from ..core.records import CacheStep, StepHook, hook_list
from .counters import AllocCounter, KVWatch
from .fuse import DECODE_ATTENTION, fuse_modules
from .generate import check_capacity, finish_step, generation, sync
from .graph_step import CapturedStep, argmax_cols, two_stage_argmax
from .models import ATTENTION, TorchModel

MODES = ("eager", "capture", "compile")
__all__ = ["MODES", "CapturedStep", "GraphRunner", "argmax_cols", "two_stage_argmax"]


class GraphRunner(CapturedStep):
    """Decode over one transformers StaticCache with a captured CUDA graph per step (the step, its buffers and its
    graph: ``CapturedStep``); this class checks the arguments and runs the loops.

    - Valid-window writes: every step writes exactly the tokens it is fed at [position, position + n); prefill
      runs uncaptured at its exact length, so no padding ever enters the cache; the mask hides stale slots.
    - The step feeds its own argmax to the next: ``decode_greedy`` replays N times with no host sync in between;
      ``generate`` keeps kvlab's contract (records, hooks, sampling) with one replay and one sync per token.
    - ``reset()`` zeroes the counters (and KV) in place: no reallocation, the graph stays valid across generations.

    mode: "capture" (capture the eager step), "compile" (torch.compile the step, fullgraph, then capture it;
    on CPU the compiled step runs without a graph), "eager" (no graph: the same device-side step, run eagerly).
    fuse: ``fuse_modules`` first (q/k/v and gate/up as single GEMMs, fused RMSNorm): fewer kernels per step;
    attention: its decode attention (``ATTENTIONS``; "reduce" pays off only compiled).
    keep_logits=False: the step keeps only its argmax (greedy only; a little faster).

    Raises ConfigError for a bad argument or a model it cannot drive, DeviceError for ``mode="capture"`` off CUDA.
    """

    def __init__(
        self,
        model: TorchModel,
        max_cache_len: int,
        *,
        mode: str = "capture",
        fuse: bool = False,
        attention: str = "sdpa",
        compile_mode: str = "default",
        compile_backend: str = "inductor",
        keep_logits: bool = True,
        warmup: int = 3,
    ):
        check_runner(model, max_cache_len, mode, attention, fuse)
        self.fused = fuse_modules(model, attention=attention) if fuse else {}
        super().__init__(model, max_cache_len, mode, compile_mode, compile_backend, keep_logits, warmup)

    def prefill(self, ids: Sequence[int]) -> torch.Tensor:
        """reset(), then feed the prompt uncaptured; returns its last logits [V] (float32, on device)."""
        n = len(ids)
        if n < 1:
            raise ConfigError("the prompt is empty: give at least one token")
        if n > self.max_cache_len:
            raise CapacityError(f"a prompt of {n} tokens does not fit max_cache_len={self.max_cache_len}")
        self.reset()
        with torch.inference_mode():
            logits = self._forward(torch.tensor([list(ids)], dtype=torch.long, device=self.model.device))
        return logits

    def start(self, ids: Sequence[int]) -> None:
        """prefill(ids), then feed its greedy token to the step: each replay from here decodes one more token."""
        first = self.prefill(ids).argmax()
        self.tok.copy_(first.view(1, 1))
        self.history[len(ids)] = first

    def decode_greedy(self, ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """The lean loop: start, then replay max_new_tokens - 1 steps with no host sync in between."""
        n_new = check_new_tokens(max_new_tokens)
        check_capacity(self.max_cache_len, positions_needed(len(ids), n_new))
        self.start(ids)
        for _ in range(n_new - 1):
            self.replay()
        out = self.history[len(ids) : len(ids) + n_new].tolist()  # one sync
        sync(self.model.device)
        return [int(t) for t in out]

    def generate(
        self,
        prompt: Any,
        *,
        max_new_tokens: int = 32,
        chat: bool = False,
        sampling: Sampling | None = None,
        stop_on_eos: bool = True,
        on_step: StepHook | Iterable[StepHook] | None = None,
    ) -> Generation:
        """kvlab's contract (records, hooks, sampling) over the graph: one replay and one host sync per token."""
        model, dev = self.model, self.model.device
        n_new = check_new_tokens(max_new_tokens)
        ids = model.encode(prompt, chat=chat)
        check_capacity(self.max_cache_len, positions_needed(len(ids), n_new))
        sampling = sampling or Sampling()
        if sampling.do_sample and not self.keep_logits:
            raise ConfigError("sampling needs the step's logits: build the GraphRunner with keep_logits=True")
        choose = sampling.chooser() if sampling.do_sample else None
        hooks, records, tokens = hook_list(on_step), [], []
        host_tok = torch.zeros((1, 1), dtype=torch.long, pin_memory=dev.type == "cuda")
        memory = CacheStep(live_bytes=sum(t.nbytes for t in KVWatch.tensors(self.cache)))
        position = 0
        while True:
            start = time.perf_counter()
            n = len(ids) if position == 0 else 1
            with AllocCounter(dev, cpu_proxy=False) as counter:
                token, run = self._token_step(ids if position == 0 else None, choose, host_tok)
            wall = (time.perf_counter() - start) * 1e3
            stop = finish_step(
                records,
                hooks,
                model,
                counter,
                tokens,
                position=position,
                n=n,
                token=token,
                wall=wall,
                run=run,
                memory=memory,
                n_new=n_new,
                stop_on_eos=stop_on_eos,
            )
            position += n
            if stop:
                break
        sync(dev)
        return generation(
            model, CacheSpec("static", self.max_cache_len, f"graph-{self.mode}"), ids, tokens, stop, records
        )

    def _token_step(
        self, prompt: Sequence[int] | None, choose: Callable[[Any], int] | None, host_tok: torch.Tensor
    ) -> tuple[int, float]:
        """One position of ``generate``: the prefill of ``prompt`` or, when it is None, one replay; then the token
        (sampled by ``choose`` from the logits, else greedy: the graph's own argmax after a replay) and the run's
        seconds to its sync. A token chosen on the host is copied into the step's input."""
        dev = self.model.device
        t0 = time.perf_counter()
        if prompt is not None:
            self.logits.copy_(self.prefill(prompt))
        else:
            self.replay()
        sync(dev)
        run = time.perf_counter() - t0
        if choose is not None:
            token = choose(self.logits.cpu().numpy())
        elif prompt is not None:
            token = int(self.logits.argmax().item())
        else:
            token = int(self.tok.item())  # the graph's own argmax
        if prompt is not None or choose is not None:  # greedy decode: the graph already fed its argmax
            host_tok[0, 0] = token
            self.tok.copy_(host_tok, non_blocking=True)
        return token, run


def check_runner(model: Any, max_cache_len: Any, mode: str, attention: str, fuse: bool) -> None:
    """GraphRunner's arguments: ConfigError for a bad one or a model it cannot drive, DeviceError for
    ``mode="capture"`` off CUDA."""
    if not isinstance(model, TorchModel):
        raise ConfigError(f"model must be a TorchModel (kvlab.pytorch.load(...)), got {model!r}")
    check_choice(mode, MODES, "mode=")
    attn = getattr(model.hf.config, "_attn_implementation", "sdpa")
    if attn not in (*ATTENTION, *(name for name, _ in DECODE_ATTENTION.values())):
        raise ConfigError(
            f"the model's attention implementation is {attn!r}; GraphRunner drives {ATTENTION} "
            "with a 4-D mask (load(..., attn_implementation='sdpa'))"
        )
    max_cache_len = check_int(max_cache_len, "max_cache_len", 2)
    ctx = getattr(model.config, "max_position_embeddings", None)
    if ctx and max_cache_len > ctx:
        raise ConfigError(f"max_cache_len={max_cache_len} exceeds the model's max_position_embeddings={ctx}")
    if mode == "capture" and model.device.type != "cuda":
        raise DeviceError(
            f"mode={mode!r} captures a CUDA graph but the model is on {model.device}; move it to "
            "'cuda' or use mode='eager'"
        )
    if attention != "sdpa" and not fuse:
        raise ConfigError(f"attention={attention!r} is one of fuse_modules' rewrites: pass fuse=True with it")
