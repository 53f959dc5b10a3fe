"""kvlab's static-cache decode loop and onnxruntime-genai's, taken in turns, a block of steps each, in one process
(was ``kvlab profile lockstep``; ``data/record_gpu.sh lockstep`` runs it per cell).

    python data/kvlab-vs-genai-on-a-gpu/lockstep.py --model M[:P] --device webgpu --context C --new-tokens N
        --rounds R [--token-on-device WHERE] [--set KEY=VALUE ...] [--out FILE.json]

Why: on a GPU, whole runs of either loop can sit at one speed or another for reasons outside both loops, so a ratio
paired by round may compare two runs at different speeds. Here each block of one loop's steps is paired with the
other loop's block taken right before or after it (the order swapped every pair, so neither always goes first):
whatever slows the machine for a while slows both sides of a pair. The first quarter of each block is left out of
the pair's ratio: the first step after a switch carries the other loop's state on the shared device. With blocks of
one step every step is such a first step, so single-step turns misplace time between the loops even though two
loops of the same kind read alike: ``block=1`` is for that check, not for comparing kvlab with genai
(docs/benchmarks.md has the measurements).

Either side can be kvlab or genai: "kvlab" against "genai" is the measurement, "kvlab" against "kvlab" (two caches)
or "genai" against "genai" (two generators) checks that the pairing itself favours neither side.

Each loop runs as it does alone (``Loop`` below): kvlab's steps are ``generate()``'s (``Stepper.step`` on the
last token, the token chosen as ``token_on_device`` says, "auto" by default; with the token on the device, bursts of
``tokens_per_read`` steps read back together, ``Stepper.decode``), genai's are ``generate_next_token`` and
``get_next_tokens``. Each step is timed from the call to the token in hand (``time.perf_counter``: exact wall time of
the call; a burst's steps share its time). Each round starts both from their own prefill of the same prompt on the
same device (not timed); the tokens are compared.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np

from kvlab.bench.plan import prompt_ids
from kvlab.bench.results import write_recording
from kvlab.bench.variants import GenaiPeer
from kvlab.cli import flags
from kvlab.cli.commands import OneLineParser, command
from kvlab.core.cache import check_every_of, check_every_text
from kvlab.core.errors import ConfigError, check_choice, check_flag, check_int
from kvlab.core.generation import positions_needed
from kvlab.core.labels import read_back_text
from kvlab.ort import CapturedStaticCache, Model, StaticCache, Stepper, load, open_device
from kvlab.ort.checks.references import genai_generator
from kvlab.ort.decode.caches.captured import CAPTURED_REDUCTIONS
from kvlab.ort.decode.greedy import AUTO, reduction_of, tokens_per_read_for
from kvlab.ort.runtime.options import webgpu_options

SIDES = ("kvlab", "genai")


class Loop:
    """A decode loop taken in turns: ``step()`` decodes one token (``_advance``) and keeps its wall time (``ms``) and
    the calling thread's CPU time (``cpu_ms``: exact for that thread; work on the runtime's other threads is not
    in it). Where the two part, the thread waited (for the GPU, or for a core)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.ms: list[float] = []
        self.cpu_ms: list[float] = []

    def step(self) -> None:
        """One decode step, timed: its token, wall time and CPU time appended."""
        self._timed(lambda: [self._advance()])

    def _timed(self, advance: Callable[[], list[int]]) -> None:
        """Run ``advance`` (it decodes and returns tokens) and keep its tokens, each with an equal share of its
        wall and CPU time."""
        wall, cpu = time.perf_counter(), time.thread_time()
        tokens = advance()
        k = len(tokens)
        self.cpu_ms += [(time.thread_time() - cpu) * 1e3 / k] * k
        self.ms += [(time.perf_counter() - wall) * 1e3 / k] * k
        self.tokens += tokens

    def steps(self, n: int) -> None:
        """``n`` decode steps, one at a time."""
        for _ in range(n):
            self.step()

    def _advance(self) -> int:
        raise NotImplementedError


