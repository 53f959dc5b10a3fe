"""The under-load benchmark (kvlab.bench.load): its competing processes live exactly for their block, a bad
setting or output path is refused before anything is measured, and a real run on the toy model writes paired
quiet/loaded figures for kvlab's static cache and onnxruntime-genai with equal tokens."""

from __future__ import annotations

import json
import os

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


def test_a_bad_setting_or_output_path_is_refused_before_measuring(tmp_path):
    with pytest.raises(ConfigError, match="setting 'spin=maybe' is not valid; choose from default, spinning=off"):
        main(["--model", "toy", "--settings", "default,spin=maybe"])
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        main(["--model", "toy", "--settings", "default", "--out", str(blocker / "out")])


def test_a_real_run_pairs_quiet_and_loaded_rounds(tmp_path, capsys):
    main(["--model", "toy", "--context", "32", "--new-tokens", "4", "--rounds", "2", "--load", "1",
          "--settings", "spinning=off", "--out", str(tmp_path)])  # fmt: skip
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["setting"] == "spinning=off" and row["cpu_ep_options"]["spinning"] == "0"
    assert row["tokens_equal"] is True
    for name in ("kvlab static", "genai"):
        v = row["variants"][name]
        assert len(v["quiet_ms_runs"]) == len(v["loaded_ms_runs"]) == 2
        assert v["ratio_min"] <= v["loaded_over_quiet"] <= v["ratio_max"]
    assert "spinning=off: kvlab static" in capsys.readouterr().out
