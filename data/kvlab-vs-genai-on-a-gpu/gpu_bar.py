"""kvlab's static step against onnxruntime-genai's, over every recording in data/: how many groups are at or below.

    python3 data/kvlab-vs-genai-on-a-gpu/gpu_bar.py [--root data] [--list] [--adapter "NVIDIA H200"]

A recording is a JSON file, or one entry of a file that packs several (``{"recordings": {name: recording}}``, named
by the file it was recorded as).

Only recordings on the adapter named (default the NVIDIA H200, where the targets are set) count; lockstep
recordings on others are reported as set aside. A group is (package, model, precision, buffer cache mode, context).
A bench recording (``results.json``) gives each of its groups the ratio of its fastest uncaptured static row
(``static@N``, with or without the token on the device: both are kvlab's, and ``generate()`` picks the token's path
by the adapter) over its genai row; a lockstep recording (``lockstep_*.json``, kvlab's default against genai in
turns, ``kvlab profile --lockstep``) gives its median ratio. Captured bench rows are left out; captured lockstep
recordings (both loops captured) are counted apart. Prints, per group, the newest recording's ratio (by the
environment's date, else the file's path) and how many groups are at or below 1.00, by the newest recording and by
every recording; then the target cells (``TARGET``: the default buffer cache mode, phi4-kv in three precisions and
smollm2-shape, 1k-16k, both packages): how many are at or below, which are above, which have no recording, and
which another recording of the newest one's day put above; then the target cells again, by the lockstep recordings of
generate's default since f7265df alone (kvlab's tokens read back in bursts, ``tokens_per_read`` above 1).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PRECISIONS = {"float32": "fp32", "float16": "fp16"}
PACKAGES = ("onnxruntime-webgpu", "onnxruntime-ep-webgpu")
TARGET = [  # (model, precision, context): smollm2-shape has 8,192 positions, so 8,000 tokens of context is its top
    *(
        (m, p, c)
        for m, p in (("phi4-kv", "fp32"), ("phi4-kv", "fp16"), ("phi4-kv", "int4"))
        for c in (1024, 2048, 4096, 8192, 16384)
    ),
    *(("smollm2-shape", "fp32", c) for c in (1024, 2048, 4096, 8000)),
]


def bench_ratios(path: Path, data: dict, adapter: str) -> list[tuple[tuple, float, str]]:
    """(group, static/genai, date) for every group of one bench recording that has both rows on ``adapter``."""
    env = data.get("environment", {})
    package = env.get("backend_package", "?")
    groups: dict[tuple, dict[str, float]] = {}
    for r in data.get("rows", []):
        if not isinstance(r, dict) or not r.get("valid", True) or r.get("decode_ms") is None:
            continue
        if adapter not in str(r.get("adapter")):
            continue
        variant, runner = str(r.get("variant", "")), str(r.get("runner", ""))
        model = str(r["model"]).removesuffix(f"-{r['precision']}")  # "phi4-kv-fp16" -> "phi4-kv"
        key = (package, model, r["precision"], r.get("buffer_cache_mode", "bucket"), r["context"])
        row = groups.setdefault(key, {})
        if runner == "genai":
            row["genai"] = r["decode_ms"]
        elif runner == "kvlab" and variant.startswith("static@") and "graph" not in variant:
            row["static"] = min(row.get("static", float("inf")), r["decode_ms"])
    date = str(env.get("date", path))
    return [(k, v["static"] / v["genai"], date) for k, v in groups.items() if {"static", "genai"} <= set(v)]


def lockstep_ratio(path: Path, data: dict) -> list[tuple[tuple, float, str]]:
    """(group, median ratio, date) of one lockstep recording of kvlab against genai. A captured one (both loops
    captured) is a group of its own: its mode reads "<mode>, captured, token on the device|host"."""
    if data.get("sides", ["kvlab", "genai"]) != ["kvlab", "genai"]:
        return []
    if data.get("block", 1) < 2:  # single-step turns misplace time between the loops (this folder's README)
        return []
    env = data.get("environment", {})
    package = "onnxruntime-ep-webgpu" if "ep-webgpu" in data.get("runtime", "") else "onnxruntime-webgpu"
    model, precision = str(data["model"]), PRECISIONS.get(data["precision"], data["precision"])
    model = model.removesuffix("-graph").removesuffix(f"-{precision}").removesuffix("-int4")  # -> "phi4-kv"
    if data.get("weights") == "int4":
        precision = "int4"
    mode = data.get("buffer_cache_mode") or "bucket"  # recordings before the flag ran in the default, bucket
    both = data.get("genai_options", {}).get("validationMode")
    if both:  # both loops in one validation mode asked for: not each its default
        mode += f", validation {both} (both)"
    if data.get("graph_capture"):
        mode += f", captured, token on the {'device' if data.get('token_on_device') else 'host'}"
    key = (package, model, precision, mode, data["context"])
    return [(key, data["ratio_median"], str(env.get("date", path)))]


def newest_of(seen: list[tuple[tuple, float, str]]) -> dict[tuple, tuple[str, float]]:
    """Each group's newest recording: group -> (date, ratio)."""
    newest: dict[tuple, tuple[str, float]] = {}
    for key, ratio, date in seen:
        if key not in newest or date >= newest[key][0]:
            newest[key] = (date, ratio)
    return newest


