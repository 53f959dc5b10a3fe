"""Decoder directories kvlab did not build for itself, built here as users build them, and what kvlab does with each:
the matrix of docs/compatibility.md.

Every case starts from a tiny random Hugging Face checkpoint (two layers, the byte tokenizer; ``ARCHS``) and is
exported by one of:

- ``builder 0.18``: the pinned onnxruntime-genai model builder, in several precisions and options (``-e cpu`` or
  ``-e webgpu``, int4 block sizes, ``enable_webgpu_graph``); Gemma 3 through kvlab's config shim (the plain builder
  fails on transformers 5's Gemma 3 config).
- ``builder 0.5.2``: an older builder (its attention is MultiHeadAttention where it did not pick
  GroupQueryAttention), run in a virtual environment of its own with the transformers and onnxruntime of its day.
- ``optimum-onnx 0.1.0``: Hugging Face Optimum (``optimum-cli export onnx``, in .venv-optimum).
- ``transformers.js layout``: an onnx-community directory (config.json, generation_config.json, the tokenizer
  files, ``onnx/model<suffix>.onnx`` per dtype) holding the builder's graphs.
- ``+ unread position_ids``: the builder's LFM2 graph with a ``position_ids`` input that no node reads, as other
  exporters of LFM2 declare it.

Each is built once into the user cache dir (``cache_dir() / "any-decoder"``), never committed. ``outcome(case)``
runs it as a user would, on the CPU EP: onnxruntime-genai's greedy tokens (where it runs), kvlab's with a
DynamicCache and with a StaticCache. ``python tests/any_decoder.py`` rewrites this runtime's table in
docs/compatibility.md (tests/test_any_decoder.py fails while it is stale).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "compatibility.md"
PROMPT = [5, 17, 42, 99, 3, 250, 7, 11] * 3
NEW_TOKENS = 16  # 40 positions: past the sliding window (32) of Gemma 2 and 3
STATIC_LEN = 64
CELL = 300  # characters of an error in a table cell
VERSION = 1  # bump to rebuild every case

SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
VOCAB = dict(vocab_size=512, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
COMMON = {**SIZES, **VOCAB, "max_position_embeddings": 2048}  # every architecture's config, and ARCHS' additions
# transformers classes (config, model) and what each architecture adds to COMMON
ARCHS: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "sliding_window": 32}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16, "sliding_window": 32}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"original_max_position_embeddings": 2048}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    "lfm2": (
        "Lfm2Config",
        "Lfm2ForCausalLM",
        {"layer_types": ["conv", "full_attention"], "block_ff_dim": 128, "conv_L_cache": 3},
    ),
    # partial rotary (half the head): heads of 32 give GroupQueryAttention's rotary table the 8 columns it needs
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", {"head_dim": 32}),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {}),
}
OLD_BUILDER = "0.5.2"  # an onnxruntime-genai whose builder uses MultiHeadAttention off its GQA configurations
OLD_BUILDER_ENV = ("onnxruntime==1.20.1", "transformers==4.46.3", "onnx==1.17.0", "numpy<2")  # and torch
TRANSFORMERS_JS = {
    "fp32": ("fp32", "cpu"),
    "fp16": ("fp16", "webgpu"),
    "q4": ("int4", "cpu"),
    "q4f16": ("int4", "webgpu"),
}


TAGS = {  # exporter -> the prefix of its cases' ids
    "builder 0.18": "",
    "builder 0.5.2": "old-",
    "optimum-onnx 0.1.0": "optimum-",
    "transformers.js layout": "tjs-",
    "+ unread position_ids": "pos-",
}
ON_WEBGPU = ("llama", "gemma2", "qwen3", "gemma3", "lfm2")  # the architectures run on WebGPU too
DERIVED = ("transformers.js layout", "+ unread position_ids")  # made from the builder's directories


@dataclass(frozen=True)
class Case:
    """One decoder directory: who exported which architecture in which precision, with which options."""

    exporter: str  # "builder 0.18", "builder 0.5.2", "optimum-onnx 0.1.0", "transformers.js layout"
    arch: str
    precision: str  # the builder's -p, or the transformers.js dtype
    ep: str = "cpu"  # the builder's -e ("" where the exporter has none)
    options: tuple[str, ...] = ()  # the builder's --extra_options
    device: str = "cpu"  # where genai and kvlab run it: "cpu" (the CPU EP) or "webgpu" (the package's WebGPU EP)

    @property
    def id(self) -> str:
        tags = {
            "builder 0.18": "",
            "builder 0.5.2": "old-",
            "optimum-onnx 0.1.0": "optimum-",
            "+ unread position_ids": "pos-",
        }
        tag = tags.get(self.exporter, "tjs-")
        at = "" if self.device == "cpu" else f"@{self.device}"
        return "-".join([f"{tag}{self.arch}", self.precision, *filter(None, [self.ep]), *self.options]) + at

    @property
    def how(self) -> str:
        """The exporter's options, as a table cell."""
        if self.exporter.startswith(("builder", "+")):
            return " ".join([f"-e {self.ep}", *self.options])
        return f"dtype={self.precision!r}" if self.exporter == "transformers.js layout" else "text-generation-with-past"


