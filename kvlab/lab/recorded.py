"""Recorded experiments, read by the question they answer. Each lives in the checkout's ``data/<question>/`` (the
wheel holds kvlab only) with the script that recorded it, a README and the ``figure.py`` that draws it::

    rec = recorded.load("staircase-on-webgpu")
    rec.results, rec.environment  # results.json, and where it was measured
    rec.read("ops_3072.csv")      # any file there: JSON parsed, CSV as rows (numbers as numbers), else text
    rec.figure()                  # figure.py's figure(rec); rec.draw("glance") calls its glance(rec)"""

from __future__ import annotations

import csv
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError


def data_dir() -> Path:
    """The checkout's ``data/``, found from the working directory up, else beside kvlab's source (an editable
    install). ConfigError outside a checkout."""
    here, source = Path.cwd(), Path(__file__).resolve().parents[2]
    for root in (here, *here.parents, source):
        if (root / "data" / "prompts").is_dir():
            return root / "data"
    raise ConfigError(f"no data/ folder of recorded experiments in {here}, its parents or {source}: use a checkout")


@dataclass(frozen=True)
class Recording:
    """One question's folder under ``data/``. Reading it changes nothing; each call reads the files again."""

    question: str
    folder: Path

    def files(self, pattern: str = "**/*") -> list[str]:
        """The files matching ``pattern`` (a glob), relative to the folder."""
        return sorted(p.relative_to(self.folder).as_posix() for p in self.folder.glob(pattern) if p.is_file())

    def read(self, name: str = "results.json") -> Any:
        """The file ``name``. ConfigError naming the folder's files when there is none of that name."""
        path = self.folder / name
        if not path.is_file():
            raise ConfigError(f"{self.question} has no file {name!r}; it holds {self.files()}")
        if path.suffix == ".csv":
            with path.open(newline="") as f:
                return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
        return json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()

    results = property(lambda self: self.read(), doc="``results.json``, parsed.")
    environment = property(lambda self: self.results.get("environment", {}), doc="Where results.json was measured.")

    def figure(self, *args: Any, **kwargs: Any) -> Any:
        """The question's figure: ``figure.py``'s ``figure(self, *args, **kwargs)``."""
        return self.draw("figure", *args, **kwargs)

    def draw(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``figure.py``'s public function ``name(self, *args, **kwargs)`` (another drawing, or a table). ConfigError
        naming the ones it defines when it defines none of that name."""
        path = self.folder / "figure.py"
        spec = importlib.util.spec_from_file_location(f"kvlab_data_{self.question.replace('-', '_')}", path)
        if not path.is_file() or spec is None or spec.loader is None:
            raise ConfigError(f"{self.question} has no figure.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        mine = sorted(n for n, f in vars(module).items() if getattr(f, "__module__", "") == module.__name__)
        mine = [n for n in mine if not n.startswith("_")]
        if name not in mine:
            raise ConfigError(f"{self.question}/figure.py has no drawing {name!r}; it has {mine}")
        return getattr(module, name)(self, *args, **kwargs)


def load(question: str) -> Recording:
    """The recorded experiment answering ``question``, its folder's name under ``data/``. ConfigError naming the
    questions there when none has that name, or outside a checkout."""
    root = data_dir()
    if not question or "/" in question or not (root / question / "README.md").is_file():
        known = sorted(p.parent.name for p in root.glob("*/README.md"))
        raise ConfigError(f"no recorded question {question!r} in {root}; there are {known}")
    return Recording(question, root / question)


def recorded_environment(result: dict[str, Any]) -> str:
    """One line naming where a recorded result (its ``environment``) was measured: date, CPU, package, commit."""
    env = result.get("environment", {})
    return (
        f"{env.get('date', 'undated')}, {env.get('cpu', 'unknown CPU')}, {env.get('backend_package', '?')} "
        f"{env.get('backend_version', '?')}, commit {env.get('commit', '?')}"
    )


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
