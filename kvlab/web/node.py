"""The runner in Node with Dawn's bindings (``kvlab/web/js/node_host.mjs``): onnxruntime-web's WebGPU code on a
machine without a browser. Dawn in Node is not a browser; its results say so (``BrowserHost.kind == "node"``)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.errors import DeviceError, check_choice
from ..ort.runtime.adapters import SWIFTSHADER_ICD, configure_vulkan
from ..presets.recipes import alive
from .assets import JS_DIR, dawn_node, npm_dir, npm_file
from .chromium import ADAPTERS, end_group, executable_override
from .job import Job


def find_node() -> str:
    """The node executable: ``$KVLAB_NODE`` or ``node`` on PATH; a DeviceError saying how to get one."""
    found = executable_override("KVLAB_NODE") or shutil.which("node")
    if not found:
        raise DeviceError("no `node` on PATH: install Node.js >= 18 (Debian/Ubuntu: apt-get install nodejs)")
    return found


def node_env(adapter: str) -> dict[str, str]:
    """The environment node runs in: "swiftshader" points the Vulkan loader at SwiftShader (DeviceError when it is
    not installed), "auto" chooses as kvlab's own WebGPU does (a hardware driver when installed), "default" leaves
    the environment alone."""
    check_choice(adapter, ADAPTERS, "adapter=")
    env = dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    if adapter == "swiftshader":
        if not os.path.exists(SWIFTSHADER_ICD):
            raise DeviceError(f"SwiftShader's Vulkan driver {SWIFTSHADER_ICD} is missing: install chromium-common")
        env["VK_ICD_FILENAMES"] = SWIFTSHADER_ICD
    elif adapter == "auto":
        configure_vulkan()
        env.update({k: v for k, v in os.environ.items() if k.startswith("VK_")})
    return env


TEMP_PREFIX = "kvlab-node-"  # node's temporary folders; each holds OWNER_FILE, the pid of the process that made it
OWNER_FILE = "owner.pid"


def _die_with_this_process() -> None:
    """node's ``preexec_fn``: the kernel sends it SIGKILL when the process that started it ends, however it ends
    (a SIGKILL included: Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def remove_orphaned_folders() -> list[Path]:
    """Remove node's temporary folders whose owner process is gone (one killed before it could clean up);
    returns them. Folders of live processes, and those this user cannot remove, stay."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(TEMP_PREFIX + "*"):
        try:
            pid = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):  # no owner file yet: not ours to judge
            continue
        if alive(pid):  # its owner still runs (or is another user's process: not ours to judge)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def run_node(job: Job, timeout: float = 600, adapter: str = "auto", dawn: Sequence[str] = ()) -> dict[str, Any]:
    """The page-shaped result dict node wrote for ``job`` (``adapter`` as ``node_env`` takes it), Dawn's instance
    made with the toggles ``dawn`` enabled (none: Dawn's defaults). node runs in a temporary folder, in a process
    group of its own, killed once on timeout or KeyboardInterrupt, and by the kernel when this process dies;
    folders that dead runs left are removed first. DeviceError when it ran past ``timeout`` seconds or exited
    without a result (naming its output's end)."""
    node = find_node()
    npm_file("ort")
    dawn_node()
    env = node_env(adapter)
    remove_orphaned_folders()
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as tmp:
        Path(tmp, OWNER_FILE).write_text(str(os.getpid()))
        job_file, out_file, log_file = Path(tmp, "job.json"), Path(tmp, "result.json"), Path(tmp, "node.log")
        job_file.write_text(json.dumps(job.to_json()))
        host_js = str(JS_DIR / "node_host.mjs")
        cmd = [node, host_js, str(job_file), str(job.model.info.path), str(npm_dir()), str(out_file), ",".join(dawn)]
        with log_file.open("wb") as log:
            process = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_this_process,  # noqa: PLW1509 - one prctl, no lock taken
            )
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                raise DeviceError(f"node ran past {timeout:g} s without a result; stopped it") from exc
            finally:
                end_group(process)
        if not out_file.is_file():
            tail = log_file.read_text(errors="replace")[-800:]
            raise DeviceError(f"node exited ({process.returncode}) without a result; its output ends: {tail}")
        return json.loads(out_file.read_text())
