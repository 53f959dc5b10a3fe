"""The live lab, for notebooks: figures of per-step records (``plots``, ``memory``, ``timeline``), the ``CacheLab``
dashboard (``widgets``, ``readouts``, ``liveplot``) and ``ChatLab`` (``chat``), step hooks (``buffers``), the
exercises and their checks (``exercises``, ``by_hand``), the tables and measurements a lesson prints (``tables``,
``layer_kinds``, ``noise``), recorded experiments read by question (``recorded``) and one visual language (``style``).

It may import ``kvlab.core``, ``kvlab.presets``, the ``kvlab.ort`` facade and ``kvlab.ort.decode``, never
``kvlab.ort.runtime`` or ``kvlab.ort.models``, nor the packages that import it (``kvlab.web``, ``kvlab.bench``,
the CLI). Figures read records and their labels only: they format labels, never parse them.
"""

from .runs import Run

__all__ = ["Run"]
