"""kvlab.lab.memory, on layouts built by hand (no model): the bytes it predicts and the tokens it says fit, against
numbers worked out on paper; and its figures (the layout figure on the toy model's own layout)."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.core.cache_layout import CacheEntry, CacheLayout, FullAttention, LayerSpec, LinearAttention, SlidingWindow
from kvlab.core.errors import ConfigError
from kvlab.lab.memory import (
    GiB,
    Line,
    bytes_figure,
    config_bytes_per_token,
    format_of,
    kv_bytes,
    memory_by_layout,
    precision_lines,
    tokens_that_fit,
)


def kv_layer(i: int, kind, heads: int, dim: int) -> LayerSpec:
    dims = (1, heads, 0, dim)
    return LayerSpec(
        i,
        kind,
        tuple(CacheEntry(i, r, f"p{i}{r}", f"q{i}{r}", dims, np.dtype("float32"), "GQA") for r in ("key", "value")),
    )


SMOLLM2 = CacheLayout(tuple(kv_layer(i, FullAttention(), 3, 64) for i in range(30)))  # 46,080 B/token
SLIDING = CacheLayout(
    tuple(kv_layer(i, SlidingWindow(16) if i % 4 != 3 else FullAttention(), 2, 32) for i in range(8))
)  # 6 sliding + 2 full, 512 B/token each
STATE = LayerSpec(
    0,
    LinearAttention(),
    (CacheEntry(0, "recurrent", "ps", "qs", (1, 4, 32, 32), np.dtype("float32"), "LinearAttention"),),
)
HYBRID = CacheLayout((STATE, kv_layer(1, FullAttention(), 2, 32)))  # 16,384 B of state + 512 B/token


def test_bytes_match_the_layout_report_and_scale_with_precision():
    assert kv_bytes(SMOLLM2, 4096) == SMOLLM2.report(4096).total_bytes == 4096 * 46080
    assert kv_bytes(HYBRID, 100) == HYBRID.report(100).total_bytes == 16384 + 100 * 512
    # int8: 1 byte + two float32 per 64 values; int4: half a byte + the same; fp8: 1 byte
    assert kv_bytes(SMOLLM2, 1, "int8") == 12960
    assert kv_bytes(SMOLLM2, 1, "int4") == 7200
    assert kv_bytes(SMOLLM2, 1, "int2") == 4320
    assert kv_bytes(SMOLLM2, 1, "fp8") == 11520
    assert kv_bytes(SMOLLM2, 1, "float16") == 23040
    # a ring buffer of 15: the six sliding layers stop at 15 positions (PyTorch's 87,040 bytes at 40 tokens)
    assert kv_bytes(SLIDING, 40, window=15) == 2 * 40 * 512 + 6 * 15 * 512 == 87040
    assert kv_bytes(SLIDING, 40) == 40 * 4096
    with pytest.raises(ValueError, match="kv_precision"):
        kv_bytes(SMOLLM2, 1, "int3")


def test_tokens_that_fit_four_gib():
    four = 4 * GiB
    assert tokens_that_fit(SMOLLM2, four).tokens == 93206  # 4,294,967,296 / 46,080 = 93,206.76
    assert tokens_that_fit(SMOLLM2, four, kv_precision="int4").tokens == 596523  # / 7,200
    assert tokens_that_fit(SLIDING, four).tokens == 1048576  # / 4,096: every position held
    # ring of 16: 6 x 16 x 512 = 49,152 bytes fixed, then 1,024 a token: (4 GiB - 49,152) / 1,024
    assert tokens_that_fit(SLIDING, four, window=16).tokens == 4194256
    assert tokens_that_fit(HYBRID, four).tokens == (four - 16384) // 512 == 8388576
    fit = tokens_that_fit(SMOLLM2, four, max_cache_len=100_000)
    assert fit.reserve_fits is False and "does NOT fit" in str(fit)
    assert tokens_that_fit(SMOLLM2, four, max_cache_len=93206).reserve_fits is True


def test_edges_of_the_fit():
    assert tokens_that_fit(HYBRID, 1000).tokens == 0  # the state alone is 16 KiB
    assert tokens_that_fit(SLIDING, 40 * 4096, window=64).tokens == 40  # within the window: every layer grows
    all_sliding = CacheLayout(tuple(kv_layer(i, SlidingWindow(16), 2, 32) for i in range(8)))
    fit = tokens_that_fit(all_sliding, GiB, window=16)
    assert fit.tokens is None and fit.bytes_needed == 16 * 4096 and "no limit" in str(fit)


def config(layers: int, kv_heads: int, head_dim: int, heads: int, **more: object) -> dict:
    """A Hugging Face config's KV fields (hidden_size = heads x head_dim)."""
    keys = ("num_hidden_layers", "num_key_value_heads", "head_dim", "num_attention_heads")
    return {**dict(zip(keys, (layers, kv_heads, head_dim, heads))), "hidden_size": heads * head_dim, **more}


