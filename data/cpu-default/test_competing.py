"""The under-load machinery of this folder, moved here from the package with its tests (tests/test_bench_load.py,
tests/test_lockstep.py): the competing processes live exactly for their block and die with a run killed without its
cleanup; a bad load, setting or output path is refused before anything is measured; a real run on the toy model pairs
quiet and loaded rounds with equal tokens. ``.venv/bin/python -m pytest data/cpu-default`` (about a minute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from competing import check_load, competing
from lockstep_under_load import loaded_line, summary, under_load  # summary: lockstep.py's
from under_load import main

from kvlab import ConfigError

HERE = Path(__file__).parent


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
    """SIGKILL (or a timeout's SIGTERM) skips the block's cleanup: the competing processes die with their parent."""
    code = "from competing import competing; import time\nwith competing(2) as ps: "
    code += "print([p.pid for p in ps], flush=True); time.sleep(60)"
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=HERE)
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


def test_a_bad_load_setting_or_output_path_is_refused_before_measuring(tmp_path):
    with pytest.raises(ConfigError, match="--load 1000000000 must be at least 0 and at most"):
        check_load(10**9)
    with pytest.raises(ConfigError, match="setting .spin=maybe. is not valid; choose from default, ort, spinning=off"):
        main(["--model", "toy", "--settings", "default,spin=maybe"])
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        main(["--model", "toy", "--settings", "default", "--out", str(blocker / "out")])


def test_a_real_run_pairs_quiet_and_loaded_rounds(tmp_path):
    cmd = [sys.executable, str(HERE / "under_load.py"), "--load", "1", "--model", "toy", "--contexts", "32"]
    cmd += ["--new-tokens", "4", "--rounds", "2", "--settings", "spinning=off", "--out", str(tmp_path)]
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


def test_lockstep_runs_each_round_quiet_and_loaded():
    """Real competing processes: every round quiet and loaded; each side's slowdown is its loaded over its quiet
    mean step (time per token), per round, and the first side's over the second's is their quotient."""
    r = under_load(1, 2, "toy", context=12, new_tokens=9, block=4)
    busy = r["under_load"]
    assert busy["processes"] == 1 and r["rounds"] == 2 and len(r["steps_ms"]) == len(busy["steps_ms"]) == 2
    for i in range(2):
        quiet, loaded = r["steps_ms"][i], busy["steps_ms"][i]
        first, second = (np.mean(loaded[k]) / np.mean(quiet[k]) for k in (0, 1))
        assert busy["rounds"]["first"][i] == pytest.approx(first)
        assert busy["rounds"]["relative"][i] == pytest.approx(first / second)
    assert r["tokens_equal"] and busy["tokens_equal"]
    assert "kvlab/genai" in summary(r)
    assert "with 1 competing processes: kvlab x" in loaded_line(r) and "of its quiet time per token" in loaded_line(r)
