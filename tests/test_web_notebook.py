"""kvlab.web's notebook widget in a real JupyterLab: the kernel sends onnxruntime-web, transformers.js and the toy
model to the page over the comm channel (no side server), the page runs both caches on Chromium's SwiftShader
WebGPU adapter and sends its result back, and the kernel checks it against its own CPU EP run. Driven with
Playwright on system Chromium (the tiers mark it browser + slow)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time

import pytest

from kvlab.web.chromium import adapter_flags, find_chromium

WIDGET_CELL = "from kvlab.web.widget import BrowserLab\nlab = BrowserLab('toy', [5, 6, 7], new_tokens=6)\nlab"


@pytest.fixture(scope="module")
def chromium() -> str:
    return find_chromium()


def _up(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def lab_server(chromium, tmp_path_factory):
    """JupyterLab on 127.0.0.1 serving one notebook that shows a BrowserLab; yields its URL with the token."""
    root = tmp_path_factory.mktemp("weblab")
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": WIDGET_CELL}
    kernel = {"name": "kvlab", "display_name": "Python (kvlab)", "language": "python"}
    nb = {"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5}
    (root / "widget.ipynb").write_text(json.dumps(nb))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(8)
    args = [f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}"]
    args += ["--no-browser", "--ip=127.0.0.1", "--ServerApp.port_retries=0", "--ServerApp.allow_root=True"]
    log = (root / "server.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", *args], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(180):
            if _up(f"http://127.0.0.1:{port}/api/status?token={token}"):
                break
            assert server.poll() is None, (root / "server.log").read_text()[-2000:]
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/lab/tree/widget.ipynb?reset&token={token}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_widget_runs_in_the_notebooks_browser_over_the_comm(lab_server, chromium):
    """The attendee's path: the kernel sends onnxruntime-web, transformers.js and the model over the comm channel,
    the page runs both caches and sends the result back, the kernel checks it against its CPU EP run."""
    from playwright.sync_api import sync_playwright

    flags = ["--no-sandbox", "--enable-unsafe-webgpu", "--enable-features=Vulkan", *adapter_flags("swiftshader")]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=flags, headless=True)
        try:
            page = browser.new_page()
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.goto(lab_server)
            page.get_by_text("Python (kvlab) | Idle").wait_for(timeout=90_000)
            page.locator(".jp-NotebookPanel .jp-Cell").first.click()
            page.keyboard.press("Shift+Enter")
            widget = page.locator(".kvlab-browser-lab").first
            widget.wait_for(timeout=120_000)
            widget.get_by_text("WebGPU adapter: google swiftshader (software)").wait_for(timeout=60_000)
            widget.locator("button").click()
            summary = widget.locator(".kvlab-browser-summary")
            deadline = time.time() + float(os.environ.get("KVLAB_TEST_WIDGET_S", 240))
            while "greedy tokens equal" not in summary.inner_text() and time.time() < deadline:
                assert not widget.locator(".kvlab-browser-status").inner_text().startswith("error"), (
                    widget.inner_text(),
                    console[-10:],
                )
                time.sleep(1)
            text = summary.inner_text()
            status = widget.locator(".kvlab-browser-status").inner_text()
        finally:
            browser.close()
    assert "greedy tokens equal the kernel's CPU EP run: True" in text, (status, text, console[-10:])
    assert "dynamic (transformers.js)" in text and "static@256 (onnxruntime-web)" in text, text
    assert "0 fresh KV tensors and 0 new GPU storage buffers per step" in text, text