def test_config_bytes_per_token():
    assert config_bytes_per_token(config(30, 3, 64, 9), 4) == 46080
    hybrid = config(4, 2, 32, 4, layer_types=["linear_attention"] * 3 + ["full_attention"])
    assert config_bytes_per_token(hybrid, 4) == 512
    types = ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 3
    shared = config(6, 2, 16, 4, num_kv_shared_layers=2, per_layer_config={"2": {"head_dim": 32}}, layer_types=types)
    assert config_bytes_per_token({"text_config": shared}, 4) == 2 * 2 * (16 * 3 + 32) * 4 == 1280
    no_dim = {**config(2, 2, 16, 4), "head_dim": None}  # head_dim from hidden_size / heads
    assert config_bytes_per_token(no_dim, 4) == 2 * 2 * 2 * 16 * 4


def test_the_figure_labels_exact_and_predicted_lines():
    fig = bytes_figure(
        [256, 512],
        [Line("a", [1, 2], 4.0), Line("b", [3, 4], 8.0, exact=False)],
        what="w",
        common="c",
        points=[("rec", [(256, 1.0)])],
    )
    names = [t.name for t in fig.data]
    assert names == ["a: 4 B/token", "b: 8 B/token (predicted)", "rec"]
    assert fig.data[1].line.dash == "dash" and fig.layout.xaxis.type == "log"


def test_the_widget_prints_the_fit_of_its_settings():
    from kvlab.lab.memory import fit_widget

    box = fit_widget({"smollm2": SMOLLM2, "sliding": SLIDING})
    out = box.children[-1]
    assert "93,206 tokens fit in 4 GiB" in out.value
    precision = box.children[0].children[1]
    precision.value = "int4"
    assert "596,523 tokens" in out.value


def test_memory_by_layout_draws_the_exact_bytes_and_the_measured_points(toy):
    layout = toy.info.layout
    fig = memory_by_layout({"toy": layout}, max_length=512, points=[("toy (recorded)", [(100, 12800)])])
    line, points = fig.data
    assert line.x[-1] == 512 and line.y[-1] * 1024 == layout.report(512).total_bytes  # KiB at this size
    assert points.marker.symbol == "square-open" and points.y[0] == 12800 / 1024


def test_precision_lines_draw_each_exact_layout_then_each_predicted_format():
    lines = precision_lines({"fp32": SMOLLM2, "hybrid": HYBRID}, [0, 1024], SMOLLM2, ["int8", "int4"])
    assert [line.name for line in lines] == ["fp32", "hybrid", "int8 (HQQ 8 bits)", "int4 (optimum-quanto 4 bits)"]
    assert [line.exact for line in lines] == [True, True, False, False]
    assert lines[0].bytes_at == [0, 1024 * 46080] and lines[1].bytes_at[0] == 16384  # the state, held from the start
    assert lines[2].per_token == 46080 / 4 * (1 + 8 / 64) and lines[2].bytes_at[1] == 1024 * lines[2].per_token
    with pytest.raises(ConfigError, match="kv_precision"):
        format_of("int3")
