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


def test_environment_yml_lists_the_pyproject_dependencies():
    """conda and Binder install what scripts/setup.py installs by default: pyproject.toml's dependencies with the
    same extras (pip reads them from pyproject.toml: one list), the same torch, a Python that onnxruntime-webgpu has
    wheels for; postBuild adds the --no-deps packages and the kernel as setup.py does. Nothing else is listed."""
    import ast

    import tomllib

    setup_py = ast.parse((REPO / "scripts" / "setup.py").read_text())
    setup = {
        t.id: ast.literal_eval(n.value)
        for n in setup_py.body
        if isinstance(n, ast.Assign) and isinstance(n.value, (ast.Constant, ast.Tuple))
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    lines = [line.strip() for line in (REPO / "environment.yml").read_text().splitlines()]
    listed = [line[2:] for line in lines[lines.index("dependencies:") :] if line.startswith("- ")]
    conda = [d for d in listed[: listed.index("pip:")] if not d.startswith("python=")]
    pip = listed[listed.index("pip:") + 1 :]
    python = next(d for d in listed if d.startswith("python="))
    assert conda == ["pip"], f"environment.yml lists conda packages besides pip: {conda}"
    assert pip == [f"--extra-index-url {setup['TORCH_CPU_INDEX']}", setup["TORCH"], "-e .[build,notebook]"], pip
    assert tuple(map(int, python.removeprefix("python=").split("."))) >= setup["MIN_PYTHON"]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"build", "notebook"} <= set(extras)
    assert '"build,notebook"' in (REPO / "scripts" / "setup.py").read_text(), "setup.py's default extras changed"
    post = (REPO / "postBuild").read_text()
    assert f"pip install --no-deps {' '.join(setup['NO_DEPS'])}" in post
    assert f'--name {setup["KERNEL"][0]} --display-name "{setup["KERNEL"][1]}"' in post
    assert "npm ci --ignore-scripts --omit=optional --prefix kvlab/web" in post, "Binder installs the runner's assets"


def test_requires_python_is_the_one_setup_py_checks():
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert declared == ">=3.11" and "MIN_PYTHON = (3, 11)" in (REPO / "scripts" / "setup.py").read_text()


def test_a_built_wheel_carries_the_browser_runners_files(tmp_path):
    """A non-editable install (a wheel, as on a laptop or a JupyterHub image) has the page and the JavaScript the
    browser runner serves, and the npm manifest its assets come from. Built from the tracked files alone, as a clean
    checkout has them (a checkout's own egg-info would list the files whatever pyproject.toml says)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in filter(None, tracked.split("\0")):
        if (REPO / name).is_file() and not name.startswith(("data/", "notebooks/", "docs/")):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path, src]
    subprocess.run(pip, check=True, capture_output=True)
    (wheel,) = tmp_path.glob("kvlab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {str(p.relative_to(REPO)) for p in (REPO / "kvlab" / "web" / "js").iterdir()}
    shipped |= {"kvlab/web/package.json", "kvlab/web/package-lock.json"}
    assert shipped <= names, sorted(shipped - names)
