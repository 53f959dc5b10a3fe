"""data/kvlab-vs-genai-on-a-gpu/lockstep.py: kvlab's static step and onnxruntime-genai's taken in turns, on the real
toy sessions (the CPU EP, and WebGPU on whatever adapter this machine has) and the real onnxruntime-genai."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kvlab import generate
from kvlab.bench.plan import prompt_ids
from kvlab.ort import Stepper
from kvlab.ort.checks.references import genai_greedy

HERE = Path(__file__).resolve().parents[1] / "data" / "kvlab-vs-genai-on-a-gpu"
sys.path.insert(0, str(HERE))
import lockstep as loops  # noqa: E402  (the recording's own script, imported by path)
from lockstep import lockstep, summary  # noqa: E402


def test_steps_alternate_and_pair_one_to_one(toy, monkeypatch):
    """Every decode step of one side is followed by one of the other, the order swapped every pair; each side's
    tokens are what it makes alone (kvlab's ``generate``, onnxruntime-genai's own loop)."""
    calls: list[str] = []
    real_step, real_generator = Stepper.step, loops.genai_generator

    def step(self, tokens, *args, **kwargs):  # the real step, its turn noted
        calls.append("kvlab")
        return real_step(self, tokens, *args, **kwargs)

    class Noted:  # the real generator, its turns noted
        def __init__(self, gen):
            self.gen = gen

        def generate_next_token(self):
            calls.append("genai")
            self.gen.generate_next_token()

        def get_next_tokens(self):
            return self.gen.get_next_tokens()

    monkeypatch.setattr(Stepper, "step", step)
    monkeypatch.setattr(loops, "genai_generator", lambda *a: Noted(real_generator(*a)))
    r = lockstep(toy, "cpu", context=20, new_tokens=7, rounds=2, token_on_device=False, block=1)
    one_round = ["kvlab", "genai"] + ["kvlab", "genai", "genai", "kvlab"] * 3  # prefills, then 6 pairs in turns
    assert calls == one_round * 2
    assert r["pairs"] == 2 * 6 and len(r["round_medians"]) == 2 and r["tokens_equal"]
    ids = prompt_ids(toy, 20)
    mine = generate(toy, ids, device="cpu", max_new_tokens=7, stop_on_eos=False, token_on_device=False).token_ids
    assert genai_greedy(toy, ids, 7) == mine  # the independent reference agrees with kvlab alone


def test_blocks_take_turns_and_pair_their_medians(toy, monkeypatch):
    """Blocks of 4 steps in turns (the last one shorter), the order swapped every pair; each pair's ratio is the
    medians' ratio of its two blocks after their first quarter (one step of 4; none of the last, of 2); every
    step's time is kept in order."""
    calls: list[str] = []
    real_step = Stepper.step
    monkeypatch.setattr(Stepper, "step", lambda self, *a, **k: calls.append(id(self)) or real_step(self, *a, **k))
    r = lockstep(
        toy, "cpu", context=12, new_tokens=11, rounds=1, block=4, sides=("kvlab", "kvlab"), token_on_device=False
    )
    first, second = calls[0], calls[1]  # the two prefills, then 10 decode steps each: 4 + 4 + 2
    assert calls[2:] == [first] * 4 + [second] * 4 + [second] * 4 + [first] * 4 + [first] * 2 + [second] * 2
    a, b = r["steps_ms"][0]
    assert len(a) == len(b) == 10 and r["pairs"] == 3 and r["left_out_per_block"] == 1
    blocks = [(1, 4), (5, 8), (8, 10)]  # each block's steps after its first quarter
    expected = [np.median(a[i:j]) / np.median(b[i:j]) for i, j in blocks]
    assert r["ratio_median"] == pytest.approx(float(np.median(expected)))
    assert r["tokens_equal"] and r["genai_version"] == ""  # two kvlab caches: the same tokens, no genai
    cpu_a, cpu_b = r["steps_cpu_ms"][0]  # the calling thread's CPU time, step by step: never above the wall time
    assert len(cpu_a) == len(cpu_b) == 10 and all(0 < c <= w for c, w in zip(cpu_a + cpu_b, a + b))
    assert "the calling thread's CPU time: kvlab" in summary(r)


def test_a_step_keeps_its_wall_time_and_its_threads_cpu_time_apart():
    """Waiting (a sleep here, as for the GPU or a core) shows in the wall time only; work on the calling thread in
    both."""

    class Loop(loops.Loop):
        def __init__(self, busy: bool):
            super().__init__()
            self.busy = busy

        def _advance(self) -> int:
            start = time.thread_time()
            while self.busy and time.thread_time() - start < 0.005:
                pass
            if not self.busy:
                time.sleep(0.005)
            return len(self.tokens)

    waits, works = Loop(busy=False), Loop(busy=True)
    for loop in (waits, works):
        loop.step()
        loop.step()
    assert waits.tokens == works.tokens == [0, 1]
    assert min(waits.ms) >= 5 and max(waits.cpu_ms) < 2
    assert min(works.cpu_ms) >= 5 and all(c <= w for c, w in zip(works.cpu_ms, works.ms))


