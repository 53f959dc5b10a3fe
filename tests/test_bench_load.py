"""The under-load benchmark (kvlab.bench.load): its competing processes live exactly for their block, a bad
setting or output path is refused before anything is measured, and a real run on the toy model (``kvlab bench
--under-load N``) writes paired quiet/loaded figures for kvlab's static cache and onnxruntime-genai with equal
tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlab import ConfigError
from kvlab.bench.load import competing, main


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_load_runs_for_its_block_and_is_gone_after_it_even_on_an_error():
    with pytest.raises(KeyboardInterrupt), competing(2) as procs:
        pids = [p.pid for p in procs]
        assert all(p.poll() is None for p in procs)
        raise KeyboardInterrupt  # Ctrl-C inside the block: the load still goes
    assert not any(_alive(pid) for pid in pids)


def test_the_load_dies_with_a_run_killed_without_its_cleanup():
    """SIGKILL (or a timeout's SIGTERM) skips the block's cleanup: the competing processes die with their parent
    (before: they spun on, and a run's child kept starting them)."""
    code = (
        "from kvlab.bench.load import competing; import time\n"
        "with competing(2) as ps: print([p.pid for p in ps], flush=True); time.sleep(60)"
    )
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = json.loads(run.stdout.readline())
    assert all(_alive(pid) for pid in pids)
    run.kill()
    run.wait()
    run.stdout.close()

    def running(pid: int) -> bool:  # a zombie not yet reaped by whoever adopted it has stopped all the same
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(running(pid) for pid in pids)


def test_a_bad_setting_or_output_path_is_refused_before_measuring(tmp_path):
    with pytest.raises(ConfigError, match="setting .spin=maybe. is not valid; choose from default, ort, spinning=off"):
        main(["--model", "toy", "--settings", "default,spin=maybe"])
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        main(["--model", "toy", "--settings", "default", "--out", str(blocker / "out")])


def test_a_real_run_pairs_quiet_and_loaded_rounds(tmp_path):
    """Through the CLI, ``kvlab bench --under-load N``, as a user runs it."""
    cmd = [sys.executable, "-m", "kvlab", "bench", "--under-load", "1", "--models", "toy", "--contexts", "32",
           "--new-tokens", "4", "--reps", "2", "--load-settings", "spinning=off", "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["context"] == 32 and row["setting"] == "spinning=off" and row["cpu_ep_options"]["spinning"] == "0"
    assert row["tokens_equal"] is True
    for name in ("kvlab static", "genai"):
        v = row["variants"][name]
        assert len(v["quiet_ms_runs"]) == len(v["loaded_ms_runs"]) == 2
        assert v["ratio_min"] <= v["loaded_over_quiet"] <= v["ratio_max"]
    assert "32 tokens, spinning=off: kvlab static" in proc.stdout


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--under-load", "0"], "--under-load 0 must be at least 1"),
        (["--under-load", "1", "--models", "toy,smollm2"], "--under-load runs one model on the CPU EP"),
        (["--under-load", "1", "--models", "toy", "--devices", "webgpu"], "--under-load runs one model on the CPU"),
        (["--under-load", "1", "--models", "toy", "--load-settings", "spin=maybe"], "setting 'spin=maybe' is not"),
        (["--under-load", "1", "--models", "nope"], "nope"),
    ],
)
def test_bench_under_load_refuses_bad_flags_in_one_line(flags, says, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "kvlab", "bench", *flags, "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert not (tmp_path / "results.json").exists()
