"""A real browser against a real JupyterLab: open notebooks 01, 01b, 02 and 04 without running them (every chart drawn,
the dashboard's plain-text line shown, nothing modified by opening), then run 02 and use the CacheLab dashboard by hand
(cache type, max_cache_len, Run) and check that the live chart and the results table follow, with the browser
runner's button inside the dashboard.

System Chromium (/usr/bin/chromium) driven by Playwright; no browser is ever downloaded. The notebooks are copied
into a temporary server root so that JupyterLab's autosave cannot touch the committed files. Screenshots are
saved under artifacts/ (gitignored). Notebook 02 keeps no picture of the dashboard: a committed screenshot showed
runs its cells never make.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "02_max_cache_len_lab.ipynb"
# opened and read without running, with the figure outputs each must show at least
OPENED = {
    REPO / "notebooks" / "01_dynamic_vs_static.ipynb": 3,
    REPO / "notebooks" / "01b_on_a_gpu.ipynb": 3,
    REPO / "notebooks" / "04_lifecycle.ipynb": 1,
}
CHROMIUM = os.environ.get("KVLAB_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = REPO / "artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory):
    """A JupyterLab server on localhost serving a copy of notebook 02; yields (base url, token)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: install Debian's `chromium` (or set KVLAB_CHROMIUM)")
    kernels = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list"], capture_output=True, text=True)
    assert " kvlab " in kernels.stdout + " ", (
        "the notebooks' kernel 'kvlab' is not installed: run `bash scripts/setup.sh --test`\n" + kernels.stdout
    )
    root = tmp_path_factory.mktemp("lab")
    for notebook in (NOTEBOOK, *OPENED):
        shutil.copy(notebook, root / notebook.name)
    shutil.copytree(NOTEBOOK.parent / "images", root / "images")
    # JupyterLab 4 renders only the cells in view by default; render them all so the dashboard stays in the DOM
    # wherever the page is scrolled. And no news pop-up over the screenshot.
    for plugin, setting in (
        ("notebook-extension/tracker", '{"windowingMode": "none"}'),
        ("apputils-extension/notification", '{"fetchNews": "false"}'),
    ):
        path = root / ".settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(setting)
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.allow_root=True",
        f"--LabApp.user_settings_dir={root / '.settings'}",
        f"--LabApp.workspaces_dir={root / '.workspaces'}",
    ]
    log = (root / "server.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{(root / 'server.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def page(jupyter):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        context = browser.new_context(viewport={"width": 1400, "height": 1500}, device_scale_factor=1)
        yield context.new_page()
        browser.close()


def _rows(lab) -> list[list[str]]:
    return [
        [c.strip() for c in row.locator("td").all_inner_texts()]
        for row in lab.locator(".kvlab-results table tbody tr").all()
    ]


def _wait_rows(lab, n: int, timeout_s: float = 120) -> list[list[str]]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        rows = _rows(lab)
        if len(rows) >= n:
            return rows
        time.sleep(0.5)
    raise AssertionError(f"the results table did not reach {n} rows; it has {_rows(lab)}")


def _legend(lab) -> list[str]:
    return lab.locator(".legendtext").all_text_contents()


def _figure_outputs(notebook: Path) -> int:
    nb = json.loads(notebook.read_text())
    return sum(
        "application/vnd.plotly.v1+json" in o.get("data", {})
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for o in c["outputs"]
    )


def _open_without_running(page, base: str, token: str, notebook: Path):
    page.goto(f"{base}/lab/tree/{notebook.name}?reset&token={token}")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=60_000)
    page.get_by_text("Python (kvlab) | Idle").wait_for(timeout=90_000)
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first


def _not_modified(page, notebook: Path) -> None:
    time.sleep(3)  # JupyterLab marks a document dirty as soon as it changes anything on load
    tab = page.locator(".lm-TabBar-tab", has_text=notebook.name).first
    assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), f"opening {notebook.name} modified it"


@pytest.mark.parametrize("notebook", list(OPENED), ids=lambda p: p.stem)
def test_a_notebook_opens_with_every_chart_drawn_and_unmodified(jupyter, page, notebook):
    """Read without running (a reader's first look, or a reload): every figure output is drawn, as the interactive
    chart or, where JupyterLab does not trust the notebook's scripts, as its PNG copy; nothing reads as a raw
    object, and opening it changes nothing."""
    panel = _open_without_running(page, *jupyter, notebook)
    want = _figure_outputs(notebook)
    assert want >= OPENED[notebook], f"{notebook.name} has only {want} figure outputs"
    drawn = (
        "[...document.querySelectorAll('.jp-OutputArea-output')].filter(o => o.querySelector('.js-plotly-plot') || "
        "[...o.querySelectorAll('img')].some(i => i.naturalWidth > 100)).length"
    )
    page.wait_for_function(f"() => {drawn} >= {want}", timeout=60_000)
    assert "VBox(children" not in panel.inner_text() and "Figure({" not in panel.inner_text()
    _not_modified(page, notebook)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{notebook.stem}_opened.png"))


