"""``ChatLab``, a conversation widget (a text box, Send, Edit last message) over a ``kvlab.Conversation``, with each
turn's time to first token beside a from-scratch prefill of the same history, the cache's fill bar and prompt
lookup's accept rate; and the figure of those turns.

    lab = ChatLab("smollm2", cache=kvlab.StaticCache(384))
    lab                                  # the widget
    lab.send("What is a KV cache?")      # what the Send button does, from code
    lab.edit_last()                      # the last message back in the box, its turn taken back (rewind_turn)
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from ..core.errors import KvlabError
from ..core.lookup import PromptLookup
from ..ort import Conversation, DynamicCache, StaticCache, load, open_device
from .show import error_html, with_plain_text
from .style import KIND_COLORS, OTHER_COLORS, finish, go, runtime_text, title

REUSE, REPREFILL = KIND_COLORS["static"], OTHER_COLORS[0]


def reprefill_positions(sizes: Sequence[int]) -> list[int]:
    """The positions a chat that re-prefills feeds at each turn, when turn i adds ``sizes[i]`` positions (its
    message and reply): the whole conversation so far, every time."""
    return list(accumulate(sizes))


class ChatLab:
    """A chat with ``model`` on ``device`` over ``cache`` (default StaticCache(512)); ``reprefill``: after each
    turn, time a from-scratch prefill of the same history too (into a second cache of the same kind and size);
    ``lookup``: the prompt lookup a ticked box uses. ``rows``: one dict per turn kept. A refused turn (a kvlab
    error, e.g. CapacityError) is shown, not raised, and kept in ``last_error``."""

    def __init__(
        self,
        model: Any = "smollm2",
        *,
        cache: Any = None,
        device: str = "cpu",
        system: str | None = None,
        max_new_tokens: int = 24,
        reprefill: bool = True,
        lookup: PromptLookup | None = None,
    ):
        import ipywidgets as w

        self.model = load(model)
        self.cache = StaticCache(512) if cache is None else cache
        self.conv = Conversation(self.model, cache=self.cache, device=open_device(device), system=system)
        size = self.cache.capacity
        self._scratch = (StaticCache(size) if size else DynamicCache()) if reprefill else None
        self.max_new_tokens, self.lookup_setting = max_new_tokens, lookup or PromptLookup(k=4)
        self.rows: list[dict[str, Any]] = []
        self.last_error: Exception | None = None
        self.text = w.Textarea(placeholder="your message", layout=w.Layout(width="100%", height="60px"))
        self.send_button = w.Button(description="Send", button_style="primary", icon="paper-plane")
        self.edit_button = w.Button(description="Edit last message", icon="undo", layout=w.Layout(width="170px"))
        self.use_lookup = w.Checkbox(
            value=False, description=f"prompt lookup (k={self.lookup_setting.k})", indent=False,
            layout=w.Layout(width="auto", margin="0 0 0 12px"),
        )  # fmt: skip
        self.transcript, self.fill, self.chart, self.status = w.HTML(), w.HTML(), w.HTML(), w.HTML()
        self.send_button.on_click(lambda _: self.send())
        self.edit_button.on_click(lambda _: self.edit_last())
        buttons = w.HBox([self.send_button, self.edit_button, self.use_lookup])
        parts = [self.transcript, self.text, buttons, self.status, self.fill, self.chart]
        self.widget = w.VBox(parts, layout=w.Layout(width="100%", max_width="860px"))
        self._render()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        text = "kvlab ChatLab (a live widget): run this cell to chat; the cells below drive it"
        return with_plain_text(self.widget._repr_mimebundle_(**kwargs), text)

    def send(self, text: str | None = None) -> Any:
        """Say ``text`` (default: the box's) and return the turn; None when it was refused (``last_error``)."""
        message = self.text.value if text is None else text
        if not message.strip():
            self.status.value = "<i>nothing to send: type a message</i>"
            return None
        lookup = self.lookup_setting if self.use_lookup.value else None
        self.status.value = "<i>thinking...</i>"
        try:
            turn = self.conv.say(message, self.max_new_tokens, lookup=lookup)
        except KvlabError as exc:
            self.last_error = exc
            self.text.value = message
            self.status.value = error_html(exc)
            self._render(refused=True)
            return None
        self.last_error, self.text.value = None, ""
        self.rows.append(self._row(turn))
        self.status.value = ""
        self._render()
        return turn

    def edit_last(self) -> str:
        """Take the last turn back (``rewind_turn``: its positions leave the cache) and put its message in the
        box, to edit and send again; returns the message ("" when there is no turn)."""
        if not self.conv.turns:
            self.status.value = "<i>no turn to edit yet</i>"
            return ""
        turn = self.conv.rewind_turn()
        self.rows.pop()
        self.text.value = turn.message or ""
        self.status.value = f"turn {turn.index} taken back: the cache keeps {self.conv.held} positions; edit, then Send"
        self._render()
        return self.text.value

    def close(self) -> None:
        """The conversation closed and the caches disposed."""
        self.conv.close()
        self.cache.dispose()
        if self._scratch is not None:
            self._scratch.dispose()

    def _row(self, turn: Any) -> dict[str, Any]:
        fresh = None
        if self._scratch is not None:  # the same history, all of it fed, as a chat without reuse would
            with Conversation(self.model, cache=self._scratch, device=self.conv.device) as again:
                fresh = again.say(turn.prompt_ids, 1).ttft_ms()
        return {
            "turn": turn.index,
            "message": turn.message,
            "history": len(turn.prompt_ids),
            "reused": turn.reused,
            "prefilled": turn.prefilled,
            "reuse_ms": turn.ttft_ms(),
            "reprefill_ms": fresh,
            "new_tokens": len(turn.token_ids),
            "drafted": turn.drafted,
            "accepted": turn.accepted,
            "reply": turn.text,
        }

    def _render(self, refused: bool = False) -> None:
        self.transcript.value = _transcript_html(self.conv)
        self.fill.value = _fill_html(len(self.conv.ids), *self.conv.capacity, refused)
        self.chart.value = _bars_html(self.rows)


def _transcript_html(conv: Conversation) -> str:
    lines = []
    for m in conv.history.messages:
        who = {"user": "you", "assistant": "model", "system": "system"}[m["role"]]
        lines.append(f"<div><b>{who}:</b> {html.escape(m['content'].strip())}</div>")
    # column-reverse: the box starts scrolled to its end, so the newest message shows without scrolling
    body = "<div>" + ("".join(lines) or "<i>no turn yet</i>") + "</div>"
    return "<div style='max-height:220px;overflow-y:auto;display:flex;flex-direction:column-reverse'>" + body + "</div>"


def _fill_html(used: int, capacity: int, what: str, refused: bool) -> str:
    pct, color = 100 * used / capacity, "#d62728" if refused else "#1f77b4"
    return (
        f"<div style='margin:6px 0'>cache fill: <b>{used:,}</b> of {capacity:,} positions ({what})"
        f"{' · <b style=color:#d62728>the last turn did not fit</b>' if refused else ''}"
        f"<div style='border:1px solid {color};height:14px;width:100%'><div style='background:{color};height:100%;"
        f"width:{pct:.1f}%'></div></div></div>"
    )


def _bars_html(rows: Sequence[dict[str, Any]]) -> str:
    """Per turn, its time to first token reused and re-prefilled, as bars on one scale."""
    if not rows:
        return ""
    top = max(max(r["reuse_ms"], r["reprefill_ms"] or 0) for r in rows)
    out = [
        f"<div style='margin-top:6px'><b>time to first token</b>: <span style='color:{REUSE}'>&#9632; kept cache"
        f"</span> <span style='color:{REPREFILL}'>&#9632; re-prefill of the whole history</span></div>"
    ]
    for r in rows:
        bars = [(r["reuse_ms"], REUSE, f"fed {r['prefilled']}")]
        if r["reprefill_ms"] is not None:
            bars.append((r["reprefill_ms"], REPREFILL, f"fed {r['history']}"))
        lookup = f" · lookup {r['accepted']}/{r['drafted']} drafts accepted" if r["drafted"] else ""
        out.append(f"<div style='font-size:90%'>turn {r['turn']} (history {r['history']:,} positions){lookup}</div>")
        for ms, color, fed in bars:
            out.append(
                f"<div style='display:flex;align-items:center;font-size:85%'><div style='background:{color};"
                f"height:10px;width:{max(0.5, 70 * ms / top):.1f}%'></div>&nbsp;{ms:,.0f} ms ({fed})</div>"
            )
    return "".join(out)


def ttft_figure(lab: ChatLab) -> Any:
    """The lab's turns: time to first token kept against re-prefilled, per turn, with the history's length; the title
    names the model, precision, runtime, device and cache."""
    rows, m, d = lab.rows, lab.model, lab.conv.device.label
    ran = f"{m.name} ({m.info.dtype_name}) · {runtime_text(d)} · {d} · cache {lab.cache.spec}"
    x = [f"turn {r['turn']}<br>{r['history']:,} positions" for r in rows]
    fig = go().Figure()
    fig.add_bar(x=x, y=[r["reuse_ms"] for r in rows], name="kept cache (feeds the new positions)", marker_color=REUSE)
    fig.add_bar(
        x=x, y=[r["reprefill_ms"] for r in rows], name="re-prefill (feeds the whole history)", marker_color=REPREFILL
    )
    t = title("Time to first token per turn, live: kept cache vs re-prefill", ran, "one run each, this machine")
    finish(fig, t, legend_y=-0.25, barmode="group", yaxis_title="time to first token (ms)", height=440)
    return fig


def rewind_rows(names: Sequence[str], turns: Sequence[Sequence[int]], edited: Sequence[int]) -> list:
    """Per model and cache kind (CPU EP): two turns of ``turns`` (6 new tokens each), the second taken back and
    ``edited`` said instead; what the cache held after the rewind, what the edited turn reused and fed, and whether
    its tokens equal a from-scratch ``generate`` of the same history."""
    from collections import Counter

    from ..ort import generate

    rows, new = [], 6
    for name in names:
        model = load(name)
        kinds = ", ".join(f"{n} x {k}" for k, n in Counter(lay.kind.name for lay in model.info.layout.layers).items())
        for make in (DynamicCache, lambda: StaticCache(128)):
            with make() as cache, Conversation(model, cache=cache) as conv:
                for ids in turns:
                    conv.say(list(ids), new)
                before = conv.held
                conv.rewind_turn()
                held, turn = conv.held, conv.say(list(edited), new)
                with StaticCache(128) as fresh:
                    same = generate(model, turn.prompt_ids, cache=fresh, max_new_tokens=new).token_ids
            rows.append({"model": name, "layers": kinds, "cache": cache.kind, "held before": before,
                         "held after rewind": held, "edited turn reused": turn.reused, "fed": turn.prefilled,
                         "tokens = from scratch": turn.token_ids == same})  # fmt: skip
    return rows
