"""What kvlab sees in a model, on one screen (``describe``: at most ``MAX_LINES`` lines of ``WIDTH`` columns): its
directory and decoder, each layer's cache kind and op, each graph input and who feeds it, which caches run it where and
why not (the ``judge`` set by ``kvlab.ort.checks.inspect``, which can see the caches), and what kvlab read but does not
apply."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ...core.cache_layout import ConvState, FullAttention, LayerSpec, LinearAttention, SharedKV, SlidingWindow
from .layers import ATTENTION_OPS, OPS

WIDTH = 100  # columns
MAX_LINES = 40
CACHES = ("dynamic", "static", "ring", "captured")
DEVICES = ("cpu", "webgpu")
FEEDS = {  # role -> what kvlab binds to it
    "input_ids": "kvlab: the token ids of the step",
    "attention_mask": "kvlab: ones over every position so far",
    "position_ids": "kvlab: the step's positions",
}


@dataclass(frozen=True)
class Verdict:
    """Whether ``cache`` ("dynamic", "static", "ring", "captured") runs the model on ``device`` ("cpu",
    "webgpu") with the installed ONNX Runtime package: ``why_not`` is "" when it does, else the reason."""

    cache: str
    device: str
    why_not: str = ""


# the judge of the caches: ModelInfo -> a Verdict per cache and device; set (assigned) by the room that holds the
# caches: kvlab.ort.checks.inspect
judge: Callable[[object], Iterable[Verdict]] | None = None


def _span(layers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    out: list[str] = []
    for i in layers:
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def cache_kind(layer: LayerSpec) -> str:
    """What a layer keeps between steps, in words: KV (full or a sliding window), a conv state, a recurrent
    state, or another layer's KV (shared)."""
    kind = layer.kind
    if isinstance(kind, SharedKV):
        return f"shared: layer {kind.source}'s KV" + (f" (window {kind.window})" if kind.window else "")
    if isinstance(kind, SlidingWindow):
        return f"KV, sliding window {kind.window}"
    if isinstance(kind, LinearAttention) and any(e.role == "conv" for e in layer.entries):
        return "conv + recurrent state"
    names = {FullAttention: "KV, full attention", LinearAttention: "recurrent state", ConvState: "conv state"}
    return names.get(type(kind), kind.name)


def _op(layer: LayerSpec) -> str:
    """The op a layer attends (or keeps its state) with: the attention node its KV reaches, where one does (an
    unfused attention: its Softmax), else the op that writes its cache."""
    if isinstance(layer.kind, SharedKV):
        return "GroupQueryAttention (borrows)"
    ops = list(dict.fromkeys(e.op for e in layer.entries))
    attention = [op for op in ops if op in ATTENTION_OPS or op in OPS]  # (OPS: those that keep a state too)
    names = {"Softmax": "MatMul + Softmax (unfused)"}
    return " + ".join(names.get(op, op) for op in attention or ops) or "?"


def _pattern(names: Iterable[str]) -> str:
    """Names that differ in one number -> one name with {a-b}: past_key_values.{0-3}.key."""
    names = list(names)
    found = [re.search(r"\d+", n) for n in names]
    if len(names) < 2 or not all(found):
        return ", ".join(names)
    stems = {n[: m.start()] + "#" + n[m.end() :] for n, m in zip(names, found)}
    if len(stems) != 1:
        return ", ".join(names[:2]) + ", ..."
    return next(iter(stems)).replace("#", "{" + _span(sorted(int(m.group()) for m in found)) + "}")


def _layers(info: object) -> list[str]:
    groups: dict[tuple[str, str, int], list[int]] = {}
    for layer in info.layout.layers:
        groups.setdefault((cache_kind(layer), _op(layer), layer.bytes_per_token), []).append(layer.index)
    rows = [f"layers ({info.num_layers}): cache kind / attention op / bytes a token"]
    for (kind, op, per_token), layers in groups.items():
        size = f"{per_token:,} B" if per_token else "none (fixed size)"
        rows.append(f"  {_span(layers):<12} {kind:<28} {op:<28} {size}")
    return rows


def _inputs(info: object) -> list[str]:
    rows = ["graph inputs: who feeds them"]
    for role, name in info.input_names.items():
        rows.append(f"  {name:<36} {FEEDS.get(role, 'kvlab')}")
    for name in info.unread_inputs:
        rows.append(f"  {name:<36} read by no node: left unbound")
    by_role: dict[str, list[str]] = {}
    for e in info.entries:
        by_role.setdefault(e.role, []).append(e.past)
    what = {"key": "the cache: past keys", "value": "the cache: past values"}
    for role, names in by_role.items():
        rows.append(f"  {_pattern(names):<36} {what.get(role, f'the cache: {role} states')}")
    return rows


def _caches(info: object, note_lines: int) -> list[str]:
    if judge is None:
        return ["caches: not judged here (import kvlab.ort: its caches say which run this model)"]
    verdicts = {(v.cache, v.device): v.why_not for v in judge(info)}
    reasons: dict[str, int] = {}  # why not -> its note's number
    rows = [f"caches       {DEVICES[0]:<30} {DEVICES[1]}"]
    for cache in CACHES:
        cells = []
        for device in DEVICES:
            why = verdicts.get((cache, device))
            if why:
                cells.append(f"no [{reasons.setdefault(why, len(reasons) + 1)}]")
            else:
                cells.append("runs" if why == "" else "?")
        rows.append(f"  {cache:<10} {cells[0]:<30} {cells[1]}")
    for why, i in reasons.items():
        wrapped = textwrap.wrap(f"[{i}] {why}", WIDTH - 2, max_lines=note_lines, placeholder=" ...")
        rows += [f"  {line}" for line in wrapped]
    return rows


def describe(info: object) -> str:
    """``info`` (a ModelInfo) as one screen of text: at most ``MAX_LINES`` lines, none over ``WIDTH`` columns.
    Reads nothing but ``info`` and the judge's verdicts (``judge``)."""
    layout = "onnxruntime-genai builder" if info.config_file == "genai_config.json" else "Hugging Face ONNX"
    path = str(info.path)
    if len(path) > WIDTH - 8:
        path = "..." + path[-(WIDTH - 11) :]
    head = [
        f"model {info.name} ({info.model_type}): a {layout} directory ({info.config_file})",
        f"  path {path}",
        f"  decoder {info.decoder_file}: {info.precision}",
        f"  {info.num_heads} query heads, {info.num_kv_heads} KV heads of {info.head_dim}, vocab {info.vocab_size}, "
        f"context {info.context_length}, EOS {list(info.eos_token_ids)}",
        "  tokenizer: tokenizer.json"
        if (info.path / "tokenizer.json").is_file()
        else "  tokenizer: none (no tokenizer.json): prompts as token ids only",
    ]
    notes = [f"  {line}" for n in info.notes for line in textwrap.wrap(n, WIDTH - 2)]
    body = [*head, *_layers(info), *_inputs(info)]
    for note_lines in (3, 2, 1):
        caches = _caches(info, note_lines)
        lines = [*body, *caches, *(["notes", *notes] if notes else [])]
        if len(lines) <= MAX_LINES:
            break
    lines = [line[:WIDTH] for line in lines[:MAX_LINES]]
    return "\n".join(lines)
