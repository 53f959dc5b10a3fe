"""The README stays one screen, its links and the docs' links lead to files that exist, every data/ and scripts/
path the README, the docs and the notebooks name exists, and the docs site builds with warnings as errors (a broken
cross-reference, a page left out of the toctree or a link to a missing file)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1[ \t]*$", re.M | re.S)  # a fenced block: code, or a MyST directive
CODE_SPAN = re.compile(r"(`+)[^`].*?\1", re.S)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)  # [label]: target


def relative_links(markdown: str) -> list[str]:
    """Every link and image target in ``markdown`` that is a path (not a URL, not an anchor in the same page),
    outside code blocks and code spans, without its ``#anchor``."""
    text = CODE_SPAN.sub("", FENCE.sub("", markdown))
    targets = INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)
    paths = []
    for target in targets:
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, or an anchor on the same page
        paths.append(target.split("#", 1)[0])
    return paths


REPO_PATH = re.compile(r"(?<![\w/.-])((?:data|scripts)/[\w.*|/-]*)")  # data/..., scripts/...: a glob, a|b alternatives


def repository_paths(text: str) -> list[str]:
    """Every path into data/ or scripts/ that ``text`` names (a link, a code span or plain words), as written, without
    trailing punctuation."""
    return [m.rstrip(".,:;)") for m in REPO_PATH.findall(text)]


def names_something(path: str) -> bool:
    """Whether a named path exists in the repository: ``*`` as a glob, ``a|b`` within a name as alternatives (each
    must exist: ``steps-fp32|fp16.json``), a docs toctree's page name with its ``.md`` left off."""
    alternatives = re.search(r"[A-Za-z0-9]+(?:\|[A-Za-z0-9]+)+", path)
    if alternatives:
        return all(names_something(path.replace(alternatives.group(0), a)) for a in alternatives.group(0).split("|"))
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists() or (ROOT / f"{path}.md").exists()


def cited_texts() -> list[tuple[str, str]]:
    """(where, text) of the README, every docs page, every notebook cell's source and text outputs, and every
    source file of the package (its docstrings point at the data/ folder that holds a measurement)."""
    package = sorted(
        p for p in (ROOT / "kvlab").rglob("*") if p.suffix in (".py", ".mjs") and "node_modules" not in p.parts
    )
    out = [(str(p.relative_to(ROOT)), p.read_text()) for p in [*markdown_files(), *package]]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            texts = ["".join(cell["source"])]
            for o in cell.get("outputs", []):
                t = o.get("text") or o.get("data", {}).get("text/plain", "")
                texts.append("".join(t) if isinstance(t, list) else t)
            out += [(f"{nb.name} cell {i}", t) for t in texts]
    return out


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_readme_is_one_screen():
    text = README.read_text()
    assert len(text.splitlines()) <= 150, f"README.md has {len(text.splitlines())} lines (at most 150)"
    assert len(text.encode()) <= 12_000, f"README.md has {len(text.encode())} bytes (at most 12,000)"


# (the parameter is not called "page": tests/tiers.py takes a fixture of that name for Playwright's)
@pytest.mark.parametrize("markdown", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_that_exists(markdown):
    links = relative_links(markdown.read_text())
    missing = [link for link in links if not (markdown.parent / link).exists()]
    assert not missing, f"{markdown.relative_to(ROOT)} links to paths that do not exist: {missing}"


def test_every_data_and_scripts_path_named_in_the_docs_notebooks_and_package_exists():
    missing = sorted({(where, path) for where, text in cited_texts() for path in repository_paths(text)
                      if not names_something(path)})  # fmt: skip
    assert not missing, f"paths into data/ or scripts/ that do not exist: {missing}"


def test_the_path_check_reads_paths_globs_and_alternatives():
    text = "see data/prompts/long.txt, `data/where-a-cpu-step-goes/ops_*.csv` and (scripts/setup.py). mydata/x"
    paths = ["data/prompts/long.txt", "data/where-a-cpu-step-goes/ops_*.csv", "scripts/setup.py"]
    assert repository_paths(text) == paths and all(names_something(p) for p in paths)
    assert names_something("data/prompt-lookup/h200/steps-fp32|fp16-phi4-kv-webgpu.json")
    assert names_something("data/README")  # a docs toctree entry: the page's name
    assert not names_something("data/gpu/stairs/results.json") and not names_something("data/prompts/none_*.txt")
    assert not names_something("data/prompt-lookup/h200/steps-fp32|fp8-phi4-kv-webgpu.json")


def test_the_link_check_sees_links_and_skips_code():
    sample = (
        '[a](docs/a.md) ![b](img/b.png "title") [c](https://x.org) [d](#here) [e](f.md#part)\n'
        "`[not](inline.md)`\n```console\n[not](fenced.md)\n```\n[ref]: ref/target.md\n"
    )
    assert relative_links(sample) == ["docs/a.md", "img/b.png", "f.md", "ref/target.md"]


def test_the_docs_build_with_warnings_as_errors(tmp_path):
    out = tmp_path / "html"  # myst-nb writes its output images beside it, in tmp_path/jupyter_execute
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"the docs build failed ({run.returncode}):\n{run.stdout[-4000:]}\n{run.stderr[-8000:]}"
    for page in ("index", "installation", "reliability", "known-limits", "notebooks/01_dynamic_vs_static"):
        assert (out / f"{page}.html").is_file(), f"{page}.html was not built"
    # every script a page loads is the site's own: nothing from a CDN, at build time or when read offline
    remote = [p.name for p in out.rglob("*.html") if re.search(r"<script[^>]+src=\"(https?:)?//", p.read_text())]
    assert not remote, f"pages that load a remote script: {remote}"
    # the notebooks' charts are there, as their PNG copies
    assert "<img" in (out / "notebooks" / "01_dynamic_vs_static.html").read_text()
