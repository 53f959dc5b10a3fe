"""Measurements a user runs from the package: ``kvlab bench``'s paired, interleaved decode sweep of the caches with
onnxruntime-genai as a peer and the machine's memory bandwidth as the roofline (``plan``, ``sweep``, ``variants``,
``machine``, ``weights``, ``results``, ``chart``); ``kvlab profile``'s modes: a decode step by ONNX operator
or by phase (``profile``); ``kvlab trace`` (``trace``); ``kvlab chat-bench`` (``ttft``).

Imports: ``kvlab.core``, ``kvlab.ort``, ``kvlab.presets`` and ``kvlab.lab.recorded`` (``results``: the charts); never
``kvlab.cli`` or ``kvlab.web``, which import it. Recordings' own experiments live beside their results in
``data/<question>/``."""

from .machine import memory_bandwidth, roofline_ms
from .plan import Plan, prompt_ids
from .profile import op_profile, step_phases
from .results import report, write
from .sweep import Interrupted, run_plan
from .weights import matmuls_only_model, run_matmuls_only, weight_bytes_per_token

__all__ = [
    "Interrupted",
    "Plan",
    "matmuls_only_model",
    "memory_bandwidth",
    "op_profile",
    "prompt_ids",
    "report",
    "roofline_ms",
    "run_matmuls_only",
    "run_plan",
    "step_phases",
    "weight_bytes_per_token",
    "write",
]
