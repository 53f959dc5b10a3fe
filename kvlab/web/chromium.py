"""Headless Chromium with WebGPU, opened on one URL, closed exactly once."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..core.errors import ConfigError, DeviceError, check_choice
from ..ort.runtime.adapters import icd_manifests, is_software_icd

ADAPTERS = ("auto", "swiftshader", "default")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--disable-domain-reliability",
    "--metrics-recording-only",
    "--mute-audio",
)


def executable_override(var: str) -> str | None:
    """The executable an environment variable names (None when unset); ConfigError when it is not one."""
    value = os.environ.get(var)
    if value and not (Path(value).is_file() and os.access(value, os.X_OK)):
        raise ConfigError(f"{var}={value!r} is not an executable file")
    return value or None


def find_chromium() -> str:
    """The Chromium executable: ``$KVLAB_CHROMIUM`` or the first of the usual names on PATH; a DeviceError saying
    how to get one."""
    override = executable_override("KVLAB_CHROMIUM")
    if override:
        return override
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    raise DeviceError(
        "no Chromium found (tried chromium, chromium-browser, google-chrome): install Debian's `chromium` "
        "(bash scripts/setup.sh --test does) or set KVLAB_CHROMIUM to a Chrome/Chromium executable"
    )


def adapter_flags(adapter: str) -> list[str]:
    """Chromium's flags for ``adapter`` (one of ``ADAPTERS``): "swiftshader" asks for its SwiftShader (software)
    adapter, "default" for whatever it picks (a GPU when its driver works), "auto" for SwiftShader exactly when no
    hardware Vulkan driver is installed. ConfigError for another value."""
    check_choice(adapter, ADAPTERS, "adapter=")
    no_gpu = all(is_software_icd(f) for f in icd_manifests())  # no hardware Vulkan driver installed
    software = adapter == "swiftshader" or (adapter == "auto" and no_gpu)
    return ["--use-webgpu-adapter=swiftshader"] if software else []


class Chromium:
    """One headless Chromium on ``url``, in a process group of its own, with a throwaway profile, no first-run or
    background network traffic, and WebGPU enabled on ``adapter`` (``adapter_flags``), its Dawn devices made with
    the toggles ``dawn`` enabled (none: Chromium's defaults). DeviceError when it cannot start (nothing left
    behind). ``close()`` (also ``__exit__``, after a KeyboardInterrupt too) ends the whole group (SIGTERM, then
    SIGKILL after a grace period) and removes the profile, once."""

    def __init__(self, url: str, *, adapter: str = "auto", dawn: Sequence[str] = ()) -> None:
        flags = adapter_flags(adapter) + ([f"--enable-dawn-features={','.join(dawn)}"] if dawn else [])
        self.executable = find_chromium()
        self.profile = tempfile.mkdtemp(prefix="kvlab-chromium-")
        self._log = (Path(self.profile) / "chromium.log").open("wb")
        self._closed = False
        env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}
        cmd = [self.executable, *FLAGS, *flags, f"--user-data-dir={self.profile}", url]
        try:
            self.process = subprocess.Popen(
                cmd,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self._cleanup()
            raise DeviceError(f"could not start {self.executable}: {exc}") from exc

    def alive(self) -> bool:
        """Whether the browser still runs."""
        return self.process.poll() is None

    def close(self) -> None:
        """The process group ended and the profile removed (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        try:
            end_group(self.process, grace=10)
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def end_group(process: subprocess.Popen, grace: float = 0) -> None:
    """``process``'s process group ended, unless it already has: SIGTERM and ``grace`` seconds to exit first when
    ``grace`` is given, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        if process.poll() is not None or not wait:
            continue
        with contextlib.suppress(ProcessLookupError):  # the group already ended
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)
