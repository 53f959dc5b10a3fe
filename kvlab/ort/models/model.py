"""A loaded model (``Model``: its ``ModelInfo``, tokenizer and chat template) and ``load("toy" | "kv-heavy" |
"smollm2" | ... | path)``, which builds a built-in model on first use (``kvlab.ort.models.build``)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import ConfigError, ModelError, check_flag, check_int
from ...core.guards import check_token_ids
from ...presets import BUILTIN_NAMES, PRECISIONS, check_precision
from .build import ensure_built
from .describe import describe
from .graph import changed_files, files_stamp
from .info import ModelInfo, read_info


class Model:
    """A loaded model: its info, tokenizer and chat template (sessions belong to devices). ``tokenizer`` is None without
    tokenizer.json. ModelError when tokenizer.json is unreadable or maps ids past the vocabulary."""

    def __init__(self, info: ModelInfo):
        self.info = info
        self.name: str = info.name
        self.files = files_stamp(info.onnx_path)  # its graph and weight files as loaded (``check_files``)
        self.tokenizer: Any = None  # a tokenizers.Tokenizer, or None (no tokenizer.json: token ids only)
        tok_file = info.path / "tokenizer.json"
        if not tok_file.is_file():
            return
        from tokenizers import Tokenizer

        try:
            self.tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as exc:  # the tokenizers library raises a bare Exception for every parse failure
            raise ModelError(
                f"{tok_file} could not be read by the tokenizers library ({exc}); it must be a "
                "Hugging Face tokenizer.json (re-export or copy it from the model's source)"
            ) from exc
        top = max(self.tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
        if top >= info.vocab_size:  # text could become ids that the logits (and the embedding) do not have
            raise ModelError(
                f"{tok_file} maps tokens to ids up to {top}, past this model's vocabulary of {info.vocab_size} "
                f"(ids 0 to {info.vocab_size - 1}): it is not this model's tokenizer"
            )

    def describe(self) -> str:
        """What kvlab sees in this model, as one screen of text (``kvlab.ort.models.describe``). Reads the graph (not
        its weights); opens no session."""
        return describe(self.info)

    def check_files(self) -> None:
        """ModelError when the model's graph or weight files changed since it was loaded (``files_stamp``): a session
        would mix the new weights with what was read of the old ones. Loading the directory again takes the new
        files."""
        changed = changed_files(self.files, files_stamp(self.info.onnx_path))
        if changed:
            raise ModelError(
                f"model {self.name}'s files changed since it was loaded ({changed} in {self.info.path}); load it "
                "again (kvlab.load) to run the new files"
            )

    @property
    def onnx_path(self) -> Path:
        """The decoder graph's file (``ModelInfo.onnx_path``)."""
        return self.info.onnx_path

    @cached_property
    def chat_template(self) -> str | None:
        """The model's Jinja chat template (chat_template.jinja, else tokenizer_config.json's, a named list's
        "default"), or None (also without a tokenizer); ModelError for a config that is not JSON or a template that is
        not a string."""
        if self.tokenizer is None:  # a template renders text, which only a tokenizer makes ids of
            return None
        jinja = self.info.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text()
        cfg = self.info.path / "tokenizer_config.json"
        if not cfg.is_file():
            return None
        try:
            template = json.loads(cfg.read_text()).get("chat_template")
        except (ValueError, AttributeError) as exc:
            raise ModelError(f"{cfg} is not a JSON object ({exc}); its chat_template cannot be read") from exc
        if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
            template = next(
                (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
            )
        if template is not None and not isinstance(template, str):
            raise ModelError(
                f"{cfg}: chat_template is {type(template).__name__} {template!r:.40}; it must be a "
                "Jinja template string (or a list of named templates with a 'default')"
            )
        return template

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render chat messages with the model's Jinja template, as transformers does. Raises ModelError (no template, a
        broken one, one that renders nothing), ConfigError (a malformed message, the template's own error)."""
        if self.chat_template is None:
            raise ModelError(f"model {self.name} has no chat template; pass plain text without --chat")
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ConfigError(f"chat message {m!r} must be a dict with 'role' and 'content'")
        from jinja2 import TemplateError, TemplateSyntaxError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ConfigError(f"chat template error: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            text = env.from_string(self.chat_template).render(
                messages=list(messages), add_generation_prompt=add_generation_prompt
            )
            if not text:  # nothing to feed: said by name here, not as an empty prompt somewhere later
                jinja = (self.info.path / "chat_template.jinja").is_file()
                raise ModelError(
                    f"the chat template of model {self.name} "
                    f"({'chat_template.jinja' if jinja else 'tokenizer_config.json'}) rendered nothing for "
                    f"{len(messages)} message(s); fix the template, or pass plain text without --chat"
                )
            return text
        except TemplateSyntaxError as exc:
            raise ModelError(
                f"the chat template of model {self.name} is broken: {exc.message} (template line "
                f"{exc.lineno}); fix chat_template.jinja or tokenizer_config.json, or pass plain "
                "text without --chat"
            ) from exc
        except TemplateError as exc:
            raise ModelError(
                f"the chat template of model {self.name} failed while rendering: {exc}; fix the "
                "template, or pass plain text without --chat"
            ) from exc

    def encode(
        self, prompt: str | Sequence[dict[str, str]] | Sequence[int] | np.ndarray, chat: bool = False
    ) -> np.ndarray:
        """Token ids [n] (int64) of a text, chat messages (rendered with the template) or ids; ConfigError for an empty
        or malformed prompt or ids outside the vocabulary, ModelError for text without a tokenizer."""
        if isinstance(prompt, np.ndarray) or (
            isinstance(prompt, (list, tuple)) and prompt and not isinstance(prompt[0], dict)
        ):
            if chat:  # token ids are already past any template: chat=True would be silently ignored
                raise ConfigError(
                    "chat=True applies to text or chat messages, not token ids; render the template "
                    "yourself or pass chat=False"
                )
            out = self.check_ids(prompt)
        elif isinstance(prompt, str):
            text = self.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
            out = self._tokenize(text, special=not chat)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt) and prompt:
            out = self._tokenize(self.apply_chat_template(prompt), special=False)
        else:
            raise ConfigError(
                f"prompt must be text, chat messages or token ids; got {type(prompt).__name__} {prompt!r:.60}"
            )
        if out.size == 0:
            raise ConfigError("the prompt is empty (0 tokens); give at least one token")
        return out

    def _tokenize(self, text: str, special: bool) -> np.ndarray:
        if self.tokenizer is None:
            raise ModelError(
                f"model {self.name} has no tokenizer ({self.info.path} holds no tokenizer.json), so the text "
                f"{text!r:.40} cannot become token ids; give the prompt as token ids, or copy the model's "
                "tokenizer.json into its directory"
            )
        try:
            return np.asarray(self.tokenizer.encode(text, add_special_tokens=special).ids, np.int64)
        except Exception as exc:  # e.g. a lone surrogate (U+D800): not valid Unicode text
            raise ConfigError(
                f"the tokenizer of model {self.name} refused the text {text!r:.40} ({exc}); give valid Unicode text"
            ) from exc

    def check_ids(self, ids: Any) -> np.ndarray:
        """Token ids as a 1-D int64 array, each checked against the vocabulary (batch size 1); ConfigError
        otherwise."""
        return check_token_ids(ids, self.info.vocab_size)

    def tokens_of(self, text: str, length: int) -> np.ndarray:
        """Exactly ``length`` token ids of real text: ``text`` tokenized and repeated as needed."""
        length = check_int(length, "length", 1, subject=f"prompt length {length!r}")
        return np.resize(self.encode(text), length).astype(np.int64)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids, special tokens left out; "" for a model without a tokenizer."""
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


def load(
    name_or_dir: str | os.PathLike | Model,
    *,
    precision: str | None = None,
    dtype: str | None = None,
    progress: bool = True,
    graph_capture: bool = False,
) -> Model:
    """A built-in model by name, in a precision (``kvlab.presets.PRECISIONS``, default "fp32"; built into the user
    cache dir on first use), or a model directory (which holds the precision it was built in): an onnxruntime-genai
    builder output, or a Hugging Face Optimum / transformers.js directory whose variant ``dtype`` chooses as
    transformers.js does ("fp32", "fp16", "q4f16", ...: ``onnx/model_<dtype>.onnx``; default: config.json's
    ``transformers.js_config.dtype``, else "fp32"); what kvlab reads there and does not apply (``ModelInfo.notes``)
    is a UserWarning, one line each. ``graph_capture``: the built-in model as the builder makes it for WebGPU
    graph capture (``enable_webgpu_graph=true``; named "<name>-graph"; see kvlab.ort.decode.caches.captured).
    Raises ConfigError for a bad argument, ModelError for a directory kvlab cannot use or a build that fails."""
    check_flag("progress", progress)
    check_flag("graph_capture", graph_capture)
    if graph_capture and not (isinstance(name_or_dir, str) and name_or_dir in BUILTIN_NAMES):
        raise ConfigError(
            f"graph_capture=True builds a built-in model ({', '.join(BUILTIN_NAMES)}) for capture; "
            f"{name_or_dir!r} is not one (build a directory with the onnxruntime-genai builder's "
            "--extra_options enable_webgpu_graph=true)"
        )
    if isinstance(name_or_dir, Model):
        given = {k: v for k, v in (("precision", precision), ("dtype", dtype)) if v is not None}
        if given:
            key, value = next(iter(given.items()))
            raise ConfigError(
                f"{key}={value!r} applies when a model is loaded by name or directory; {name_or_dir.name} "
                f"is loaded already ({name_or_dir.info.precision})"
            )
        return name_or_dir
    if not isinstance(name_or_dir, (str, os.PathLike)):
        raise ConfigError(f"model must be a name ({', '.join(BUILTIN_NAMES)}) or a directory, got {name_or_dir!r}")
    key = str(name_or_dir)
    if key in BUILTIN_NAMES:
        if dtype is not None:
            raise ConfigError(
                f"dtype={dtype!r} chooses a transformers.js directory's variant; built-in models take "
                f"precision= one of {tuple(PRECISIONS)}"
            )
        precision = check_precision("fp32" if precision is None else precision)
        name = (key if precision == "fp32" else f"{key}-{precision}") + ("-graph" if graph_capture else "")
        return Model(read_info(ensure_built(key, precision, progress=progress, graph_capture=graph_capture), name=name))
    try:  # "" is no name, and not the current folder (Path("") is "."); a name no file system holds is no folder
        exists = bool(key.strip()) and Path(key).exists()
    except (OSError, ValueError):
        exists = False
    if not exists:
        raise ModelError(
            f"model {key!r} is neither a built-in name ({', '.join(BUILTIN_NAMES)}) nor an existing directory"
        )
    if precision is not None:
        raise ConfigError(
            f"precision={precision!r} applies to built-in models ({', '.join(BUILTIN_NAMES)}); the "
            f"directory {key!r} holds the precision it was built in (a transformers.js directory's variants: dtype=)"
        )
    model = Model(read_info(key, dtype=dtype))
    for note in model.info.notes:  # what kvlab read and does not apply: one line each, where a user sees it
        warnings.warn(f"model {model.name}: {note}", stacklevel=2)
    return model
