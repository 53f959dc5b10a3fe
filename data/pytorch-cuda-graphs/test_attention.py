"""attention.py's decode attentions (moved here from tests/test_torch.py with them): the same output as transformers'
sdpa, and the same greedy tokens through kvlab's GraphRunner, eager and traced, on CPU (on CUDA where there is one).
``.venv/bin/python -m pytest data/pytorch-cuda-graphs``"""

import attention
import pytest
import torch

from kvlab import ConfigError
from kvlab import pytorch as tb
from kvlab.pytorch.graphs import GraphRunner

CUDA = torch.cuda.is_available()
PROMPT = list(range(3, 40))


@pytest.mark.parametrize("name", ["packed-gqa", "reduce"])
def test_decode_attentions_match_sdpa(name):
    """One decode token against a 4-D bool mask with stale slots: the same output as transformers' sdpa (the
    reference), for grouped heads (GQA) and plain multi-head attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    _, fn = attention.DECODE_ATTENTION[name]
    gen = torch.Generator().manual_seed(0)
    dev = "cuda" if CUDA else "cpu"
    for heads, kv_heads in ((8, 2), (4, 4), (9, 3)):
        module = torch.nn.Module()
        module.num_key_value_groups, module.is_causal = heads // kv_heads, True
        q = torch.randn(1, heads, 1, 16, generator=gen).to(dev)
        k, v = torch.randn(2, 1, kv_heads, 200, 16, generator=gen).to(dev)  # 200 slots: several kernel tiles
        mask = (torch.arange(200, device=dev) <= 130).view(1, 1, 1, 200)  # slots 131.. are stale: must not count
        ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
        out, _ = fn(module, q, k, v, mask, scaling=0.25)
        assert out.shape == ref.shape == (1, 1, heads, 16)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        k[:, :, 131:] = 1e4  # garbage in the stale slots changes nothing
        torch.testing.assert_close(fn(module, q, k, v, mask, scaling=0.25)[0], ref, rtol=1e-5, atol=1e-5)


def test_graph_runner_drives_the_decode_attentions():
    """Each decode attention, fused, eager and traced (torch.compile's "eager" backend: no graph break): the same
    greedy tokens as transformers' DynamicCache; a name not in ATTENTIONS is refused."""
    reference = tb.generate(tb.load("toy"), PROMPT, max_new_tokens=16, stop_on_eos=False).token_ids
    for name in ("packed-gqa", "reduce"):
        for mode, backend in (("eager", "inductor"), ("compile", "eager")):
            model = tb.load("toy")
            assert attention.use(model, name) == 1 and attention.use(model, name) == 0  # once
            runner = GraphRunner(model, 64, mode=mode, compile_backend=backend, fuse=True)
            assert runner.decode_greedy(PROMPT, 16) == reference, (name, mode)
    with pytest.raises(ConfigError, match="attention='flash' is not valid; choose one of"):
        attention.use(tb.load("toy"), "flash")
