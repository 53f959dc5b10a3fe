"""The ``kvlab`` command's flags: one function per flag group, used by every command that takes it, and the
conversions of their values. A value argparse can check is checked by the parser (a bad one: one line, exit 2); a
value only the model or the device can judge is a ConfigError when the command runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..bench.plan import untag
from ..core.devices import DEVICES
from ..core.errors import ConfigError
from ..core.generation import Sampling
from ..ort.decode.greedy import AUTO, REDUCTIONS
from ..presets import BUILTIN_NAMES, PRECISIONS


def nonempty(text: str) -> str:
    """``text`` when it is not empty; else ValueError."""
    if not text:
        raise ValueError("empty")
    return text


# --device-option KEY=VALUE: open_device's keyword arguments, and how each value is read
ON_OFF = {"on": True, "off": False}
DEVICE_OPTIONS = {
    "threads": int,  # the CPU EP's intra-op threads
    "spinning": ON_OFF.__getitem__,  # whether its idle pool threads spin
    "huge_pages": ON_OFF.__getitem__,  # its sessions' weights in 2 MiB pages
    "buffer_cache_mode": nonempty,  # WebGPU's storage buffer cache mode
    "validation_mode": nonempty,  # WebGPU's validation mode
}
SAMPLING = {"temperature": float, "top_k": int, "top_p": float, "seed": int}  # --sample KEY=VALUE: Sampling's
WHERE = {"auto": AUTO, "on": True, "off": False, **{r: r for r in REDUCTIONS}}  # --token-on-device WHERE


def positive(cast: Callable[[str], Any], noun: str) -> Callable[[str], Any]:
    """An argparse type: ``cast(text)`` when it is above 0 (an int: >= 1); else an ArgumentTypeError naming ``noun``."""
    least = ">= 1" if cast is int else "> 0"

    def read(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{value} must be {least}")
        return value

    return read


positive_int = positive(int, "an int")


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated ints >= 1."""
    try:
        return [positive_int(v) for v in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}; give comma-separated positive ints") from None


def path_arg(text: str) -> Path:
    """An argparse type: a path; an empty one is refused (``Path("")`` would silently be ``.``)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a path: name a file or a directory")
    return Path(text)


def cache_names(text: str) -> list[tuple[str, int | None]]:
    """An argparse type: comma-separated caches, each (kind, size or None): dynamic, static, static@N, graph (a
    static cache whose decode step is a captured WebGPU graph), graph@N."""
    out = []
    for name in text.split(","):
        kind, at, size = name.partition("@")
        sized = size.isascii() and size.isdigit() and len(size) < 19 and int(size) > 0 and kind != "dynamic"
        if kind not in ("dynamic", "static", "graph") or (at and not sized):
            raise argparse.ArgumentTypeError(
                f"cache {name!r} is not valid; choose dynamic, static, static@N, graph or graph@N"
            )
        out.append((kind, int(size) if size else None))
    return out


def model(p: argparse.ArgumentParser, default: str | None = "toy", several: bool = False) -> None:
    """``--model NAME[:PRECISION]`` (or ``--models``, comma-separated): a built-in model, at a precision, or a
    model directory; read with ``model_names``."""
    p.add_argument(
        "--models" if several else "--model",
        default=default,
        metavar="NAME[:PRECISION]" + (",..." if several else ""),
        help=("comma-separated: " if several else "")
        + f"a built-in model ({', '.join(BUILTIN_NAMES[:3])}, ...) at {'|'.join(PRECISIONS)}, or a model directory"
        + (f" (default {default})" if default else ""),
    )


def model_names(text: str) -> list[tuple[str, str | None]]:
    """``--model`` / ``--models`` as (name or directory, precision or None) pairs (``kvlab.bench.plan.untag``);
    ConfigError for a built-in name tagged with a precision that is not one."""
    return [untag(item) for item in text.split(",")]


def one_model(text: str, command: str) -> tuple[str, str | None]:
    """``--model``'s one (name or directory, precision or None); ConfigError where it names several (``command``,
    which runs one, named in the message) or a bad precision."""
    (name, precision), *more = model_names(text)
    if more:
        raise ConfigError(f"--model {text!r} names several models; {command} runs one")
    return name, precision


def device(p: argparse.ArgumentParser, default: str = "cpu", several: bool = False) -> None:
    """``--device`` (or ``--devices``, comma-separated): where the model runs."""
    if several:
        p.add_argument("--devices", metavar="LIST", help=f"comma-separated devices from {', '.join(DEVICES)}")
    else:
        p.add_argument("--device", default=default, choices=DEVICES, help=f"where it runs (default {default})")


def devices_of(text: str, flag: str) -> list[str]:
    """Comma-separated devices; ConfigError naming ``flag`` for one that is not a device."""
    devices = text.split(",")
    bad = [d for d in devices if d not in DEVICES]
    if bad:
        raise ConfigError(f"{flag} {bad[0]!r} is not valid; choose from {DEVICES}")
    return devices


def device_options(p: argparse.ArgumentParser) -> None:
    """``--device-option KEY=VALUE`` (repeatable): how the device opens; read with ``device_options_of``."""
    key_value_flag(
        p,
        "--device-option",
        "CPU: threads=N, spinning=on|off, huge_pages=on|off; WebGPU: buffer_cache_mode=M, validation_mode=M",
    )


def key_value_flag(p: argparse.ArgumentParser, flag: str, what: str) -> None:
    """A repeatable ``flag KEY=VALUE``; read with ``key_values``."""
    p.add_argument(flag, action="append", default=[], metavar="KEY=VALUE", help=what)


def key_values(items: list[str], flag: str, keys: dict[str, Any]) -> dict[str, Any]:
    """``KEY=VALUE`` items, each value read by its key's function; ConfigError naming ``flag`` for an unknown or
    repeated key or a value its function refuses."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or key not in keys:
            raise ConfigError(f"{flag} {item!r}: give KEY=VALUE with KEY one of {', '.join(keys)}")
        if key in out:
            raise ConfigError(f"{flag} {key} is given twice")
        try:
            out[key] = keys[key](value)
        except ConfigError:
            raise  # it names the value and what is valid
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"{flag} {item!r}: {exc}") from None
        except (KeyError, ValueError):
            table = getattr(keys[key], "__self__", None)  # a table's lookup (e.g. on/off): name its entries
            valid = f"; choose one of {', '.join(map(str, table))}" if isinstance(table, dict) else ""
            raise ConfigError(f"{flag} {item!r}: {value!r} is not a valid {key}{valid}") from None
    return out