class KvlabLoop(Loop):
    """kvlab's loop on a new static cache: prefilled on entry. With ``per_read`` > 1 its steps run in bursts whose
    tokens are read back together (``Stepper.decode``, as ``generate`` runs them): each step of a burst is given
    the burst's wall and CPU time divided by its steps, the time per token."""

    def __init__(self, model: Model, dev: Any, ids: np.ndarray, reduction: str, cache: StaticCache, per_read: int):
        super().__init__()
        self.model, self.dev, self.ids, self.reduction, self.cache = model, dev, ids, reduction, cache
        self.per_read = per_read

    def __enter__(self) -> KvlabLoop:
        with ExitStack() as stack:
            stack.enter_context(self.cache)
            on_device = self.reduction or False
            self.stepper = stack.enter_context(
                Stepper(self.model, self.cache, self.dev, self.cache.max_cache_len, (), on_device, False, self.per_read)
            )
            _, first = self.stepper.step(self.ids, logits_out="none")  # the prefill, as generate() runs it
            self.tokens.append(first.token)
            self._close = stack.pop_all()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close.__exit__(*exc)

    def _advance(self) -> int:
        return self.stepper.step(np.array([self.tokens[-1]], np.int64), logits_out="none")[1].token

    def steps(self, n: int) -> None:
        """``n`` decode steps: one at a time, or in bursts of ``per_read`` read back together."""
        if self.per_read <= 1:
            super().steps(n)
            return
        for start in range(0, n, self.per_read):
            k = min(self.per_read, n - start)
            self._timed(lambda k=k: [r.token for r in self.stepper.decode(self.tokens[-1], k)])


class GenaiLoop(Loop):
    """onnxruntime-genai's loop: a generator prefilled on entry."""

    def __init__(self, peer: GenaiPeer, ids: np.ndarray, new: int):
        super().__init__()
        self.peer, self.ids, self.new = peer, ids, new

    def __enter__(self) -> GenaiLoop:
        self.gen = genai_generator(self.peer.model, self.ids, self.new)
        self.gen.generate_next_token()  # the first call samples the prefill's logits: no forward pass
        self.tokens.append(int(self.gen.get_next_tokens()[0]))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.gen = None

    def _advance(self) -> int:
        self.gen.generate_next_token()
        return int(self.gen.get_next_tokens()[0])


