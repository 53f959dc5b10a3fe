"""Fewer, larger kernels for batch-1 decode on PyTorch: ``fuse_modules`` rewrites a Llama-family model in place
(q/k/v and gate/up as single GEMMs, RMSNorm through ``F.rms_norm``). Same function, same weights; float rounding
can differ in the last bits."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .models import TorchModel


def fuse_modules(model: TorchModel) -> dict[str, int]:
    """Rewrite a Llama-family model in place for fewer kernels per decode step (see the module docstring). Idempotent;
    returns what it replaced (counts per kind: "qkv", "gate_up", "rms_norm")."""
    done = {"qkv": 0, "gate_up": 0, "rms_norm": 0}
    for name, mod in list(model.hf.named_modules()):
        parent, _, child = name.rpartition(".")
        owner = model.hf.get_submodule(parent) if parent else model.hf
        if all(isinstance(getattr(mod, p, None), nn.Linear) for p in ("q_proj", "k_proj", "v_proj")):
            qkv = FusedLinear([mod.q_proj, mod.k_proj, mod.v_proj])
            mod.q_proj, mod.k_proj, mod.v_proj = Part(qkv, 0), Part(qkv, 1), Part(qkv, 2)
            done["qkv"] += 1
        if (
            all(isinstance(getattr(mod, p, None), nn.Linear) for p in ("gate_proj", "up_proj", "down_proj"))
            and hasattr(mod, "act_fn")
            and type(mod).__name__.endswith("MLP")
        ):
            setattr(owner, child, GatedMLP(mod))
            done["gate_up"] += 1
        if (
            type(mod).__name__.endswith("RMSNorm")
            and isinstance(getattr(mod, "weight", None), nn.Parameter)
            and hasattr(mod, "variance_epsilon")
            and mod.weight.dim() == 1
        ):
            setattr(owner, child, RMSNorm(mod))
            done["rms_norm"] += 1
    return done


class FusedLinear(nn.Module):
    """Several Linears on the same input as one GEMM; the first call computes all, the others read parts."""

    def __init__(self, linears: list[Any]):
        super().__init__()
        self.sizes = [lin.out_features for lin in linears]
        self.weight = nn.Parameter(torch.cat([lin.weight.detach() for lin in linears]), requires_grad=False)
        w = self.weight
        biases = [lin.bias.detach() if lin.bias is not None else w.new_zeros(lin.out_features) for lin in linears]
        has_bias = any(lin.bias is not None for lin in linears)
        self.bias = nn.Parameter(torch.cat(biases), requires_grad=False) if has_bias else None
        self._input: Any = None
        self._parts: Any = None

    def compute(self, x: Any, i: int) -> Any:
        """The ``i``-th Linear's output for ``x``: all of them computed in one GEMM when the first is asked for."""
        if i == 0 or self._input is not x:  # the first projection (or an unexpected order): compute all
            self._input = x
            self._parts = F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
        out = self._parts[i]
        if i == len(self.sizes) - 1:
            self._input = self._parts = None  # keep nothing alive between steps
        return out


class Part(nn.Module):
    """One output of a FusedLinear, standing in for the Linear it replaced."""

    def __init__(self, owner: FusedLinear, i: int):
        super().__init__()
        self.i = i
        self.owner = [owner]  # a list: not registered twice as a submodule
        if i == 0:
            self.fused = owner  # registered once, by the first part

    def forward(self, x: Any) -> Any:
        """What the replaced Linear returned for ``x``."""
        return self.owner[0].compute(x, self.i)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up as one GEMM."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.gate_up = FusedLinear([mlp.gate_proj, mlp.up_proj])
        self.down_proj, self.act_fn = mlp.down_proj, mlp.act_fn

    def forward(self, x: Any) -> Any:
        """What the replaced MLP returned for ``x``."""
        gate, up = F.linear(x, self.gate_up.weight, self.gate_up.bias).split(self.gate_up.sizes, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class RMSNorm(nn.Module):
    """transformers' RMSNorm through F.rms_norm (one fused kernel on CUDA)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight, self.eps = norm.weight, float(norm.variance_epsilon)

    def forward(self, x: Any) -> Any:
        """As transformers' RMSNorm: normalized in float32, cast back, then scaled."""
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
