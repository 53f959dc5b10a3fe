"""``kvlab bench`` and ``kvlab profile``: paired, interleaved decode benchmarks of the caches with
onnxruntime-genai as a peer and the machine's memory bandwidth as the roofline; a decode step by ONNX operator.
``python -m kvlab.bench.pytorch``: the PyTorch paths (eager caches, CUDA graphs) on one device."""

from .anatomy import step_phases
from .machine import memory_bandwidth, roofline_ms
from .plan import Plan
from .profile import op_profile
from .results import report, write
from .sweep import Interrupted, run_plan
from .weights import matmuls_only_model, run_matmuls_only, weight_bytes_per_token

__all__ = [
    "Interrupted",
    "Plan",
    "matmuls_only_model",
    "memory_bandwidth",
    "op_profile",
    "report",
    "roofline_ms",
    "run_matmuls_only",
    "run_plan",
    "step_phases",
    "weight_bytes_per_token",
    "write",
]
