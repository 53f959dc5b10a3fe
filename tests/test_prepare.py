"""``kvlab prepare``: the models the notebooks load, built ahead of the day with their sizes and times; its list
covers every preset a notebook loads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.cli.prepare import CORE, DEEP_DIVES, triple
from kvlab.presets import BUILTIN_NAMES

REPO = Path(__file__).resolve().parents[1]
KVLAB = [str(Path(sys.executable).parent / "kvlab")]


def kvlab(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(KVLAB + list(args), capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow  # builds the toy model: tens of seconds on a 2-core machine
def test_prepare_builds_what_is_missing_then_finds_it_built(tmp_path):
    env = {**os.environ, "KVLAB_CACHE_DIR": str(tmp_path)}
    listed = kvlab("prepare", "sliding-toy", "--list", "--json", env=env)  # a deep dive's model: one build
    assert listed.returncode == 1 and [r["status"] for r in json.loads(listed.stdout)] == ["missing"]
    built = kvlab("prepare", "sliding-toy", "--json", env=env)
    assert built.returncode == 0, built.stderr
    (row,) = json.loads(built.stdout)
    assert row["status"] == "built now" and row["bytes"] > 100_000 and row["seconds"] > 0
    assert Path(row["path"]).parent == tmp_path / "models"
    again = kvlab("prepare", "sliding-toy", env=env)
    assert again.returncode == 0 and re.search(r"^sliding-toy fp32 +already built +\d+\.\d MiB", again.stdout, re.M)
    assert "1 models," in again.stdout and str(tmp_path) in again.stdout
    toy = [r["graph_capture"] for r in json.loads(kvlab("prepare", "toy", "--list", "--json", env=env).stdout)]
    assert toy == [False, True]  # toy and its build for graph capture (notebook 01b's button runs the latter)


def test_a_model_outside_the_list_is_one_line_naming_the_valid_ones():
    r = kvlab("prepare", "phi4-kv")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "'phi4-kv' is not one of the notebooks' models: 'all' or" in r.stderr and "'smollm2'" in r.stderr


def test_the_list_holds_every_preset_a_notebook_loads():
    """Every built-in preset named in a notebook's code, but phi4-kv (drawn from its recipe, never built there) and
    smollm2-shape (read from recordings), is prepared; and every precision the notebooks load."""
    prepared = [triple(spec) for spec in CORE + DEEP_DIVES]
    listed = {name for name, _, _ in prepared}
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        named = {n for n in BUILTIN_NAMES if re.search(rf"[\"']{re.escape(n)}[\"']", code)}
        assert named - {"phi4-kv", "smollm2-shape"} <= listed, (nb.name, named - listed)
        if re.search(r"load\(\"smollm2\", precision", code):  # SmolLM2 in other weight precisions (03, 10)
            for precision in set(re.findall(r"[\"'](fp16|int4)[\"']", code)):
                assert ("smollm2", precision, False) in map(triple, CORE), (nb.name, precision)
    assert ("toy", "fp32", True) in prepared  # notebook 06's graph-capture build
