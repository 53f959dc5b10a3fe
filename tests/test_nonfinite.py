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
        generate(nan_model, [1, 2, 3, 4, 5, 6], max_new_tokens=4, cache=cache, sampling=sampling)
    assert cache.seq_length == 0 and cache.tensors  # undone, its buffers kept for a retry
    cache.dispose()
