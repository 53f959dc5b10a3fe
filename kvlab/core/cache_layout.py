"""The shape of a decoder's cache, and what a static cache of it reserves, known before anything is allocated.

A decoder keeps one tensor per past input / present output pair (a ``CacheEntry``). Each layer (a ``LayerSpec``) is of
one kind (``LayerKind``): full and sliding-window attention keep keys and values that grow by one position per token;
linear attention and short convolutions keep fixed-size states; a KV-shared layer keeps nothing. ``CacheLayout`` is the
whole model's, as data."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .errors import check_int


# -- layer kinds: what one decoder layer keeps between steps (one small class each)
@dataclass(frozen=True)
class LayerKind:
    """What a layer keeps. ``grows``: its entries get one position longer per token."""

    grows = False

    @property
    def name(self) -> str:
        """The kind in words, for reports ("full attention", "sliding window (512)", ...)."""
        raise NotImplementedError

    def attended(self, length: int) -> int:
        """Positions the layer's attention reads at a sequence of ``length`` (0: it keeps no positions)."""
        return 0


@dataclass(frozen=True)
class FullAttention(LayerKind):
    """Attention over every position: keys and values that grow by one position per token."""

    grows = True
    name = "full attention"

    def attended(self, length: int) -> int:
        """Every position."""
        return length


@dataclass(frozen=True)
class SlidingWindow(LayerKind):
    """Attention over the last ``window`` positions. A Dynamic or StaticCache still stores every position (the window
    limits what is read), so it grows like full attention; ``attended`` is what a ring buffer keeps."""

    window: int
    grows = True

    @property
    def name(self) -> str:
        """ "sliding window (N)"."""
        return f"sliding window ({self.window})"

    def attended(self, length: int) -> int:
        """The last ``window`` positions."""
        return min(length, self.window)


@dataclass(frozen=True)
class LinearAttention(LayerKind):
    """Linear attention (Qwen3.5's gated delta rule): a conv state and a recurrent state, both of fixed size."""

    name = "linear attention (recurrent state)"


@dataclass(frozen=True)
class ConvState(LayerKind):
    """A short causal convolution (LFM2): the last inputs it needs, of fixed size."""

    name = "conv state"


@dataclass(frozen=True)
class SharedKV(LayerKind):
    """Attention over the keys and values of layer ``source`` (Gemma 4's KV-shared layers): the layer has no past
    input or present output of its own, so it keeps nothing; ``window`` is its sliding window (0: full)."""

    source: int
    window: int = 0

    @property
    def name(self) -> str:
        """ "KV of layer N (window W)" or "(full)"."""
        return f"KV of layer {self.source} ({f'window {self.window}' if self.window else 'full'})"

    def attended(self, length: int) -> int:
        """The source layer's positions this layer's window reads."""
        return min(length, self.window) if self.window else length


GROWING_ROLES = ("key", "value")  # entries that get one position longer per token (length axis 2)
STATE_ROLES = ("conv", "recurrent")  # fixed-size states


