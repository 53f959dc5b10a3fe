"""Huge pages for the weights a decode step streams (kvlab.memory), measured with the kernel's own counters."""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import pytest
from conftest import run_python

from kvlab import ConfigError, open_device
from kvlab.ort.runtime import memory

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(),
    reason="transparent huge pages are absent or set to never on this kernel",
)


@needs_thp
def test_fresh_memory_is_collapsed_and_keeps_its_contents():
    pattern = bytes(range(256)) * (64 * 1024)  # 16 MiB
    with memory.collapsing() as report:
        # a mapping of its own (malloc could reuse memory mapped before the block, which collapsing leaves alone)
        buf = mmap.mmap(-1, len(pattern), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf[:] = pattern
        huge_before = memory.state()["anon_huge_mib"]
    assert report["bytes"] >= 12 << 20, report  # whole 2 MiB pages inside the new mapping
    assert memory.state()["anon_huge_mib"] - huge_before >= 12
    assert buf[:] == pattern
    with memory.collapsing() as again:
        pass
    assert again["bytes"] == 0  # nothing new since: nothing to do
    buf.close()


@needs_thp
def test_cpu_sessions_put_their_weights_in_huge_pages(smollm2):
    """SmolLM2's ~540 MB of fp32 weights: collapsed by default, left alone with huge_pages=False."""
    code = """
import json, sys, kvlab
d = kvlab.open_device('cpu', **json.loads(sys.argv[1]))
d.session(kvlab.load('smollm2').onnx_path)
print(d.huge_page_bytes)
"""
    default = run_python(code.replace("sys.argv[1]", "'{}'"))
    off = run_python(code.replace("sys.argv[1]", "'{\"huge_pages\": false}'"))
    assert default.returncode == 0 and off.returncode == 0, default.stderr + off.stderr
    assert int(default.stdout) > 0.8 * 540e6 and int(off.stdout) == 0


def test_huge_pages_option_is_checked():
    with pytest.raises(ConfigError, match="huge_pages='yes' must be True or False"):
        open_device("cpu", huge_pages="yes")
    with pytest.raises(ConfigError, match="apply to device 'cpu' only"):
        open_device("webgpu", huge_pages=False)
    assert json.dumps(memory.state())  # THP mode and the mapped MiB are plain, recordable values
