"""Record kvlab's CPU EP step against onnxruntime-genai's, timed from outside both (per_token.py), for
kvlab's default and the settings it chooses between, on a quiet machine and with CPU-bound processes competing.

    .venv/bin/python data/cpu-default/record.py [--contexts 256,2048] [--loads 0,1,2] [--rounds 5] [--new 64]

Writes results.json beside this file (one row per context, load and setting) and prints a line per row. Run it on a
machine with nothing else to do: every figure is a paired ratio, but a busy machine widens the spread.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from competing import competing
from per_token import per_token_vs_genai, summary

import kvlab
from kvlab.ort.runtime.backend import versions
from kvlab.ort.runtime.device import private_device

# kvlab's default; ONNX Runtime's own on a 2-core machine (kvlab's default before the one below); the earlier
# default, one thread fewer than the physical cores (one thread on two cores)
SETTINGS = {
    "kvlab default": None,
    "2 threads, spinning": {"threads": 2, "spinning": True},
    "1 thread, not spinning": {"threads": 1, "spinning": False},
}
HERE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="256,2048")
    ap.add_argument("--loads", default="0,1,2", help="competing CPU-bound processes, one block each")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()
    model, rows = kvlab.load("smollm2"), []
    for load in map(int, args.loads.split(",")):
        with competing(load):  # started before the devices open: the default measures the busy cores
            for name, options in SETTINGS.items():
                device = kvlab.open_device("cpu") if options is None else private_device("cpu", **options)
                for context in map(int, args.contexts.split(",")):
                    r = per_token_vs_genai(model, context, args.new, args.rounds, device=device)
                    rows.append({"load": load, "setting": name, **r})
                    print(f"load {load}, {name}: " + summary(r), flush=True)
                if options is None:
                    kvlab.close_device("cpu")  # the next load's default measures the cores again
    machine = {
        "platform": platform.platform(),
        "versions": versions(),
        "cpu": kvlab.open_device("cpu").label.adapter.name,
    }
    (HERE / "results.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
