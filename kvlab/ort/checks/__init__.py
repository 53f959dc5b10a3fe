"""The checks room: what kvlab's results are checked against. The CPU EP's logits (``conformance``), the tokens of
onnxruntime-genai and transformers (``references``), mobius's own static cache (``mobius_static``), fault
injection for the tests and the lessons (``faults``), and which caches run a model where (``inspect``: the engine of
``kvlab inspect`` and of ``Model.describe``'s verdicts). Imports every other room of ``kvlab.ort`` and ``kvlab.core``;
nothing in them imports it."""
