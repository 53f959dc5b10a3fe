"""The files the browser runner serves: kvlab's own JavaScript (``kvlab/web/js/``) and the npm packages installed
at setup time (``scripts/setup.sh`` runs ``npm ci`` on ``kvlab/web/package.json``, which pins exact versions and
gives transformers.js the onnxruntime-web kvlab's page code runs); nothing is fetched from a CDN at run time. A
missing file is a DeviceError naming it and the command that installs it."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from ..core.errors import ConfigError, DeviceError

WEB_DIR = Path(__file__).resolve().parent
JS_DIR = WEB_DIR / "js"
INSTALL_HINT = "bash scripts/setup.sh (or: npm ci --ignore-scripts --omit=optional --prefix kvlab/web)"

# key -> path under node_modules (served at /npm/<path>: the bundle finds its wasm beside itself)
NPM_FILES = {
    "ort": "onnxruntime-web/dist/ort.webgpu.bundle.min.mjs",  # the WebGPU build, its wasm glue bundled in
    "ort-wasm": "onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.wasm",  # what that bundle loads
    "transformers": "@huggingface/transformers/dist/transformers.web.min.js",
}
PACKAGES = ("onnxruntime-web", "@huggingface/transformers", "webgpu")


def npm_dir() -> Path:
    """The node_modules folder the runner serves from: ``$KVLAB_WEB_ASSETS`` or ``kvlab/web/node_modules``."""
    override = os.environ.get("KVLAB_WEB_ASSETS")
    return Path(override) if override else WEB_DIR / "node_modules"


def versions() -> dict[str, str]:
    """Installed version of each package ("missing" when it is not there), read from its package.json."""
    found = {}
    for name in PACKAGES:
        meta = npm_dir() / name / "package.json"
        try:
            found[name] = json.loads(meta.read_text())["version"]
        except (OSError, ValueError, KeyError):
            found[name] = "missing"
    return found


def npm_file(key: str) -> Path:
    """The path of a served npm file, checked to exist."""
    if key not in NPM_FILES:
        raise ConfigError(f"npm asset {key!r} is not valid; choose one of {tuple(NPM_FILES)}")
    path = npm_dir() / NPM_FILES[key]
    if not path.is_file():
        raise DeviceError(f"the browser runner's asset {path} is missing: install the npm packages with {INSTALL_HINT}")
    return path


def kvlab_file(name: str) -> Path:
    """One of kvlab's own JS files (``kvlab/web/js/<name>``), checked to be one."""
    path = JS_DIR / name
    if "/" in name or name.startswith(".") or not path.is_file():
        choices = tuple(sorted(p.name for p in JS_DIR.iterdir() if p.is_file()))
        raise ConfigError(f"kvlab web file {name!r} is not valid; choose one of {choices}")
    return path


def dawn_node() -> Path:
    """The Dawn Node binding (the npm package ``webgpu``) for this platform."""
    arch = {"x86_64": "x64", "AMD64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "?")
    system = {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}.get(platform.system(), "?")
    where = "darwin-universal" if system == "darwin" else f"{system}-{arch}"
    path = npm_dir() / "webgpu" / "dist" / where / "dawn.node"
    if not path.is_file():
        raise DeviceError(f"Dawn's Node binding {path} is missing: install the npm packages with {INSTALL_HINT}")
    return path
