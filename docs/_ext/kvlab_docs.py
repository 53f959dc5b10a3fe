"""kvlab's additions to the docs build: links by repository path, notebooks read with their PNG charts, and a
lexer name for Mermaid sources."""

from __future__ import annotations

import os

import nbformat
from pygments.lexers.special import TextLexer
from sphinx import addnodes
from sphinx.transforms.post_transforms import SphinxPostTransform

PLOTLY = "application/vnd.plotly.v1+json"


def read_notebook(text: str) -> nbformat.NotebookNode:
    """Read a notebook as myst-nb's own reader does, minus each Plotly figure's JSON where its PNG copy exists.

    kvlab's charts are stored twice: as Plotly JSON, which needs plotly.js (several MB) to draw, and as a PNG copy for
    static viewers. The pages show the PNG, so they load no script, at build time or when read offline; without
    this, myst-nb would warn about the JSON output it cannot render (and -W makes that an error).
    """
    notebook = nbformat.reads(text, as_version=4)
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY in data and "image/png" in data:
                del data[PLOTLY]
    return notebook


class RepositoryPathLinks(SphinxPostTransform):
    """Resolve a link written as a repository path to the page that renders that file.

    The pages link to notebooks and data READMEs by their real paths (``../notebooks/01_....ipynb``), so that the
    links work when the Markdown is read in the repository too. The docs tree holds those files through symlinks
    (``docs/notebooks``, ``docs/data``); this maps a link's real path onto the page built from it. A link to a
    file that no page renders is left alone, and MyST reports it (an error under -W).
    """

    default_priority = 8  # before MyST's own resolver (9)

    def run(self, **kwargs) -> None:
        env = self.env
        pages = {}
        for docname in env.all_docs:
            path = os.path.realpath(env.doc2path(docname))
            pages[os.path.splitext(path)[0]] = docname
        for node in self.document.findall(addnodes.pending_xref):
            target = node.get("reftarget", "")
            if node.get("reftype") != "myst" or node.get("refdomain") != "doc" or target in env.all_docs:
                continue
            page = pages.get(os.path.realpath(os.path.join(env.srcdir, target)))
            if page is not None:
                node["reftarget"] = page


def setup(app):
    app.add_post_transform(RepositoryPathLinks)
    # Notebook 04 draws a cache's lifecycle as a Mermaid diagram: the page shows its source as text (a renderer
    # would load mermaid.js from a CDN).
    app.add_lexer("mermaid", TextLexer)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
