"""Every bad input we tried, and the error it gets: the table in docs/reliability.md ("Bad inputs and their errors") is
rendered from ``CASES`` below, and each row is run here. A row passes when kvlab raises the row's error class (a
CLI row: exits with its code and prints exactly one line), the message holds the row's fragment (which names the
bad value or what would be valid), and no device tensor is left alive. Regenerate the docs table with
``python tests/test_bad_inputs.py``."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvlab
from kvlab import Conversation, DynamicCache, Sampling, StaticCache, Stepper, generate, load, open_device
from kvlab.lab import memory
from kvlab.ort import close_device, make_cache
from kvlab.ort.runtime.device import private_device
from kvlab.presets import check_precision, recipe
from kvlab.web.job import make_job

ROOT = Path(__file__).resolve().parents[1]
TABLE_PAGE = ROOT / "docs" / "reliability.md"  # the page that shows the table
MARK_START, MARK_END = "<!-- bad-inputs:start -->", "<!-- bad-inputs:end -->"


@dataclass(frozen=True)
class Case:
    area: str  # what kind of input
    what: str  # the bad input, as a user would write it
    error: str  # the kvlab error class, or "exit N" for the command line
    says: str  # a fragment of the message (it names the value or what is valid)
    run: Callable[[Env], Any]


class Env:
    """What the rows need: the toy model, broken copies of its directory, the CLI in-process."""

    def __init__(self, toy: kvlab.Model, tmp: Path, capsys: Any):
        self.toy, self.tmp, self._capsys = toy, tmp, capsys

    def model_dir(self, edit: Callable[[Path], None]) -> Path:
        """A copy of the toy's directory (its graph linked, not copied), changed by ``edit``."""
        out = self.tmp / "model"
        out.mkdir()
        for f in self.toy.info.path.iterdir():
            if f.name.startswith("model.onnx"):
                (out / f.name).symlink_to(f)
            else:
                shutil.copy(f, out / f.name)
        edit(out)
        return out

    def cli(self, *argv: str) -> tuple[int, str]:
        from kvlab.cli import main

        self._capsys.readouterr()
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse exits
            rc = exc.code
        return rc, self._capsys.readouterr().err


def genai(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        cfg = json.loads((d / "genai_config.json").read_text())
        edit(cfg["model"])
        (d / "genai_config.json").write_text(json.dumps(cfg))

    return change


def write(name: str, text: str | bytes) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())

    return change


