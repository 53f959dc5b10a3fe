"""kvlab bench --quick, as CI's smoke run: it measures, pairs, checks tokens and writes its files."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from kvlab.bench import memory_bandwidth, weight_bytes_per_token

KVLAB = str(Path(sys.executable).parent / "kvlab")


def test_bench_quick_writes_valid_paired_results(tmp_path):
    proc = subprocess.run([KVLAB, "bench", "--quick", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "results.json").read_text())
    env, rows = result["environment"], result["rows"]
    assert env["versions"]["onnxruntime-webgpu"] == "1.27.0" and env["bandwidth_gbps"]["best"] > 0
    assert env["commit"] and env["cpu"]
    assert {(r["device"], r["variant"].split("@")[0]) for r in rows} >= {
        ("cpu", "dynamic"), ("cpu", "static"), ("cpu", "genai"), ("webgpu", "dynamic"), ("webgpu", "static")}
    assert all(r["valid"] and r["tokens_equal"] for r in rows)  # every variant produced the same tokens
    for r in rows:
        assert r["decode_ms_min"] <= r["decode_ms"] <= r["decode_ms_max"] and r["reps"] == 2
        if r["variant"].startswith("static"):
            assert r["tensors_per_step"] == 0 and r["new_buffers_per_step"] == 0
        if r["variant"] == "dynamic":
            assert r["tensors_per_step"] == 4 and r["ratio_to_dynamic"] == 1.0
    assert (tmp_path / "results.csv").read_text().startswith("model,device,adapter")
    for name in ("toy-cpu", "toy-webgpu"):
        assert (tmp_path / f"{name}.html").is_file() and (tmp_path / f"{name}.png").stat().st_size > 10_000
    assert "toy/webgpu/bucket ctx 256: dynamic" in proc.stdout and "wrote " in proc.stdout


def test_memory_bandwidth_is_measured():
    bw = memory_bandwidth(size_mib=32, repeats=2)
    assert set(bw) == {"copy_1t", "copy_2t", "read_1t", "best"} and bw["best"] == max(bw.values()) > 0.1


def test_weight_bytes_count_gathered_tables_by_row(smollm2):
    # SmolLM2: 134.5M parameters in fp32. The builder ties the embedding to the lm_head (the table is a
    # Transpose of lm_head.MatMul.weight, folded at load): the lm_head reads the whole matrix once per token,
    # the embedding lookup one row, so about every parameter is read once.
    b = weight_bytes_per_token(smollm2)
    assert np.isclose(b, 134_515_008 * 4, rtol=0.01)
