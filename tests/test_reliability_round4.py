"""Issue 55's defects, each with the real part: a conversation's cache held by someone else, a conversation called
from two real threads, sizes taken from a flag, non-finite logits on the device path, model files replaced under a
loaded model, special files as outputs, a killed browser-bench's node, and a Ctrl-C during ONNX Runtime's import."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import kvlab
from kvlab import Conversation, StaticCache, Stepper, generate, open_device
from kvlab.core.paths import check_output, write_atomic
from kvlab.ort.models.graph import DERIVED

REPO = Path(__file__).resolve().parents[1]

A, B = [5, 6, 7, 8], [9, 10]


# -- one owner per cache use: a refused turn does not adopt another's use
def test_a_turn_refused_because_a_stepper_holds_the_cache_does_not_adopt_its_use(toy):
    with Conversation(toy, StaticCache(32)) as reference:
        reference.say(A, 3, stop_on_eos=False)
        expected = reference.say(B, 3, stop_on_eos=False).token_ids
    cache = StaticCache(32)
    with Conversation(toy, cache) as chat:
        chat.say(A, 3, stop_on_eos=False)
        with Stepper(toy, cache, "cpu", 8) as other:  # someone else's sequence in the conversation's cache
            other.step([20, 21, 22])
            with pytest.raises(kvlab.CacheStateError, match="in use by another generation"):
                chat.say(B, 3, stop_on_eos=False)
        assert chat.held == 0  # the other use's positions are not the conversation's
        assert chat.say(B, 3, stop_on_eos=False).token_ids == expected


# -- a conversation is called by one thread at a time
def _hold_a_turn(chat: Conversation) -> tuple[threading.Thread, threading.Event, threading.Event, list]:
    """A thread whose turn waits inside its first step's hook until released; returns it, 'inside', 'go on'."""
    inside, go_on, errors = threading.Event(), threading.Event(), []

    def hook(record):
        inside.set()
        assert go_on.wait(30)

    chat.hooks.append(hook)

    def turn():
        try:
            chat.say(B, 2, stop_on_eos=False)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    t = threading.Thread(target=turn, name="turn-thread")
    t.start()
    assert inside.wait(30)
    return t, go_on, errors


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.say([11, 12], 2),
        lambda c: c.rewind(2),
        lambda c: c.rewind_turn(),
        lambda c: c.close(),
    ],
    ids=["say", "rewind", "rewind_turn", "close"],
)
def test_a_second_thread_calling_a_conversation_during_a_turn_is_refused_and_changes_nothing(toy, call):
    with Conversation(toy, StaticCache(32)) as chat:
        chat.say(A, 3, stop_on_eos=False)
        t, go_on, errors = _hold_a_turn(chat)
        try:
            with pytest.raises(kvlab.CacheStateError, match=r"while turn-thread runs Conversation\.say\(\)"):
                call(chat)
        finally:
            go_on.set()
            t.join(30)
        chat.hooks.pop()
        assert not errors
        assert [(t.index, t.start) for t in chat.turns] == [(1, 0), (2, len(A) + 3)]
        with Conversation(toy, StaticCache(32)) as reference:
            reference.say(A, 3, stop_on_eos=False)
            assert chat.turns[1].token_ids == reference.say(B, 2, stop_on_eos=False).token_ids
        assert chat.rewind_turn().index == 2 and len(chat.ids) == len(A) + 3


# -- sizes from the run, checked before allocation
def test_tokens_per_read_past_the_run_allocates_for_the_run(toy):
    dev = open_device("cpu")
    live: list[int] = []
    before, start = dev.live_tensors, time.perf_counter()
    g = generate(
        toy, A, max_new_tokens=4, token_on_device=True, tokens_per_read=10**3, stop_on_eos=False,
        cache=StaticCache(16), on_step=lambda r: live.append(dev.live_tensors),
    )  # fmt: skip
    assert time.perf_counter() - start < 5
    assert len(g.token_ids) == 4
    assert max(live) - before < 40  # the cache's buffers and a ring of at most the run's positions + 1


@pytest.mark.parametrize("asked", [10**5])  # (10**9 allocated until memory ran out before the bound)
def test_an_absurd_tokens_per_read_is_refused_by_name_before_anything_runs(toy, asked):
    start = time.perf_counter()
    with pytest.raises(kvlab.ConfigError, match=rf"tokens_per_read={asked} must be an int from 1 to"):
        generate(toy, A, max_new_tokens=4, token_on_device=True, tokens_per_read=asked)
    with pytest.raises(kvlab.ConfigError, match=rf"tokens_per_read={asked} must be an int from 1 to"):
        Stepper(toy, StaticCache(16), "cpu", 8, token_on_device=True, tokens_per_read=asked)
    assert time.perf_counter() - start < 5


def test_a_burst_after_a_prefill_that_returned_its_logits_runs(toy):
    # the prefill bound the logits [1, 4, vocab] on the binding the burst's steps reuse: a raw RuntimeError before
    expected = generate(toy, A, max_new_tokens=4, token_on_device=False, stop_on_eos=False).token_ids
    with Stepper(toy, StaticCache(16), "cpu", 8, token_on_device=True, tokens_per_read=10**3) as s:
        first = s.step(np.array(A))[1].token
        records = s.decode(first, 3)
    assert [first, *(r.token for r in records)] == expected


