"""Live kvlab tensors on one device through a cache's lifecycle: a count at every named event, drawn as one chart.

timeline = TensorTimeline(device)                          # the baseline: the device's live tensors now
timeline.mark("created")                                    # one point
kvlab.generate(..., on_step=timeline.marking("generation"))  # one point per step
timeline.figure("toy model · webgpu")                       # the chart
"""

from __future__ import annotations

from typing import Any

from .style import finish, title

FAILURE_WORDS = ("fail", "Ctrl-C")  # an event naming one of these is drawn red


class TensorTimeline:
    """The live kvlab tensors of ``device`` (anything with ``live_tensors``) above the count when it was made, at
    each event marked. Marking reads the count only; nothing is allocated or released."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.baseline = device.live_tensors
        self.events: list[tuple[str, int]] = []  # (event, live tensors above the baseline)

    def mark(self, event: str) -> None:
        """One point: ``event`` with the device's live kvlab tensors above the baseline now."""
        self.events.append((event, self.device.live_tensors - self.baseline))

    def marking(self, prefix: str) -> Any:
        """A step hook (``on_step``) that marks every step of a generation as '<prefix>: step N (phase)'."""
        return lambda record: self.mark(f"{prefix}: step {record.step} ({record.phase})")

    def figure(self, common: str) -> Any:
        """The count at every event as a step line (a plotly Figure): steps close together and unlabelled, every
        other event labelled with a wider gap around it, failures red; ``common``: what the title says produced it.
        ValueError when nothing was marked."""
        import plotly.graph_objects as go

        if not self.events:
            raise ValueError("no event marked yet: call mark() or pass marking() as a step hook first")
        events, live = zip(*self.events)
        labelled = [i for i, e in enumerate(events) if "step" not in e or "failed" in e]
        x = [0]
        for i in range(1, len(events)):
            x.append(x[-1] + (3 if i in labelled or i - 1 in labelled else 1))
        colors = ["#d62728" if any(w in e for w in FAILURE_WORDS) else "#1f77b4" for e in events]
        fig = go.Figure(
            go.Scatter(
                x=x,
                y=live,
                mode="lines+markers",
                line={"shape": "hv"},
                text=events,
                marker={"size": 7, "color": colors},
                hovertemplate="%{text}<br>%{y} live tensors<extra></extra>",
            )
        )
        t = title(
            "Live kvlab tensors through the lifecycle (exact count)",
            common,
            "red: an injected failure; every one returns to the count before it; unlabelled points: steps",
        )
        ticks = {"tickvals": [x[i] for i in labelled], "ticktext": [events[i] for i in labelled]}
        xaxis = {**ticks, "tickangle": -45, "showgrid": False, "tickfont": {"size": 10}}
        yaxis = {"title": "live tensors", "tickformat": "d", "rangemode": "tozero", "range": [0, max(live) + 2]}
        return finish(fig, t, height=560, showlegend=False, xaxis=xaxis, yaxis=yaxis, margin={"b": 190})
