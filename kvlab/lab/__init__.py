"""The live lab, for notebooks: figures of per-step records (``plots``, ``memory``), the ``CacheLab`` dashboard
(``widgets`` with its ``controls``, ``readouts`` and ``liveplot``), the ``BufferWatch`` step hook (``buffers``),
``ChatLab`` (``chat``), exercises with checked answers (``exercises``), a KV cache written by hand in numpy with
its checks and exact byte counts (``by_hand``), the tables and reports a lesson prints (``tables``), which layers of
a model grow and what each cache holds and saves, per architecture (``layer_kinds``), a model edited to show what a
runtime refuses (``graph_edits``), live tensors counted through a cache's lifecycle (``timeline``) and one visual
language (``style``).

It may import ``kvlab.core``, ``kvlab.presets``, the ``kvlab.ort`` facade and ``kvlab.ort.decode``, never
``kvlab.ort.runtime`` or ``kvlab.ort.models``, nor the packages that import it (``kvlab.web``, ``kvlab.bench``,
the CLI). Figures read records and their labels only: they format labels, never parse them.
"""

from .runs import Run

__all__ = ["Run"]
