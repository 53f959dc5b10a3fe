"""The CacheLab's controls: the widgets a run's settings are read from (each with its ``kvlab-...`` CSS class, so a
browser test can find it), the settings they hold as one value, the Run button and the dashboard's progress bar."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.devices import BUFFER_CACHE_MODES, DEVICES
from ..core.generation import positions_needed
from ..core.records import StepRecord
from ..ort.decode.caches.kinds import CACHE_KINDS

# the CSS class of each setting widget, in the order of ``Controls.inputs``: "kvlab-" + this
CSS_CLASSES = ("model", "cache-type", "max-cache-len", "prompt-tokens", "new-tokens", "device", "buffer-cache-mode")
MAX_CACHE_LEN_TOP = 1 << 16  # the largest max_cache_len the controls offer


@dataclass(frozen=True)
class Settings:
    """What the controls say the next run is."""

    model: str
    cache: str  # "dynamic" or "static"
    max_cache_len: int  # the control's value, meaningful for a static cache only (``size``)
    prompt_tokens: int
    new_tokens: int
    device: str
    buffer_cache_mode: str  # the control's value, meaningful on WebGPU only (``mode``)

    @property
    def mode(self) -> str:
        """The WebGPU buffer cache mode; "-" on another device."""
        return self.buffer_cache_mode if self.device == "webgpu" else "-"

    @property
    def size(self) -> int | None:
        """The static cache's max_cache_len; None for a dynamic cache."""
        return self.max_cache_len if self.cache == "static" else None

    @property
    def needed(self) -> int:
        """Positions the run needs: prompt + new tokens - 1 (the last token is never fed back)."""
        return positions_needed(self.prompt_tokens, self.new_tokens)


class Controls:
    """Dropdowns, toggles and sliders for model (``names``), cache type, max_cache_len, prompt length, new tokens,
    device and WebGPU buffer cache mode, set to the values of ``first``; the Run button and a hidden progress bar.
    The values are not checked here."""

    def __init__(self, names: Sequence[str], first: Settings):
        import ipywidgets as w

        style, layout = {"description_width": "110px"}, w.Layout(width="330px")

        def dropdown(options: Sequence[str], value: str, description: str) -> Any:
            return w.Dropdown(options=list(options), value=value, description=description, style=style, layout=layout)

        def slider(value: int, top: int, description: str) -> Any:
            kw = {"continuous_update": False, "style": style, "layout": layout}
            return w.IntSlider(value=value, min=1, max=top, description=description, **kw)

        self.model = dropdown(names, first.model, "model")
        self.cache_type = w.ToggleButtons(
            options=list(CACHE_KINDS),
            value=first.cache,
            description="cache",
            style={**style, "button_width": "104px"},
            layout=w.Layout(width="340px", display="flex", flex_flow="row"),
        )
        # a slider to sweep, and a text box beside it for an exact value; linked in the kernel, so setting either
        # from code moves both
        self.max_cache_len = w.IntSlider(
            value=first.max_cache_len, min=1, max=MAX_CACHE_LEN_TOP, description="max_cache_len", readout=False,
            continuous_update=False, style=style, layout=w.Layout(width="250px"),
        )  # fmt: skip
        self.max_cache_len_text = w.BoundedIntText(
            value=first.max_cache_len, min=1, max=MAX_CACHE_LEN_TOP, layout=w.Layout(width="80px")
        )
        w.link((self.max_cache_len, "value"), (self.max_cache_len_text, "value"))
        self.prompt_tokens = slider(first.prompt_tokens, 2048, "prompt tokens")
        self.new_tokens = slider(first.new_tokens, 256, "new tokens")
        self.device = dropdown(DEVICES, first.device, "device")
        self.buffer_cache_mode = dropdown(BUFFER_CACHE_MODES, first.buffer_cache_mode, "buffer cache")
        self.run_button = w.Button(
            description="Run", button_style="primary", icon="play", layout=w.Layout(width="120px")
        )
        # the dashboard's own progress bar: a widget in the layout, so it adds no cell output
        self.progress_bar = w.IntProgress(
            max=1, description="tokens", layout=w.Layout(width="200px", visibility="hidden")
        )
        pairs = (*zip(self.inputs, CSS_CLASSES), (self.max_cache_len_text, "max-cache-len"), (self.run_button, "run"))
        for widget, cls in pairs:
            widget.add_class(f"kvlab-{cls}")

    @property
    def inputs(self) -> tuple[Any, ...]:
        """The seven setting widgets, in the order shown (that of ``Settings``' fields)."""
        return (
            self.model,
            self.cache_type,
            self.max_cache_len,
            self.prompt_tokens,
            self.new_tokens,
            self.device,
            self.buffer_cache_mode,
        )

    def read(self) -> Settings:
        """The settings the controls hold now."""
        return Settings(*(widget.value for widget in self.inputs))

    def enable(self) -> None:
        """max_cache_len enabled only for a static cache, the buffer cache mode only on WebGPU."""
        self.max_cache_len.disabled = self.max_cache_len_text.disabled = self.cache_type.value != "static"
        self.buffer_cache_mode.disabled = self.device.value != "webgpu"

    def box(self) -> Any:
        """The controls stacked (max_cache_len's slider with its text box beside it), the Run button and the progress
        bar in the last row."""
        import ipywidgets as w

        rows = [w.HBox([c, self.max_cache_len_text]) if c is self.max_cache_len else c for c in self.inputs]
        return w.VBox([*rows, w.HBox([self.run_button, self.progress_bar])], layout=w.Layout(min_width="360px"))

    def progress(self, total: int) -> Callable[[StepRecord], None]:
        """The progress bar shown, empty, for ``total`` tokens; returns the step hook that fills it (a token per
        step but a handoff). ``hide_progress`` hides it again."""
        bar = self.progress_bar
        bar.max, bar.value, bar.layout.visibility = total, 0, "visible"

        def advance(record: StepRecord) -> None:
            if record.phase != "handoff":
                bar.value = min(bar.max, bar.value + 1)

        return advance

    def hide_progress(self) -> None:
        """The progress bar hidden."""
        self.progress_bar.layout.visibility = "hidden"