def target(newest: dict[tuple, tuple[str, float]], seen: list[tuple[tuple, float, str]], title: str) -> None:
    """Print the target cells' count at or below, the ones above or missing, and the ones at or below by their
    newest recording that another of the same day put above (how far a cell swings between recordings)."""
    above, missing, swung, met = [], [], [], 0
    for package in PACKAGES:
        for model, precision, context in TARGET:
            key = (package, model, precision, "bucket", context)
            if key not in newest:
                missing.append(f"{package} {model} {precision} {context}")
            elif newest[key][1] <= 1.0:
                met += 1
                day = newest[key][0][:10]  # the newest one's day: the same code, as a rule; its spread
                ratios = sorted(r for k, r, date in seen if k == key and date[:10] == day)
                if ratios[-1] > 1.0:
                    swung.append(
                        f"{package} {model} {precision} {context}: {len(ratios)} recordings on {day}, "
                        f"x{ratios[0]:.3f}-x{ratios[-1]:.3f}, {sum(r > 1.0 for r in ratios)} above"
                    )
            else:
                above.append(f"{package} {model} {precision} {context}: x{newest[key][1]:.3f}")
    print(f"{title}: {met} of {len(PACKAGES) * len(TARGET)} at or below genai's step")
    for line in above:
        print(f"  above: {line}")
    for line in missing if len(missing) < len(PACKAGES) * len(TARGET) else [f"all {len(missing)}"]:
        print(f"  not recorded: {line}")
    for line in swung:
        print(f"  at or below, but above in another recording that day: {line}")


def recordings(root: Path) -> Iterator[tuple[Path, Any]]:
    """(path, recording) of every JSON recording under ``root``, a packed file's entries each at the path they were
    recorded as (its name plus .json, under the packed file's folder)."""
    for path in sorted(root.rglob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("recordings"), dict):
            yield from ((path.parent / f"{name}.json", one) for name, one in data["recordings"].items())
        else:
            yield path, data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--list", action="store_true", help="print every group's newest ratio")
    ap.add_argument("--adapter", default="NVIDIA H200", help="count recordings on this adapter only")
    args = ap.parse_args()
    seen: list[tuple[tuple, float, str]] = []
    bursts: list[tuple[tuple, float, str]] = []  # lockstep recordings of kvlab reading its tokens back in bursts
    aside: set[str] = set()
    for path, data in recordings(args.root):
        if path.name != "results.json" and not path.name.startswith("lockstep_"):
            continue
        if not isinstance(data, dict):
            continue
        if path.name == "results.json":
            seen += bench_ratios(path, data, args.adapter)  # row by row: a recording may hold several adapters
        elif args.adapter in str(data.get("adapter")):
            seen += lockstep_ratio(path, data)
            if (data.get("tokens_per_read") or 1) > 1:  # generate's default since f7265df, where the token is kept
                bursts += lockstep_ratio(path, data)  # on the device; recordings before it read every step back
        else:
            aside.add(str(data.get("adapter")))
    print(f"recordings on {args.adapter}" + (f"; set aside: lockstep recordings on {sorted(aside)}" if aside else ""))
    newest = newest_of(seen)
    if args.list:
        for key, (date, ratio) in sorted(newest.items()):
            print(f"{'  '.join(map(str, key))}: x{ratio:.3f} ({date[:16]})")
    for title, captured in (("", False), ("captured (both loops): ", True)):
        groups = {k: r for k, (_, r) in newest.items() if ("captured" in k[3]) == captured}
        pairs = [r for k, r, _ in seen if ("captured" in k[3]) == captured]
        at_or_below = sum(r <= 1.0 for r in groups.values())
        print(f"{title}newest recording per group: {at_or_below} of {len(groups)} groups at or below genai's step")
        for package in sorted({k[0] for k in groups}):
            mine = [r for k, r in groups.items() if k[0] == package]
            print(f"  {package}: {sum(r <= 1.0 for r in mine)} of {len(mine)}")
        print(
            f"{title}every recording: {sum(r <= 1.0 for r in pairs)} of {len(pairs)} (group, recording) pairs at or "
            "below"
        )
    target(newest, seen, "target cells (bucket mode, 1k-16k)")
    target(newest_of(bursts), bursts, "target cells by recordings of the default since f7265df (tokens read in bursts)")


if __name__ == "__main__":
    main()
