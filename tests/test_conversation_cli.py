"""``kvlab chat``: a scripted or piped conversation prints each turn with the positions it reused and prefilled and
its time to first token; ``/back`` takes a turn back; a turn that does not fit, or a bad flag, is one line on stderr
and exit 2, with the turns before it printed; Ctrl-C exits 130. ``kvlab chat-bench`` writes results.json with its
environment and a row per turn (reused against re-prefilled). All on the toy model, on the CPU EP."""

from __future__ import annotations

import gc
import io
import json
import signal
import subprocess
import sys

import pytest
from conftest import ctrl_c_as_in_a_terminal

from kvlab.cli import main
from kvlab.ort import open_device
from kvlab.ort.decode.conversation import default_prefill_chunk

TOY = ["chat", "--model", "toy", "--max-new-tokens", "6", "--json"]


def _turns(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_scripted_turns_reuse_the_cache(capsys):
    assert main([*TOY, "--turn", "hello there", "--turn", "and once more"]) == 0
    first, second = _turns(capsys.readouterr().out)
    assert (first["turn"], first["reused"]) == (1, 0) and first["prefilled"] > 0
    assert second["reused"] == first["positions"] - 1  # all but the reply's last token, which the turn feeds
    assert second["reused"] + second["prefilled"] + second["new_tokens"] == second["positions"]
    assert first["ttft_ms"] > 0 and first["capacity"] == 2048


def test_plain_output_names_reused_prefilled_and_ttft(capsys):
    assert main(["chat", "--model", "toy", "--max-new-tokens", "4", "--turn", "hi", "--turn", "again"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[turn 1: reused 0, prefilled ") and " ms, 4 tokens" in lines[0]
    assert lines[1].startswith("assistant: ") and lines[2].startswith("[turn 2: reused ")


def test_stdin_lines_and_back(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("first message\n\nsecond message\n/back\nsecond, edited\n"))
    assert main(TOY) == 0
    first, second, back, edited = _turns(capsys.readouterr().out)
    assert back == {"back": 2, "positions": first["positions"]}
    assert edited["turn"] == 2 and edited["reused"] == second["reused"] + 1  # the rewound cache kept one more
    assert second["text"] != "" and edited["positions"] > first["positions"]


def test_a_turn_that_does_not_fit_is_one_line_and_exit_2(capsys):
    rc = main([*TOY, "--cache", "static@60", "--turn", "a short one", "--turn", "x " * 80, "--turn", "never"])
    out, err = capsys.readouterr()
    assert rc == 2 and len(_turns(out)) == 1
    assert err.count("\n") == 1 and err.startswith("kvlab: error: chat: turn 2: turn 2 does not fit")
    assert "positions (max_cache_len of the static cache)" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["chat", "--max-new-tokens", "0", "--turn", "hi"],
        ["chat", "--cache", "static@0", "--turn", "hi"],
        ["chat", "--cache", "dynamic,static", "--turn", "hi"],
        ["chat", "--lookup", "0", "--turn", "hi"],
        ["chat-bench", "--turns", "0"],
        ["chat-bench", "--probe", "-2"],
    ],
)
def test_bad_values_are_one_line_and_exit_2(capsys, argv):
    try:
        rc = main([*argv, "--model", "toy"])
    except SystemExit as stop:  # argparse's own checks exit from inside the parser
        rc = stop.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"kvlab: error: {argv[0]}: "), err


def test_a_bad_flag_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["chat", "--cache", "paged"])
    assert stop.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_lookup_reports_drafts(capsys):
    text = "one two three four one two three four one two three four"
    assert main([*TOY, "--lookup", "4", "--max-new-tokens", "12", "--turn", text]) == 0
    (turn,) = _turns(capsys.readouterr().out)
    assert turn["new_tokens"] == 12 and 0 <= turn["accepted"] <= turn["drafted"]
    assert turn["lookup_off"] == ""  # it ran


def test_lookup_that_cannot_run_says_why_in_the_turn_line(capsys):
    """Where multi-token steps are wrong (onnxruntime-webgpu 1.27 on a software adapter) --lookup runs one token a
    step: the turn's line says so instead of nothing; where it runs, the line counts its drafts."""
    text = "one two three four one two three four"
    argv = ["chat", "--model", "toy", "--device", "webgpu", "--lookup", "3", "--max-new-tokens", "3", "--turn", text]
    assert main(argv) == 0
    line = capsys.readouterr().out.splitlines()[0]
    wrong = bool(default_prefill_chunk(open_device("webgpu")))  # kvlab's own judgement of this package and adapter
    assert (", no prompt lookup: " in line) is wrong, line


def test_bench_writes_rows_with_their_environment(tmp_path, capsys):
    argv = ["chat-bench", "--model", "toy", "--turns", "2", "--turn-tokens", "24", "--probe", "6"]
    gc.collect()
    gc.disable()  # both caches released by the command itself, not left to the collector
    try:
        assert main([*argv, "--new-tokens", "4", "--reps", "2", "--out", str(tmp_path)]) == 0
        assert open_device("cpu").live_tensors == 0
    finally:
        gc.enable()
    result = json.loads((tmp_path / "results.json").read_text())
    assert {"versions", "backend_package", "cpu", "commit", "date"} <= set(result["environment"])
    rows = result["rows"]
    assert [r["turn"] for r in rows] == [1, 2] and all(r["tokens_equal"] for r in rows)
    for r in rows:
        assert r["reused_positions"] + r["prefilled_positions"] == r["history_tokens"]
        assert r["message_tokens"] == 6 and len(r["reprefill_ttft_runs"]) == 2 and len(r["reuse_ttft_runs"]) == 3
        assert r["ratio"] == pytest.approx(r["reuse_ttft_ms"] / r["reprefill_ttft_ms"])
    assert rows[1]["history_tokens"] > rows[0]["history_tokens"]
    assert "turn 2: history" in capsys.readouterr().out
    # notebook 09 reads such a file back beside the recorded ones (data/conversation/figure.py's runs), and leaves
    # out other recordings in the folder
    from kvlab.lab import recorded

    (tmp_path / "bench").mkdir()
    (tmp_path / "results.json").rename(tmp_path / "bench" / "results.json")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.json").write_text(json.dumps({"rows": [{"check": "a held-out check"}]}))
    (tmp_path / "figure.py").write_text(recorded.load("conversation").read("figure.py"))
    assert recorded.Recording("conversation", tmp_path).draw("runs") == ["bench/results.json"]


def test_ctrl_c_exits_130():
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvlab", *TOY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )
    try:
        proc.stdin.write("hello\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        while line and not line.startswith("{"):  # e.g. a model build's progress, in a fresh cache dir
            line = proc.stdout.readline()
        assert json.loads(line)["turn"] == 1  # the turn is done; it waits for the next line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        err = proc.stderr.read()
        assert err.startswith("kvlab: interrupted") and err.count("\n") == 1 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_chat_on_webgpu_says_what_a_chat_on_the_cpu_says(capsys):
    """The turns on WebGPU feed what the cache lacks one token a step where the package's multi-token steps are
    wrong (onnxruntime-webgpu 1.27 on a software adapter), so the replies equal the CPU EP's (a held-out check found
    them different when the CLI fed each turn in one step)."""
    said = {}
    for device in ("cpu", "webgpu"):
        assert main([*TOY, "--device", device, "--turn", "Which birds migrate?", "--turn", "And where to?"]) == 0
        said[device] = [t["text"] for t in _turns(capsys.readouterr().out)]
    assert said["webgpu"] == said["cpu"] and len(said["cpu"]) == 2