def test_notebook_02_before_running_says_what_the_dashboard_is(jupyter, page):
    panel = _open_without_running(page, *jupyter, NOTEBOOK)
    panel.get_by_text("kvlab CacheLab dashboard (live widgets): run this cell to show it").first.wait_for(
        timeout=30_000
    )
    assert "VBox(children" not in panel.inner_text()
    _not_modified(page, NOTEBOOK)


def test_notebook_02_in_chromium(jupyter, page):
    try:
        _drive_notebook_02(page, *jupyter)
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "browser_failure.png"))
        raise


def _drive_notebook_02(page, base: str, token: str) -> None:
    page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?reset&token={token}")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=60_000)
    page.get_by_text("Python (kvlab) | Idle").wait_for(timeout=90_000)  # kernel started and connected

    # Run all cells through the menu (not awaited: it resolves only when every cell has run). Retried once if
    # nothing starts (a click racing the kernel's first connection is lost).
    for _ in range(2):
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-item:not(.lm-mod-hidden) .lm-Menu-itemLabel").get_by_text(
            "Run All Cells", exact=True
        ).click()
        try:
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                ".some(e => e.textContent.includes('*') || /\\d/.test(e.textContent))",
                timeout=20_000,
            )
            break
        except Exception:  # noqa: BLE001 - playwright's TimeoutError; try once more
            continue
    page.keyboard.press("Control+b")  # hide the file browser: more room for the dashboard
    lab = page.locator(".kvlab-cachelab").first
    lab.wait_for(state="attached", timeout=120_000)
    lab.get_by_text("Run it on this browser's GPU").wait_for(timeout=60_000)  # the browser runner, inside
    deadline = time.time() + 240  # every code cell has an execution count and none is queued or running
    while True:
        prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
        if prompts and all(p.strip() not in ("[ ]:", "[*]:", "") for p in prompts):
            break
        assert time.time() < deadline, f"the notebook did not finish running: prompts {prompts}"
        time.sleep(1)
    before = _rows(lab)
    assert len(before) >= 4 and before[-1][4] == "static", before  # the cells drove the lab from code
    assert any("CapacityError" in " ".join(r) for r in before)
    # after Run All the chart holds the lesson's runs (static, dynamic, a larger static), not a refused one's
    legend = _legend(lab)
    assert any(t.startswith("#3 dynamic") for t in legend) and any(t.startswith("#4 static") for t in legend), legend
    assert not any(t.startswith("#2 ") for t in legend), legend

    # By hand: switch to dynamic and run.
    lab.scroll_into_view_if_needed()
    lab.locator(".kvlab-cache-type button", has_text="dynamic").click()
    lab.locator(".kvlab-run button, button.kvlab-run").first.click()
    rows = _wait_rows(lab, len(before) + 1)
    assert rows[-1][4] == "dynamic" and rows[-1][5] == "-" and rows[-1][9].startswith("ok"), rows[-1]
    page.wait_for_function(
        "() => [...document.querySelectorAll('.kvlab-cachelab .legendtext')]"
        f".some(e => e.textContent.startsWith('#{len(before) + 1} dynamic'))",
        timeout=30_000,
    )

    # By hand: back to static with max_cache_len 2100 (the lesson's 2,048-token prompt and 24 new tokens fit).
    lab.locator(".kvlab-cache-type button", has_text="static").click()
    box = lab.locator(".kvlab-max-cache-len input")
    box.fill("2100")
    box.press("Enter")
    lab.locator(".kvlab-plan").get_by_text("once (2100 positions)").wait_for(timeout=30_000)
    lab.locator("button.kvlab-run").click()
    rows = _wait_rows(lab, len(before) + 2)
    assert rows[-1][4] == "static" and rows[-1][5] == "2100" and rows[-1][9].startswith("ok"), rows[-1]
    n = len(before) + 2
    page.wait_for_function(
        "() => [...document.querySelectorAll('.kvlab-cachelab .legendtext')]"
        f".some(e => e.textContent.startsWith('#{n} static(2100)'))",
        timeout=30_000,
    )
    legend = _legend(lab)
    assert any(t.startswith(f"#{n - 1} dynamic") for t in legend), legend
    points = page.evaluate(
        "() => document.querySelector('.kvlab-cachelab .js-plotly-plot')"
        ".data.filter(t => t.name.startsWith('#" + str(n) + " ')).map(t => t.x.length)"
    )
    assert points and points[0] == 23, points  # 24 new tokens: 23 decode steps drawn for the new run

    ARTIFACTS.mkdir(exist_ok=True)
    lab.screenshot(path=str(ARTIFACTS / "notebook02_cachelab.png"))
    page.screenshot(path=str(ARTIFACTS / "notebook02_page.png"))
