"""How a live widget reads where no kernel draws it (a committed notebook opened without running it, a static
viewer): the widget shows as usual, but its plain-text fallback is a sentence saying what it is and how to get it.

    from kvlab.lab.show import live_widget
    live_widget(browser, "the browser runner (a live widget): run this cell, then press its button")
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any


def with_plain_text(bundle: Any, text: str) -> Any:
    """A widget's mime bundle (a dict, or (data, metadata) as ipywidgets may return it) with ``text`` as its
    text/plain; ``{"text/plain": text}`` for anything else."""
    if isinstance(bundle, tuple):
        data, metadata = bundle
        return {**data, "text/plain": text}, metadata
    return {**bundle, "text/plain": text} if isinstance(bundle, dict) else {"text/plain": text}


def error_html(exc: Exception) -> str:
    """``exc`` as a widget's status line: its type in bold, then its message."""
    return (
        "<div style='color:#b00020;border-left:4px solid #b00020;padding:4px 8px;background:#fdeaea'>"
        f"<b>{type(exc).__name__}</b>: {html.escape(str(exc))}</div>"
    )


@dataclass(repr=False)
class LiveWidget:
    """``widget`` as a notebook shows it, with ``text`` as its plain-text form."""

    widget: Any
    text: str

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return with_plain_text(self.widget._repr_mimebundle_(**kwargs), self.text)

    def __repr__(self) -> str:
        return self.text


def live_widget(widget: Any, text: str) -> Any:
    """What a cell ends with to show ``widget`` live, and ``text`` where it cannot be drawn; None (nothing shown)
    when there is no widget, e.g. it could not start here."""
    return LiveWidget(widget, text) if widget is not None else None


def live_text(source: Any, names: str | list[str], render: Any) -> Any:
    """A ``live_widget`` text that follows ``source``: an ipywidgets Output holding ``render()``'s str, printed again
    whenever one of ``source``'s traits ``names`` changes; its plain-text form is the first text. What ``render``
    raises propagates from the first call and is printed into the box on later ones."""
    import ipywidgets as w

    box = w.Output()

    def show(_: Any = None) -> None:
        try:
            text = render()
        except Exception as exc:  # a later redraw: say it in the box rather than lose the error in a callback
            text = f"{type(exc).__name__}: {exc}"
        box.outputs = ({"output_type": "stream", "name": "stdout", "text": text + "\n"},)

    first = render()
    show()
    source.observe(show, names=names)
    return live_widget(box, first)