# -- one output writer: only a regular file is replaced
def _fifo_reader(path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(open(path, "rb").read()))  # noqa: SIM115 - read to the end
    t.start()
    return t, got


def test_an_output_that_is_a_fifo_is_written_through_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    reader, got = _fifo_reader(fifo)
    write_atomic(fifo, '{"a": 1}')
    reader.join(10)
    assert got == [b'{"a": 1}'] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_an_output_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_a_command_writing_to_a_character_device_keeps_the_device(tmp_path, capsys):
    from kvlab.cli import main

    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # the system's /dev/null, made here
    assert main(["trace", "--device", "cpu", "--context", "4", "--steps", "2", "--out", str(null)]) == 0
    assert stat.S_ISCHR(os.stat(null).st_mode) and os.stat(null).st_rdev == os.makedev(1, 3)
    assert check_output(null, "--out", False) == null


# -- ONNX Runtime's import is not split by a Ctrl-C
IMPORT_INTERRUPTED = """
import signal, sys
seen = []
def hook(event, args):
    if event == "import" and args[0].startswith("onnxruntime"):
        seen.append(args[0])
        if len(seen) == {at}:
            signal.raise_signal(signal.SIGINT)
sys.addaudithook(hook)
import kvlab
from kvlab.ort.runtime import device
try:
    kvlab.generate("toy", [1, 2, 3], max_new_tokens=2, stop_on_eos=False)
except KeyboardInterrupt:
    print("interrupted, whole:", "onnxruntime" in sys.modules and device._BACKEND is not None)
print("retry:", kvlab.generate("toy", [1, 2, 3], max_new_tokens=2, stop_on_eos=False).token_ids)
"""


