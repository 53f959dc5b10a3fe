"""Guards of what a user sees, run alone by the full run (scripts/full_run.sh, before its parts start, so that
nothing else of the run competes for the cores): kvlab's default decode step on the CPU EP against
onnxruntime-genai's, timed from outside both (data/cpu-default/per_token.py), paired and interleaved in one process.

The bound is a ratio of two loops, not a time: x0.95, kvlab's default ahead of genai's. Each measurement runs in a
fresh process, up to three: on a shared 2-core VM the same code's ratio moves between processes (x0.68-0.96 at 256
tokens, with where a process's weights land), so the guard asks whether kvlab's default beats genai in one of three
processes, and prints every figure it measured. It is a coarse check: there, one thread instead of the default two
read x0.95 at 256 tokens and x1.22 at 2,048 (data/cpu-default/README.md, "The guard"); the exact check of the default
thread count is tests/test_runtime.py's.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_python

# kvlab's default step at most this share of genai's, per context
BOUNDS = {256: 0.95, 2048: 0.95}
PROCESSES = 3  # fresh processes a context may take to clear its bound

MEASURE = """
import json, sys
sys.path.insert(0, "data/cpu-default")
from per_token import per_token_vs_genai, summary
result = per_token_vs_genai("smollm2", {context}, new_tokens=64, rounds=7)
print(json.dumps({{"ratio": result["ratio"], "tokens_equal": result["tokens_equal"], "summary": summary(result)}}))
"""


def measure(context: int) -> dict:
    """One guard measurement in a fresh interpreter: the median ratio, whether the tokens were equal, its summary."""
    done = run_python(MEASURE.format(context=context), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("context", sorted(BOUNDS))
def test_the_default_cpu_step_beats_onnxruntime_genai(smollm2, context):
    seen = []
    for attempt in range(1, PROCESSES + 1):
        result = measure(context)
        seen.append(result["summary"])
        print(f"\n[kvlab guard] process {attempt}: {result['summary']}; bound x{BOUNDS[context]}")
        assert result["tokens_equal"], result["summary"]
        if result["ratio"] <= BOUNDS[context]:
            return
    pytest.fail(f"above x{BOUNDS[context]} in {PROCESSES} processes: " + " | ".join(seen))
