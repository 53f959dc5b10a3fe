"""Tables and reports a lesson prints: one row per run (the exact counts beside the median time), the adapters found,
how far a precision's logits drift, and a summary of comparisons. They read what they are given and change nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def cache_summary(generations: Sequence[Any]) -> Any:
    """One row per ``kvlab.Generation``, indexed by its cache: the prompt's length ("context"), the median decode
    step ms, the KV tensors (median) and MiB (mean) a decode step allocates, and the KV MiB held at the end. A pandas
    DataFrame; ValueError for a generation without a decode step."""
    import pandas as pd

    rows = []
    for g in generations:
        f = g.frame()
        decode = f[f.phase == "decode"]
        if decode.empty:
            raise ValueError(f"the run of {g.label.cache} has no decode step: generate at least 2 new tokens")
        rows.append(
            {
                "cache": str(g.label.cache),
                "context": len(g.prompt_ids),
                "median decode ms": round(g.decode_ms(), 1),
                "KV tensors per decode step": int(decode.cache_tensors_allocated.median()),
                "KV MiB allocated per decode step": round(decode.cache_bytes_allocated.mean() / 2**20, 1),
                "KV MiB reserved at the end": round(f.live_cache_bytes.iloc[-1] / 2**20, 1),
            }
        )
    return pd.DataFrame(rows).set_index("cache")


def adapter_report(verdict: dict[str, Any], cpu: str) -> str:
    """Lines on what runs the kernels: ``cpu`` (the CPU adapter's name), then the WebGPU adapter of ``verdict``
    (``kvlab.cli.platform_facts.assess``'s), why it is the one, float16, its memory, and each problem with its fix."""
    lines = [f"cpu    : {cpu}"]
    gpu = verdict.get("adapter")
    if gpu is None:
        lines.append("webgpu : no adapter (see `kvlab doctor`)")
    else:
        f16 = {True: "yes", False: "no: float16 models run on the CPU EP only", None: "not known before a float16 run"}
        memory = f"{gpu['memory_bytes'] / 2**30:.1f} GiB" if gpu.get("memory_bytes") else "not reported"
        lines += [
            f"webgpu : {gpu['description']} ({gpu['kind']}), on {gpu['backend']}",
            f"why    : {gpu['reason']}",
            f"f16    : {f16[gpu.get('shader_f16')]}",
            f"memory : {memory} | found by {gpu['source']}",
        ]
    lines += [f"PROBLEM: {p['problem']}\n   fix : {p['fix']}" for p in verdict.get("problems", [])]
    return "\n".join(lines)


def precision_drift(logits: dict[str, Any], reference: str) -> Any:
    """How far each precision's teacher-forced logits (``logits``: precision -> [positions, vocabulary], along the
    same tokens) lie from ``reference``'s: per other precision the median and worst position's largest |difference|
    and how many positions keep the reference's argmax. A pandas Styler; KeyError for a ``reference`` not there."""
    import numpy as np
    import pandas as pd

    ref = np.asarray(logits[reference], dtype=np.float32)
    rows = []
    for name, values in logits.items():
        if name == reference:
            continue
        values = np.asarray(values, dtype=np.float32)
        diff = np.abs(values - ref).max(axis=1)
        same = values.argmax(axis=1) == ref.argmax(axis=1)
        rows.append(
            {
                "precision": name,
                "max |logit diff|, median over positions": round(float(np.median(diff)), 3),
                "worst position": round(float(diff.max()), 3),
                f"argmax equal to {reference}'s": f"{int(same.sum())}/{same.size}",
            }
        )
    return pd.DataFrame(rows).style.hide(axis="index").format(precision=3)


def agreement(a: Sequence[int], b: Sequence[int]) -> str:
    """'identical', or 'differs from token N' at the first index where the token ids ``a`` and ``b`` part."""
    from ..core.generation import first_divergence

    first = first_divergence(a, b)
    return "identical" if first is None else f"differs from token {first}"


def comparisons(rows: Sequence[tuple[str, str, Sequence[int], Sequence[int], str]]) -> Any:
    """A summary of comparisons: one row per (what was compared, on what, the two runs' token ids, what their logits
    say), the tokens read as ``agreement``. A pandas Styler; reads only."""
    import pandas as pd

    table = [
        {"compared": what, "on": on, "tokens": agreement(a, b), "logits": logits} for what, on, a, b, logits in rows
    ]
    return pd.DataFrame(table).style.hide(axis="index")


def op_shares(profiles: dict[str, Any], main: Sequence[str]) -> Any:
    """The share of a step's time per part, per profile (``profiles``: name -> per-operator rows with ``op`` and
    ``share``, as ``kvlab.bench.op_profile`` and its recorded CSV give them): the operators in ``main`` by name, the
    others summed into 'other ops', the '(run)' row left out. A DataFrame with columns profile, part and share."""
    import pandas as pd

    ops = pd.concat([pd.DataFrame(rows).assign(profile=name) for name, rows in profiles.items()])
    ops = ops[ops.op != "(run)"]
    ops = ops.assign(part=ops.op.where(ops.op.isin(list(main)), "other ops"))
    return ops.groupby(["profile", "part"], as_index=False, sort=False)["share"].sum()


def low_decode_ms(generation: Any) -> float:
    """The 10th percentile of a generation's (a ``kvlab.Generation``'s) decode steps' wall ms: other work on a shared
    machine only ever adds time, so the low end is the step's own cost. NaN for a run without a decode step."""
    f = generation.frame()
    return float(f[f.phase == "decode"].wall_ms.quantile(0.1))


def text_until_eos(model: Any, token_ids: Sequence[int]) -> str:
    """``model``'s text of ``token_ids`` up to and including the first of its ``eos_token_ids`` (a PyTorch model's, or
    a ``kvlab.Model``'s ``info.eos_token_ids``): a run generated past the end on purpose reads as the answer."""
    eos = model.eos_token_ids if hasattr(model, "eos_token_ids") else model.info.eos_token_ids
    end = next((i + 1 for i, t in enumerate(token_ids) if t in eos), len(token_ids))
    return model.decode(token_ids[:end])