@pytest.mark.parametrize("at", [2, 5])  # inside the package's import, and at its C extension
def test_a_ctrl_c_during_onnx_runtimes_import_lands_after_it_and_a_retry_works(at):
    from conftest import run_python

    out = run_python(IMPORT_INTERRUPTED.format(at=at), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "interrupted, whole: True" in out.stdout and "retry: [" in out.stdout, out.stdout


# -- model files changed under a loaded model
def _copy_of(toy: kvlab.Model, to) -> kvlab.Model:
    to.mkdir()
    for f in toy.info.path.iterdir():
        if DERIVED not in f.name:
            shutil.copy(f, to / f.name)
    return kvlab.load(to)


def _write_other_weights(folder) -> None:
    """Other weights, written in place into the same model.onnx.data (same size and inode): lm_head scaled."""
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    init = next(i for i in graph.graph.initializer if i.name == "lm_head.MatMul.weight")
    where = {e.key: e.value for e in init.external_data}
    offset, length = int(where["offset"]), int(where["length"])
    with open(folder / where["location"], "r+b") as f:
        f.seek(offset)
        weights = np.frombuffer(f.read(length), np.float32)
        f.seek(offset)
        f.write((weights[::-1]).tobytes())  # another model: the same bytes in another order
    os.utime(folder / where["location"], ns=(time.time_ns(), time.time_ns() + 10**9))


@pytest.mark.parametrize("token_on_device", [False, "single", "rows", "blocks"])
def test_files_changed_under_a_loaded_model_are_refused_and_a_new_load_runs_the_new_files(
    toy, tmp_path, token_on_device
):
    model = _copy_of(toy, tmp_path / "m")
    run = {"max_new_tokens": 4, "stop_on_eos": False, "token_on_device": token_on_device}
    before = generate(model, A, **run).token_ids
    with Conversation(model, StaticCache(32)) as chat:
        chat.say(A, 2, stop_on_eos=False)
        _write_other_weights(tmp_path / "m")
        with pytest.raises(kvlab.ModelError, match=r"model m's files changed since it was loaded \(model.onnx.data"):
            chat.say(B, 2, stop_on_eos=False)
    for how in ({}, {"cache": StaticCache(32)}):
        with pytest.raises(kvlab.ModelError, match="changed since it was loaded"):
            generate(model, A, **run, **how)
    again = generate(kvlab.load(tmp_path / "m"), A, **run).token_ids
    shutil.copytree(tmp_path / "m", tmp_path / "fresh", ignore=lambda d, names: [n for n in names if DERIVED in n])
    assert again == generate(kvlab.load(tmp_path / "fresh"), A, **run).token_ids != before


# -- a killed browser-bench takes its node with it
def _children(pid: int) -> list[int]:
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(stat_file.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_browser_bench_killed_with_sigkill_takes_node_with_it_and_its_folder_goes_at_the_next_start(
    tmp_path, monkeypatch
):
    from kvlab.web.node import TEMP_PREFIX, remove_orphaned_folders

    temp = tmp_path / "tmp"
    temp.mkdir()
    argv = ["--models", "toy", "--contexts", "8", "--new-tokens", "64", "--reps", "50", "--cache", "static"]
    cli = subprocess.Popen(
        [sys.executable, "-m", "kvlab", "browser-bench", "--host", "node", *argv, "--out", str(tmp_path / "out")],
        env={**os.environ, "TMPDIR": str(temp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, node = time.monotonic() + 120, []
        while not node and time.monotonic() < deadline and cli.poll() is None:
            time.sleep(0.2)
            node = _children(cli.pid)
        assert node, "node never started"
        folders = list(temp.glob(TEMP_PREFIX + "*"))
        cli.kill()  # SIGKILL: nothing of the CLI runs after it
        cli.wait(30)
    finally:
        if cli.poll() is None:
            cli.kill()
    deadline = time.monotonic() + 10
    while any(map(_alive, node)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, node)), "node outlived the killed command"
    assert folders and all(f.exists() for f in folders)  # nobody could clean up: the next start does
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    assert sorted(remove_orphaned_folders()) == sorted(folders) and not any(f.exists() for f in folders)


# -- messages that name the user's values truly
def test_a_full_conversation_says_none_is_left_not_a_negative_count(toy):
    with Conversation(toy, StaticCache(10)) as chat:
        chat.say(A, 7, stop_on_eos=False)  # 4 + 7 - 1 = 10 positions: the history holds 11 tokens
        with pytest.raises(kvlab.CapacityError) as err:
            chat.say(B, 2, stop_on_eos=False)
    message = str(err.value)
    assert "holds 11 tokens and max_cache_len of the static cache allows 10 positions, so none is left" in message
    assert "-1" not in message


def test_kvlab_version_answers_with_the_version():
    from conftest import run_python

    out = run_python("import sys; from kvlab.cli import main; sys.argv = ['kvlab', '--version']; main()")
    assert out.returncode == 0 and out.stdout.strip() == f"kvlab {kvlab.__version__}", out.stderr


def test_chat_lines_ending_in_cr_lf_are_the_same_messages(capsys, monkeypatch):
    from kvlab.cli import main

    said = {}
    for ending in ("\n", "\r\n"):
        monkeypatch.setattr(sys, "stdin", io.StringIO(f"first message{ending}second{ending}"))
        assert main(["chat", "--model", "toy", "--max-new-tokens", "3", "--json"]) == 0
        said[ending] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    same = [[(t["prefilled"], t["positions"], t["text"]) for t in said[e]] for e in ("\n", "\r\n")]
    assert len(same[0]) == 2 and same[0] == same[1]  # no CR in the prompts


@pytest.mark.parametrize(
    "shell, says",
    [
        ("generate --model \"$(printf 'x%.0s' $(seq 300))\"", "is neither a built-in name"),
        ("chat --model toy <&-", "no messages: stdin is closed and no --turn was given"),
        ("generate --model toy --max-new-tokens 2 >&-", "stdout is closed, so the command's output would be lost"),
    ],
    ids=["300-character model", "chat, stdin closed", "stdout closed"],
)
def test_inputs_a_shell_can_give_are_one_line_errors_and_exit_2(shell, says):
    """A name the file system cannot hold, a closed stdin, a closed stdout: each one line on stderr, exit 2."""
    r = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m kvlab {shell}"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, (r.returncode, r.stderr[-500:])


# -- no setting silently dropped
def test_a_ring_cache_with_a_kv_precision_is_refused_by_name_not_made_without_it():
    from kvlab.core.labels import CacheSpec
    from kvlab.ort import make_cache
    from kvlab.ort.decode.caches.ring import RingStaticCache

    with pytest.raises(kvlab.ConfigError, match=r"RingStaticCache\(kv_precision='int8'\): ring buffers hold"):
        make_cache(CacheSpec("static", 64, "ring+kv-int8"))
    with pytest.raises(kvlab.ConfigError, match=r"RingStaticCache\(kv_precision='int4'\)"):
        RingStaticCache(64, kv_precision="int4")
    assert type(make_cache(CacheSpec("static", 64, "ring"))) is RingStaticCache


def test_keeping_another_models_sequence_is_refused_and_changes_nothing(toy):
    """toy and its graph-capture build share a layout: a cache that holds toy's KV cannot be continued by the other
    model with keep=True (it would mix two models' keys and values); a fresh use of the other model resets it."""
    other = kvlab.load("toy", graph_capture=True)
    assert other.info.layout == toy.info.layout and other.name != toy.name
    with StaticCache(64) as cache:
        generate(toy, [1, 2, 3], cache=cache, device="cpu", max_new_tokens=3, stop_on_eos=False)
        held = cache.seq_length
        with pytest.raises(kvlab.CacheStateError, match=r"holds 5 positions of model toy's KV; continuing them"):
            with Stepper(other, cache, "cpu", held + 2, keep=True):
                pass
        assert cache.seq_length == held and not cache.in_use
        with Stepper(toy, cache, "cpu", held + 2, keep=True):  # the same model goes on
            pass
        generate(other, [1, 2, 3], cache=cache, device="cpu", max_new_tokens=2, stop_on_eos=False)  # fresh: fine
