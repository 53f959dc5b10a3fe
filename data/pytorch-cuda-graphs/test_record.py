"""record.py on the CPU (moved here from tests/test_torch.py with the script): the plumbing of two modes on a tiny
random model, their tokens compared, and the summary table. ``.venv/bin/python -m pytest data/pytorch-cuda-graphs``"""

import json

import record


def test_a_config_runs_on_cpu_and_is_summarized(tmp_path):
    res = record.run_config("tiny", "float32", 16, 6, ["eager-dynamic", "graph-eager"], "cpu", repeats=1)
    r = res["results"]
    assert r["graph-eager"]["tokens"] == r["eager-dynamic"]["tokens"] and r["graph-eager"]["tokens_equal_eager_dynamic"]
    assert len(r["eager-dynamic"]["top2_margin"]["first_20"]) == 6
    assert r["graph-eager"]["teacher_forced"] == {
        "steps": 6,
        "agree": 6,
        "differ_at": [],
        "eager_top2_margin_at_differ": [],
    }
    (tmp_path / "tiny_float32.json").write_text(json.dumps(res))
    assert "| tiny_float32 | graph-eager |" in record.summarize(tmp_path)
    assert "| 6/6 |" in record.summarize(tmp_path)