CASES: list[Case] = [
    *(Case("builder 0.18", a, "fp32", "cpu") for a in ARCHS),
    *(Case("builder 0.18", a, "int4", "cpu") for a in ARCHS),
    *(Case("builder 0.18", a, "fp32", "webgpu") for a in ARCHS),
    Case("builder 0.18", "llama", "int4", "cpu", ("int4_block_size=16",)),
    Case("builder 0.18", "llama", "int4", "webgpu"),
    Case("builder 0.18", "llama", "fp16", "webgpu"),
    Case("builder 0.18", "llama", "fp32", "webgpu", ("enable_webgpu_graph=true",)),
    Case("builder 0.5.2", "llama", "fp32", "cuda"),
    Case("builder 0.5.2", "llama", "fp16", "cpu"),
    Case("optimum-onnx 0.1.0", "llama", "fp32", ""),
    Case("+ unread position_ids", "lfm2", "fp32", "cpu"),
    *(Case("transformers.js layout", "llama", dtype, "") for dtype in TRANSFORMERS_JS),
    # on WebGPU (fp32: SwiftShader has no shader-f16): the builder's -e webgpu graphs, q/k norms fused or not
    *(Case("builder 0.18", a, "fp32", "webgpu", device="webgpu") for a in ON_WEBGPU),
]


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def root() -> Path:
    from kvlab.presets import cache_dir

    return cache_dir() / "any-decoder"


def checkpoint_key(arch: str) -> str:
    """What ``arch``'s checkpoint is made of, hashed (its config and the version of this code)."""
    return _key(ARCHS[arch], COMMON, VERSION)


def checkpoint(arch: str) -> Path:
    """The tiny random checkpoint of ``arch`` with the byte tokenizer (seeded), written once."""
    from kvlab.presets.recipes import building

    out = root() / "hf" / f"{arch}-{checkpoint_key(arch)}"
    if (out / "config.json").is_file():
        return out
    import torch
    import transformers

    from kvlab.presets import save_byte_tokenizer

    config_name, model_name, extra = ARCHS[arch]
    with building(out, "config.json") as tmp:
        save_byte_tokenizer(COMMON["vocab_size"], tmp)
        config = getattr(transformers, config_name)(**{**COMMON, **extra})
        torch.manual_seed(0)
        model = getattr(transformers, model_name)(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.08)
        model.save_pretrained(tmp)
    return out


def _run(cmd: list[str], **kwargs) -> str:
    """Run ``cmd`` offline; "" on success, else the last line of what it said."""
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, **kwargs)
    if r.returncode == 0:
        return ""
    lines = [line for line in (r.stderr or r.stdout).splitlines() if line.strip()]
    return lines[-1][:300] if lines else f"exit {r.returncode}"


_ONE_ENV = threading.Lock()


