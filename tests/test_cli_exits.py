"""The ``kvlab`` command's exit statuses (``kvlab.cli``'s docstring): a table of bad command lines, each exiting 2
with one line on stderr and no "internal error" (in-process, through ``kvlab.cli.main``); and, as a user meets
them, in real subprocesses: a user error through ``python -m kvlab``, a real SIGINT at points of the startup
(exit 130, one line, no traceback), and stdout's reader gone, before the first byte and in the middle of a long
output (exit 141, nothing on stderr)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ctrl_c_as_in_a_terminal

from kvlab.cli import main

KVLAB = str(Path(sys.executable).parent / "kvlab")

# (argv, a fragment of the one line): each a mistake a user can make; none starts a measurement.
BAD = [
    ([], "the following arguments are required: COMMAND"),
    (["generate", "a", "--prompt-file", "b.txt"], "argument --prompt-file: not allowed with argument prompt"),
    (["generate", "--cache", "graph"], "needs --device webgpu, not cpu"),
    (["generate", "--model", "toy", "--sample", "top_k=-1"], "top_k"),
    (["generate", "--model", "toy", "--sample", "top_p"], "--sample 'top_p': give KEY=VALUE"),
    (["generate", "--model", "toy", "--cache", "dynamic", "--max-new-tokens", "5000"], "holds at most 4096"),
    (["generate", "--model", "toy", "--max-new-tokens", str(10**10)], "positions are needed but model toy holds"),
    (["generate", "--model", "toy", "--max-new-tokens", str(10**30)], "positions are needed but model toy holds"),
    (["generate", "--model", "toy", "--sample", "temperature=1e-320"], "temperature=1e-320 is below"),
    (["generate", "--model", "toy", "--device-option", "threads=2", "--device-option", "threads=1"], "given twice"),
    (["generate", "--model", "toy:int3"], "precision 'int3' is not valid"),
    (["generate", "--cache", "static@"], "cache 'static@' is not valid"),
    (["compare", "--model", "toy", "--max-new-tokens", "-5"], "compare: argument --max-new-tokens: -5 must be >= 1"),
    (["bench", "--reps", "0"], "argument --reps: 0 must be >= 1"),
    (["bench", "--models", "smollm2:int3"], "precision 'int3' is not valid"),
    (["bench", "--set", "static_lens=64,0"], "--set 'static_lens=64,0'"),
    (["bench", "--set", "colour=blue"], "KEY one of precisions, genai, static_lens"),
    (["bench", "--set", "genai=tpu"], "genai 'tpu' is not valid"),
    (["bench", "--device-option", "validation_mode=basic"], "kvlab bench opens WebGPU in its default validation"),
    (["profile"], "the following arguments are required: MODE"),
    (["profile", "ops", "--context", "0"], "argument --context: 0 must be >= 1"),
    (["profile", "phases", "--model", "/no/such/model"], "'/no/such/model' is neither a built-in name"),
    (["profile", "phases", "--token-on-device", "sideways"], "argument --token-on-device: invalid choice"),
    (["trace", "--model", "toy", "--steps", "0"], "argument --steps: 0 must be >= 1"),
    (["trace", "--model", "toy,toy"], "names several models; kvlab trace runs one"),
    (["conformance", "--models", "toy:fp32,toy:int3"], "precision 'int3' is not valid"),
    (["chat", "--model", "toy", "--max-new-tokens", "0", "--turn", "hi"], "argument --max-new-tokens: 0 must be >= 1"),
    (["chat", "--model", "toy", "--cache", "static,dynamic", "--turn", "hi"], "a conversation runs one cache"),
    (["chat-bench", "--probe", "-1"], "--probe -1 must be 0 or a positive int"),
    (["chat", "--model", "/no/such/model", "--turn", "hi"], "'/no/such/model' is neither a built-in name"),
    (["browser-bench", "--new-tokens", "0"], "argument --new-tokens: 0 must be >= 1"),
    (["browser-bench", "--cache", "paged"], "cache 'paged' is not valid"),
    (["browser-bench", "--set", "timeout=nan"], "--set 'timeout=nan': nan must be > 0"),
    (["doctor", "--verbose"], "unrecognized arguments: --verbose"),
    (["inspect", "/no/such/model"], "'/no/such/model' is neither a built-in name"),
    (["prepare", "phi4-kv"], "'phi4-kv' is not one of the notebooks' models"),
]


@pytest.mark.parametrize("argv, says", BAD, ids=[" ".join(a) or "(none)" for a, _ in BAD])
def test_a_bad_command_line_exits_2_with_one_line(argv, says, toy, capsys):
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's usage errors exit from inside the parser
        rc = exc.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("kvlab: error: "), (rc, err)
    assert "internal error" not in err and "Traceback" not in err and says in lines[0], err


def test_the_table_spans_the_subcommands():
    from kvlab.cli.commands import parser

    (commands,) = [a for a in parser()._actions if a.dest == "command"]
    assert len(BAD) >= 10 and {a[0] for a, _ in BAD if a} >= set(commands.choices)


def test_a_user_error_through_python_m_kvlab_exits_2():
    r = subprocess.run(
        [sys.executable, "-m", "kvlab", "bench", "--contexts", "1k"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("kvlab: error: bench: argument --contexts: '1k'"), r.stderr


# Where in ``python -m kvlab doctor``'s startup the SIGINT is sent: once a module has loaded (``python -v`` names
# each one). From the package itself (now a few milliseconds: its names load lazily) through ``kvlab.cli`` to the
# heavy imports (numpy, ONNX Runtime) that ``main`` makes after its handler is in place.
STARTUP = ["import 'kvlab' ", "import 'kvlab.cli.exits'", "import 'kvlab.cli' ", "import 'numpy' ", "kvlab.ort.models"]


def _interrupt_after(after: str) -> tuple[int, str, str]:
    """``python -v -m kvlab doctor``, sent a real SIGINT once ``after`` shows in its list of imports: (exit status,
    stdout, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-v", "-m", "kvlab", "doctor"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )
    try:
        for line in proc.stderr:
            if after in line:
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.mark.parametrize("after", STARTUP, ids=[m.split("'")[1] if "'" in m else m for m in STARTUP])
def test_ctrl_c_at_any_point_of_the_startup_exits_130(after):
    """A real SIGINT, sent once ``after`` shows in ``python -v``'s list of imports (the child waits on that pipe,
    so the signal lands within the startup): exit 130, one line, no traceback. On a busy machine this process can
    read the pipe so late that the child is already tearing the interpreter down when the signal lands (killed by
    it: -2, its stderr at ``# cleanup``): that try tested nothing about the startup and is made again (3 at most)."""
    for _ in range(3):
        code, out, err = _interrupt_after(after)
        if not (code == -signal.SIGINT and "# cleanup" in err):
            break
    ours = [line for line in err.splitlines() if line.startswith("kvlab")]
    assert code == 130 and ours == ["kvlab: interrupted"], (code, err[-3000:])
    assert "Traceback" not in err and out == "", err[-3000:]


def test_import_kvlab_loads_nothing_heavy():
    """The package's names load on first use: ``import kvlab`` leaves numpy and ONNX Runtime unloaded, so Ctrl-C
    is the command's from the start; ``from kvlab import X`` and ``kvlab.X`` still reach every public name."""
    code = (
        "import sys, kvlab; heavy = [m for m in ('numpy', 'onnxruntime', 'kvlab.ort') if m in sys.modules]; "
        "from kvlab import load, KvlabError, Cache; assert all(getattr(kvlab, n) for n in kvlab.__all__); "
        "assert set(kvlab.__all__) <= set(dir(kvlab)); print(heavy)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)


def _quiet(err: str) -> bool:
    """Nothing on stderr from kvlab or from Python's flush at exit."""
    return not any(s in err for s in ("Traceback", "Exception ignored", "kvlab:", "BrokenPipeError"))


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_stdout_closed_before_the_first_byte_exits_141_quietly(buffered):
    """``kvlab generate --json`` into a pipe whose reader has already gone: the write fails in the command's own
    print (stdout unbuffered, ``PYTHONUNBUFFERED=1``) or when ``main`` flushes stdout at the end (buffered)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [KVLAB, "generate", "--model", "toy", "hi", "--max-new-tokens", "2", "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141 and _quiet(proc.stderr), (proc.returncode, proc.stderr)


def test_a_reader_that_takes_one_line_and_goes_stops_kvlab_quietly():
    """As ``kvlab generate --json | head -1``: the JSON is far larger than a pipe holds, so kvlab is still writing
    when its reader goes, in the middle of the command."""
    proc = subprocess.Popen(
        [KVLAB, "generate", "--model", "toy", "hi", "--max-new-tokens", "400", "--ignore-eos", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout.readline() == b"{\n"
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141 and _quiet(err), (proc.returncode, err)
    finally:
        if proc.poll() is None:
            proc.kill()
