"""The caches on ONNX Runtime, one file per kind, each with the slots it is made of (the slot protocol and the step
transaction every cache shares: ``kvlab.core.slots``, ``kvlab.core.cache``). Read first:

- ``static``: ``StaticCache``, every KV buffer allocated once and written in place (``FixedKV``), the mechanism top to
  bottom; ``dynamic``: ``DynamicCache``, new presents from the runtime every step (``GrowingKV``).
- ``ort_cache``: what both do on ONNX Runtime (the session their steps run on, the KV precision, the greedy token).
- ``ring``: ``RingStaticCache``, sliding layers in ring buffers of their window.
- ``captured``: ``CapturedStaticCache``, the decode step replayed as captured WebGPU graphs; ``capture_binding``:
  its fixed step buffers and pinned bindings; ``replay_graph``: the graph it replays.
- ``kinds``: ``make_cache``, a cache from its name or its recorded ``CacheSpec``; ``kv_precision``: packed KV;
  ``shared_kv``: what KV-shared layers may do on WebGPU.

Imports: ``kvlab.core``, the runtime and models rooms, and ``kvlab.ort.decode.greedy``; nothing else of the decode
room (the stepper and the loops import the caches, not the other way).
"""