def _old_builder() -> tuple[Path, Path]:
    """(python, builder.py) of onnxruntime-genai ``OLD_BUILDER``'s model builder: its wheel's builder.py, run in a
    virtual environment of its own with the packages of its day (created once)."""
    with _ONE_ENV:
        return _old_builder_env()


def _old_builder_env() -> tuple[Path, Path]:
    env = root() / f"genai-{OLD_BUILDER}-env"
    python, builder = env / "bin" / "python", env / "builder" / "builder.py"
    if builder.is_file():
        return python, builder
    shutil.rmtree(env, ignore_errors=True)
    sys.path.insert(0, str(REPO / "scripts"))
    import setup  # the project's installer: uv where it runs, torch's CPU build

    setup.make_venv(env, f"onnxruntime-genai {OLD_BUILDER}'s model builder")
    setup.install(env, *OLD_BUILDER_ENV)  # (with setup.TORCH)
    pip = [str(python), "-m", "pip"]
    wheels = env / "wheel"
    wheel = f"onnxruntime-genai=={OLD_BUILDER}"
    subprocess.run([*pip, "download", "-q", "--no-deps", "-d", str(wheels), wheel], check=True)
    with zipfile.ZipFile(next(wheels.glob("*.whl"))) as whl:
        for name in whl.namelist():
            if name.startswith("onnxruntime_genai/models/") and name.endswith(".py"):
                (env / "builder").mkdir(exist_ok=True)
                (env / "builder" / Path(name).name).write_bytes(whl.read(name))
    return python, builder


def _builder_checkpoint(hf: Path, out: Path) -> Path:
    """A copy of ``hf`` whose tokenizer_config.json names PreTrainedTokenizerFast: transformers 4.x (the old
    builder's) does not know transformers 5's tokenizer class name; the tokenizer itself is the same."""
    shutil.copytree(hf, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def _export(case: Case, out: Path) -> str:
    """Export ``case`` into ``out`` (an empty directory); "" on success, else the exporter's last words."""
    from kvlab.ort.models.build import export

    hf = checkpoint(case.arch)
    if case.exporter == "builder 0.18":
        try:
            export(
                hf,
                out,
                case.id,
                case.precision,
                extra_options=case.options,
                execution_provider=case.ep,
                shims=case.arch == "gemma3",
            )
        except Exception as exc:  # noqa: BLE001 - ModelError with the builder's stderr
            return str(exc).strip().splitlines()[-1][:300]
        return ""
    if case.exporter == "builder 0.5.2":
        python, builder = _old_builder()
        src = _builder_checkpoint(hf, out.with_name(out.name + ".hf"))
        try:
            cmd = [str(python), str(builder), "-i", str(src), "-o", str(out), "-p", case.precision, "-e", case.ep]
            return _run([*cmd, "-c", str(out.with_name(out.name + ".cache"))])
        finally:
            shutil.rmtree(src, ignore_errors=True)
            shutil.rmtree(out.with_name(out.name + ".cache"), ignore_errors=True)
    if case.exporter == "optimum-onnx 0.1.0":
        cli = REPO / ".venv-optimum" / "bin" / "optimum-cli"
        if not cli.is_file():
            raise FileNotFoundError(f"{cli} is missing: run `bash scripts/setup.sh --full`")
        failed = _run([str(cli), "export", "onnx", "--model", str(hf), "--task", "text-generation-with-past", str(out)])
        for name in ("tokenizer.json", "tokenizer_config.json"):  # it skips a transformers 5 tokenizer
            shutil.copy(hf / name, out / name)
        return failed
    if case.exporter == "+ unread position_ids":
        return _unread_position_ids(built(Case("builder 0.18", case.arch, case.precision, case.ep)), out)
    return _transformers_js(hf, out)


def _unread_position_ids(src: Path, out: Path) -> str:
    """A copy of the builder's directory ``src`` whose graph declares a ``position_ids`` input no node reads."""
    import onnx
    from onnx import TensorProto, helper

    for f in src.iterdir():
        if "kvlab" not in f.name:
            shutil.copy(f, out / f.name)
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False)
    graph.graph.input.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]))
    onnx.save(graph, str(out / "model.onnx"))
    return ""


