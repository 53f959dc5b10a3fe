"""kvlab.web's notebook widgets in a real JupyterLab. Notebook 00's adapter cells first: the page reports Chromium's
WebGPU adapter (SwiftShader) to the kernel, which prints it beside its own. Then the browser runner: the kernel
sends onnxruntime-web, transformers.js and the toy model to the page over the comm channel (no side server), the
page runs both caches on Chromium's SwiftShader WebGPU adapter and sends its result back, and the kernel checks it
against its own CPU EP run. Driven with Playwright on system Chromium (the tiers mark it browser + slow)."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlab.web.chromium import adapter_flags, find_chromium

WIDGET_CELL = "from kvlab.web.widget import BrowserLab\nlab = BrowserLab('toy', [5, 6, 7], new_tokens=6)\nlab"
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOK_00 = NOTEBOOKS / "00_setup_check.ipynb"
BUTTON_S = 90  # notebook 01b's browser button, pressed, finishes within this on SwiftShader


def notebook_00_adapter_cells() -> list[str]:
    """Notebook 00's own cells, as the lesson has them: the kernel's facts, the adapter widget, the text table."""
    sources = ["".join(c["source"]) for c in json.loads(NOTEBOOK_00.read_text())["cells"] if c["cell_type"] == "code"]
    wanted = ("facts = collect()", "BrowserAdapter(gpu)", "adapters.side_by_side()")
    return [next(s for s in sources if w in s) for w in wanted]


FLAGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--enable-features=Vulkan", *adapter_flags("swiftshader")]


def notebook_01b_button_cell() -> str:
    """Notebook 01b's cell that shows the browser button, as the lesson has it."""
    nb = json.loads((NOTEBOOKS / "01b_on_a_gpu.ipynb").read_text())
    return next("".join(c["source"]) for c in nb["cells"] if "BrowserLab(" in "".join(c["source"]))


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
    """JupyterLab on 127.0.0.1 serving two notebooks (widget.ipynb: notebook 00's adapter cells and a BrowserLab;
    button.ipynb: notebook 01b's browser button); yields a function of a notebook's name giving its URL."""
    root = tmp_path_factory.mktemp("weblab")
    sources = [*notebook_00_adapter_cells(), WIDGET_CELL]
    blank = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None}
    kernel = {"name": "kvlab", "display_name": "Python (kvlab)", "language": "python"}
    for name, cells in (("widget", sources), ("button", ["import kvlab", notebook_01b_button_cell()])):
        nb = {"cells": [{**blank, "source": s} for s in cells], "metadata": {"kernelspec": kernel}}
        (root / f"{name}.ipynb").write_text(json.dumps({**nb, "nbformat": 4, "nbformat_minor": 5}))
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
        yield lambda name: f"http://127.0.0.1:{port}/lab/tree/{name}.ipynb?reset&token={token}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_widget_runs_in_the_notebooks_browser_over_the_comm(lab_server, chromium):
    """The attendee's path. Notebook 00's adapter cells: the page answers with its WebGPU adapter (SwiftShader
    here), the kernel holds it and prints it beside its own adapter (SwiftShader on Vulkan here). Then the browser
    runner: the kernel sends onnxruntime-web, transformers.js and the model over the comm channel, the page runs
    both caches and sends the result back, the kernel checks it against its CPU EP run."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=FLAGS, headless=True)
        try:
            page = browser.new_page()
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.goto(lab_server("widget"))
            page.get_by_text("Python (kvlab) | Idle").wait_for(timeout=90_000)
            cells = page.locator(".jp-NotebookPanel .jp-Cell")
            cells.first.click()
            page.keyboard.press("Shift+Enter")  # the kernel's facts
            page.keyboard.press("Shift+Enter")  # the adapter widget: the page asks navigator.gpu
            adapters = page.locator(".kvlab-adapters").first
            adapters.get_by_text("software (fallback adapter)").wait_for(timeout=120_000)
            shown = [r.locator("th, td").all_inner_texts() for r in adapters.locator("tr").all()]
            page.keyboard.press("Shift+Enter")  # the table as text, from the kernel: the browser's answer came back
            # the cell's live text (kvlab.lab.show.live_text): an output area inside the cell's output; its text
            printed = cells.nth(2).locator(".jp-RenderedText").last
            printed.get_by_text("this browser (navigator.gpu)").wait_for(timeout=60_000)
            table = printed.inner_text()
            page.keyboard.press("Shift+Enter")  # the browser runner
            widget = page.locator(".kvlab-browser-lab").first
            widget.wait_for(timeout=120_000)
            widget.get_by_text("WebGPU adapter: google swiftshader (software)").wait_for(timeout=60_000)
            widget.get_by_text("Run it on this browser's GPU").click()
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
    rows = {r[0]: r[1:] for r in shown}
    assert "SwiftShader" in rows["adapter"][0] and rows["kind"][0] == "software", shown  # the kernel's (Vulkan)
    assert rows["vendor / architecture"][1] == "google swiftshader", shown  # the browser's, from adapter.info
    assert rows["runs on"][0] == "Vulkan" and rows["runs on"][1].startswith("Chromium "), shown
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert "SwiftShader Device" in lines["adapter"] and "google swiftshader" in lines["vendor / architecture"], table
    assert lines["vendor / architecture"].count("swiftshader") == 2 and "Chromium " in lines["runs on"], table
    assert "no browser front end" not in table, table
    assert "greedy tokens equal the kernel's CPU EP run: True" in text, (status, text, console[-10:])
    assert "dynamic (transformers.js; " in text and "static@256 (onnxruntime-web; " in text, text
    assert "(onnxruntime-web; token on the GPU, read every 8)" in text, text
    assert "0 fresh KV tensors, 0 new GPU storage buffers and" in text, text


def test_notebook_01b_button_fits_the_adapter_finishes_and_cancels(lab_server, chromium):
    """Notebook 01b's "Run it on this browser's GPU" on SwiftShader: the run is sized to the software adapter (said in
    one line), shows steps done of the total with the elapsed time, finishes within BUTTON_S and draws its result
    over the recorded curves; pressed again and cancelled, the page releases every buffer it made (exact counts)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=FLAGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(lab_server("button"))
            page.get_by_text("Python (kvlab) | Idle").wait_for(timeout=90_000)
            page.locator(".jp-NotebookPanel .jp-Cell").first.click()
            page.keyboard.press("Shift+Enter")
            page.keyboard.press("Shift+Enter")
            widget = page.locator(".kvlab-browser-lab").first
            widget.get_by_text("WebGPU adapter: google swiftshader (software)").wait_for(timeout=120_000)
            status = widget.locator(".kvlab-browser-status")
            pressed = time.monotonic()
            widget.get_by_text("Run it on this browser's GPU").click()
            widget.locator(".kvlab-browser-summary").get_by_text("greedy tokens equal").wait_for(
                timeout=BUTTON_S * 1000
            )
            took = time.monotonic() - pressed
            plan = widget.locator(".kvlab-browser-plan").inner_text()
            progress = widget.locator(".kvlab-browser-progress").inner_text()
            summary = widget.locator(".kvlab-browser-summary").inner_text()
            page.locator(".jp-OutputArea-output .js-plotly-plot").first.wait_for(timeout=30_000)
            legend = page.locator(".jp-OutputArea-output .legendtext").all_text_contents()

            widget.get_by_text("Run it on this browser's GPU").click()  # again, then Cancel while it runs
            widget.locator(".kvlab-browser-cancel").wait_for(state="visible", timeout=60_000)
            running = widget.locator(".kvlab-browser-progress").inner_text()
            widget.locator(".kvlab-browser-cancel").click()
            status.get_by_text("cancelled after").wait_for(timeout=60_000)
            cancelled = status.inner_text()
        finally:
            browser.close()
    assert took < BUTTON_S and plan.startswith("this adapter is software"), (took, plan)
    assert "toy with a 3-token prompt and 32 new tokens" in plan, plan
    assert re.fullmatch(r"\d+ steps in [\d.]+ s", progress) and int(progress.split()[0]) >= 128, progress
    assert "greedy tokens equal the kernel's CPU EP run: True" in summary, summary
    rows = summary.splitlines()[1:4]  # dynamic, static, captured
    assert rows[0].startswith("dynamic (transformers.js; token on the host): "), summary
    assert rows[1].startswith("static@256 (onnxruntime-web; token on the GPU, read every 8): "), summary
    assert " 0 new GPU storage buffers and " in rows[1], summary
    assert rows[2].startswith("static@256 graph (onnxruntime-web; token on the GPU, read every 8): "), summary
    assert running.startswith("step ") and " / 192 · " in running and " s elapsed · " in running, running
    assert any("toy-graph in this browser" in t for t in legend) and any("(recorded)" in t for t in legend), legend
    created, destroyed, live = (
        int(n) for n in re.findall(r"\((\d+) created, (\d+) destroyed, (\d+) live\)", cancelled)[0]
    )
    assert created == destroyed and live == 0 and created > 0, cancelled
