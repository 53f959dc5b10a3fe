"""The runtime room: what kvlab asks of an ONNX Runtime package. The seam (``backend``) and its two packages
(``builtin``, ``plugin``), the adapters and devices, sessions and their bindings, the device tensors kvlab owns, and
where memory sits (``memory``, ``gpu_memory``). Imports ``kvlab.core`` and ``kvlab.ort.models.graph`` only."""
