"""The checks room: what kvlab's results are checked against. The CPU EP's logits (``conformance``), the tokens of
onnxruntime-genai and transformers (``references``), and fault injection for the tests and the lessons
(``faults``). Imports every other room; nothing in them imports it."""