def token_id_moved(token_id: int) -> Callable[[Path], None]:
    """An edit: in tokenizer.json's vocabulary, the token of the highest id gets id ``token_id`` instead."""

    def edit(d: Path) -> None:
        tok = json.loads((d / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        vocab[max(vocab, key=vocab.get)] = token_id
        (d / "tokenizer.json").write_text(json.dumps(tok))

    return edit


def remove(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).unlink()


def chat_with(template: str) -> Callable[[Env], Any]:
    return lambda e: generate(
        load(e.model_dir(write("chat_template.jinja", template))), "hi", chat=True, max_new_tokens=1
    )


def gen(**kw: Any) -> Callable[[Env], Any]:
    kw.setdefault("max_new_tokens", 2)
    prompt = kw.pop("prompt", [1, 2, 3])
    return lambda e: generate(e.toy, prompt, **kw)


def nested_use(e: Env) -> None:
    with StaticCache(16) as cache, Stepper(e.toy, cache, "cpu", 8), Stepper(e.toy, cache, "cpu", 8):
        pass


def disposed(e: Env) -> None:
    cache = StaticCache(16)
    cache.dispose()
    generate(e.toy, [1, 2], cache=cache, max_new_tokens=1)


def step(ids: Any, positions: int = 8, **kw: Any) -> Callable[[Env], Any]:
    def run(e: Env) -> None:
        with DynamicCache() as cache, Stepper(e.toy, cache, "cpu", positions) as s:
            s.step([1, 2])
            s.step(ids, **kw)

    return run


def existing(e: Env) -> Path:
    f = e.tmp / "results"
    f.write_text("kept")
    return f


def prompt_file(content: bytes | None) -> Callable[[Env], Any]:
    def run(e: Env) -> tuple[int, str]:
        f = e.tmp / "prompt.txt"
        if content is not None:
            f.write_bytes(content)
        return e.cli("generate", "--prompt-file", str(f), "--max-new-tokens", "1")

    return run


def deep(opening: str, inner: str, closing: str) -> Callable[[Path], None]:
    """A genai_config.json nested 100,000 levels deep (Python's JSON reader recurses per level)."""
    return write("genai_config.json", opening * 100_000 + inner + closing * 100_000)


def unreadable(e: Env) -> None:
    if os.geteuid() == 0:  # root reads a file of any mode: no honest way to make it unreadable here
        pytest.skip("running as root, which can read a file of mode 000")
    load(e.model_dir(lambda d: (d / "genai_config.json").chmod(0)))


def conversation(act: Callable[[Conversation], Any], closed: bool = False) -> Callable[[Env], Any]:
    def run(e: Env) -> None:
        c = Conversation(e.toy)
        try:
            if closed:
                c.close()
            act(c)
        finally:
            c.close()

    return run


def stepper(act: Callable[[Stepper], Any]) -> Callable[[Env], Any]:
    def run(e: Env) -> None:
        with DynamicCache() as cache:
            act(Stepper(e.toy, cache, "cpu", 8))

    return run


def after_its_block(s: Stepper) -> None:
    with s:
        s.step([1])
    s.step([2])


def entered_twice(s: Stepper) -> None:
    with s, s:
        pass


def with_cache_dir(value: str, act: Callable[[Env], Any]) -> Callable[[Env], Any]:
    """``act`` with $KVLAB_CACHE_DIR set to ``value`` (put back after)."""

    def run(e: Env) -> Any:
        old = os.environ.get("KVLAB_CACHE_DIR")
        os.environ["KVLAB_CACHE_DIR"] = value
        try:
            return act(e)
        finally:
            if old is None:
                del os.environ["KVLAB_CACHE_DIR"]
            else:
                os.environ["KVLAB_CACHE_DIR"] = old

    return run


def files_changed_after_load(e: Env) -> None:
    """A copy of the toy, loaded, then its weights file touched (modified, same size and inode), then used."""
    folder = e.tmp / "copied"
    shutil.copytree(e.toy.info.path, folder, ignore=lambda d, names: [n for n in names if ".kvlab-" in n])
    model = load(folder)
    os.utime(folder / "model.onnx.data", ns=(1, 10**18))
    generate(model, [1, 2, 3], max_new_tokens=2)


def cli(*argv: str) -> Callable[[Env], Any]:
    return lambda e: e.cli(*argv)


CASES = [
    # model directories and their configs
    Case("model", 'load("nope")', "ModelError", "neither a built-in name", lambda e: load("nope")),
    Case(
        "model",
        'load("toy", precision="int8")',
        "ConfigError",
        "choose one of ('fp32', 'fp16', 'int4')",
        lambda e: load("toy", precision="int8"),
    ),
    Case(
        "model",
        "a directory without genai_config.json",
        "ModelError",
        "has no genai_config.json",
        lambda e: load(e.model_dir(remove("genai_config.json"))),
    ),
    Case(
        "model",
        "genai_config.json that is not JSON",
        "ModelError",
        "is not valid JSON",
        lambda e: load(e.model_dir(write("genai_config.json", "{model: "))),
    ),
    Case(
        "model",
        "genai_config.json holding a list",
        "ModelError",
        "must hold a JSON object, not list",
        lambda e: load(e.model_dir(write("genai_config.json", "[1, 2]"))),
    ),
    Case(
        "model",
        'num_hidden_layers: "two"',
        "ModelError",
        "'model.decoder.num_hidden_layers' is 'two'",
        lambda e: load(e.model_dir(genai(lambda m: m["decoder"].update(num_hidden_layers="two")))),
    ),
    Case(
        "model",
        "num_hidden_layers: 2.5",
        "ModelError",
        "is 2.5; it must be a non-negative integer",
        lambda e: load(e.model_dir(genai(lambda m: m["decoder"].update(num_hidden_layers=2.5)))),
    ),
    Case(
        "model",
        "num_key_value_heads that disagrees with the graph",
        "ModelError",
        "num_key_value_heads = 4",
        lambda e: load(e.model_dir(genai(lambda m: m["decoder"].update(num_key_value_heads=4)))),
    ),
    Case(
        "model",
        "head_size that disagrees with the graph",
        "ModelError",
        "head_size = 32",
        lambda e: load(e.model_dir(genai(lambda m: m["decoder"].update(head_size=32)))),
    ),
    Case(
        "model",
        "vocab_size that disagrees with the graph",
        "ModelError",
        "vocab_size = 1000",
        lambda e: load(e.model_dir(genai(lambda m: m.update(vocab_size=1000)))),
    ),
    Case(
        "model",
        "context_length longer than the rotary table",
        "ModelError",
        "context_length = 8192",
        lambda e: load(e.model_dir(genai(lambda m: m.update(context_length=8192)))),
    ),
    Case(
        "model",
        "a decoder filename that is missing",
        "ModelError",
        "'other.onnx' named in",
        lambda e: load(e.model_dir(genai(lambda m: m["decoder"].update(filename="other.onnx")))),
    ),
    Case(
        "model",
        'eos_token_id: "x"',
        "ModelError",
        "eos_token_id 'x' must be an integer",
        lambda e: load(e.model_dir(genai(lambda m: m.update(eos_token_id="x")))),
    ),
    Case(
        "model",
        "past_key_names without %d",
        "ModelError",
        "must hold one %d",
        lambda e: load(e.model_dir(genai(lambda m: m["decoder"]["inputs"].update(past_key_names="past.key")))),
    ),
    Case(
        "model",
        "config.json but no model.onnx (an Optimum layout, incomplete)",
        "ModelError",
        "has a config.json but no onnx/model.onnx",
        lambda e: load(
            e.model_dir(
                lambda d: (
                    remove("genai_config.json")(d),
                    remove("model.onnx")(d),
                    write("config.json", '{"model_type": "llama"}')(d),
                )
            )
        ),
    ),
    # tokenizers and chat templates
    Case(
        "tokenizer",
        "a text prompt for a model without tokenizer.json",
        "ModelError",
        "holds no tokenizer.json), so the text",
        lambda e: generate(load(e.model_dir(remove("tokenizer.json"))), "hello", max_new_tokens=1),
    ),
    Case(
        "tokenizer",
        "a corrupt tokenizer.json",
        "ModelError",
        "could not be read by the tokenizers library",
        lambda e: load(e.model_dir(write("tokenizer.json", '{"model": 3'))),
    ),
    Case(
        "tokenizer",
        "a tokenizer.json whose vocabulary has an id past the model's",
        "ModelError",
        "maps tokens to ids up to 100000, past this model's vocabulary of 512",
        lambda e: load(e.model_dir(token_id_moved(100_000))),
    ),
    Case(
        "tokenizer",
        "tokenizer.json of the wrong structure",
        "ModelError",
        "must be a Hugging Face tokenizer",
        lambda e: load(e.model_dir(write("tokenizer.json", '{"model": 3}'))),
    ),
    Case(
        "tokenizer",
        "a chat template with a syntax error",
        "ModelError",
        "chat template of model",
        chat_with("{% for m in messages %}{{ m['content'] }"),
    ),
    Case(
        "tokenizer",
        "a chat template that fails while rendering",
        "ModelError",
        "failed while rendering",
        chat_with("{{ messages[0]['content'].nosuch() }}"),
    ),
    Case(
        "tokenizer",
        "a chat template that raises (raise_exception)",
        "ConfigError",
        "chat template error: system role not supported",
        chat_with("{{ raise_exception('system role not supported') }}"),
    ),
    Case(
        "tokenizer",
        "tokenizer_config.json that is not JSON (no .jinja beside it)",
        "ModelError",
        "is not a JSON object",
        lambda e: generate(
            load(e.model_dir(lambda d: (remove("chat_template.jinja")(d), write("tokenizer_config.json", "{oops")(d)))),
            "hi",
            chat=True,
            max_new_tokens=1,
        ),
    ),
    Case(
        "tokenizer",
        "chat=True on a model without a chat template",
        "ModelError",
        "has no chat template",
        lambda e: generate(
            load(e.model_dir(lambda d: (remove("chat_template.jinja")(d), write("tokenizer_config.json", "{}")(d)))),
            "hi",
            chat=True,
            max_new_tokens=1,
        ),
    ),
    # prompts and token ids
    Case("prompt", 'generate(model, "")', "ConfigError", "the prompt is empty", gen(prompt="")),
    Case(
        "prompt",
        "bytes instead of text",
        "ConfigError",
        "prompt must be text, chat messages or token ids",
        gen(prompt=b"hello"),
    ),
    Case(
        "prompt",
        "text the tokenizer refuses (a lone surrogate)",
        "ConfigError",
        "refused the text",
        gen(prompt="ok \ud800"),
    ),
    Case("prompt", "token id -1", "ConfigError", "token id -1 is outside the vocabulary [0, 512)", gen(prompt=[-1])),
    Case(
        "prompt", "token id 100000 (vocabulary 512)", "ConfigError", "token id 100000 is outside", gen(prompt=[100000])
    ),
    Case("prompt", "token ids [1.7, 2.2]", "ConfigError", "must be a 1-D list of ints", gen(prompt=[1.7, 2.2])),
    Case(
        "prompt",
        "a chat message without a role",
        "ConfigError",
        "must be a dict with 'role' and 'content'",
        gen(prompt=[{"content": "hi"}]),
    ),
    Case("prompt", 'chat="yes"', "ConfigError", "chat='yes' must be True or False", gen(chat="yes")),
    Case("prompt", "Stepper.step([-1])", "ConfigError", "token id -1 is outside", step([-1])),
    Case("prompt", "Stepper.step([1.7, 2.2])", "ConfigError", "must be a 1-D list of ints", step([1.7, 2.2])),
    Case(
        "prompt",
        "Stepper.step past the positions it was opened for",
        "ConfigError",
        "exceeds the 3 positions this stepper was opened for",
        step([3, 4], positions=3),
    ),
    Case(
        "prompt",
        'Stepper.step(ids, logits_out="some")',
        "ConfigError",
        "logits_out='some' is not valid",
        step([3], logits_out="some"),
    ),
    Case(
        "prompt",
        "Stepper(model, cache, device, positions=0)",
        "ConfigError",
        "positions=0 must be a positive int",
        lambda e: Stepper(e.toy, DynamicCache(), "cpu", 0),
    ),
    # caches
    Case("cache", "StaticCache(0)", "ConfigError", "max_cache_len=0 must be a positive int", lambda e: StaticCache(0)),
    Case(
        "cache",
        "DynamicCache(max_cache_len=5)",
        "ConfigError",
        "a dynamic cache grows with the sequence and has no size",
        lambda e: DynamicCache(max_cache_len=5),
    ),
    Case(
        "model",
        'load("toy", progress="yes")',
        "ConfigError",
        "progress='yes' must be True or False",
        lambda e: load("toy", progress="yes"),
    ),  # fmt: skip
    Case(
        "cache",
        'StaticCache("8")',
        "ConfigError",
        "max_cache_len='8' must be a positive int",
        lambda e: StaticCache("8"),
    ),
    Case(
        "cache",
        "StaticCache(8192) on a 4096-token model",
        "ConfigError",
        "larger than model toy's context",
        gen(cache=StaticCache(8192)),
    ),
    Case(
        "cache",
        "StaticCache(4) for a 3-token prompt + 5 tokens",
        "CapacityError",
        "7 positions are needed but max_cache_len is 4",
        gen(cache=StaticCache(4), max_new_tokens=5),
    ),
    Case(
        "cache",
        "DynamicCache past the context length (5,000 new tokens)",
        "CapacityError",
        "holds at most 4096 (its context length",
        gen(cache=DynamicCache(), max_new_tokens=5000),
    ),
    *[
        Case(
            "cache",
            f"max_new_tokens={text} (refused before anything sized by it is allocated)",
            "CapacityError",
            f"{n + 2} positions are needed but model toy holds at most 4096",
            gen(cache=StaticCache(64), max_new_tokens=n),
        )
        for text, n in (("5 * 10**8", 5 * 10**8), ("10**10", 10**10), ("10**30", 10**30))
    ],
    Case("cache", 'cache="static"', "ConfigError", "cache must be a kvlab cache", gen(cache="static")),
    Case(
        "cache",
        "one cache in two generations at once",
        "CacheStateError",
        "serves one generation at a time",
        nested_use,
    ),
    Case("cache", "a cache used after dispose()", "CacheStateError", "was disposed; create a new one", disposed),
    # sampling
    Case(
        "sampling",
        'Sampling(do_sample="no")',
        "ConfigError",
        "do_sample='no' must be True or False",
        lambda e: Sampling(do_sample="no"),
    ),
    Case(
        "sampling",
        "Sampling(temperature=0)",
        "ConfigError",
        "temperature=0 must be a finite number > 0",
        lambda e: Sampling(temperature=0),
    ),
    Case(
        "sampling",
        'Sampling(temperature=float("nan"))',
        "ConfigError",
        "temperature=nan must be a finite",
        lambda e: Sampling(temperature=float("nan")),
    ),
    Case(
        "sampling",
        'Sampling(temperature=float("inf"))',
        "ConfigError",
        "temperature=inf must be a finite",
        lambda e: Sampling(temperature=float("inf")),
    ),
    Case("sampling", "Sampling(top_k=-1)", "ConfigError", "top_k=-1 must be an int >= 0", lambda e: Sampling(top_k=-1)),
    Case(
        "sampling",
        "top_k=100000 on a 512-token vocabulary",
        "ConfigError",
        "top_k=100000 is larger than the vocabulary (512 tokens)",
        gen(sampling=Sampling(do_sample=True, top_k=100000)),
    ),
    Case(
        "sampling", "Sampling(top_p=1.5)", "ConfigError", "top_p=1.5 must be in (0, 1]", lambda e: Sampling(top_p=1.5)
    ),
    Case(
        "sampling",
        "Sampling(seed=-1)",
        "ConfigError",
        "seed=-1 must be an int >= 0 (or None)",
        lambda e: Sampling(seed=-1),
    ),
    Case(
        "sampling",
        "Sampling(seed=1.5)",
        "ConfigError",
        "seed=1.5 must be an int >= 0 (or None)",
        lambda e: Sampling(seed=1.5),
    ),
    Case(
        "sampling",
        'sampling={"do_sample": True}',
        "ConfigError",
        "sampling must be a kvlab.Sampling",
        gen(sampling={"do_sample": True}),
    ),
    # generation options
    Case("option", "max_new_tokens=0", "ConfigError", "max_new_tokens=0 must be a positive int", gen(max_new_tokens=0)),
    Case(
        "option",
        "max_new_tokens=2.5",
        "ConfigError",
        "max_new_tokens=2.5 must be a positive int",
        gen(max_new_tokens=2.5),
    ),
    Case("option", 'stop_on_eos="no"', "ConfigError", "stop_on_eos='no' must be True or False", gen(stop_on_eos="no")),
    Case("option", "on_step=[3] (not callable)", "ConfigError", "3", gen(on_step=[3])),
    Case(
        "option",
        "prefill_model without a prefill_device",
        "ConfigError",
        "prefill_model needs a prefill_device",
        gen(prefill_model="toy"),
    ),
    # devices
    Case(
        "device",
        'open_device("tpu")',
        "ConfigError",
        "device 'tpu' is not valid; choose one of",
        lambda e: open_device("tpu"),
    ),
    Case(
        "device",
        'buffer_cache_mode="huge"',
        "ConfigError",
        "buffer cache mode 'huge' is not valid",
        lambda e: open_device("webgpu", buffer_cache_mode="huge"),
    ),
    Case(
        "device",
        'open_device("cpu", spinning="no")',
        "ConfigError",
        "spinning='no' must be True or False",
        lambda e: open_device("cpu", spinning="no"),
    ),
    Case(
        "device",
        'open_device("cpu", threads=0)',
        "ConfigError",
        "threads=0 must be an int from 1 to",
        lambda e: open_device("cpu", threads=0),
    ),
    Case(
        "device",
        'open_device("cpu", threads=4096) (more threads than logical CPUs)',
        "ConfigError",
        "threads=4096 must be an int from 1 to",
        lambda e: open_device("cpu", threads=4096),
    ),
    Case(
        "device",
        'open_device("cpu", threads=10**6)',
        "ConfigError",
        "threads=1000000 must be an int from 1 to",
        lambda e: open_device("cpu", threads=10**6),
    ),
    Case(
        "device",
        'open_device("cpu", threads="4")',
        "ConfigError",
        "threads='4' must be an int from 1 to",
        lambda e: open_device("cpu", threads="4"),
    ),
    Case(
        "device",
        'private_device("cpu", threads=4096)',
        "ConfigError",
        "threads=4096 must be an int from 1 to",
        lambda e: private_device("cpu", threads=4096),
    ),
    Case(
        "device",
        'open_device("webgpu", threads=2)',
        "ConfigError",
        "apply to device 'cpu' only",
        lambda e: open_device("webgpu", threads=2),
    ),
    Case(
        "prompt",
        "token ids [[1, 2], [3]] (ragged)",
        "ConfigError",
        "token ids must be a 1-D list of ints",
        gen(prompt=[[1, 2], [3]]),
    ),
    Case("prompt", "token id 10**30", "ConfigError", "must be a 1-D list of ints", gen(prompt=[10**30])),
    Case(
        "prompt",
        "chat=True with token ids (the flag would be ignored)",
        "ConfigError",
        "chat=True applies to text or chat messages",
        gen(chat=True),
    ),
    Case(
        "prompt",
        "token ids of shape (2, 2) (a batch)",
        "ConfigError",
        "batch size 2 is not supported",
        gen(prompt=[[1, 2], [3, 4]]),
    ),
    Case(
        "prompt",
        "an empty list of token ids",
        "ConfigError",
        "prompt must be text, chat messages or token ids",
        gen(prompt=[]),
    ),
    Case(
        "sampling",
        "Sampling(temperature=5e-324) (subnormal: NaN probabilities)",
        "ConfigError",
        "temperature=5e-324 is below 1e-06",
        lambda e: Sampling(do_sample=True, temperature=5e-324),
    ),
    Case(
        "sampling",
        "Sampling(temperature=1e-9)",
        "ConfigError",
        "temperature=1e-09 is below",
        lambda e: Sampling(temperature=1e-9),
    ),
    Case(
        "sampling", 'Sampling(top_k="3")', "ConfigError", "top_k='3' must be an int >= 0", lambda e: Sampling(top_k="3")
    ),
    Case(
        "sampling",
        'Sampling(top_p=float("nan"))',
        "ConfigError",
        "top_p=nan must be in (0, 1]",
        lambda e: Sampling(top_p=float("nan")),
    ),
    Case(
        "sampling",
        "Sampling(temperature=True)",
        "ConfigError",
        "temperature=True must be a finite number",
        lambda e: Sampling(temperature=True),
    ),
    Case(
        "option",
        "max_new_tokens=1e30",
        "ConfigError",
        "max_new_tokens=1e+30 must be a positive int",
        gen(max_new_tokens=1e30),
    ),
    Case(
        "option",
        "max_new_tokens=True",
        "ConfigError",
        "max_new_tokens=True must be a positive int",
        gen(max_new_tokens=True),
    ),
    Case("option", "device=3", "ConfigError", "device 3 is not valid", gen(device=3)),
    Case("model", "load(3)", "ConfigError", "model must be a name", lambda e: load(3)),
    Case(
        "cache",
        "StaticCache(10**30) on a 4096-token model",
        "ConfigError",
        "larger than model toy's context",
        gen(cache=StaticCache(10**30)),
    ),
    Case(
        "device",
        'close_device("tpu") (an unknown name)',
        "ConfigError",
        "device 'tpu' is not valid",
        lambda e: kvlab.close_device("tpu"),
    ),
    Case(
        "device",
        'buffer_cache_mode="" (empty)',
        "ConfigError",
        "buffer cache mode '' is not valid",
        lambda e: open_device("webgpu", buffer_cache_mode=""),
    ),
    Case(
        "device",
        'open_device("webgpu", huge_pages=False) (a CPU-only option)',
        "ConfigError",
        "apply to device 'cpu' only",
        lambda e: open_device("webgpu", huge_pages=False),
    ),
    Case(
        "device",
        'validation_mode="none"',
        "ConfigError",
        "validation mode 'none' is not valid",
        lambda e: open_device("webgpu", validation_mode="none"),
    ),
    # the command line (in-process; one line on stderr)
    Case(
        "CLI",
        "kvlab bench --set prefill_on=tpu",
        "exit 2",
        "--set 'prefill_on=tpu': 'tpu' is not a valid prefill_on",
        lambda e: e.cli("bench", "--set", "prefill_on=tpu", "--models", "toy"),
    ),
    Case(
        "CLI",
        "kvlab profile ops --rounds 2 (a flag of phases)",
        "exit 2",
        "unrecognized arguments: --rounds",
        lambda e: e.cli("profile", "ops", "--model", "toy", "--rounds", "2"),
    ),
    Case(
        "CLI",
        "kvlab profile --model toy (no mode: the form before 0.1.0)",
        "exit 2",
        "argument MODE: invalid choice: 'toy' (choose from 'ops', 'phases')",
        lambda e: e.cli("profile", "--model", "toy"),
    ),
    Case(
        "CLI",
        "kvlab generate --cache static,static",
        "exit 2",
        "names a cache twice",
        lambda e: e.cli("generate", "--model", "toy", "--cache", "static,static"),
    ),
    Case(
        "CLI",
        "kvlab profile phases --set graph_capture=on (a setting of lockstep.py)",
        "exit 2",
        "unrecognized arguments: --set graph_capture=on",
        lambda e: e.cli("profile", "phases", "--model", "toy", "--set", "graph_capture=on"),
    ),
    Case(
        "CLI",
        "kvlab generate --device-option buffer_cache_mode=simple on the CPU",
        "exit 2",
        "buffer_cache_mode and validation_mode apply to device 'webgpu' only, not 'cpu'",
        lambda e: e.cli("generate", "--model", "toy", "--device-option", "buffer_cache_mode=simple"),
    ),
    Case(
        "CLI",
        "kvlab generate --device-option colour=blue",
        "exit 2",
        "--device-option 'colour=blue': give KEY=VALUE with KEY one of threads",
        lambda e: e.cli("generate", "--model", "toy", "--device-option", "colour=blue"),
    ),
    Case(
        "CLI",
        "kvlab profile phases --token-on-device sideways",
        "exit 2",
        "argument --token-on-device: invalid choice: 'sideways'",
        lambda e: e.cli("profile", "phases", "--model", "toy", "--token-on-device", "sideways"),
    ),
    Case(
        "CLI",
        "kvlab generate --device webgpu --device-option threads=1",
        "exit 2",
        "threads, spinning and huge_pages apply to device 'cpu' only, not 'webgpu'",
        lambda e: e.cli("generate", "--model", "toy", "--device", "webgpu", "--device-option", "threads=1"),
    ),
    Case(
        "CLI",
        "kvlab generate --device tpu",
        "exit 2",
        "invalid choice: 'tpu'",
        lambda e: e.cli("generate", "--device", "tpu"),
    ),
    Case(
        "CLI",
        "kvlab generate --max-new-tokens x",
        "exit 2",
        "argument --max-new-tokens: 'x' is not an int",
        lambda e: e.cli("generate", "--max-new-tokens", "x"),
    ),
    Case(
        "CLI",
        "kvlab generate --model toy:int8",
        "exit 2",
        "precision 'int8' is not valid",
        lambda e: e.cli("generate", "--model", "toy:int8"),
    ),
    Case("CLI", "kvlab frobnicate", "exit 2", "invalid choice: 'frobnicate'", lambda e: e.cli("frobnicate")),
    Case(
        "CLI",
        "kvlab generate --max-new-tokens 0",
        "exit 2",
        "argument --max-new-tokens: 0 must be >= 1",
        lambda e: e.cli("generate", "--max-new-tokens", "0"),
    ),
    Case(
        "CLI",
        "kvlab generate --cache dynamic@64",
        "exit 2",
        "cache 'dynamic@64' is not valid; choose dynamic, static, static@N, graph or graph@N",
        lambda e: e.cli("generate", "--cache", "dynamic@64"),
    ),
    Case(
        "CLI",
        "kvlab generate --model nope",
        "exit 2",
        "neither a built-in name",
        lambda e: e.cli("generate", "--model", "nope"),
    ),
    Case("CLI", "kvlab generate --prompt-file missing.txt", "exit 2", "No such file or directory", prompt_file(None)),
    Case(
        "CLI",
        "kvlab generate --prompt-file (Latin-1 bytes)",
        "exit 2",
        "is not UTF-8 text (byte 3",
        prompt_file(b"caf\xe9 au lait"),
    ),
    Case(
        "CLI",
        "kvlab generate ''",
        "exit 2",
        "the prompt is empty",
        lambda e: e.cli("generate", ""),
    ),
    Case(
        "CLI",
        "kvlab generate --cache static@4 hi --max-new-tokens 8",
        "exit 2",
        "--cache static@4 holds 4 positions; this run needs",
        lambda e: e.cli("generate", "--cache", "static@4", "hi", "--max-new-tokens", "8"),
    ),
    Case(
        "CLI",
        "kvlab generate --sample top_p=2",
        "exit 2",
        "top_p=2.0 must be in (0, 1]",
        lambda e: e.cli("generate", "--sample", "top_p=2"),
    ),
    Case(
        "CLI",
        "kvlab generate --sample seed=-3",
        "exit 2",
        "seed=-3 must be an int >= 0 (or None)",
        lambda e: e.cli("generate", "--sample", "seed=-3"),
    ),
    Case(
        "CLI",
        "kvlab generate --device-option threads=4096",
        "exit 2",
        "threads=4096 must be an int from 1 to",
        lambda e: e.cli("generate", "--device-option", "threads=4096", "--max-new-tokens", "1"),
    ),
    # output paths: checked before anything is measured (exit 2, as a bad flag)
    Case(
        "CLI",
        "kvlab bench --out an existing file",
        "exit 2",
        "is an existing file; it must name a folder",
        lambda e: e.cli("bench", "--out", str(existing(e))),
    ),
    Case(
        "CLI",
        "kvlab bench --out /dev/null/bench (under a file)",
        "exit 2",
        "'/dev/null' is not a folder",
        lambda e: e.cli("bench", "--out", "/dev/null/bench"),
    ),
    Case(
        "CLI",
        "kvlab bench --out /proc/kvlab (a folder nothing can be written in)",
        "exit 2",
        "cannot write in '/proc'",
        lambda e: e.cli("bench", "--out", "/proc/kvlab"),
    ),
    Case(
        "CLI",
        "kvlab trace --out /proc/version (an existing file in a folder where no file can be made)",
        "exit 2",
        "cannot write in '/proc': making a file there failed",
        lambda e: e.cli("trace", "--out", "/proc/version"),
    ),
    Case(
        "CLI",
        "kvlab trace --out /dev/null/t.json",
        "exit 2",
        "'/dev/null' is not a folder",
        lambda e: e.cli("trace", "--out", "/dev/null/t.json"),
    ),
    Case(
        "CLI",
        "kvlab trace --out an existing folder",
        "exit 2",
        "is a folder; it must name a file",
        lambda e: e.cli("trace", "--out", str(e.tmp)),
    ),
    Case(
        "CLI",
        "kvlab conformance --out /dev/null/c.json",
        "exit 2",
        "'/dev/null' is not a folder",
        lambda e: e.cli("conformance", "--out", "/dev/null/c.json"),
    ),
    Case(
        "CLI",
        "kvlab profile ops --out /dev/null/p.csv",
        "exit 2",
        "--out '/dev/null/p.csv'",
        lambda e: e.cli("profile", "ops", "--out", "/dev/null/p.csv"),
    ),
    Case(
        "CLI",
        "kvlab profile phases --out an existing folder",
        "exit 2",
        "is a folder; it must name a file",
        lambda e: e.cli("profile", "phases", "--out", str(e.tmp)),
    ),
    Case(
        "CLI",
        "kvlab browser-bench --out an existing file",
        "exit 2",
        "is an existing file",
        lambda e: e.cli("browser-bench", "--out", str(existing(e))),
    ),
    Case(
        "CLI",
        "kvlab chat-bench --out /dev/null/x",
        "exit 2",
        "'/dev/null' is not a folder",
        lambda e: e.cli("chat-bench", "--out", "/dev/null/x"),
    ),
    Case("CLI", "kvlab bench --contexts 1k,x", "exit 2", "--contexts", lambda e: e.cli("bench", "--contexts", "1k,x")),
    Case(
        "CLI", "kvlab bench --devices tpu", "exit 2", "'tpu' is not valid", lambda e: e.cli("bench", "--devices", "tpu")
    ),
    Case("CLI", "kvlab bench --out ''", "exit 2", "'' is not a path", lambda e: e.cli("bench", "--out", "")),
    Case(
        "CLI", "kvlab chat-bench --out ' '", "exit 2", "' ' is not a path", lambda e: e.cli("chat-bench", "--out", " ")
    ),
    # round three: configs that lie, the conversation API, Stepper misuse, presets, the environment, more CLI
    Case(
        "model",
        "genai_config.json nested 100,000 deep ([[[...)",
        "ModelError",
        "is nested too deeply",
        lambda e: load(e.model_dir(deep("[", "", "]"))),
    ),
    Case(
        "model",
        "genai_config.json: an object nested 100,000 deep",
        "ModelError",
        "is nested too deeply",
        lambda e: load(e.model_dir(deep('{"a":', "1", "}"))),
    ),
    Case("model", "genai_config.json of mode 000 (skipped as root)", "ModelError", "cannot be read", unreadable),
    Case(
        "model",
        "context_length: 0",
        "ModelError",
        "the context length is 0",
        lambda e: load(e.model_dir(genai(lambda m: m.update(context_length=0)))),
    ),
    Case(
        "model",
        "eos_token_id: 99999 (vocabulary 512)",
        "ModelError",
        "eos_token_id 99999 is outside the vocabulary [0, 512)",
        lambda e: load(e.model_dir(genai(lambda m: m.update(eos_token_id=99999)))),
    ),
    Case(
        "model",
        "eos_token_id: [2, -1]",
        "ModelError",
        "eos_token_id -1 is outside the vocabulary",
        lambda e: load(e.model_dir(genai(lambda m: m.update(eos_token_id=[2, -1])))),
    ),
    Case(
        "tokenizer",
        "a chat template reaching past the sandbox (''.__class__)",
        "ModelError",
        "is unsafe",
        chat_with("{{ ''.__class__.__mro__[1].__subclasses__() }}"),
    ),
    Case(
        "tokenizer",
        "a chat template reaching for a function's globals",
        "ModelError",
        "is unsafe",
        chat_with("{{ raise_exception.__globals__['os'].system('id') }}"),
    ),
    Case(
        "conversation",
        "Conversation.say after close()",
        "CacheStateError",
        "this conversation was closed",
        conversation(lambda c: c.say("hi", max_new_tokens=1), closed=True),
    ),
    Case(
        "conversation",
        "Conversation.rewind(10**6), past the history",
        "ConfigError",
        "rewind(1000000): n must be an int from 0 to",
        conversation(lambda c: c.rewind(10**6)),
    ),
    Case(
        "conversation",
        "Conversation.rewind(-1)",
        "ConfigError",
        "rewind(-1): n must be an int from 0",
        conversation(lambda c: c.rewind(-1)),
    ),
    Case(
        "conversation", "Conversation.rewind(1.5)", "ConfigError", "rewind(1.5)", conversation(lambda c: c.rewind(1.5))
    ),
    Case(
        "conversation",
        "Conversation.say(3)",
        "ConfigError",
        "message must be text or a non-empty list of token ids",
        conversation(lambda c: c.say(3, max_new_tokens=1)),
    ),
    Case(
        "conversation",
        "Conversation.say([])",
        "ConfigError",
        "message must be text or a non-empty list",
        conversation(lambda c: c.say([], max_new_tokens=1)),
    ),
    Case(
        "conversation",
        'Conversation.say("hi", max_new_tokens=0)',
        "ConfigError",
        "max_new_tokens=0 must be a positive int",
        conversation(lambda c: c.say("hi", max_new_tokens=0)),
    ),
    Case(
        "conversation",
        'Conversation(model, cache="x")',
        "ConfigError",
        "cache must be a kvlab cache",
        lambda e: Conversation(e.toy, cache="x"),
    ),
    Case(
        "conversation",
        'Conversation(model, device="tpu")',
        "ConfigError",
        "device 'tpu' is not valid",
        lambda e: Conversation(e.toy, device="tpu"),
    ),
    Case(
        "stepper",
        "Stepper.step outside its with block",
        "CacheStateError",
        "before its with block",
        stepper(lambda s: s.step([1, 2])),
    ),
    Case(
        "stepper",
        "Stepper.step after its with block",
        "CacheStateError",
        "after its with block ended",
        stepper(after_its_block),
    ),
    Case("stepper", "a Stepper entered twice", "CacheStateError", "was entered already", stepper(entered_twice)),
    Case("stepper", "Stepper.step([]) (an empty step)", "ConfigError", "must be a 1-D list of ints", step([])),
    Case(
        "cache",
        'make_cache("paged", 8)',
        "ConfigError",
        "cache type 'paged' is not valid",
        lambda e: make_cache("paged", 8),
    ),
    Case(
        "cache",
        'make_cache("static") without a size',
        "ConfigError",
        "a static cache needs max_cache_len",
        lambda e: make_cache("static"),
    ),
    Case(
        "cache", "StaticCache(-1)", "ConfigError", "max_cache_len=-1 must be a positive int", lambda e: StaticCache(-1)
    ),
    Case(
        "cache",
        "StaticCache(np.int64(0))",
        "ConfigError",
        "max_cache_len=np.int64(0) must be a positive int",
        lambda e: StaticCache(np.int64(0)),
    ),
    Case(
        "device",
        'open_device("cpu", threads=1.0)',
        "ConfigError",
        "threads=1.0 must be an int from 1 to",
        lambda e: open_device("cpu", threads=1.0),
    ),
    Case("device", "close_device(None)", "ConfigError", "device None is not valid", lambda e: close_device(None)),
    Case(
        "device",
        'open_device("webgpu", buffer_cache_mode=3)',
        "ConfigError",
        "buffer cache mode 3 is not valid",
        lambda e: open_device("webgpu", buffer_cache_mode=3),
    ),
    Case(
        "prompt",
        "token ids [True, False] (bools)",
        "ConfigError",
        "must be a 1-D list of ints",
        gen(prompt=[True, False]),
    ),
    Case(
        "prompt",
        "token ids np.array([1.0, 2.0]) (floats)",
        "ConfigError",
        "must be a 1-D list of ints",
        gen(prompt=np.array([1.0, 2.0])),
    ),
    Case("prompt", "token ids [np.int64(-1)]", "ConfigError", "token id -1 is outside", gen(prompt=[np.int64(-1)])),
    Case(
        "preset",
        'presets.recipe("nope")',
        "ConfigError",
        "unknown built-in model 'nope'",
        lambda e: recipe("nope"),
    ),
    Case(
        "preset",
        "presets.check_precision(3)",
        "ConfigError",
        "precision 3 is not valid",
        lambda e: check_precision(3),
    ),
    Case(
        "preset",
        'load("toy", precision="")',
        "ConfigError",
        "precision '' is not valid",
        lambda e: load("toy", precision=""),
    ),
    Case(
        "env",
        "KVLAB_CACHE_DIR=/dev/null/x (under a file)",
        "ConfigError",
        "KVLAB_CACHE_DIR '/dev/null/x'",
        with_cache_dir("/dev/null/x", lambda e: load("toy")),
    ),
    Case(
        "env",
        "KVLAB_CACHE_DIR=/proc/kvlab (nothing can be written)",
        "ConfigError",
        "cannot write in '/proc'",
        with_cache_dir("/proc/kvlab", lambda e: load("toy")),
    ),
    Case(
        "env",
        "KVLAB_CACHE_DIR an existing file",
        "ConfigError",
        "is an existing file; it must name a folder",
        lambda e: with_cache_dir(str(existing(e)), lambda e: load("toy"))(e),
    ),
    Case(
        "CLI",
        "KVLAB_CACHE_DIR=/dev/null/x kvlab generate",
        "exit 2",
        "KVLAB_CACHE_DIR '/dev/null/x'",
        with_cache_dir("/dev/null/x", lambda e: e.cli("generate", "hi", "--max-new-tokens", "1")),
    ),
    Case(
        "CLI",
        "kvlab browser-bench --new-tokens 0",
        "exit 2",
        "0 must be >= 1",
        cli("browser-bench", "--new-tokens", "0"),
    ),
    Case(
        "CLI",
        "kvlab browser-bench --cache paged",
        "exit 2",
        "cache 'paged' is not valid",
        cli("browser-bench", "--cache", "paged"),
    ),
    Case(
        "CLI",
        "kvlab browser-bench --set timeout=nan",
        "exit 2",
        "nan must be > 0",
        cli("browser-bench", "--set", "timeout=nan"),
    ),
    Case(
        "CLI", "kvlab browser-bench --contexts 0", "exit 2", "0 must be >= 1", cli("browser-bench", "--contexts", "0")
    ),
    Case(
        "CLI",
        "kvlab browser-bench --models nope",
        "exit 2",
        "'nope' is neither a built-in name",
        cli("browser-bench", "--models", "nope"),
    ),
    Case(
        "CLI",
        "kvlab browser-bench --devices tpu (no such flag)",
        "exit 2",
        "unrecognized arguments: --devices",
        cli("browser-bench", "--devices", "tpu"),
    ),
    Case("CLI", "kvlab compare --device tpu", "exit 2", "invalid choice: 'tpu'", cli("compare", "--device", "tpu")),
    Case("CLI", "kvlab trace --steps x", "exit 2", "'x' is not an int", cli("trace", "--steps", "x")),
    Case(
        "CLI",
        "kvlab chat --device tpu",
        "exit 2",
        "invalid choice: 'tpu'",
        cli("chat", "--turn", "hi", "--device", "tpu"),
    ),
    Case(
        "CLI",
        "kvlab profile ops --device tpu",
        "exit 2",
        "invalid choice: 'tpu'",
        cli("profile", "ops", "--device", "tpu"),
    ),
    Case(
        "CLI",
        "kvlab generate --sample temperature=-1",
        "exit 2",
        "temperature=-1.0 must be a finite number > 0",
        cli("generate", "hi", "--sample", "temperature=-1"),
    ),
    Case(
        "CLI",
        "kvlab generate --sample top_k=x",
        "exit 2",
        "--sample 'top_k=x': 'x' is not a valid top_k",
        cli("generate", "--sample", "top_k=x"),
    ),
    Case(
        "CLI",
        "kvlab generate --cache paged",
        "exit 2",
        "cache 'paged' is not valid",
        cli("generate", "--cache", "paged"),
    ),
    Case(
        "CLI",
        "kvlab generate --device-option buffer_cache_mode=",
        "exit 2",
        "'' is not a valid buffer_cache_mode",
        cli("generate", "--device-option", "buffer_cache_mode="),
    ),
    Case(
        "CLI",
        "kvlab generate --max-new-tokens 10**10",
        "exit 2",
        "positions are needed but model toy holds",
        cli("generate", "hi", "--max-new-tokens", str(10**10)),
    ),
    Case("CLI", "kvlab doctor --json x", "exit 2", "unrecognized arguments: x", cli("doctor", "--json", "x")),
    Case(
        "CLI",
        "kvlab bench --contexts -1",
        "exit 2",
        "argument --contexts: '-1': -1 must be >= 1; give comma-separated positive ints",
        cli("bench", "--contexts", "-1"),
    ),
    # held-out probe round (2026-12-03)
    Case(
        "CLI",
        "kvlab chat --cache graph",
        "exit 2",
        "a captured graph has one shape",
        cli("chat", "--model", "toy", "--cache", "graph", "--turn", "hi"),
    ),
    Case(
        "web",
        'make_job(toy, ids, caches=["static@²"]) (a digit to str.isdigit, not to int)',
        "ConfigError",
        "the size after 'static@' must be a positive int",
        lambda e: make_job(e.toy, [1, 2], caches=["static@²"]),
    ),
    Case(
        "web",
        "make_job(toy, 5) (one int, not a list)",
        "ConfigError",
        "prompt_ids must be a list of token ids, got 5",
        lambda e: make_job(e.toy, 5),
    ),
    Case(
        "web",
        "make_job(toy, ids, buffer_cache_mode=0)",
        "ConfigError",
        "buffer cache mode 0 is not valid",
        lambda e: make_job(e.toy, [1, 2], buffer_cache_mode=0),
    ),
    Case(
        "memory",
        'tokens_that_fit(layout, float("nan"))',
        "ConfigError",
        "budget_bytes=nan must be an int >= 0",
        lambda e: memory.tokens_that_fit(e.toy.info.layout, float("nan")),
    ),
    Case(
        "memory",
        'tokens_that_fit(layout, "1GiB")',
        "ConfigError",
        "budget_bytes='1GiB' must be an int >= 0",
        lambda e: memory.tokens_that_fit(e.toy.info.layout, "1GiB"),
    ),
    Case(
        "memory",
        'tokens_that_fit(layout, 2**30, kv_precision="int9")',
        "ConfigError",
        "kv_precision='int9' is not valid; choose one of",
        lambda e: memory.tokens_that_fit(e.toy.info.layout, 2**30, kv_precision="int9"),
    ),
    Case(
        "memory",
        "tokens_that_fit(layout, 2**30, window=-5)",
        "ConfigError",
        "window=-5 must be a positive int",
        lambda e: memory.tokens_that_fit(e.toy.info.layout, 2**30, window=-5),
    ),
    Case(
        "memory",
        "tokens_that_fit(layout, 2**30, max_cache_len=-1)",
        "ConfigError",
        "max_cache_len=-1 must be a positive int",
        lambda e: memory.tokens_that_fit(e.toy.info.layout, 2**30, max_cache_len=-1),
    ),
    Case(
        "conversation",
        'Conversation(model, system="\\udcff") (a lone surrogate: the error named the first message)',
        "ConfigError",
        "is not valid Unicode text (surrogates not allowed at 0)",
        lambda e: Conversation(e.toy, system="\udcff"),
    ),
    Case(
        "model",
        'load("") (no name; it was read as the current folder)',
        "ModelError",
        "model '' is neither a built-in name",
        lambda e: load(""),
    ),
    Case(
        "CLI",
        "kvlab conformance --models '' (the message spoke of precision)",
        "exit 2",
        "model '' is neither a built-in name",
        lambda e: e.cli("conformance", "--models", "", "--out", str(e.tmp / "c.json")),
    ),
    Case(
        "option",
        "generate(..., token_on_device=True, tokens_per_read=10**9, max_new_tokens=4)",
        "ConfigError",
        "tokens_per_read=1000000000 must be an int from 1 to 4096",
        gen(token_on_device=True, tokens_per_read=10**9, max_new_tokens=4),
    ),
    Case(
        "model",
        "model.onnx.data rewritten after load() (generate with the loaded Model)",
        "ModelError",
        "files changed since it was loaded (model.onnx.data modified",
        files_changed_after_load,
    ),
    Case(
        "memory",
        "kv_bytes(layout, -10) (a negative length)",
        "ConfigError",
        "length=-10 must be an int >= 0",
        lambda e: memory.kv_bytes(e.toy.info.layout, -10),
    ),
]


def _live() -> dict[str, int]:
    return {d: open_device(d).live_tensors for d in ("cpu", "webgpu")}


@pytest.mark.parametrize("case", CASES, ids=[f"{c.area}:{c.what}" for c in CASES])
def test_a_bad_input_gets_a_clear_error(case, toy, tmp_path, capsys):
    env = Env(toy, tmp_path, capsys)
    gc.collect()  # what earlier tests left to the collector goes now, not during this one
    before = _live()
    if case.error.startswith("exit "):
        rc, err = case.run(env)
        lines = err.strip().splitlines()
        assert rc == int(case.error.split()[1]), err
        assert len(lines) == 1 and lines[0].startswith("kvlab: error: "), err
        assert case.says in lines[0]
    else:
        error = getattr(kvlab, case.error)
        with pytest.raises(error) as info:
            case.run(env)
        assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
        assert case.says in str(info.value)
    assert _live() == before, "a device tensor was left alive"


def test_the_table_has_forty_rows_and_covers_every_area():
    assert len(CASES) >= 40
    assert {c.area for c in CASES} >= {"model", "tokenizer", "prompt", "cache", "sampling", "option", "device", "CLI"}
    assert len({(c.area, c.what) for c in CASES}) == len(CASES)


def render() -> str:
    """The docs' table of bad inputs, from ``CASES``."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    rows = [f"| {c.area} | {cell(c.what)} | {c.error} | {cell(c.says)} |" for c in CASES]
    return "\n".join(["| Area | Bad input | Error | The message says (in part) |", "|---|---|---|---|", *rows])


def test_the_docs_table_is_rendered_from_these_cases():
    text = TABLE_PAGE.read_text()
    found = re.search(re.escape(MARK_START) + r"\n(.*?)\n" + re.escape(MARK_END), text, re.S)
    assert found, f"{TABLE_PAGE.relative_to(ROOT)} has no {MARK_START} ... {MARK_END} block"
    assert found.group(1) == render(), "the bad-input table is stale: run python tests/test_bad_inputs.py"


if __name__ == "__main__":  # rewrite the table in the docs page
    text = TABLE_PAGE.read_text()
    block = f"{MARK_START}\n{render()}\n{MARK_END}"
    if MARK_START in text:
        text = re.sub(re.escape(MARK_START) + r".*?" + re.escape(MARK_END), lambda _: block, text, flags=re.S)
    else:
        sys.exit(f"add {MARK_START} and {MARK_END} to {TABLE_PAGE.relative_to(ROOT)} where the table goes")
    TABLE_PAGE.write_text(text)
    print(f"{len(CASES)} rows written")
