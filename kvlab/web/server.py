"""A small HTTP server on 127.0.0.1 that serves one job to the browser runner's page and receives its result."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..core.errors import DeviceError
from .assets import NPM_FILES, kvlab_file, npm_dir
from .job import Job

TYPES = {
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".wasm": "application/wasm",
    ".html": "text/html",
    "": "application/json",  # /job
}
MAX_POST = 64 * 2**20  # a result of thousands of steps is a few MB


class PageServer:
    """Serves one job to one page, on a free port of 127.0.0.1 only, from the moment it is made: ``/`` (the page),
    ``/kvlab/<file>`` (kvlab's JS), ``/npm/<path>`` (only the npm files in ``assets.NPM_FILES``), ``/job`` ({"job":
    the job's JSON, "assets": those npm files' URLs by key}) and ``/model/<name>`` (only the job's model files); it
    takes ``POST /progress`` (one finished step, named in ``wait_result``'s errors) and ``POST /result`` (the page's
    result); anything else is a 404. Pages are served cross-origin isolated (COOP/COEP), so onnxruntime-web's
    threaded wasm has SharedArrayBuffer. ``close()`` (or leaving the ``with`` block) stops it, once."""

    def __init__(self, job: Job) -> None:
        assets = {key: f"/npm/{rel}" for key, rel in NPM_FILES.items()}
        self.job_json = json.dumps({"job": job.to_json(), "assets": assets}).encode()
        self.files: dict[str, Path | bytes] = job.served
        self.result: dict[str, Any] | None = None
        self.last_progress: dict[str, Any] | None = None
        self._done = threading.Event()
        self._closed = False
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kvlab-web-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The page's URL."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def route(self, path: str) -> Path | bytes | None:
        """What a GET of ``path`` serves: a file, bytes, or None (404)."""
        if path in ("/", "/index.html"):
            return kvlab_file("page.html")
        if path == "/job":
            return self.job_json
        if path.startswith("/kvlab/"):
            try:
                return kvlab_file(path.removeprefix("/kvlab/"))
            except Exception:  # noqa: BLE001 - any bad name is a 404
                return None
        if path.startswith("/npm/") and path.removeprefix("/npm/") in NPM_FILES.values():
            file = npm_dir() / path.removeprefix("/npm/")
            return file if file.is_file() else None
        if path.startswith("/model/"):
            return self.files.get(unquote(path.removeprefix("/model/")))
        return None

    def receive(self, path: str, body: dict[str, Any]) -> bool:
        """A POST of ``body`` to ``path`` taken (True) or not (False: a 404)."""
        if path == "/progress":
            self.last_progress = body
        elif path == "/result":
            self.result = body
            self._done.set()
        else:
            return False
        return True

    def wait_result(self, timeout: float, alive: Callable[[], bool] = lambda: True) -> dict[str, Any]:
        """The page's result, once it came; DeviceError (naming the last finished step) when ``timeout`` seconds pass
        first or ``alive()`` turns false (the browser exited)."""
        deadline = time.monotonic() + timeout
        while not self._done.wait(0.25):
            if not alive():
                raise DeviceError("the browser exited before the page sent its result" + self._where())
            if time.monotonic() > deadline:
                raise DeviceError(f"the page sent no result within {timeout:g} s" + self._where())
        assert self.result is not None
        return self.result

    def _where(self) -> str:
        p = self.last_progress
        return f" (its last finished step: {p.get('phase')} step {p.get('step')})" if p else " (no step had finished)"

    def close(self) -> None:
        """The server stopped (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> PageServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _handler(server: PageServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: the page's progress is reported instead
            pass

        def _headers(self, status: int, length: int, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(length))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
            self.send_header("Cross-Origin-Resource-Policy", "same-origin")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = urlparse(self.path).path
            found = server.route(path)
            if found is None:
                self._headers(404, 0, "text/plain")
                return
            data = found if isinstance(found, bytes) else found.read_bytes()
            suffix = Path(path).suffix if isinstance(found, bytes) else found.suffix
            kind = TYPES.get(suffix, "application/octet-stream")
            self._headers(200, len(data), kind)
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_POST:
                self._headers(413, 0, "text/plain")
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._headers(400, 0, "text/plain")
                return
            ok = isinstance(body, dict) and server.receive(urlparse(self.path).path, body)
            self._headers(204 if ok else 404, 0, "text/plain")

    return Handler
