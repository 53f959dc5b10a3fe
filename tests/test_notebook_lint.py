"""The notebooks read as lessons, not as test logs: no nbval markers in any cell's text (their checks are cell tags),
every notebook opens with what you will learn, what it needs and how long it takes, and closes with "You can now
explain" and "Try this"; every cross-reference to a notebook or a section points at one that exists; the lesson
lists (README.md, docs/lessons.md) name every notebook; the cheat sheet in docs/ is the one notebook 01b ends with;
the core path's notebooks list their new concepts, 8 at most each; notebook 02 leaves its dashboard on its lesson.

Plain JSON reading, no kernel: the fast tier runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
HEADER_ROWS = ("**you will learn**", "**needs**", "**how long**")
NBVAL_TAGS = {"nbval-check-output", "nbval-ignore-output", "nbval-skip", "nbval-raises-exception", "raises-exception"}
SECTION_HEADING = re.compile(r"^#{2,3} (\d+)[a-z]? \u00b7", re.M)
NOTEBOOK_REF = re.compile(r"\b(?i:notebooks?) (\d\d[a-z]?)\b")
SECTION_REF = re.compile(r"(?:\b(?i:notebook) (\d\d[a-z]?)(?:'s)?,? )?\bsections? (\d+(?:(?:-|, | and | or )\d+)*)\b")


def cells(notebook: Path) -> list[dict]:
    return json.loads(notebook.read_text())["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def markdown(notebook: Path) -> str:
    return "\n\n".join(text(c) for c in cells(notebook) if c["cell_type"] == "markdown")


def number(notebook: Path) -> str:
    """A notebook's number, as its title and cross-references write it: '01', or '00b' for one inserted after 00."""
    return notebook.name.split("_")[0]


def by_number() -> dict[str, Path]:
    return {number(p): p for p in NOTEBOOKS}


def headings(notebook: Path) -> set[int]:
    return {int(n) for n in SECTION_HEADING.findall(markdown(notebook))}


def heading_block(md: str, heading: str) -> str:
    """The text under a '## heading' up to the next heading of level 1 or 2 ('' when there is none)."""
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^#{{1,2}} |\Z)", md, re.M | re.S)
    return m.group(1) if m else ""


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_nbval_marker_in_any_cell_and_tags_are_nbvals(notebook):
    for i, cell in enumerate(cells(notebook)):
        assert "NBVAL" not in text(cell), f"{notebook.name} cell {i}: an nbval marker in its text (use a cell tag)"
        tags = set(cell.get("metadata", {}).get("tags", []))
        assert not {t for t in tags if t.startswith("nbval") or "exception" in t} - NBVAL_TAGS, (notebook.name, i, tags)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_saved_widget_state(notebook):
    """Saved widget state makes the docs page of the notebook load a widget script from a CDN (the docs build
    refuses that: tests/test_docs.py); executing a notebook in place saves it, so strip it after."""
    assert "widgets" not in json.loads(notebook.read_text()).get("metadata", {}), (
        f"{notebook.name} keeps widget state in its metadata: delete metadata.widgets"
    )


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_opens_with_its_header(notebook):
    first = cells(notebook)[0]
    assert first["cell_type"] == "markdown", f"{notebook.name} does not open with text"
    head = text(first)
    assert re.match(rf"# {number(notebook)} \u00b7 \S", head), f"{notebook.name}: title is not '# NN · ...'"
    missing = [row for row in HEADER_ROWS if row not in head]
    assert not missing, f"{notebook.name}: its first cell lacks the header rows {missing}"
    how_long = re.search(r"\*\*how long\*\* \|([^\n]*)", head).group(1)
    assert re.search(r"\d+ (s|min|minutes?)\b", how_long), f"{notebook.name}: 'how long' gives no time: {how_long}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_closes_with_a_summary_and_try_this(notebook):
    md = markdown(notebook)
    summary = heading_block(md, "You can now explain")
    assert re.search(r"^(\d+\.|-) \S", summary, re.M), f"{notebook.name}: no '## You can now explain' with a list"
    tries = heading_block(md, "Try this")
    assert re.search(r"^(\d+\.|-) \S", tries, re.M), f"{notebook.name}: no '## Try this' section with items"


def claims_try_this() -> list[str]:
    """Who says every notebook has a 'Try this': the lesson lists, and any notebook that mentions one."""
    who = [f for f in ("README.md", "docs/lessons.md") if "Try this" in (REPO / f).read_text()]
    return who + [p.name for p in NOTEBOOKS if "Try this" in markdown(p).replace("## Try this", "")]


def test_a_claimed_try_this_is_there():
    claims = claims_try_this()
    assert claims, "nobody promises a 'Try this': the lesson lists should"
    lacking = [p.name for p in NOTEBOOKS if not heading_block(markdown(p), "Try this").strip()]
    assert not lacking, f"{', '.join(claims)} promise a 'Try this' that {lacking} lack"


