"""Logits that are not finite are reported, not turned into a token: a real model whose lm_head weights hold NaN
(a copy of the toy's directory with that one initializer rewritten) fails its first step with a ModelError naming
the step and the position, for greedy and sampled decoding, and leaves the cache empty and usable."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import kvlab
from kvlab import Sampling, StaticCache, generate


@pytest.fixture(scope="module")
def nan_model(toy, tmp_path_factory):
    out = tmp_path_factory.mktemp("nan-toy")
    for f in toy.info.path.iterdir():
        if not f.name.startswith("model."):
            shutil.copy(f, out / f.name)
    graph = onnx.load(str(toy.info.path / "model.onnx"))  # external data loaded: saved whole below
    for init in graph.graph.initializer:
        if init.name == "lm_head.MatMul.weight":
            weights = numpy_helper.to_array(init).copy()
            weights[:, 7] = np.nan  # one vocabulary column: one NaN logit per position
            init.CopyFrom(numpy_helper.from_array(weights, init.name))
    onnx.save(graph, str(out / "model.onnx"))
    return kvlab.load(out)


@pytest.mark.parametrize("sampling", [None, Sampling(do_sample=True, seed=1)], ids=["greedy", "sampled"])
def test_nan_logits_fail_the_step_with_its_step_and_position(nan_model, sampling):
    cache = StaticCache(32)
    with pytest.raises(kvlab.ModelError, match=r"non-finite logits at step 0 \(position 5\): 1 NaN and 0 Inf of"):
        generate(nan_model, [1, 2, 3, 4, 5, 6], max_new_tokens=4, cache=cache, sampling=sampling, token_on_device=False)
    assert cache.seq_length == 0 and cache.tensors  # undone, its buffers kept for a retry
    cache.dispose()


PROMPT = [1, 2, 3, 4, 5, 6]


@pytest.fixture(scope="module")
def nan_after_prefill(toy, tmp_path_factory):
    """A copy of the toy whose embedding row of the token its prefill picks is NaN: the prefill is finite, and the
    first decode step (fed that token) gives NaN logits. Returns the model and that token."""
    first = generate(toy, PROMPT, max_new_tokens=1, token_on_device=False).token_ids[0]
    out = tmp_path_factory.mktemp("nan-row-toy")
    for f in toy.info.path.iterdir():
        if not f.name.startswith("model."):
            shutil.copy(f, out / f.name)
    graph = onnx.load(str(toy.info.path / "model.onnx"))
    for init in graph.graph.initializer:
        if init.name == "model.embed_tokens.weight":
            rows = numpy_helper.to_array(init).copy()
            rows[first] = np.nan
            init.CopyFrom(numpy_helper.from_array(rows, init.name))
    onnx.save(graph, str(out / "model.onnx"))
    return kvlab.load(out), first


@pytest.mark.parametrize("per_read", [1, 8])
@pytest.mark.parametrize("reduction", ["blocks", "single", "rows", False])
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
def test_nan_logits_on_every_path_fail_the_step_that_made_them(nan_after_prefill, device, reduction, per_read):
    """With the token on the device the graph writes a token outside the vocabulary where a logit is NaN or Inf,
    read with the burst: the step fails by name, the steps before it are kept (``partial``) and the cache holds
    exactly them."""
    if reduction is False and per_read > 1:
        pytest.skip("the host path reads every token")
    model, first = nan_after_prefill
    cache = StaticCache(32)
    with pytest.raises(kvlab.ModelError, match=r"non-finite logits at step 1 \(position 6\)") as err:
        generate(
            model,
            PROMPT,
            max_new_tokens=6,
            cache=cache,
            device=device,
            token_on_device=reduction,
            tokens_per_read=per_read if reduction else "auto",
        )
    assert err.value.partial.token_ids == [first]
    use = cache.use(model.info, kvlab.open_device(device), 8, keep=True)
    with use:
        assert cache.seq_length == len(PROMPT)  # the prefill kept, the failed step undone
    cache.dispose()
