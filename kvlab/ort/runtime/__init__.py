"""The runtime room: what kvlab asks of an ONNX Runtime package. The seam (``backend``) and its two packages
(``builtin``, ``plugin``); the adapter WebGPU gets (``adapters``); devices and their options (``device``,
``options``); sessions, their bindings and the device tensors kvlab owns (``session``), and what a graph needs
before its session opens (``preflight``); where memory sits (``memory``, ``gpu_memory``). Imports ``kvlab.core``
and ``kvlab.ort.models`` (graphs and their rewrites) only."""
