"""The WebGPU EP's storage buffer pool in its default "bucket" mode (ONNX Runtime's buffer_manager.cc): a request is
rounded up to the next bucket size, and a released buffer is kept for reuse unless its bucket already keeps its cap of
free buffers; requests above the largest bucket are never pooled. A DynamicCache's tensors, one token longer every step,
are destroyed and re-created every step once more of one bucket are alive than it keeps: the latency "staircase". Pure
data and arithmetic, so the lab draws it without importing a backend."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

KiB, MiB = 1024, 2**20

# bucket size (bytes) -> how many free buffers of that size the pool keeps
BUCKETS: dict[int, int] = {
    64: 250,
    128: 200,
    256: 200,
    512: 200,
    2048: 230,
    4096: 200,
    **{2**k * KiB: 50 for k in range(3, 11)},  # 8 KiB ... 1 MiB
    2 * MiB: 30,
    4 * MiB: 20,
    8 * MiB: 10,
    12 * MiB: 10,
    16 * MiB: 10,
    25 * MiB: 15,
    32 * MiB: 22,
    44236800: 2,
    58982400: 6,
    64 * MiB: 6,
    128 * MiB: 6,
    160 * MiB: 6,
}

# the bucket boundaries a KV tensor of kvlab's presets crosses within a few thousand tokens: where to look
BUCKET_LINES_MIB: tuple[int, ...] = (4, 8, 12, 16)


def bucket_positions(bytes_per_tensor_token: float, buckets_mib: Iterable[int] = BUCKET_LINES_MIB) -> dict[int, int]:
    """Cache length at which one KV tensor reaches each bucket size (MiB -> tokens); ValueError unless > 0."""
    if not bytes_per_tensor_token or bytes_per_tensor_token <= 0:
        raise ValueError(f"bytes_per_tensor_token={bytes_per_tensor_token!r} must be > 0")
    return {b: int(np.ceil(b * MiB / bytes_per_tensor_token)) for b in buckets_mib}


def bucket_of(nbytes: int) -> int | None:
    """The bucket size a request of ``nbytes`` is rounded up to (None: larger than every bucket, never pooled)."""
    return next((size for size in sorted(BUCKETS) if size >= nbytes), None)


@dataclass(frozen=True)
class Churn:
    """What a DynamicCache's KV tensors do to the bucket pool in one decode step, in steady state."""

    length: int  # tokens each new KV tensor holds (a decode step at context c asks for c + 1)
    tensor_bytes: int  # one KV tensor's size as requested
    bucket: int | None  # the bucket it rounds up to (None: above every bucket, not pooled)
    kept: int  # free buffers that bucket keeps
    fresh: int  # tensors created afresh (CreateBuffer) each step: the ones the pool could not keep
    fresh_bytes: int  # their bytes (at the bucket's size)


def predict_churn(tensors: int, bytes_per_tensor_token: int, length: int) -> Churn:
    """The pool's churn when each decode step asks for ``tensors`` new KV tensors of ``length`` tokens and releases the
    previous ones: ``BUCKETS[bucket]`` of them are kept, the rest made afresh (all above the largest bucket)."""
    size = bytes_per_tensor_token * length
    bucket = bucket_of(size)
    kept = BUCKETS.get(bucket, 0) if bucket is not None else 0
    fresh = max(0, tensors - kept)
    return Churn(length, size, bucket, kept, fresh, fresh * (bucket or size))
