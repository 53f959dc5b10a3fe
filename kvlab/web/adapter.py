"""``BrowserAdapter``: the WebGPU adapter of the browser showing the notebook, beside the kernel's. They can differ:
on Binder or a CPU server the kernel has SwiftShader while the attendee's laptop browser has a real GPU. The widget
asks the browser for ``navigator.gpu.requestAdapter()`` and its ``GPUAdapter.info`` (``kvlab/web/js/adapter.mjs``)
and shows both in one table."""

from __future__ import annotations

from typing import Any

import anywidget
import traitlets

from .results import adapter_kind
from .widget import bundle

HEADER = ["", "this kernel (kvlab doctor)", "this browser (navigator.gpu)"]
NO_FRONT_END = "no browser front end attached (or it has not answered yet: run this cell again)"
CSS = """
.kvlab-adapters table { border-collapse: collapse; font-family: var(--jp-ui-font-family, sans-serif); }
.kvlab-adapters th, .kvlab-adapters td { padding: 2px 10px; text-align: left; vertical-align: top; }
.kvlab-adapters tr:first-child th { border-bottom: 1px solid var(--jp-border-color1, #ccc); }
"""


def _described(info: dict[str, Any]) -> list[str]:
    """The adapter's description and its vendor and architecture, "not reported" where it gives none."""
    maker = " ".join(v for v in (info.get("vendor"), info.get("architecture")) if v)
    return [info.get("description") or "not reported", maker or "not reported"]


def _kernel_column(gpu: dict[str, Any] | None) -> list[str]:
    if not gpu:
        return ["no WebGPU adapter (see `kvlab doctor`)", "-", "-", "-"]
    return [*_described(gpu), gpu.get("kind") or "not known", gpu.get("backend", "")]


def _browser_column(browser: dict[str, Any]) -> list[str]:
    if not browser.get("name"):
        return [NO_FRONT_END, "-", "-", "-"]
    info = browser.get("adapter")
    if not browser.get("webgpu"):
        return ["this browser has no WebGPU (no navigator.gpu)", "-", "-", browser["name"]]
    if not info:
        return [f"no adapter: {browser.get('error', 'requestAdapter() gave none')}", "-", "-", browser["name"]]
    kind = adapter_kind(info) + (" (fallback adapter)" if info.get("is_fallback") else "")
    return [*_described(info), kind, browser["name"]]


class BrowserAdapter(anywidget.AnyWidget):
    """The kernel's and the browser's WebGPU adapters side by side. ``kernel``: the kernel's adapter dict (what
    ``kvlab doctor`` found: ``kvlab.cli.platform_facts.assess(...)["adapter"]``), or None: no adapter. ``browser``
    (a synced dict) is empty until a browser front end answers, then holds its name, ``webgpu`` (whether it has
    ``navigator.gpu``) and ``adapter`` (vendor, architecture, description, is_fallback, ...) or ``error``. ``rows()``
    and ``side_by_side()`` read both at any time and never raise: without a front end (nbval, nbconvert, a
    terminal) the browser's column says "no browser front end attached"."""

    _esm = traitlets.Unicode(bundle(("host.mjs", "adapter.mjs"))).tag(sync=True)
    _css = traitlets.Unicode(CSS).tag(sync=True)
    header = traitlets.List(HEADER).tag(sync=True)
    table = traitlets.List([]).tag(sync=True)
    browser = traitlets.Dict({}).tag(sync=True)  # set by the page

    def __init__(self, kernel: dict[str, Any] | None) -> None:
        super().__init__()
        self.kernel = kernel
        self.table = self.rows()
        self.observe(lambda _change: setattr(self, "table", self.rows()), names="browser")

    def rows(self) -> list[list[str]]:
        """[label, kernel, browser] for: adapter, vendor and architecture, kind, runs on."""
        labels = ("adapter", "vendor / architecture", "kind", "runs on")
        return [list(r) for r in zip(labels, _kernel_column(self.kernel), _browser_column(self.browser))]

    def side_by_side(self) -> str:
        """The table as text, one row a line."""
        rows = [HEADER, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(2)]
        return "\n".join(f"{r[0]:{widths[0]}}  {r[1]:{widths[1]}}  {r[2]}".rstrip() for r in rows)
