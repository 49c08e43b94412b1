"""A Hugging Face Hub on loopback, for building a hub cache with huggingface_hub's own downloads (the cache's layout
is the library's, not this test's): it answers HEAD and GET of /{repo}/resolve/{revision}/{file}."""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path


class FakeHub:
    """Serves `files`: repo id -> {file name in the repo: local path}. `url` is the endpoint to download from."""

    def __init__(self, files: dict[str, dict[str, Path]]):
        self.files = files
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def found(self) -> tuple[Path, str] | None:
                for repo, names in hub.files.items():
                    head = f"/{repo}/resolve/"
                    if self.path.startswith(head):
                        _, _, name = self.path[len(head) :].partition("/")
                        if name in names:
                            return names[name], repo
                return None

            def headers_of(self, path: Path, repo: str) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(path.stat().st_size))
                self.send_header("X-Repo-Commit", hashlib.sha1(repo.encode()).hexdigest())
                self.send_header("ETag", f'"{hashlib.sha1(str(path).encode()).hexdigest()}"')
                self.end_headers()

            def do_HEAD(self) -> None:
                hit = self.found()
                if hit is None:
                    self.send_error(404)
                    return
                self.headers_of(*hit)

            def do_GET(self) -> None:
                hit = self.found()
                if hit is None:
                    self.send_error(404)
                    return
                self.headers_of(*hit)
                with open(hit[0], "rb") as f:
                    while chunk := f.read(1 << 20):
                        self.wfile.write(chunk)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
