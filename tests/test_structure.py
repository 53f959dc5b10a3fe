"""kvlab's shape, held by tests: the direction of its imports, and the length of one decode step's path. (No line
caps per module, class or function: a cap makes code wider to fit a number, not simpler.)

- Imports (every import counts: module level, inside functions, under TYPE_CHECKING): ``kvlab.core`` imports no
  other kvlab package; in ``kvlab.ort`` each room imports only itself and the rooms below it (models <- runtime <-
  decode <- checks; none imports the ``kvlab.ort`` facade); ``kvlab.lab`` imports neither ``kvlab.ort.runtime``
  nor ``kvlab.ort.models``; kvlab's top-level packages import each other without a cycle, and so do its modules.
- One decode step (``scripts/step_path.py``, traced on the toy model): at most 700 lines of kvlab in 6 files, for
  the static and the dynamic cache.

The checks are functions of a source root, so ``test_the_checks_catch_a_violating_tree`` runs them on a planted
tree to show each one fails where it should.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the folder holding the kvlab package
ROOMS = ("models", "runtime", "decode", "checks")  # kvlab.ort's rooms, lowest first

# Imports let through despite the rules: (importer, imported). None today; an entry must go once its import does
# (stale entries fail).
IMPORT_EXEMPT: set[tuple[str, str]] = set()


def python_files(root: Path) -> Iterator[Path]:
    """Every .py file of the kvlab package under ``root`` (none from node_modules)."""
    for path in sorted((root / "kvlab").rglob("*.py")):
        if "node_modules" not in path.parts:
            yield path


def imports(root: Path) -> dict[str, set[str]]:
    """Each kvlab module -> the kvlab modules and packages it imports (relative imports resolved; ``from X import
    name`` counts as importing X.name where that is a module or package)."""
    modules = {_module_name(p, root): p for p in python_files(root)}
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                subs = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
                targets |= subs or {base}
        out[name] = {t for t in targets if t == "kvlab" or t.startswith("kvlab.")}
    return out


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def import_violations(graph: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """(rule, importer, imported) for every import that breaks a rule of the module docstring."""
    out = []
    for importer, targets in graph.items():
        for target in sorted(targets):
            if _within(importer, "kvlab.core") and not _within(target, "kvlab.core"):
                out.append(("core imports no other kvlab package", importer, target))
            room = _room(importer)
            if room is not None and _within(target, "kvlab.ort"):
                to = _room(target)
                if to is None or ROOMS.index(to) > ROOMS.index(room):
                    out.append(("ort rooms import only downward", importer, target))
            if _within(importer, "kvlab.lab") and any(
                _within(target, f"kvlab.ort.{room}") for room in ("runtime", "models")
            ):
                out.append(("lab reaches no ort internals", importer, target))
    return out


def _room(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "ort" and parts[2] in ROOMS else None


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles among kvlab's top-level packages (and the ``kvlab`` package itself), each as a path that ends
    where it starts."""
    top = lambda name: ".".join(name.split(".")[:2])  # noqa: E731
    edges: dict[str, set[str]] = {}
    for importer, targets in graph.items():
        edges.setdefault(top(importer), set()).update(top(t) for t in targets if top(t) != top(importer))
    return cycles(edges)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of a graph (node -> the nodes it imports), each as a path that ends where it starts."""
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append(path[path.index(node) :] + [node])
            return
        if node in done:
            return
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for node in sorted(edges):
        visit(node, [])
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return imports(ROOT)


def test_imports_follow_the_layers(graph):
    broken = [v for v in import_violations(graph) if v[1:] not in IMPORT_EXEMPT]
    assert not broken, "\n".join(f"{rule}: {importer} imports {target}" for rule, importer, target in broken)


def test_the_import_exemptions_are_still_needed(graph):
    stale = sorted(pair for pair in IMPORT_EXEMPT if pair[1] not in graph.get(pair[0], set()))
    assert not stale, f"no longer imported: delete these IMPORT_EXEMPT entries: {stale}"


def test_top_level_packages_import_without_a_cycle(graph):
    cycles = package_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_modules_import_without_a_cycle(graph):
    """Also inside one package or room: two modules that need each other are one job split in two (or a third
    module waiting to be written), even where the import is deferred into a function or a type annotation."""
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_one_decode_step_reads_at_most_700_lines_in_6_files():
    """``scripts/step_path.py`` traces a real decode step of each cache (the toy model, CPU EP) and counts the kvlab
    lines and files it enters, from ``Stepper.step`` to the run and back through the commit, the record and the
    settle (docs/architecture.md, "One step's data flow")."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "step_path.py")], capture_output=True, text=True, check=True
    ).stdout
    whole = re.findall(r"(\w+) cache on cpu, the whole step: (\d+) lines in (\d+) files", out)
    assert [kind for kind, _, _ in whole] == ["static", "dynamic"], out
    assert all(int(lines) <= 700 and int(files) <= 6 for _, lines, files in whole), out


def test_the_checks_catch_a_violating_tree(tmp_path):
    files = {
        "kvlab/__init__.py": "",
        "kvlab/core/__init__.py": "",
        "kvlab/core/cache.py": "def f():\n    from ..ort.runtime import device\n",
        "kvlab/ort/__init__.py": "from .decode import caches\n",
        "kvlab/ort/runtime/__init__.py": "",
        "kvlab/ort/runtime/device.py": "from ..decode.caches import X\nfrom .. import decode\n",
        "kvlab/ort/decode/__init__.py": "",
        "kvlab/ort/decode/caches.py": "from ..runtime.device import Device\nfrom ..models import layouts\n"
        + "def make():\n    from .window import Ring\n",
        "kvlab/ort/decode/window.py": "import typing\nif typing.TYPE_CHECKING:\n    from .caches import S\n",
        "kvlab/ort/models/__init__.py": "",
        "kvlab/ort/models/layouts.py": "from kvlab.ort.checks import faults\n",
        "kvlab/ort/checks/__init__.py": "",
        "kvlab/ort/checks/faults.py": "from ..decode import caches\n",
        "kvlab/lab/__init__.py": "from ..ort.models.layouts import read_info\nfrom ..ort import caches\n",
        "kvlab/bench/__init__.py": "from ..web import job\n",
        "kvlab/web/__init__.py": "",
        "kvlab/web/job.py": "def g():\n    from ..bench import plan\n",
        "kvlab/bench/plan.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    planted = imports(tmp_path)
    assert {v[1:] for v in import_violations(planted)} == {
        ("kvlab.core.cache", "kvlab.ort.runtime.device"),  # core reaches a backend (inside a function)
        ("kvlab.ort.runtime.device", "kvlab.ort.decode.caches"),  # a room imports a higher one
        ("kvlab.ort.runtime.device", "kvlab.ort.decode"),
        ("kvlab.ort.models.layouts", "kvlab.ort.checks.faults"),  # absolute imports count alike
        ("kvlab.lab", "kvlab.ort.models.layouts"),  # lab reaches ort's internals
    }
    assert ("kvlab.ort.decode.caches", "kvlab.ort.runtime.device") not in {v[1:] for v in import_violations(planted)}
    assert package_cycles(planted) == [["kvlab.bench", "kvlab.web", "kvlab.bench"]]
    assert ["kvlab.ort.decode.caches", "kvlab.ort.decode.window", "kvlab.ort.decode.caches"] in cycles(planted)
