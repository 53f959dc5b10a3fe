"""The models room: ONNX decoders as files. Reading a graph without its weights (``graph``), what each layer keeps
between steps (``layers``, ``layouts``, ``info``), loading (``loading``), and building the presets with the
onnxruntime-genai builder (``build``, ``builder_shims``, ``rewrites``). Runs no session: imports ``kvlab.core`` and
``kvlab.presets`` only."""