def test_the_lint_catches_a_missing_try_this(tmp_path):
    """The check above, on a notebook made to lack its section: it must be found lacking."""
    md = "# 09 · x\n\n## You can now explain\n\n- a\n\n## Try this\n\n1. b\n"
    assert heading_block(md, "Try this").strip() == "1. b"
    assert heading_block(md.replace("## Try this\n\n1. b\n", ""), "Try this") == ""
    assert heading_block("## Try this\n\n## Next\n1. c\n", "Try this").strip() == ""


def references(source: str, own: str | None) -> list[tuple[str, int]]:
    """(notebook number, section number) of every 'section N' / 'notebook NN, section N' in ``source``."""
    out = []
    for m in SECTION_REF.finditer(source):
        target = m.group(1) or own
        if target is None:
            continue
        for n in re.findall(r"\d+", m.group(2)):
            out.append((target, int(n)))
    return out


def test_the_reference_parser_reads_ranges_and_other_notebooks():
    got = references("see section 3, notebook 01, section 5 and sections 1-3 and 6; notebook 07's section 2", "04")
    assert got == [("04", 3), ("01", 5), ("04", 1), ("04", 3), ("04", 6), ("07", 2)]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_cross_reference_points_at_something_that_exists(notebook):
    numbers = by_number()
    source = "\n".join(text(c) for c in cells(notebook))
    for n in NOTEBOOK_REF.findall(source):
        assert n in numbers, f"{notebook.name} refers to notebook {n}, which does not exist"
    for target, section in references(source, number(notebook)):
        assert target in numbers, f"{notebook.name} refers to notebook {target}"
        assert section in headings(numbers[target]), (
            f"{notebook.name} refers to section {section} of {numbers[target].name}, which has sections "
            f"{sorted(headings(numbers[target]))}"
        )
    for image in re.findall(r"\]\((images/[^)\s]+)\)", source):
        assert (notebook.parent / image).is_file(), f"{notebook.name} shows {image}, which does not exist"


def test_the_lesson_lists_name_every_notebook_and_nothing_else():
    readme = (REPO / "README.md").read_text()
    lessons = (REPO / "docs" / "lessons.md").read_text()
    for p in NOTEBOOKS:
        assert f"(notebooks/{p.name})" in readme, f"README.md's notebook list lacks {p.name}"
        assert f"(../notebooks/{p.name})" in lessons, f"docs/lessons.md's table lacks {p.name}"
        assert f"notebooks/{p.stem}\n" in lessons, f"docs/lessons.md's toctree lacks {p.stem}"
    for doc, found in (("README.md", readme), ("docs/lessons.md", lessons)):
        for name in re.findall(r"notebooks/(\d\d[a-z]?_\w+)\.ipynb", found):
            assert (REPO / "notebooks" / f"{name}.ipynb").is_file(), f"{doc} lists {name}, which does not exist"
        for n, section in references(found, None):
            assert section in headings(by_number()[n]), f"{doc} refers to section {section} of notebook {n}"


def test_notebook_01b_ends_with_the_cheat_sheet_of_the_docs():
    sheet = (REPO / "docs" / "cheat-sheet.md").read_text().replace("# Cheat sheet", "## Cheat sheet", 1).strip()
    last = cells(by_number()["01b"])[-1]
    assert last["cell_type"] == "markdown" and text(last).strip() == sheet, (
        "notebook 01b's last cell is not docs/cheat-sheet.md (heading one level down): change both together"
    )


RUN_TIMES = REPO / "notebooks" / "run_times.json"  # written by tests/test_notebooks.py's nbval runs
STATED_TOLERANCE = 1.4  # a stated time may be this far from the measured one, either way


def stated_seconds(notebook: Path) -> int:
    """The run time a notebook's header states: the first 'N s' of its 'how long' row."""
    row = re.search(r"\*\*how long\*\* \|([^\n]*)", text(cells(notebook)[0])).group(1)
    found = re.search(r"(\d[\d,]*) s\b", row)
    assert found, f"{notebook.name}: its 'how long' row states no run time in seconds: {row}"
    return int(found.group(1).replace(",", ""))


def test_stated_run_times_are_the_test_suites_measured_ones():
    """Each notebook's header, README.md and docs/lessons.md state its cells' run time; the nbval run of
    tests/test_notebooks.py measures it and writes it to notebooks/run_times.json. A stated time must be within
    STATED_TOLERANCE of the last measured one (notebooks not measured yet are left out)."""
    times = json.loads(RUN_TIMES.read_text())
    readme = (REPO / "README.md").read_text()
    assert times, "notebooks/run_times.json holds no measured run"
    for stem, measured in times.items():
        notebook = REPO / "notebooks" / f"{stem}.ipynb"
        assert notebook.is_file(), f"run_times.json measures {stem}, which does not exist"
        seconds = measured["seconds"]
        stated = [("its header", stated_seconds(notebook))]
        line = re.search(rf"\(notebooks/{re.escape(notebook.name)}\)[^\n]*\((\d+) min; (?:cells )?(\d+) s\)", readme)
        assert line, f"README.md's list states no '(N min; M s)' for {notebook.name}"
        stated.append(("README.md", int(line.group(2))))
        for where, said in stated:
            assert seconds / STATED_TOLERANCE <= said <= seconds * STATED_TOLERANCE, (
                f"{where} says {notebook.name}'s cells run in {said} s; tests/test_notebooks.py measured {seconds} s "
                f"on {measured['date']} ({measured['machine']}): state the measured time"
            )