@dataclass(frozen=True)
class CacheEntry:
    """One past input / present output pair: a tensor the decoder keeps between steps."""

    layer: int
    role: str  # "key" | "value" (grow along axis 2) | "conv" | "recurrent" (fixed size)
    past: str  # the graph input
    present: str  # the graph output
    dims: tuple[int, ...]  # the shape at batch 1; a growing entry holds 0 at its length axis
    dtype: np.dtype
    op: str  # the node type that reads the past and writes the present

    @property
    def grows(self) -> bool:
        """Whether the entry gets one position longer per token (keys and values)."""
        return self.role in GROWING_ROLES

    def shape(self, length: int) -> tuple[int, ...]:
        """The tensor's shape holding ``length`` positions (a state's whatever the length)."""
        return self.dims[:2] + (length,) + self.dims[3:] if self.grows else self.dims

    def nbytes(self, length: int) -> int:
        """Bytes of the tensor holding ``length`` positions."""
        return int(np.prod(self.shape(length), dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def bytes_per_token(self) -> int:
        """Bytes one more position adds (0 for a state)."""
        return self.nbytes(1) if self.grows else 0


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: its kind and the entries it keeps."""

    index: int
    kind: LayerKind
    entries: tuple[CacheEntry, ...] = ()

    @property
    def fixed_bytes(self) -> int:
        """Bytes of the layer's states (one copy each), whatever the length."""
        return sum(e.nbytes(0) for e in self.entries if not e.grows)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one more position adds to the layer."""
        return sum(e.bytes_per_token for e in self.entries)


@dataclass(frozen=True)
class LayerMemory:
    """One layer's bytes in a memory report: fixed (states, ring buffers) and growing (KV at its length)."""

    layer: int
    kind: str
    fixed_bytes: int
    growing_bytes: int
    tensors: int

    @property
    def total_bytes(self) -> int:
        """Fixed and growing bytes together."""
        return self.fixed_bytes + self.growing_bytes


@dataclass(frozen=True)
class CacheLayout:
    """Every layer of a decoder and what it keeps, in layer order; ``entries`` in that order (key, value, conv,
    recurrent within a layer) is the order the caches hold their tensors in."""

    layers: tuple[LayerSpec, ...]

    @cached_property
    def entries(self) -> tuple[CacheEntry, ...]:
        """Every entry, layer by layer."""
        return tuple(e for layer in self.layers for e in layer.entries)

    @property
    def tensors(self) -> int:
        """How many entries (a cache holds a tensor for each; a StaticCache two for a swapped state)."""
        return len(self.entries)

    @cached_property
    def states(self) -> tuple[CacheEntry, ...]:
        """The fixed-size entries (conv, recurrent)."""
        return tuple(e for e in self.entries if not e.grows)

    @cached_property
    def bytes_per_token(self) -> int:
        """Bytes one more token adds across all layers (the growing entries: keys and values)."""
        return sum(e.bytes_per_token for e in self.entries)

    @cached_property
    def fixed_bytes(self) -> int:
        """Bytes of the fixed-size states (one copy each), whatever the length."""
        return sum(layer.fixed_bytes for layer in self.layers)

    @property
    def dtype(self) -> np.dtype:
        """The entries' dtype (the first one's; float32 for a layout without entries)."""
        return np.dtype(self.entries[0].dtype) if self.entries else np.dtype(np.float32)

    @cached_property
    def uniform(self) -> bool:
        """Every layer full attention with KV of one shape (the layout kvlab's first models all have)."""
        return (
            all(type(layer.kind) is FullAttention for layer in self.layers)
            and len({(e.dims, np.dtype(e.dtype)) for e in self.entries}) == 1
        )

    def memory(
        self, length: int, state_copies: int = 1, windows: dict[int, int] | None = None
    ) -> tuple[LayerMemory, ...]:
        """Bytes per layer with ``length`` positions in the growing entries and ``state_copies`` buffers of each state;
        a layer of ``windows`` ({layer: window}) holds its KV in a ring buffer of its window: fixed bytes."""
        windows = windows or {}
        rows = []
        for layer in self.layers:
            ring = sum(e.nbytes(windows[layer.index]) for e in layer.entries) if layer.index in windows else 0
            growing = 0 if layer.index in windows else length * layer.bytes_per_token
            kind = f"{layer.kind.name}, ring buffer" if layer.index in windows else layer.kind.name
            tensors = sum(1 if e.grows else state_copies for e in layer.entries)
            rows.append(LayerMemory(layer.index, kind, ring + state_copies * layer.fixed_bytes, growing, tensors))
        return tuple(rows)

    def report(
        self, length: int, state_copies: int = 1, kind: str = "StaticCache", windows: dict[int, int] | None = None
    ) -> MemoryReport:
        """What a cache ``kind`` of ``length`` positions reserves, per layer (``memory``)."""
        rows = self.memory(length, state_copies, windows)
        growing = [e for e in self.entries if e.grows]
        fixed = sum(r.fixed_bytes for r in rows)
        return MemoryReport(
            length,
            sum(layer.bytes_per_token for layer in self.layers if layer.index not in (windows or {})),
            fixed + sum(r.growing_bytes for r in rows),
            sum(r.tensors for r in rows),
            growing[0].shape(length) if growing else (),
            fixed_bytes=fixed,
            layers=rows,
            kind=kind,
            uniform=self.uniform,
        )

    def __str__(self) -> str:
        if self.uniform and self.entries:
            e = self.entries[0]
            return f"{len(self.layers)} layers x (K, V) of {e.dims[1]} heads x {e.dims[3]}, {np.dtype(e.dtype).name}"
        kinds: dict[str, int] = {}
        for layer in self.layers:
            kinds[layer.kind.name] = kinds.get(layer.kind.name, 0) + 1
        return (
            f"{len(self.layers)} layers ({', '.join(f'{n} x {k}' for k, n in kinds.items())}), "
            f"{self.bytes_per_token:,} bytes per token + {self.fixed_bytes:,} bytes of state, {self.dtype.name}"
        )


@dataclass(frozen=True)
class MemoryReport:
    """What a cache will reserve, known before anything is allocated, per layer (``layers``)."""

    max_cache_len: int
    bytes_per_token: int  # of the layers that grow
    total_bytes: int
    tensors: int
    tensor_shape: tuple[int, ...]  # the first growing entry's (every entry's, when ``uniform``)
    fixed_bytes: int = 0  # of total_bytes: the fixed-size states and ring buffers (every copy held)
    layers: tuple[LayerMemory, ...] = field(default=())
    kind: str = "StaticCache"
    uniform: bool = True  # every layer full attention of one KV shape: one line says it all

    def __str__(self) -> str:
        if self.uniform:
            return (
                f"{self.kind}: {self.tensors} tensors of {list(self.tensor_shape)}, {self.bytes_per_token:,} "
                f"bytes per token, {self.total_bytes / 2**20:,.1f} MiB at max_cache_len={self.max_cache_len}"
            )
        growing = sum(1 for r in self.layers if r.growing_bytes)
        return (
            f"{self.kind}: {self.tensors} tensors, {growing} of {len(self.layers)} layers grow "
            f"({self.bytes_per_token:,} bytes per token), {self.fixed_bytes:,} bytes of fixed state; "
            f"{self.total_bytes / 2**20:,.2f} MiB at max_cache_len={self.max_cache_len}"
        )

    def table(self) -> list[dict[str, object]]:
        """One row per layer: kind, fixed bytes, growing bytes, total bytes, tensors (for a DataFrame)."""
        return [
            {
                "layer": r.layer,
                "kind": r.kind,
                "fixed_bytes": r.fixed_bytes,
                "growing_bytes": r.growing_bytes,
                "total_bytes": r.total_bytes,
                "tensors": r.tensors,
            }
            for r in self.layers
        ]


def check_max_cache_len(value: object) -> int:
    """``value`` as an int when it is a positive int; else ConfigError."""
    return check_int(value, "max_cache_len", 1)
