"""The kvlab command, run as a user runs it (a subprocess of the installed entry point)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.ort.runtime.plugin import installed

KVLAB = [str(Path(sys.executable).parent / "kvlab")]


def kvlab(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(KVLAB + list(args), capture_output=True, text=True, timeout=timeout)


def test_compare_json_smollm2_cpu():
    r = kvlab(
        "compare",
        "--model",
        "smollm2",
        "--device",
        "cpu",
        "--chat",
        "What is the capital of France?",
        "--max-new-tokens",
        "20",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["identical"] is True and set(out["runs"]) == {"dynamic", "static"}
    for run in out["runs"].values():
        assert run["text"] == "The capital of France is Paris."
        assert len(run["records"]) == len(run["token_ids"])
    assert out["runs"]["static"]["summary"]["tensors_per_step"] == 0
    assert out["runs"]["dynamic"]["summary"]["tensors_per_step"] == 60


def test_compare_table_toy_webgpu(tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("kv caches on webgpu")
    r = kvlab(
        "compare",
        "--model",
        "toy",
        "--device",
        "webgpu",
        "--prompt-file",
        str(prompt),
        "--max-new-tokens",
        "6",
        "--ignore-eos",
    )
    assert r.returncode == 0, r.stderr
    assert "outputs identical: True" in r.stdout and "SwiftShader" in r.stdout or "hardware" in r.stdout
    assert "static@256" in r.stdout and "tok/s" in r.stdout
    assert "greedy token chosen on the device" not in r.stdout  # by default on the host
    dev = kvlab(
        "compare",
        "--model",
        "toy",
        "--device",
        "webgpu",
        "--prompt-file",
        str(prompt),
        "--max-new-tokens",
        "6",
        "--ignore-eos",
        "--token-on-device",
    )
    assert dev.returncode == 0, dev.stderr
    assert dev.stdout.count("; the greedy token chosen on the device, read back every 8 steps)") == 2  # per run
    assert "outputs identical: True" in dev.stdout


def test_generate_and_python_dash_m():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvlab",
            "generate",
            "--model",
            "toy",
            "--cache",
            "static@64",
            "hi",
            "--max-new-tokens",
            "4",
            "--ignore-eos",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert list(out["runs"]) == ["static@64"] and len(out["runs"]["static@64"]["token_ids"]) == 4
    assert out["max_cache_len"] == 64


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "--model", "toy", "--cache", "static@0"], "cache 'static@0' is not valid"),
        (
            ["generate", "--model", "toy", "--cache", "static@3", "far too long a prompt"],
            "--cache static@3 holds 3 positions; this run needs",
        ),
        (["generate", "--model", "/no/such/dir"], "'/no/such/dir' is neither a built-in name"),
        (["generate", "--model", "toy", ""], "the prompt is empty"),
        (["generate", "--model", "toy", "--sample", "--token-on-device"], "sampling (do_sample=True) needs the logits"),
        (["generate", "--model", "toy", "--cache", "dynamic@8"], "cache 'dynamic@8' is not valid"),
        (["generate", "--model", "toy", "--prompt-file", "/no/file.txt"], "--prompt-file '/no/file.txt'"),
        (["generate", "--model", "toy", "--cache", "static@99999"], "larger than model toy's context length 4096"),
        (["inspect", "/no/such/dir"], "'/no/such/dir' is neither a built-in name"),
        (["inspect", "toy", "q9"], "q9"),
    ],
)
def test_errors_exit_nonzero_with_message_on_stderr(args, message):
    r = kvlab(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("kvlab: error: ") and message in r.stderr


def test_inspect_shows_layers_inputs_and_which_caches_run_a_model():
    r = kvlab("inspect", "sliding-toy")
    assert r.returncode == 0, r.stderr
    assert "KV, sliding window 16" in r.stdout and "past_key_values." in r.stdout
    caches = r.stdout.split("caches", 1)[1].splitlines()
    assert any(line.split()[:1] == ["ring"] for line in caches) and any("runs" in line for line in caches)
    assert len(r.stdout.splitlines()) <= 40  # one screen


def test_argparse_rejects_unknown_choices():
    r = kvlab("generate", "--device", "tpu")
    assert r.returncode == 2 and "invalid choice: 'tpu'" in r.stderr
    r = kvlab("generate", "--device-option", "buffer_cache_mode=huge", "--device", "webgpu")
    assert r.returncode == 2 and "buffer cache mode 'huge' is not valid" in r.stderr


def test_doctor_json():
    r = kvlab("doctor", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    if installed():  # .venv-plugin: onnxruntime + the plugin EP, never the built-in wheel beside them
        assert (
            out["versions"]["onnxruntime-ep-webgpu"] == "0.4.0" and out["versions"]["onnxruntime-webgpu"] == "missing"
        )
        assert out["backend"].startswith("onnxruntime-ep-webgpu")
    else:
        assert out["versions"]["onnxruntime-webgpu"] == "1.27.0" and out["versions"]["onnxruntime"] == "missing"
        assert out["backend"].startswith("onnxruntime-webgpu")
    assert out["runs"]["cpu"]["ok"] and out["runs"]["webgpu"]["ok"]
    assert out["runs"]["cpu"]["tokens"] == out["runs"]["webgpu"]["tokens"]
    cpu_setting = r"\d+ threads, (not )?spinning: [\d.]+ of \d+ cores idle when the device opened \((quiet|busy)\)"
    assert re.fullmatch(cpu_setting, out["runs"]["cpu"]["settings"]) and out["runs"]["webgpu"]["settings"] == ""
    assert out["adapters"]["webgpu"]["kind"] in ("hardware", "software") and out["problems"] == []


@pytest.mark.parametrize("ctrl_c", ["default", "ignored"])
def test_a_sigterm_is_ctrl_c_and_waits_for_an_atomic_block(ctrl_c):
    """The CLI's SIGTERM handler (real signals, raised in this process): outside an atomic block it stops at once
    with a KeyboardInterrupt; inside one, the block runs to its end first, as with Ctrl-C; also where Ctrl-C is
    ignored."""
    import signal

    from kvlab.cli import stop
    from kvlab.core.guards import atomic

    old_int = signal.signal(signal.SIGINT, signal.default_int_handler if ctrl_c == "default" else signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
        reached = []
        with pytest.raises(KeyboardInterrupt), atomic():
            signal.raise_signal(signal.SIGTERM)
            reached.append("the end of the block")
        assert reached == ["the end of the block"]
        assert signal.getsignal(signal.SIGINT) is (
            signal.default_int_handler if ctrl_c == "default" else signal.SIG_IGN
        )
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def _subparsers(ap: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of the kvlab parser and every subcommand's, each once (an alias is the same parser)."""
    yield path, ap
    for action in (a for a in ap._actions if isinstance(a, argparse._SubParsersAction)):
        seen: set[int] = set()
        for name, sub in action.choices.items():
            if id(sub) not in seen:
                seen.add(id(sub))
                yield from _subparsers(sub, (*path, name))


def test_the_command_has_at_most_80_flags_and_every_help_fits_a_screen(monkeypatch):
    """A CLI a person can hold: flags counted per (sub)command, --help excluded; every --help at most 40 lines of an
    80-column terminal."""
    from kvlab.cli.commands import parser

    monkeypatch.setenv("COLUMNS", "80")
    parsers = list(_subparsers(parser()))
    flags = [(p, a.option_strings[-1]) for p, ap in parsers for a in ap._actions if a.option_strings]
    flags = [f for f in flags if f[1] != "--help"]
    assert len(flags) <= 80, flags
    long = {" ".join(p): n for p, ap in parsers if (n := len(ap.format_help().splitlines())) > 40}
    assert not long, long
