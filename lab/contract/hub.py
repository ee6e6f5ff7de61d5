"""A stand-in for the Hugging Face Hub on loopback, serving one GGUF the way llama.cpp's
downloader asks for it (common/hf-cache.cpp and common/download.cpp at b10729):

- ``GET api/models/<repo>/refs``: the branches, ``main`` -> a 40-hex commit;
- ``GET api/models/<repo>/tree/<commit>?recursive=true``: the files, each with its LFS sha256;
- ``HEAD``/``GET <repo>/resolve/<commit>/<file>``: the bytes, with an ETag and byte ranges,
  sent slowly enough (``seconds``) that a test can watch the server while it downloads.

The server finds it through ``MODEL_ENDPOINT``, as it would find a mirror.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_sha1(data: bytes) -> str:
    """A regular (non-LFS) file's oid on the Hub: git's blob hash."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@contextmanager
def hub(repo: str, filename: str, gguf: Path, seconds: float = 1.5, served: list | None = None,
        log: list | None = None, hold: threading.Event | None = None) -> Iterator[str]:
    """Serve ``gguf`` as ``<repo>/<filename>``; yields the endpoint URL (ending in /). ``served``
    gets the monotonic time at which each file body finished sending; ``log`` each request line
    (with its Range header, if any)."""
    with hub_files(repo, {filename: gguf.read_bytes()}, seconds, served=served, log=log, hold=hold) as endpoint:
        yield endpoint


@contextmanager
def hub_files(repo: str, files: dict[str, bytes], seconds: float = 0.0, lfs_suffixes=(".gguf", ".safetensors", ".bin"),
              log: list | None = None, served: list | None = None,
              hold: threading.Event | None = None, page: int = 0) -> Iterator[str]:
    """Serve several files; large-file ones (by suffix) as LFS objects whose resolve URL redirects
    to a CDN path, as the Hub does. ``hold``: a whole-file download stops after its first chunk
    until the event is set (a test can then stop the client mid-download, whatever its speed).
    ``page``: list a tree in pages of this many files."""
    with hub_repos({repo: files}, seconds, lfs_suffixes, log, served, hold, page) as endpoint:
        yield endpoint


@contextmanager
def hub_repos(repos: dict[str, dict[str, bytes]], seconds: float = 0.0, lfs_suffixes=(".gguf", ".safetensors", ".bin"),
              log: list | None = None, served: list | None = None,
              hold: threading.Event | None = None, page: int = 0) -> Iterator[str]:
    """Several repos at once, each as hub_files serves one."""
    lfs_of = {repo: {path: hashlib.sha256(data).hexdigest() for path, data in files.items() if path.endswith(lfs_suffixes)}
              for repo, files in repos.items()}
    cdn = {sha: repos[repo][path] for repo, lfs in lfs_of.items() for path, sha in lfs.items()}
    requests = log if log is not None else []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _json(self, value, link: str | None = None) -> None:
            body = json.dumps(value).encode()
            self.send_response(200)
            if link:
                self.send_header("Link", f'<{link}>; rel="next"')
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _bytes(self, data: bytes, etag: str, send_body: bool) -> None:
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes="):
                start = int(ranged[6:].split("-")[0] or 0)
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("ETag", f'"{etag}"')
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not send_body:
                return
            chunks = 20
            size = max(1, (len(data) - start) // chunks + 1)
            for offset in range(start, len(data), size):
                try:
                    self.wfile.write(data[offset:offset + size])
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client went away mid-download (a test stops it on purpose)
                if offset + size >= len(data):
                    if served is not None:
                        served.append(time.monotonic())  # the last byte is out
                    break
                if hold is not None and offset == 0:
                    hold.wait(60)
                time.sleep(seconds / chunks)

        def _route(self, send_body: bool) -> None:
            ranged = self.headers.get("Range")
            auth = self.headers.get("Authorization")
            requests.append(f"{self.command} {self.path}" + (f" Range: {ranged}" if ranged else "")
                            + (f" Authorization: {auth}" if auth else ""))
            path = self.path.split("?", 1)[0]
            for repo, files in repos.items():
                if path.startswith((f"/api/models/{repo}/", f"/{repo}/resolve/")):
                    return self._repo(path, repo, files, lfs_of[repo], send_body)
            if path.startswith("/cdn/") and path[5:] in cdn:
                return self._bytes(cdn[path[5:]], path[5:], send_body)
            self._missing()

        def _missing(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _repo(self, path: str, repo: str, files: dict[str, bytes], lfs: dict[str, str], send_body: bool) -> None:
            resolve = f"/{repo}/resolve/{COMMIT}/"
            if path == f"/api/models/{repo}/refs":
                return self._json({"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": COMMIT}],
                                   "tags": [{"name": "v1", "ref": "refs/tags/v1", "targetCommit": COMMIT}]})
            if path == f"/api/models/{repo}/tree/{COMMIT}":
                listing = [
                    {"type": "file", "path": name, "oid": git_blob_sha1(data), "size": len(data),
                     **({"lfs": {"oid": lfs[name], "size": len(data)}} if name in lfs else {})}
                    for name, data in files.items()
                ]
                # Paged as the Hub pages it: a cursor in the query, the next page in a Link header.
                cursor = int(self.path.split("cursor=", 1)[1]) if "cursor=" in self.path else 0
                end = cursor + page if page else len(listing)
                more = f"http://{self.headers['Host']}{path}?recursive=true&cursor={end}" if end < len(listing) else None
                return self._json(listing[cursor:end], more)
            if path.startswith(resolve) and path[len(resolve):] in files:
                name = path[len(resolve):]
                if name in lfs and not self.headers.get("X-No-Redirect"):
                    # LFS files live on the CDN: the Hub answers with a redirect there.
                    self.send_response(302)
                    self.send_header("Location", f"/cdn/{lfs[name]}")
                    self.send_header("X-Linked-Etag", f'"{lfs[name]}"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                return self._bytes(files[name], git_blob_sha1(files[name]), send_body)
            self._missing()

        def do_GET(self) -> None:  # noqa: N802
            self._route(True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._route(False)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
