"""The decode room: the caches (``caches/``: one file per cache kind, the static one first) and the machinery that
steps them: one step (``stepper``), greedy steps read back in bursts (``burst``), the greedy token kept on the device
(``greedy``), the generation loop (``generate``) and a chat that keeps its cache between turns, with prompt lookup
(``conversation``).

Imports: ``kvlab.core`` and the rooms below it in ``kvlab.ort`` (``runtime``, ``models``); never ``checks`` or the
``kvlab.ort`` facade.
"""