def device_options_of(args: argparse.Namespace) -> dict[str, Any]:
    """``--device-option``'s items as ``open_device`` keyword arguments (which judges what a device accepts)."""
    return key_values(args.device_option, "--device-option", DEVICE_OPTIONS)


def prompt(p: argparse.ArgumentParser) -> None:
    """The prompt: a positional text or ``--prompt-file``, and ``--chat``; read with ``prompt_of``."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("prompt", nargs="?", help="the prompt text (default: a question about KV caches)")
    src.add_argument("--prompt-file", type=path_arg, metavar="FILE", help="read the prompt from a UTF-8 file")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")


DEFAULT_PROMPT = "Explain in two sentences why a language model keeps a cache of keys and values."


MAX_TEXT_BYTES = 16 * 2**20  # the most bytes of a prompt file or a chat line read: far past any model's context


def prompt_of(args: argparse.Namespace) -> str:
    """The prompt text; ConfigError for a prompt file that cannot be read, is not UTF-8 or holds more than
    ``MAX_TEXT_BYTES`` (read no further: ``/dev/zero`` never ends)."""
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, "rb") as f:
                data = f.read(MAX_TEXT_BYTES + 1)
            if len(data) > MAX_TEXT_BYTES:
                raise ConfigError(
                    f"--prompt-file {str(args.prompt_file)!r} holds more than {MAX_TEXT_BYTES} bytes, far more "
                    "than any model's context; give a shorter prompt"
                )
            return data.decode("utf-8")
        except OSError as exc:
            raise ConfigError(f"--prompt-file {str(args.prompt_file)!r}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"--prompt-file {str(args.prompt_file)!r} is not UTF-8 text (byte {exc.start}: "
                f"{exc.object[exc.start : exc.start + 1]!r}); save it as UTF-8"
            ) from exc
    return DEFAULT_PROMPT if args.prompt is None else args.prompt


def sample(p: argparse.ArgumentParser) -> None:
    """``--sample [KEY=VALUE]`` (repeatable): sampling instead of greedy decoding; read with ``sampling_of``."""
    p.add_argument(
        "--sample",
        nargs="?",
        action="append",
        const="",
        metavar="KEY=VALUE",
        help="sample instead of greedy decoding: temperature=1, top_k=0, top_p=1, seed=0 unless given",
    )


def sampling_of(args: argparse.Namespace) -> Sampling:
    """``--sample``'s items as a Sampling (greedy without the flag); ConfigError for a bad key or value."""
    if args.sample is None:
        return Sampling()
    return Sampling(do_sample=True, **{"seed": 0, **key_values([s for s in args.sample if s], "--sample", SAMPLING)})


def token_on_device(p: argparse.ArgumentParser) -> None:
    """``--token-on-device [WHERE]``: where the greedy token is chosen (``generate``'s ``token_on_device``)."""
    p.add_argument(
        "--token-on-device",
        nargs="?",
        const="on",
        default="auto",
        choices=WHERE,
        metavar="WHERE",
        help="where the greedy token is chosen: device (on, blocks, single, rows), host (off), or auto (default)",
    )


def caches(p: argparse.ArgumentParser, default: str | None, what: str) -> None:
    """``--cache LIST``: which caches run (``cache_names``)."""
    p.add_argument("--cache", type=cache_names, metavar="LIST", help=what + f" (default {default})")


def settings(p: argparse.ArgumentParser, call: str, keys: dict[str, Any]) -> None:
    """``--set KEY=VALUE`` (repeatable): a keyword of ``call``, the Python call the command makes, beyond its flags;
    read with ``key_values(args.set, "--set", keys)``."""
    key_value_flag(p, "--set", f"a keyword of {call}: {', '.join(keys)} (lists comma-separated, switches on|off)")


def counts(p: argparse.ArgumentParser, **defaults: tuple[int | None, str]) -> None:
    """One positive-int flag per keyword (``new_tokens=(16, "help")`` adds ``--new-tokens``)."""
    for name, (default, what) in defaults.items():
        more = "" if default is None else f" (default {default})"
        p.add_argument("--" + name.replace("_", "-"), type=positive_int, default=default, metavar="N", help=what + more)


def out(p: argparse.ArgumentParser, default: str | None, what: str, folder: bool = False) -> None:
    """``--out PATH``: where the results go (a folder or a file), checked before anything is measured."""
    p.add_argument(
        "--out", type=path_arg, default=None if default is None else Path(default), metavar="PATH", help=what
    )
    p.set_defaults(out_is_folder=folder)


def json_flag(p: argparse.ArgumentParser, what: str = "machine-readable result on stdout") -> None:
    """``--json``: the result as JSON on stdout."""
    p.add_argument("--json", action="store_true", help=what)
