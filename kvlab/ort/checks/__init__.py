"""The checks room: what kvlab's results are checked against. The CPU EP's logits (``conformance``), the tokens of
onnxruntime-genai and transformers (``references``), mobius's own static cache (``mobius_static``), and fault
injection for the tests and the lessons (``faults``). Imports every other room of ``kvlab.ort`` and ``kvlab.core``;
nothing in them imports it."""
