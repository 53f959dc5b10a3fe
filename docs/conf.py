"""Sphinx configuration of kvlab's documentation: MyST Markdown pages and the committed, executed notebooks.

Build: ``sphinx-build -W --keep-going -b html docs <outdir>`` (``tests/test_docs.py`` runs it in the full tier).
Warnings are errors there, so a broken cross-reference, a page missing from the toctree or a link to a file that
does not exist fails the build.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "kvlab"
author = "the kvlab authors"
copyright = "the kvlab authors"

extensions = ["myst_nb", "kvlab_docs"]  # myst_nb brings myst_parser: .md pages and .ipynb notebooks

# docs/notebooks is a symlink to the repository's notebooks/: the lessons render from where they are kept.
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]

# The notebooks are committed executed: the pages show those outputs and no kernel ever runs in a docs build.
nb_execution_mode = "off"
nb_custom_formats = {".ipynb": "kvlab_docs.read_notebook"}  # each chart as its PNG copy (see kvlab_docs)

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3  # [text](page.md#a-heading) resolves; a missing anchor is a warning

nitpicky = True

html_theme = "furo"
html_title = "kvlab"
html_show_sourcelink = False