def prepare(
    model: Model | str,
    device: str = "webgpu",
    precision: str | None = None,
    context: int = 1024,
    new_tokens: int = 128,
    token_on_device: bool | str = AUTO,
    graph_capture: bool = False,
    check_every: int | None = None,
    block: int = 32,
    sides: tuple[str, str] = SIDES,
    buffer_cache_mode: str | None = None,
    validation_mode: str | None = None,
    tokens_per_read: int | str = AUTO,
) -> tuple[dict[str, Any], Callable[..., dict[str, Any]]]:
    """The two loops of ``lockstep`` set up (the arguments as it takes them): (what runs and its settings, a function
    running one round, ``stat`` summarizing each block's steps, the median by default, into that round's pairs). The
    device and genai's model open here; each round makes fresh loops and disposes of them. ConfigError for a bad
    setting."""
    _check(device, (context, new_tokens, block), token_on_device, graph_capture, sides)
    check_every_of(check_every)
    model = load(model, precision=precision, graph_capture=graph_capture)
    dev = open_device(device, buffer_cache_mode=buffer_cache_mode, validation_mode=validation_mode)
    make = CapturedStaticCache if graph_capture else StaticCache
    reduction = _reduction(make, token_on_device, model, dev)
    per_read = tokens_per_read_for(tokens_per_read, reduction, make)
    ids, genai_options = prompt_ids(model, context), webgpu_options(buffer_cache_mode, validation_mode)
    peer = GenaiPeer(model, device, True if graph_capture else None, genai_options) if "genai" in sides else None
    needed = positions_needed(len(ids), new_tokens)

    def side(name: str) -> KvlabLoop | GenaiLoop:
        if name == "genai":
            return GenaiLoop(peer, ids, new_tokens)
        return KvlabLoop(model, dev, ids, reduction, make(needed, check_every), max(per_read, 1))

    def one(stat: Callable[..., Any] = np.median) -> dict[str, Any]:
        return _round(side(sides[0]), side(sides[1]), new_tokens - 1, block, stat)

    settings = {"context": context, "new_tokens": new_tokens, "sides": list(sides), "block": block}
    settings |= {"left_out_per_block": block // 4, "graph_capture": graph_capture, "check_every": check_every}
    return {**_what_ran(model, dev, reduction, peer), "tokens_per_read": per_read, **settings}, one


def lockstep(
    model: Model | str,
    device: str = "webgpu",
    precision: str | None = None,
    context: int = 1024,
    new_tokens: int = 128,
    rounds: int = 3,
    **settings: Any,
) -> dict[str, Any]:
    """``rounds`` rounds of two decode loops (``sides``, each "kvlab" or "genai"; default kvlab's static cache and
    onnxruntime-genai) generating ``new_tokens`` tokens after the same ``context`` prompt tokens, ``block`` (32)
    steps each in turn. ``precision``: as ``load`` takes it, for a model given by name. ``settings`` (``prepare``'s):
    ``graph_capture`` (WebGPU): both captured (kvlab's ``CapturedStaticCache`` on the built-in model built for
    capture, genai with ``enableGraphCapture``; the token on the host, as ``generate`` chooses for a captured cache);
    ``check_every``: the static cache's (how often it reads back its presents' buffer identities);
    ``buffer_cache_mode``, ``validation_mode`` (WebGPU): both loops run in them (kvlab's device opened with them,
    DeviceError when it is open with others; genai's sessions given them), unset each its own default (genai: its
    genai_config.json's); ``token_on_device``, ``tokens_per_read``: kvlab's, as ``generate`` takes them.

    Returns the block pairs' ratios (first side / second side, each a median of its block's steps after the first
    quarter): their median, quartiles and share below 1, each round's median, both sides' median steps, every
    step's time, whether the tokens are equal, and what ran (model, device, adapter, runtime). ConfigError for a bad
    setting."""
    check_int(rounds, "rounds", 1)
    what, one = prepare(model, device, precision, context, new_tokens, **settings)
    return {**what, "rounds": rounds, **pair_rounds([one() for _ in range(rounds)])}


def _reduction(make: type[StaticCache], token_on_device: bool | str, model: Model, dev: Any) -> str:
    """The greedy graph's reduction kvlab's side runs ("" for the host): what the cache kind picks for "auto";
    ConfigError for one a captured step cannot run."""
    on_auto = isinstance(token_on_device, str) and token_on_device == AUTO
    reduction = make.auto_reduction(model.info.vocab_size, dev) if on_auto else reduction_of(token_on_device)
    if make is CapturedStaticCache and reduction not in ("", *CAPTURED_REDUCTIONS):
        raise ConfigError(
            f"token_on_device={reduction!r}: a captured step keeps the token on the device with "
            f"{' or '.join(map(repr, CAPTURED_REDUCTIONS))} (its ids stay int64), or chooses it on the host (False)"
        )
    return reduction


def _what_ran(model: Model, dev: Any, reduction: str, peer: GenaiPeer | None) -> dict[str, Any]:
    """The labels of a result: the model as built, the device, adapter and runtime, the token's path, genai's
    version."""
    return {
        "model": model.name,
        "weights": model.info.weights,
        "precision": model.info.dtype_name,  # the KV cache's
        "device": dev.name,
        "adapter": str(dev.label.adapter),  # its name and whether hardware or software
        "runtime": dev.label.runtime,
        "buffer_cache_mode": dev.label.buffer_cache_mode,  # kvlab's WebGPU device's (genai's too where asked for)
        "validation_mode": dev.label.validation_mode,  # kvlab's WebGPU device's
        "genai_options": peer.options if peer else {},  # WebGPU EP options genai ran with beyond its config's
        "token_on_device": bool(reduction),
        "greedy_reduction": reduction,
        "genai_version": peer.version if peer else "",
    }


def _check(
    device: str, counts: tuple[int, ...], token_on_device: bool | str, graph_capture: bool, sides: tuple[str, str]
) -> None:
    for name, value, least in zip(("context", "new_tokens", "block"), counts, (1, 3, 1)):
        check_int(value, name, least)
    check_flag("graph_capture", graph_capture)
    if not isinstance(sides, (tuple, list)) or len(sides) != 2:
        raise ConfigError(f"sides={sides!r} must be two of {SIDES}, e.g. ('kvlab', 'genai')")
    for s in sides:
        check_choice(s, SIDES, "sides: ")
    if graph_capture and device != "webgpu":
        raise ConfigError(f"graph_capture runs on webgpu, not on {device!r}")


def _round(
    a: KvlabLoop | GenaiLoop, b: KvlabLoop | GenaiLoop, steps: int, block: int, stat: Callable[..., Any] = np.median
) -> dict[str, Any]:
    """Both sides prefilled, then ``steps`` decode steps each, ``block`` at a time in turns; the ratio of each pair
    of blocks (``stat``, the median by default, of their steps after the first quarter)."""
    ratios = []
    with a, b:
        for pair, start in enumerate(range(0, steps, block)):
            n = min(block, steps - start)
            for side in (a, b) if pair % 2 == 0 else (b, a):
                side.steps(n)
            skip = n // 4
            ratios.append(stat(a.ms[start + skip : start + n]) / stat(b.ms[start + skip : start + n]))
    times = {"a_ms": a.ms, "b_ms": b.ms, "a_cpu_ms": a.cpu_ms, "b_cpu_ms": b.cpu_ms}
    return {"ratios": np.array(ratios), **times, "tokens_equal": a.tokens == b.tokens}


def pair_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The pairs of every round together: the ratios' median, quartiles and share below 1; per round its median
    ratio and both median steps; every step's time, and its calling thread's CPU time."""
    ratios = np.concatenate([r["ratios"] for r in rounds])
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    return {
        "pairs": int(ratios.size),
        "ratio_median": float(median),
        "ratio_quartiles": [float(q1), float(q3)],
        "below_one": float(np.mean(ratios < 1.0)),
        "round_medians": [float(np.median(r["ratios"])) for r in rounds],
        "first_step_ms": float(np.median(np.concatenate([r["a_ms"] for r in rounds]))),
        "second_step_ms": float(np.median(np.concatenate([r["b_ms"] for r in rounds]))),
        "round_steps_ms": [[float(np.median(r["a_ms"])), float(np.median(r["b_ms"]))] for r in rounds],
        "first_cpu_ms": float(np.median(np.concatenate([r["a_cpu_ms"] for r in rounds]))),
        "second_cpu_ms": float(np.median(np.concatenate([r["b_cpu_ms"] for r in rounds]))),
        "steps_ms": [[r["a_ms"], r["b_ms"]] for r in rounds],  # per round, each side's steps in order
        "steps_cpu_ms": [[r["a_cpu_ms"], r["b_cpu_ms"]] for r in rounds],  # the calling thread's CPU time
        "tokens_equal": all(r["tokens_equal"] for r in rounds),
    }


def summary(r: dict[str, Any]) -> str:
    """The result in a few lines, with its label."""
    a, b = r["sides"]
    token = f"the token on the device ({r['greedy_reduction']})" if r["token_on_device"] else "the token on the host"
    token += read_back_text(r["tokens_per_read"])
    cache = "captured static cache" if r["graph_capture"] else "static cache"
    peer = f"genai {r['genai_version']}" + (" captured" if r["graph_capture"] else "")
    names = {"kvlab": f"kvlab's {cache} ({check_every_text(r['check_every'])}, {token})", "genai": peer}
    q1, q3 = r["ratio_quartiles"]
    rounds = ", ".join(f"x{m:.3f}" for m in r["round_medians"])
    unit = "step pairs" if r["block"] == 1 else f"pairs of {r['block']}-step blocks"
    return (
        f"{a}/{b}, {r['pairs']} {unit} taken in turns: x{r['ratio_median']:.3f} (quartiles x{q1:.3f}-x{q3:.3f}; "
        f"{a} faster in {100 * r['below_one']:.0f}% of pairs); per round {rounds}\n"
        f"{a} step {r['first_step_ms']:.3f} ms, {b} step {r['second_step_ms']:.3f} ms (the calling thread's CPU time: "
        f"{a} {r['first_cpu_ms']:.3f} ms, {b} {r['second_cpu_ms']:.3f} ms); tokens equal: {r['tokens_equal']}\n"
        f"({r['model']}: {r['weights']} weights, {r['precision']} KV cache, on {r['device']} ({r['adapter']}, "
        f"{r['runtime']}{_mode(r)}); {' against '.join(names[s] for s in dict.fromkeys(r['sides']))}; context "
        f"{r['context']}, {r['new_tokens']} new tokens x {r['rounds']} rounds)"
    )


def _mode(r: dict[str, Any]) -> str:
    """ ", buffer cache mode M, validation mode V (genai: W)" where kvlab's device has WebGPU modes."""
    mode = f", buffer cache mode {r['buffer_cache_mode']}" if r["buffer_cache_mode"] else ""
    if r["validation_mode"]:
        genai = r["genai_options"].get("validationMode", "its config's")
        mode += f", validation mode {r['validation_mode']} (genai: {genai})"
    return mode


# --set KEY=VALUE: lockstep's keywords beyond the flags, and how each value is read
SETTINGS = {
    "block": flags.positive_int,  # steps each loop takes per turn (default 32)
    "sides": lambda text: tuple(text.split(",")),  # the two loops (default kvlab,genai)
    "check_every": flags.positive_int,  # the static cache reads back all its presents every k steps
    "tokens_per_read": flags.positive_int,  # kvlab's greedy steps read back together
    "buffer_cache_mode": flags.nonempty,  # WebGPU: the storage buffer cache mode both loops run in
    "validation_mode": flags.nonempty,  # WebGPU: the validation mode both loops run in
    "graph_capture": flags.ON_OFF.__getitem__,  # WebGPU: both captured (CapturedStaticCache; genai enableGraphCapture)
}


def parser() -> argparse.ArgumentParser:
    """The command line (module docstring), parsed as ``kvlab``'s commands are: a bad flag is one line, exit 2."""
    p = OneLineParser(prog="lockstep.py", description=__doc__.split("\n\n")[0])
    flags.model(p)
    flags.device(p)
    flags.counts(
        p,
        context=(256, "prompt tokens before the decode steps"),
        new_tokens=(16, "tokens decoded (the first decode step is left out)"),
        rounds=(3, "rounds of both loops"),
    )
    flags.token_on_device(p)
    flags.settings(p, "lockstep()", SETTINGS)
    flags.out(p, None, "also write the result as JSON")
    p.set_defaults(run=run_command)
    return p


def run_command(args: argparse.Namespace) -> int:
    """``lockstep``'s summary for the parsed flags (and its result as JSON with ``--out``); returns 0."""
    name, precision = flags.one_model(args.model, "lockstep")
    r = lockstep(
        name,
        args.device,
        precision,
        args.context,
        args.new_tokens,
        args.rounds,
        token_on_device=flags.WHERE[args.token_on_device],
        **flags.key_values(args.set, "--set", SETTINGS),
    )
    print(summary(r))
    if args.out:
        write_recording(args.out, r, note="not measured by lockstep.py")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv``: every failure one line on stderr and an exit status, as ``kvlab``'s."""
    return command(parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