def _transformers_js(hf: Path, out: Path) -> str:
    """An onnx-community / transformers.js directory: the checkpoint's config, generation config and tokenizer
    files, and ``onnx/model<suffix>.onnx`` (with its weights in ``<file>_data``, transformers.js's name for them) for
    each dtype of ``TRANSFORMERS_JS``, each the builder's graph of that precision."""
    import onnx

    from kvlab.ort.models.declared import TRANSFORMERS_JS_SUFFIX

    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf / name, out / name)
    (out / "onnx").mkdir()
    for dtype, (precision, ep) in TRANSFORMERS_JS.items():
        src = built(Case("builder 0.18", "llama", precision, ep))
        target = f"model{TRANSFORMERS_JS_SUFFIX[dtype]}.onnx"
        graph = onnx.load(str(src / "model.onnx"))  # with its weights, saved again under transformers.js's name
        onnx.save(graph, str(out / "onnx" / target), save_as_external_data=True, location=f"{target}_data")
    return ""


def export_id(case: Case) -> str:
    """The id of ``case``'s export (the same on every device)."""
    return case.id.removesuffix(f"@{case.device}")


def built(case: Case) -> Path:
    """The directory of ``case``, exported once (atomically); a failed export leaves ``export-failed.txt`` there
    with the exporter's last words."""
    from kvlab.presets.recipes import building

    export = {k: v for k, v in asdict(case).items() if k != "device"}  # one export, run on either device
    out = root() / "onnx" / f"{export_id(case)}-{_key(export, VERSION, checkpoint_key(case.arch))}"
    if (out / "kvlab_case.json").is_file():
        return out
    with building(out, "kvlab_case.json") as tmp:
        shutil.rmtree(tmp)
        tmp.mkdir()
        failed = _export(case, tmp)
        if failed:
            (tmp / "export-failed.txt").write_text(failed)
        (tmp / "kvlab_case.json").write_text(json.dumps(asdict(case)))
    return out


def build_all(cases: list[Case], jobs: int = 2) -> list[Path]:
    """``built`` for every case, ``jobs`` exports at a time (each exporter runs in a process of its own); the
    ``DERIVED`` ones last (they reuse the builder's directories)."""
    for arch in dict.fromkeys(c.arch for c in cases):  # one writer per checkpoint: before the exports share them
        checkpoint(arch)
    with ThreadPoolExecutor(jobs) as pool:
        list(
            pool.map(built, [c for c in cases if c.exporter not in ("transformers.js layout", "+ unread position_ids")])
        )
    return [built(c) for c in cases]


def runtime() -> str:
    """The ONNX Runtime package kvlab and onnxruntime-genai run on here, e.g. "onnxruntime-webgpu 1.27.0" (its WebGPU
    EP's package after a "+" where it is another)."""
    from kvlab.ort.runtime.device import backend

    (cpu, cpu_version), (webgpu, webgpu_version) = (backend().label_for(d) for d in ("cpu", "webgpu"))
    plugin = f" + {webgpu} {webgpu_version.split(' on ')[0]}" if webgpu != cpu else ""  # "0.4.0 on onnxruntime ..."
    return f"{cpu} {cpu_version}{plugin}"


def short(exc: BaseException | str, where: Path | None = None) -> str:
    """An error as one table cell: what went wrong, not where (the model's directory and name become DIR; of an ONNX
    Runtime message, the first sentence of what it says went wrong), cut at a clause near ``CELL`` characters."""
    text = " ".join(str(exc).split())
    if where is not None:
        text = text.replace(str(where), "DIR").replace(where.name, "DIR")
    text = re.sub(r"^could not create a \w+ session: ", "", re.sub(r"/\S*/any-decoder/\S*", "DIR", text))
    said = None
    if "Status Message: " in text:  # a kernel's refusal at run time
        op = re.search(r"running (\w+) node", text)
        said = f"{op.group(1) if op else 'a'} node: " + text.split("Status Message: ", 1)[1].split(" : FAIL : ")[-1]
    elif ", Error " in text:  # ONNX Runtime's invalid-model message ends with what is wrong
        said = "ONNX Runtime: " + text.rsplit(", Error ", 1)[1]
    if said is not None:
        text = said[: said.find(". ") + 1] if ". " in said else said
    if len(text) > CELL:
        cut = text.rfind("; ", 0, CELL)
        text = text[:cut] if cut > CELL // 2 else text[: CELL - 3] + "..."
        text += ")" * (text.count("(") - text.count(")"))
    return text


