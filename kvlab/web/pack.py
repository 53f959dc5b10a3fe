"""``python -m kvlab.web.pack OUT.tar.xz``: the runner's Node host in one archive, for a machine without npm or
Node (the NVIDIA H200 machine): the ``node`` executable found here and the npm files ``assets.NODE_FILES`` names
(onnxruntime-web's WebGPU bundle and wasm, Dawn's Node binding), xz-compressed.

Contract: ``pack_archive(out, node)`` writes the archive (``bin/node`` and ``node_modules/...``) and returns each
member's size (raw and, for the archive, compressed). Extract it with ``python3 -m tarfile -e OUT.tar.xz DIR``, then
run kvlab with ``KVLAB_NODE=DIR/bin/node KVLAB_WEB_ASSETS=DIR/node_modules``.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
from pathlib import Path

from .assets import pack
from .node import find_node


def pack_archive(out: Path, node: str | None = None) -> dict[str, int]:
    node = node or find_node()
    sizes = {}
    with tempfile.TemporaryDirectory(prefix="kvlab-pack-") as tmp:
        files = pack(Path(tmp) / "node_modules")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:xz") as tar:
            tar.add(Path(node).resolve(), arcname="bin/node")
            sizes["bin/node"] = Path(node).resolve().stat().st_size
            for f in files:
                name = str(f.relative_to(tmp))
                tar.add(f, arcname=name)
                sizes[name] = f.stat().st_size
    sizes[out.name] = out.stat().st_size
    return sizes


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m kvlab.web.pack OUT.tar.xz [NODE_EXECUTABLE]", file=sys.stderr)
        return 2
    sizes = pack_archive(Path(argv[0]), argv[1] if len(argv) == 2 else None)
    for name, size in sizes.items():
        print(f"{size / 2**20:8.1f} MiB  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
