"""``python data/what-a-static-cache-buys/browser-node/pack_node.py OUT.tar.xz [NODE]``: the browser runner's Node host
in one archive, for a recording machine without npm or Node: the ``node`` executable found here (or NODE) and the npm
files a Dawn-in-Node run needs on Linux x86-64 (onnxruntime-web's WebGPU bundle and wasm, Dawn's Node binding), xz-
compressed, in a node_modules layout. Prints each member's size (and the archive's, compressed).

Extract it with ``python3 -m tarfile -e OUT.tar.xz DIR``, then run kvlab with ``KVLAB_NODE=DIR/bin/node
KVLAB_WEB_ASSETS=DIR/node_modules`` (scripts/record_gpu.sh's browser phase does)."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

from kvlab.core.errors import DeviceError
from kvlab.web.assets import npm_dir
from kvlab.web.node import find_node

# no transformers.js: it needs a browser
NODE_FILES = (
    "onnxruntime-web/package.json",
    "onnxruntime-web/dist/ort.webgpu.bundle.min.mjs",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.wasm",
    "webgpu/package.json",
    "webgpu/index.js",
    "webgpu/dist/linux-x64/dawn.node",
)


def pack_archive(out: Path, node: str | None = None) -> dict[str, int]:
    """Writes the archive (``bin/node`` and ``node_modules/...``); returns each member's size and the archive's.
    DeviceError when node or an npm file is missing."""
    node_path = Path(node or find_node()).resolve()
    files = {rel: npm_dir() / rel for rel in NODE_FILES}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise DeviceError(f"{missing[0]} is missing: install the npm packages with bash scripts/setup.sh")
    out.parent.mkdir(parents=True, exist_ok=True)
    sizes = {"bin/node": node_path.stat().st_size}
    with tarfile.open(out, "w:xz") as tar:
        tar.add(node_path, arcname="bin/node")
        for rel, path in files.items():
            tar.add(path, arcname=f"node_modules/{rel}")
            sizes[f"node_modules/{rel}"] = path.stat().st_size
    sizes[out.name] = out.stat().st_size
    return sizes


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python data/what-a-static-cache-buys/browser-node/pack_node.py OUT.tar.xz [NODE_EXECUTABLE]")
    for name, size in pack_archive(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) == 3 else None).items():
        print(f"{size / 2**20:8.1f} MiB  {name}")