@dataclass(frozen=True)
class Row:
    """What each party did with one case on this runtime."""

    case: Case
    genai: str  # "runs" or "fails: ..."
    dynamic: str  # "tokens equal", "tokens differ: ...", "runs (genai fails)", "refused: ..." or "fails: ..."
    static: str
    genai_tokens: tuple[int, ...] = ()
    shares_buffers: bool | None = None  # None where kvlab did not load it
    kvlab_errors: tuple[str, ...] = ()  # the kvlab error classes of the refusals, in order (dynamic, static)

    def cells(self) -> list[str]:
        c = self.case
        return [c.exporter, c.arch, c.precision, c.how, c.device, self.genai, self.dynamic, self.static]


def _genai(path: Path, device: str = "cpu") -> tuple[str, tuple[int, ...]]:
    if not (path / "genai_config.json").is_file():
        return "no genai_config.json", ()
    import onnxruntime_genai as og

    from kvlab.ort.checks.references import genai_decode, genai_model

    try:
        if device == "cpu":
            config = og.Config(str(path))
            config.clear_providers()  # the CPU EP
            model = og.Model(config)
        else:  # the package's WebGPU EP, registered as kvlab registers it
            import kvlab

            model = genai_model(kvlab.load(path), device)
        return "runs", tuple(genai_decode(model, PROMPT, NEW_TOKENS)[0])
    except Exception as exc:  # noqa: BLE001 - genai raises RuntimeError/OgaError with ORT's message
        return f"fails: {short(exc, path)}", ()


PLUGIN_PYTHON = REPO / ".venv-plugin" / "bin" / "python"
GENAI_ELSEWHERE = """
import json, sys
import onnxruntime_genai as og
from kvlab.ort.checks.references import genai_decode
from kvlab.ort.runtime.device import backend
config = og.Config(sys.argv[1])
config.clear_providers()
tokens = genai_decode(og.Model(config), json.loads(sys.argv[2]), int(sys.argv[3]))[0]
print(json.dumps({"runtime": " ".join(backend().label_for("cpu")), "tokens": tokens}))
"""


def genai_elsewhere(path: Path) -> tuple[str, tuple[int, ...]]:
    """onnxruntime-genai's tokens on ``path`` in the plugin environment (onnxruntime 1.31), where it runs graphs
    onnxruntime-webgpu 1.27 cannot load: (its runtime, the tokens), or ("", ()) where that fails or is not here."""
    if not PLUGIN_PYTHON.is_file() or Path(sys.prefix).resolve() == PLUGIN_PYTHON.parents[1].resolve():
        return "", ()
    args = [str(PLUGIN_PYTHON), "-c", GENAI_ELSEWHERE, str(path), json.dumps(PROMPT), str(NEW_TOKENS)]
    r = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if r.returncode != 0:
        return "", ()
    found = json.loads(r.stdout.strip().splitlines()[-1])
    return found["runtime"], tuple(found["tokens"])


def built_for_genai(case: Case) -> Path:
    """The directory onnxruntime-genai runs for ``case``: its own; for a transformers.js layout (no
    genai_config.json) the builder's directory its graph was copied from; for an Optimum export (no
    genai_config.json either) the builder's fp32 export of the same checkpoint."""
    if case.exporter == "transformers.js layout":
        precision, ep = TRANSFORMERS_JS[case.precision]
        return built(Case("builder 0.18", "llama", precision, ep))
    if case.exporter == "optimum-onnx 0.1.0":
        return built(Case("builder 0.18", case.arch, "fp32", "cpu"))
    return built(case)