def test_the_result_states_its_ratios_and_label(toy):
    r = lockstep(toy, "cpu", context=16, new_tokens=6, rounds=3)
    q1, q3 = r["ratio_quartiles"]
    assert q1 <= r["ratio_median"] <= q3 and 0 <= r["below_one"] <= 1
    assert r["first_step_ms"] > 0 and r["second_step_ms"] > 0 and len(r["round_steps_ms"]) == 3
    assert r["sides"] == ["kvlab", "genai"] and r["block"] == 32 and r["left_out_per_block"] == 8
    assert r["pairs"] == 3  # 5 decode steps a round: one pair of blocks, shorter than 32
    assert r["runtime"].startswith("onnxruntime") and "(hardware)" in r["adapter"]
    assert not r["graph_capture"] and r["check_every"] is None and r["token_on_device"] is True  # "auto" on the CPU
    text = summary(r)
    assert f"kvlab/genai, {r['pairs']} pairs of 32-step blocks taken in turns" in text
    assert "the token on the device (single)" in text
    assert f"({toy.name}: float32 weights, float32 KV cache, on cpu (" in text


def test_both_captured_on_webgpu(toy):
    """kvlab's CapturedStaticCache on the capture build beside genai with graph capture, in turns; the prefill runs
    uncaptured on both, as each loop does alone."""
    r = lockstep("toy", "webgpu", context=12, new_tokens=4, rounds=1, graph_capture=True, check_every=2)
    assert r["graph_capture"] and r["model"] == "toy-graph" and r["check_every"] == 2
    assert r["tokens_equal"] and r["pairs"] == 1 and not r["token_on_device"]  # 3 steps: one pair of blocks
    assert (
        "kvlab's captured static cache (every present checked every 2 steps, the token on the host) against genai"
        in summary(r)
    )
    assert summary(r).split(";")[-2].endswith("captured")


def test_cli_writes_the_result(tmp_path):
    out = tmp_path / "lockstep.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "lockstep.py"), "--model", "toy", "--context", "12", "--new-tokens", "4"]
        + ["--rounds", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = json.loads(out.read_text())
    assert saved["pairs"] == 1 and saved["tokens_equal"] and saved["rounds"] == 1
    assert f"x{saved['ratio_median']:.3f}" in proc.stdout
    assert np.isfinite(saved["first_step_ms"]) and saved["environment"]["commit"]


def test_both_loops_run_in_the_modes_given():
    """``buffer_cache_mode`` and ``validation_mode`` open kvlab's WebGPU device in those modes and hand them to
    genai's sessions (on onnxruntime-webgpu genai's context is its own): the result and its summary name them; the
    tokens stay equal. In a process of its own: the modes fix the process's WebGPU context."""
    code = """
import json, sys
sys.path.insert(0, HERE)
from lockstep import lockstep, summary
r = lockstep("toy", "webgpu", context=12, new_tokens=4, rounds=1, buffer_cache_mode="simple", validation_mode="basic")
print(json.dumps({k: r[k] for k in ("buffer_cache_mode", "validation_mode", "genai_options", "tokens_equal")}))
print(summary(r))
""".replace("HERE", repr(str(HERE)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, *rest = proc.stdout.splitlines()
    saved = json.loads(first)
    assert saved["buffer_cache_mode"] == "simple" and saved["validation_mode"] == "basic" and saved["tokens_equal"]
    assert saved["genai_options"] == {"storageBufferCacheMode": "simple", "validationMode": "basic"}
    assert "buffer cache mode simple, validation mode basic (genai: basic));" in "\n".join(rest)


def test_without_modes_each_loop_runs_its_own_default(toy):
    """No mode asked for: kvlab's device in its default validation mode ("disabled"), genai given nothing beyond
    its genai_config.json."""
    r = lockstep("toy", "webgpu", context=12, new_tokens=4, rounds=1)
    assert r["validation_mode"] == "disabled" and r["genai_options"] == {}
    assert "validation mode disabled (genai: its config's)" in summary(r)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--set", "graph_capture=on", "--device", "cpu"], "graph_capture runs on webgpu, not on 'cpu'"),
        (
            ["--set", "graph_capture=on", "--token-on-device", "rows", "--device", "webgpu"],
            "a captured step keeps the token on the device with 'single' or 'blocks'",
        ),
        (
            ["--token-on-device", "single", "--set", "tokens_per_read=1000000000"],
            "tokens_per_read=1000000000 must be an int from 1 to 4096",
        ),
        (["--set", "block=0"], "--set 'block=0': 0 must be >= 1"),
        (["--token-on-device", "sideways"], "argument --token-on-device: invalid choice"),
        (["--model", "toy,toy"], "names several models; lockstep runs one"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(argv, says, capsys):
    """As ``kvlab``'s commands: a bad flag or setting is one line on stderr, exit 2, before anything runs."""
    try:
        rc = loops.main(["--model", "toy", *argv])
    except SystemExit as exc:  # argparse's own refusals
        rc = exc.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("kvlab: error: ") and says in lines[0], lines
