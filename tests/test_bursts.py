"""Greedy steps in bursts (``Stepper.decode``, ``generate(tokens_per_read=...)``): the token stays on the device and
a burst's tokens are read back together. Compared against kvlab's one-step-a-time host path on the same real sessions
(which tests/test_generate.py compares with onnxruntime-genai and transformers)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvlab import ConfigError, DynamicCache, StaticCache
from kvlab.ort import CapturedStaticCache, Stepper, generate, load, open_device
from kvlab.ort.checks.faults import Injected, fault, raising_hook

PROMPT = "Once upon a time"
CACHES = {"dynamic": DynamicCache, "static": lambda: StaticCache(64)}


def _reference(model, device: str, n: int = 20) -> list[int]:
    """The tokens read back one step at a time, chosen on the host."""
    with StaticCache(64) as cache:
        return generate(
            model, PROMPT, cache=cache, device=device, max_new_tokens=n, stop_on_eos=False, token_on_device=False
        ).token_ids


def _bursts(n: int, per_read: int) -> list[int]:
    """``read_with`` of ``n`` decode steps in bursts of ``per_read``."""
    sizes = [per_read] * (n // per_read) + ([n % per_read] if n % per_read else [])
    return [k for k in sizes for _ in range(k)]


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
@pytest.mark.parametrize("kind", list(CACHES))
@pytest.mark.parametrize("per_read", [2, 3, 8])
def test_bursts_give_the_tokens_of_one_step_at_a_time(toy, device, kind, per_read):
    dev = open_device(device)
    want, before = _reference(toy, device), dev.live_tensors
    with CACHES[kind]() as cache:
        run = generate(
            toy, PROMPT, cache=cache, device=device, max_new_tokens=20, stop_on_eos=False, token_on_device=True,
            tokens_per_read=per_read,
        )  # fmt: skip
        assert cache.seq_length == len(run.prompt_ids) + 19  # the prefill's token, then 19 decode steps
    assert run.token_ids == want
    assert run.label.tokens_per_read == per_read
    decode = [r for r in run.records if r.phase == "decode"]
    assert [r.read_with for r in decode] == _bursts(19, per_read)
    assert [r.position for r in decode] == list(range(len(run.prompt_ids), len(run.prompt_ids) + 19))
    per_token = toy.info.layout.bytes_per_token
    assert [r.used_cache_bytes for r in decode] == [(r.position + 1) * per_token for r in decode]  # each its own
    assert dev.live_tensors == before  # the ring of token tensors went with the stepper


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
@pytest.mark.parametrize("kind", list(CACHES))
def test_a_burst_stops_at_a_stop_token_and_undoes_the_steps_past_it(toy, device, kind):
    """The stop token comes mid-burst: the steps after it ran, and are cropped away and never reported; the next
    decode continues from the stop token as if the burst had ended there."""
    want, seen = _reference(toy, device, 30), []
    ids = toy.encode(PROMPT)
    stop = want[10]
    first = want.index(stop)  # where it first appears (the random toy may repeat tokens)
    with (
        CACHES[kind]() as cache,
        Stepper(toy, cache, open_device(device), 64, [seen.append], "single", False, 8) as st,
    ):
        token = st.step(ids, logits_out="none")[1].token
        kept = st.decode(token, 25, until={stop})
        assert [r.token for r in kept] == want[1 : first + 1]
        assert cache.seq_length == len(ids) + first
        assert [r.token for r in seen[1:]] == want[1 : first + 1]  # the hooks saw no step past the stop token
        more = st.decode(kept[-1].token, 5)
    assert [r.token for r in more] == want[first + 1 : first + 6]


@pytest.mark.parametrize("kind", list(CACHES))
def test_generate_stops_at_eos_inside_a_burst(toy, monkeypatch, kind):
    """An EOS token mid-burst ends the generation there, as one step at a time does, and the cache holds what it
    would have (a dynamic cache's crop keeps copies of its first positions); the toy's EOS is set to a token its
    greedy run reaches, the model and its sessions are the real ones."""
    want = _reference(toy, "cpu", 30)
    monkeypatch.setattr(toy, "info", replace(toy.info, eos_token_ids=(want[12],)))
    runs = {}
    for per_read in (1, 8):
        with CACHES[kind]() as cache:
            runs[per_read] = generate(
                toy, PROMPT, cache=cache, device="cpu", max_new_tokens=30, token_on_device=True,
                tokens_per_read=per_read,
            )  # fmt: skip
            assert cache.seq_length == len(runs[per_read].prompt_ids) + len(runs[per_read].token_ids) - 1
    assert runs[8].token_ids == runs[1].token_ids == want[: want.index(want[12]) + 1]
    assert runs[8].stop_reason == runs[1].stop_reason == "eos"


@pytest.mark.parametrize("name", ["hybrid-toy", "conv-toy"])
def test_a_cache_holding_a_state_reads_every_step_back(name):
    """A recurrent or convolution state cannot be cropped back over a burst: those steps run one per read
    (read_with 1), and the tokens stay the host path's."""
    model = load(name)
    want = _reference(model, "cpu", 40)
    with StaticCache(64) as cache:
        run = generate(model, PROMPT, cache=cache, device="cpu", max_new_tokens=40, token_on_device=True)
        assert not cache.can_crop(1) and cache.can_crop(0)
    assert run.token_ids == want[: len(run.token_ids)]
    assert {r.read_with for r in run.records if r.phase == "decode"} == {1}


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
@pytest.mark.parametrize(
    "point, error", [("run", None), ("after-run", None), ("commit", KeyboardInterrupt()), ("run", KeyboardInterrupt())]
)
def test_a_step_failing_mid_burst_keeps_the_steps_before_it(toy, device, point, error):
    """Fault injection (a device loss or Ctrl-C cannot be produced on demand): the fourth step of a burst fails.
    The three before it are kept and reported, the failing one is undone; decoding again continues the sequence."""
    want, seen = _reference(toy, device), []
    ids = toy.encode(PROMPT)
    with (
        StaticCache(64) as cache,
        Stepper(toy, cache, open_device(device), 64, [seen.append], "single", False, 8) as st,
    ):
        token = st.step(ids, logits_out="none")[1].token
        with fault(point, at_call=4, error=error), pytest.raises(type(error) if error else Injected):
            st.decode(token, 10)
        assert [r.token for r in seen[1:]] == want[1:4] and cache.seq_length == len(ids) + 3
        rest = st.decode(seen[-1].token, 16)
    assert [r.token for r in seen[1:4]] + [r.token for r in rest] == want[1:]


@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_a_failing_hook_undoes_its_step_and_the_ones_after_it(toy, device):
    want = _reference(toy, device)
    ids = toy.encode(PROMPT)
    with StaticCache(64) as cache, Stepper(toy, cache, open_device(device), 64, [raising_hook(4)], "single") as st:
        st.tokens_per_read = 8
        token = st.step(ids, logits_out="none")[1].token
        with pytest.raises(Injected):
            st.decode(token, 10)  # records 2, 3 reached the hook; the third of the burst failed in it
        assert cache.seq_length == len(ids) + 2
        rest = st.decode(want[2], 17)
    assert [r.token for r in rest] == want[3:]


def test_refusals(toy):
    with StaticCache(64) as cache, Stepper(toy, cache, "cpu", 64) as st:
        with pytest.raises(ConfigError, match=r"decode\(\) keeps the token on the device"):
            st.decode(5, 3)
    with pytest.raises(
        ConfigError, match=r"tokens_per_read=0 must be an int from 1 to 4096 \(decode steps read back together\)"
    ):
        Stepper(toy, StaticCache(64), "cpu", 64, token_on_device=True, tokens_per_read=0)
    with pytest.raises(ConfigError, match=r"tokens_per_read=4 reads back tokens kept on the device, but the token is"):
        generate(toy, PROMPT, device="cpu", max_new_tokens=4, token_on_device=False, tokens_per_read=4)
    with pytest.raises(ConfigError, match=r"but a CapturedStaticCache reads each token back"):
        generate(toy, PROMPT, cache=CapturedStaticCache(64), device="cpu", token_on_device="single", tokens_per_read=4)
    with StaticCache(64) as cache, Stepper(toy, cache, "cpu", 64, token_on_device=True) as st:
        token = st.step(toy.encode(PROMPT), logits_out="none")[1].token
        with pytest.raises(ConfigError, match=r"n=99 must be an int from 1 to 48 \(the positions left\)"):
            st.decode(token, 99)
        assert cache.seq_length == len(toy.encode(PROMPT))


def test_the_label_says_how_many_steps_were_read_together(toy):
    with StaticCache(64) as cache:
        host = generate(toy, PROMPT, cache=cache, device="cpu", max_new_tokens=4, token_on_device=False)
        auto = generate(toy, PROMPT, cache=cache, device="cpu", max_new_tokens=4, token_on_device=True)
    assert (host.label.tokens_per_read, auto.label.tokens_per_read) == (0, 8)
    assert {r.read_with for r in host.records} == {0}
    assert np.all([r.wall_ms > 0 for r in auto.records])