def _reference(case: Case) -> tuple[str, tuple[int, ...]]:
    """onnxruntime-genai's tokens for the case (``built_for_genai``), and what its cell says."""
    cell, tokens = _genai(built_for_genai(case), case.device)
    if cell == "runs" and case.exporter == "optimum-onnx 0.1.0":
        cell = "runs the builder's fp32 export of the same weights"
    elif cell == "runs" and case.exporter == "transformers.js layout":
        cell = "runs the builder's directory of the same graph"
    return cell, tokens


@functools.cache
def outcome(case: Case) -> Row:
    """What genai and kvlab (DynamicCache, StaticCache) do with ``case`` on its device, as a user would run it."""
    import kvlab

    path = built(case)
    if (path / "export-failed.txt").is_file():
        failed = f"export fails: {short((path / 'export-failed.txt').read_text(), path)}"
        return Row(case, failed, "-", "-")
    genai, reference = _reference(case)
    try:
        model = kvlab.load(path, dtype=case.precision if case.exporter == "transformers.js layout" else None)
    except kvlab.KvlabError as exc:
        cell = f"refused: {short(exc, path)}"
        return Row(case, genai, cell, cell, reference, None, (type(exc).__name__,) * 2)
    cells, errors, elsewhere = [], [], None
    for cache in (kvlab.DynamicCache(), kvlab.StaticCache(STATIC_LEN)):
        try:
            got = kvlab.generate(
                model, PROMPT, cache=cache, device=case.device, max_new_tokens=NEW_TOKENS, stop_on_eos=False
            )
        except kvlab.KvlabError as exc:
            cells.append(f"refused: {short(exc, path)}")
            errors.append(type(exc).__name__)
            continue
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own error, from inside a run
            cells.append(f"fails in ONNX Runtime: {short(exc, path)}")
            errors.append(type(exc).__name__)
            continue
        tokens = tuple(got.token_ids)
        if not reference:
            if elsewhere is None:
                elsewhere = genai_elsewhere(built_for_genai(case)) if case.device == "cpu" else ("", ())
            where, theirs = elsewhere
            same = "tokens equal" if tokens == theirs else f"tokens differ: {list(tokens)}"
            cells.append(f"runs; {same} to genai's on {where}" if theirs else "runs (genai fails)")
        else:
            cells.append("tokens equal" if tokens == reference else f"tokens differ: {list(tokens)}")
    return Row(case, genai, *cells, reference, model.info.shares_buffers, tuple(errors))


HEADER = ["exporter", "architecture", "precision", "options", "EP", "onnxruntime-genai", "DynamicCache", "StaticCache"]


def table(rows: list[Row]) -> str:
    """The rows as a markdown table."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell(c) for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def marks(name: str) -> tuple[str, str]:
    """The comments around the table of the runtime ``name`` in docs/compatibility.md."""
    return f"<!-- matrix: {name} -->", f"<!-- end of matrix: {name} -->"


def section(text: str, name: str) -> str | None:
    """The table of runtime ``name`` in the page's ``text``, or None where it has none."""
    start, end = marks(name)
    found = re.search(re.escape(start) + r"\n(.*?)\n" + re.escape(end), text, re.S)
    return found.group(1) if found else None


def write(rows: list[Row], name: str) -> None:
    """Put the table of runtime ``name`` into docs/compatibility.md (replaced where it is, else appended)."""
    text = PAGE.read_text()
    start, end = marks(name)
    block = f"{start}\n{table(rows)}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + f"\n\n## {name}\n\n{block}\n"
    PAGE.write_text(text)


if __name__ == "__main__":  # rebuild what is missing, run the matrix on this runtime, rewrite its table
    build_all(CASES)
    found = [outcome(c) for c in CASES]
    write(found, runtime())
    print(f"{len(found)} rows written for {runtime()} into {PAGE.relative_to(REPO)}")
