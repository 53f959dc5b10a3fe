"""The models room: ONNX decoders as files. Reading a graph without its weights (``graph``); what a directory's
config declares (``declared``) and what each layer keeps (``layers``), checked against each other into a
``ModelInfo`` (``info``); a loaded ``Model`` and ``load`` (``model``), and what kvlab sees in it on one screen
(``describe``); building the presets (``build``: the onnxruntime-genai builder with its ``builder_shims``, or
``mobius``) and the graph rewrites kvlab makes (``rewrites``). Runs no session: imports ``kvlab.core`` and
``kvlab.presets`` only."""
