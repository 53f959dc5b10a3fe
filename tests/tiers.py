"""The test tiers, given by rule at collection time (no test file marks itself by hand).

Plain ``pytest`` runs the fast tier (``-m "not slow"`` in pyproject.toml's addopts): every test that runs in
seconds, in one process (``-n 2`` for two, pytest-xdist).
``pytest -m ""`` runs everything; ``.ci/run`` runs the fast tier and then the rest (scripts/full_run.sh).
The rules, in the order they are applied:

- ``webgpu``: the test is parametrised on ``"webgpu"``, or it is not parametrised on ``"cpu"`` and its code names
  the WebGPU device.
- ``browser``: the test drives Chromium (it uses the ``jupyter`` or ``chromium`` fixtures, or Playwright).
- ``package``: its outcome can depend on which ONNX Runtime package is installed (the built-in WebGPU EP of
  onnxruntime-webgpu, or onnxruntime with the WebGPU plugin EP): it runs on WebGPU, or its code reaches the
  package's own seam (``backend()``, ``kvlab.ort.runtime.plugin``, onnxruntime-genai). The full run repeats these, and
  only these, in ``.venv-plugin``. Not the notebooks under nbval (lessons, run on the kernel an attendee gets; the
  calls they make are package tests of their own), not the browsers (their kernel is .venv's either way), not
  nested suites (they run once).
- ``hypothesis``: a property test (its module uses hypothesis); the full run repeats it with many examples.
- ``guard``: a guard of what a user sees, timed (tests/test_guards.py): the full run runs these alone, before its
  parts start (nothing else competes for the cores); slow as well, never a package test.
- ``slow``: it starts another pytest (a nested suite, a notebook under nbval), drives a browser, needs the second
  environment with Optimum (``optimum_toy``) or the exporters' builds of the compatibility matrix (``exporters``),
  installs (it creates a virtual environment or runs pip), or it took longer than ``FAST_LIMIT_S`` in the last
  full run on the reference machine (``tests/durations.json``, written by ``pytest --write-durations``; not a
  property test: the fast profile bounds those).

Hypothesis: the profile ``fast`` (few examples) is loaded unless ``--hypothesis-profile=full`` is given.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from pathlib import Path

import pytest
from hypothesis import settings

DURATIONS = Path(__file__).with_name("durations.json")
FAST_LIMIT_S = 5.0  # a test slower than this (setup + call, on the 2-core reference machine) is slow

MARKS = {
    "webgpu": "runs on a WebGPU adapter: SwiftShader here (CPU-bound, 0.2-8 s a test on the toy models)",
    "browser": "drives a real Chromium (JupyterLab or the browser runner): 10-60 s a test",
    "package": "can depend on the ONNX Runtime package: the full run repeats it in .venv-plugin",
    "hypothesis": "a property test: few examples in the fast tier, many in the full run",
    "guard": "a timed guard (tests/test_guards.py): the full run runs these alone, before anything else",
    "slow": "the full tier only: nested suites, nbval, browsers, Optimum, or over FAST_LIMIT_S in the last full run",
}

settings.register_profile("fast", max_examples=20, deadline=None)
settings.register_profile("full", max_examples=50, deadline=None)

_NAME = re.compile(r"\b([A-Za-z_]\w*)\(")
_WEBGPU = re.compile(r"""["']webgpu["']""")
_NESTED = re.compile(r"""["']-m["'],\s*["']pytest["']|nbval_command\(""")
_INSTALLS = re.compile(
    r"""\bvenv\.(create|EnvBuilder)\b|["']-m["'],\s*["'](venv|pip)["']|["']pip["'],\s*["']install["']"""
)
_PACKAGE = re.compile(
    r"""\bbackend\(\)|\binstalled\(\)|on_the_plugin_ep\(|\bort\.[A-Za-z]|import onnxruntime|genai_\w+\("""
)
_BROWSER_FIXTURES = {"jupyter", "chromium", "page"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--write-durations",
        metavar="PATH",
        default=None,
        help="write each test's duration (setup + call, seconds) to PATH, merged into what PATH holds",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, cost in MARKS.items():
        config.addinivalue_line("markers", f"{name}: {cost}")
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile("fast")


def _body(fn: object) -> str:
    """A function's source without its decorators (they name every parameter value), or ''."""
    try:
        source = inspect.getsource(fn)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""
    return source[source.find("def ") :]


def _source(item: pytest.Item) -> str:
    """The code a test runs, as far as a rule can see it: its body, the module's functions it calls by name, and
    the fixtures it requests (their bodies)."""
    test = getattr(item, "function", None)
    if test is None:
        return ""
    body = _body(test)
    module = vars(inspect.getmodule(test) or object())
    helpers = [
        module[n] for n in set(_NAME.findall(body)) if inspect.isfunction(module.get(n)) and module[n] is not test
    ]
    info = getattr(item, "_fixtureinfo", None)
    fixtures = [d[-1].func for d in info.name2fixturedefs.values()] if info else []
    return "\n".join([body, *map(_body, helpers), *map(_body, fixtures)])


def _params(item: pytest.Item) -> list[object]:
    spec = getattr(item, "callspec", None)
    return list(spec.params.values()) if spec else []


@functools.cache
def _module_uses(path: Path, name: str) -> bool:
    return name in path.read_text()


def recorded_durations() -> dict[str, float]:
    """Seconds per test id from the last full run, or {} when none is recorded."""
    return json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = recorded_durations()
    for item in items:
        source, fixtures = _source(item), set(getattr(item, "fixturenames", ()))
        marks = {m.name for m in item.iter_markers()}
        add = set()
        params = _params(item)
        if "webgpu" in params or ("cpu" not in params and _WEBGPU.search(source)):
            add.add("webgpu")
        if fixtures & _BROWSER_FIXTURES or _module_uses(item.path, "playwright"):
            add.add("browser")
        if _module_uses(item.path, "hypothesis"):
            add.add("hypothesis")
        nested = bool(_NESTED.search(source))
        seam = "webgpu" in marks | add or _PACKAGE.search(source) or item.path.name == "test_plugin.py"
        if item.path.name == "test_guards.py":
            add |= {"guard", "slow"}
        elif seam and not nested and "browser" not in marks | add:
            add.add("package")
        if (
            nested
            or _INSTALLS.search(source)
            or "browser" in marks | add
            or fixtures & {"optimum_toy", "exporters"}
            or ("hypothesis" not in add and seconds.get(item.nodeid, 0.0) > FAST_LIMIT_S)
        ):
            add.add("slow")
        for name in sorted(add - marks):
            item.add_marker(name)
        if "browser" in marks | add:  # one worker drives every browser, in turn (xdist's --dist loadgroup)
            item.add_marker(pytest.mark.xdist_group("browser"))


_measured: dict[str, float] = {}  # this session's seconds per test id (setup + call)
_fast: set[str] = set()  # the ids of this run's fast-tier tests


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when in ("setup", "call"):
        _measured[report.nodeid] = _measured.get(report.nodeid, 0.0) + report.duration
        if "slow" not in report.keywords:  # (a report carries its marks: with xdist, workers collect, not here)
            _fast.add(report.nodeid)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """Say which tests of the fast tier ran over its limit (so the tier cannot grow slow unseen), and record the
    durations when asked."""
    over = sorted((s, t) for t, s in _measured.items() if t in _fast and s > FAST_LIMIT_S)
    if over:
        terminalreporter.write_line(
            f"fast-tier tests over {FAST_LIMIT_S:g} s in this run (slow next time once recorded):"
        )
        for s, t in over:
            terminalreporter.write_line(f"  {s:6.1f} s  {t}")
    path = config.getoption("write_durations")
    if path:
        merged = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
        merged.update({t: round(s, 2) for t, s in _measured.items()})
        Path(path).write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
