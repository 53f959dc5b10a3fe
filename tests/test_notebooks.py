"""Every notebook runs top to bottom under nbval, in this environment, with a per-cell timeout.

``--nbval-lax`` only requires cells to run, except those tagged ``nbval-check-output`` in their cell metadata
(greedy token ids, "outputs identical: True", error messages), whose outputs must match the committed ones after the
sanitizers in ``nbval_sanitize.cfg``. The tags keep the checks out of the lessons' text
(``tests/test_notebook_lint.py``). nbval runs in a subprocess so that each notebook gets its own kernel and the WebGPU
context of this pytest process is not shared with it.
"""

from __future__ import annotations

import fcntl
import json
import platform
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kvlab.ort.runtime.plugin import installed

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
SANITIZE = REPO / "tests" / "nbval_sanitize.cfg"
CELL_TIMEOUT_S = 240
NOTEBOOK_TIMEOUT_S = 600
RUN_TIMES = REPO / "notebooks" / "run_times.json"  # each notebook's last nbval run: what its header may state


def nbval_command(notebook: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--nbval-lax",
        "--nbval-current-env",
        f"--nbval-cell-timeout={CELL_TIMEOUT_S}",
        "--nbval-sanitize-with",
        str(SANITIZE),
        str(notebook.relative_to(REPO)),
    ]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_under_nbval(notebook: Path) -> None:
    if notebook.stem == "02_max_cache_len_lab" and installed():
        pytest.skip(
            "notebook 02 switches the WebGPU buffer cache mode in one kernel, which the plugin EP refuses "
            "(one WebGPU context per process; tests/test_plugin.py)"
        )
    start = time.perf_counter()
    proc = subprocess.run(nbval_command(notebook), cwd=REPO, capture_output=True, text=True, timeout=NOTEBOOK_TIMEOUT_S)
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, f"nbval failed on {notebook.name}:\n{proc.stdout[-8000:]}\n{proc.stderr[-2000:]}"
    record_run_time(notebook.stem, seconds)


def record_run_time(stem: str, seconds: float) -> None:
    """The notebook's nbval run time (its kernel's start included) into ``RUN_TIMES``, with the machine and the
    date, and stated from it in the notebook's header and README.md's lesson list (``state_run_time``; checked by
    ``tests/test_notebook_lint.py``). Several workers may write at once: read, change and write under a lock."""
    import os
    import tempfile

    with open(Path(tempfile.gettempdir()) / "kvlab-notebook-run-times.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        times = json.loads(RUN_TIMES.read_text()) if RUN_TIMES.is_file() else {}
        times[stem] = {
            "seconds": round(seconds),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        }
        replace_text(RUN_TIMES, json.dumps(dict(sorted(times.items())), indent=1) + "\n")
        state_run_time(stem, round(seconds))


HOW_LONG = re.compile(r"(\*\*how long\*\* \|[^\n]*?)(\d[\d,]*)( s\b)")


def restated(header: str, seconds: int) -> str:
    """``header`` with the first 'N s' of its 'how long' row made ``seconds`` (unchanged when it states none)."""
    return HOW_LONG.sub(lambda m: f"{m.group(1)}{seconds:,}{m.group(3)}", header, count=1)


def test_the_stated_time_is_the_first_seconds_of_the_how_long_row():
    header = "| **needs** | 5 s |\n| **how long** | 20 minutes. The cells run in about 1,310 s (plus 3 s) |\n"
    assert (
        restated(header, 95)
        == "| **needs** | 5 s |\n| **how long** | 20 minutes. The cells run in about 95 s (plus 3 s) |\n"
    )
    assert restated("| **how long** | 20 minutes |", 95) == "| **how long** | 20 minutes |"


def state_run_time(stem: str, seconds: int) -> None:
    """``seconds`` written where the run time of notebook ``stem`` is stated: the first 'N s' of its header's
    'how long' row and the 'M s' of README.md's '(N min; M s)' for it; the rest of both files is left as it was
    (``tests/test_notebook_lint.py`` checks that the two agree with ``RUN_TIMES``). Call it under the lock."""
    notebook = REPO / "notebooks" / f"{stem}.ipynb"
    nb = json.loads(notebook.read_text())
    header = "".join(nb["cells"][0]["source"])
    stated = restated(header, seconds)
    if stated != header:
        nb["cells"][0]["source"] = stated.splitlines(keepends=True)
        replace_text(notebook, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    readme = REPO / "README.md"
    line = re.compile(rf"(\(notebooks/{re.escape(notebook.name)}\)[^\n]*\(\d+ min; (?:cells )?)(\d+)( s)")
    text = readme.read_text()
    replace_text(readme, line.sub(lambda m: f"{m.group(1)}{seconds}{m.group(3)}", text, count=1))


def replace_text(path: Path, text: str) -> None:
    """``path`` holding ``text``, written beside it and moved over it: a test reading it meanwhile sees the old
    file or the new one, never half of one."""
    part = path.with_name(path.name + ".writing")
    part.write_text(text)
    part.replace(path)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_executed(notebook: Path) -> None:
    """Teaching material is committed with outputs: every code cell ran, in order, on the 'kvlab' kernel, and no
    multi-megabyte widget state (a FigureWidget's state embeds plotly.js, 4.8 MB) is stored. The cap leaves room for
    the PNGs every chart carries (``kvlab.lab.style.static_images``: 100-200 KB each)."""
    nb = json.loads(notebook.read_text())
    assert nb["metadata"].get("kernelspec", {}).get("name") == "kvlab", f"{notebook.name}: kernelspec is not 'kvlab'"
    counts = [
        c.get("execution_count") for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()
    ]
    assert counts and None not in counts, f"{notebook.name}: has unexecuted code cells {counts}"
    assert counts == sorted(counts), f"{notebook.name}: cells were not run top to bottom: {counts}"
    assert notebook.stat().st_size < 2_500_000, f"{notebook.name} is {notebook.stat().st_size:,} bytes"


def check_tagged(notebook: Path) -> list[int]:
    """The code cells nbval compares, by index."""
    cells = json.loads(notebook.read_text())["cells"]
    return [i for i, c in enumerate(cells) if "nbval-check-output" in c.get("metadata", {}).get("tags", [])]


def test_there_are_notebooks_and_check_marks() -> None:
    numbers = [p.name.split("_")[0] for p in NOTEBOOKS]
    assert numbers == ["00", "00b", "01", "01b", *(f"{i:02d}" for i in range(2, 11))], [p.name for p in NOTEBOOKS]
    for nb in NOTEBOOKS:
        assert check_tagged(nb), f"{nb.name} checks no deterministic output (tag a cell nbval-check-output)"
