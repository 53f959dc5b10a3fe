"""What one decode step reads: every kvlab function a real step enters, traced, with its length in lines.

    .venv/bin/python scripts/step_path.py [--cache static|dynamic|both] [--device cpu|webgpu] [--list]

It builds nothing new (the toy model), runs a prefill and two steps, then traces the third: one token, from
``Stepper.step`` to the runtime's run and back through the commit and the record. A function counts once, with all
its lines (what a reader opens), whether or not each line ran. Prints lines and files per cache kind: the whole
step, and the part entered before the cache's commit returned (the run and the commit; then come the record, the
hooks and the settle).
"""

from __future__ import annotations

import argparse
import collections
import inspect
import sys
from pathlib import Path

PACKAGE = str(Path(__file__).resolve().parents[1] / "kvlab")


Entered = dict[tuple[str, str, int], int]


def traced_step(cache_kind: str, device: str) -> tuple[Entered, Entered]:
    """(file, function, first line) -> its length in lines, for every kvlab function one decode step enters, and
    for those it entered before the cache's commit returned."""
    from kvlab.ort import DynamicCache, StaticCache, Stepper, load

    model = load("toy")
    entered: Entered = {}
    to_commit: Entered = {}
    commit = (str(Path(PACKAGE) / "core" / "cache.py"), "commit")

    def tracer(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(PACKAGE):
            key = (code.co_filename[len(PACKAGE) + 1 :], code.co_name, code.co_firstlineno)
            if key not in entered and not code.co_name.startswith("<"):  # comprehensions: inside their function
                entered[key] = len(inspect.getsourcelines(code)[0])
            if (code.co_filename, code.co_name) == commit:
                return commit_returns  # watch this frame for its return

    def commit_returns(frame, event, arg):
        if event == "return":
            to_commit.update(entered)
        return commit_returns

    cache = StaticCache(64) if cache_kind == "static" else DynamicCache()
    with cache, Stepper(model, cache, device, 64) as stepper:
        stepper.step([1, 2, 3])
        stepper.step([4])
        stepper.step([5])  # every lazy first-use path is behind us
        sys.settrace(tracer)
        try:
            stepper.step([6])
        finally:
            sys.settrace(None)
    return entered, to_commit


def summary(entered: Entered) -> str:
    """ "N lines in F files (file lines, ...)", the biggest file first."""
    per_file: collections.Counter[str] = collections.Counter()
    for (path, _, _), n in entered.items():
        per_file[path] += n
    files = ", ".join(f"{p} {n}" for p, n in per_file.most_common())
    return f"{sum(per_file.values())} lines in {len(per_file)} files ({files})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", choices=("static", "dynamic", "both"), default="both")
    ap.add_argument("--device", choices=("cpu", "webgpu"), default="cpu")
    ap.add_argument("--list", action="store_true", help="list every function entered")
    args = ap.parse_args()
    for kind in ("static", "dynamic") if args.cache == "both" else (args.cache,):
        entered, to_commit = traced_step(kind, args.device)
        for path, name, line in sorted(entered) if args.list else ():
            print(f"  {path}:{line} {name} ({entered[path, name, line]} lines)")
        print(f"{kind} cache on {args.device}, the whole step: {summary(entered)}")
        print(f"{kind} cache on {args.device}, through the commit: {summary(to_commit)}")


if __name__ == "__main__":
    main()