CORE_PATH = ("00", "00b", "01", "01b", "02", "03", "04")  # docs/workshop.md's 90 minutes
MAX_NEW_CONCEPTS = 8  # what one lesson of the core path may introduce


def new_concepts(header: str) -> list[str]:
    """The concepts a header's '**new concepts**' row lists, split at its semicolons ([] when it has no such row)."""
    row = re.search(r"\*\*new concepts\*\* \|([^\n]*)", header)
    return [c.strip() for c in row.group(1).strip(" |").split(";") if c.strip()] if row else []


def test_the_concept_count_reads_the_row():
    assert new_concepts("| **new concepts** | a; b (c, d); e |\n| **needs** | x; y |") == ["a", "b (c, d)", "e"]
    assert new_concepts("| **needs** | x; y |") == []


@pytest.mark.parametrize("stem", CORE_PATH)
def test_the_core_path_lists_its_new_concepts_8_at_most(stem):
    """Each core-path notebook lists, at its top, the concepts it introduces, and introduces 8 at most."""
    notebook = by_number()[stem]
    concepts = new_concepts(text(cells(notebook)[0]))
    assert concepts, (
        f"{notebook.name}: its header has no '**new concepts**' row (the concepts it introduces, ';'-separated)"
    )
    assert len(concepts) <= MAX_NEW_CONCEPTS, (
        f"{notebook.name} introduces {len(concepts)} concepts, more than {MAX_NEW_CONCEPTS}: {concepts}; split it"
    )


LESSON_CONTROLS = {"cache_type", "max_cache_len"}  # what notebook 02's cells may set on its dashboard


def dashboard_settings(source: str) -> set[str]:
    """The controls of the dashboard ``lab`` that a cell's code assigns (``lab.X.value = ...``, also in a tuple)."""
    import ast

    out = set()
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                inner = t.value if isinstance(t, ast.Attribute) and t.attr == "value" else None
                if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id == "lab":
                    out.add(inner.attr)
    return out


def test_the_settings_reader_sees_tuple_assignments():
    assert dashboard_settings('lab.model.value, lab.device.value = "toy", "webgpu"\nx.y.value = 1') == {
        "model",
        "device",
    }


def test_notebook_02_leaves_its_dashboard_on_the_runs_of_its_lesson():
    """After Run All the dashboard's chart holds the last runs of one prompt length (``LivePlot.join``). Its lesson
    (sections 1-3: the advised model and context, static against dynamic, a larger max_cache_len) stays on it only if
    no cell switches the dashboard's model, device, prompt or buffer mode: those are the attendee's to try."""
    code = [text(c) for c in cells(by_number()["02"]) if c["cell_type"] == "code"]
    changed = set().union(*(dashboard_settings(s) for s in code))
    assert changed and changed <= LESSON_CONTROLS, (
        f"notebook 02's cells set the dashboard's {sorted(changed - LESSON_CONTROLS)}: its chart would end on "
        "runs other than its lesson's after Run All"
    )


MAX_PLUMBING_LINES = 12  # a lesson cell's code beyond this goes behind a named function (kvlab.lab, figure.py)


def plumbing_lines(source: str) -> int:
    """A cell's lines of code that are neither blank, comments nor imports."""
    lines = [line for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return len([line for line in lines if not line.startswith(("import ", "from "))])


def test_the_plumbing_count_leaves_out_imports_comments_and_blanks():
    assert plumbing_lines("import a\nfrom b import c\n\n# note\nx = 1  # set\n    y = 2\n") == 2


@pytest.mark.parametrize("stem", sorted(by_number()))
def test_no_lesson_cell_holds_more_than_12_lines_of_plumbing(stem):
    """Code a lesson does not teach sits behind a named function (kvlab.lab, or the figure.py of the data/ folder
    whose recording it reads): no code cell of any notebook is longer than MAX_PLUMBING_LINES, except a cell
    tagged 'lesson-code', whose code is what the lesson reads."""
    notebook = by_number()[stem]
    long = [
        (i, plumbing_lines(text(c)))
        for i, c in enumerate(cells(notebook))
        if c["cell_type"] == "code"
        and "lesson-code" not in c.get("metadata", {}).get("tags", [])
        and plumbing_lines(text(c)) > MAX_PLUMBING_LINES
    ]
    assert not long, f"{notebook.name}: cells (index, lines) over {MAX_PLUMBING_LINES} lines of plumbing: {long}"
