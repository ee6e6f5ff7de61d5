"""A stand-in for llama.cpp's router (b10729, started with --no-models-autoload --models-max 0), written from
lab/contract/ROUTER_FACTS.md and the router's source, not from the proxy's code: for the property and
load tests of the admission proxy, where the real router is too slow to meet thousands of requests.

It reads a request as the router does: the key from Authorization (less an exact "Bearer ") else X-Api-Key,
compared with the key file's lines; query parameters with the last of a repeated name winning; a
form-urlencoded POST body's fields as parameters too; a multipart POST's form fields as the JSON body; a
JSON body with a UTF-8 byte-order mark skipped; `autoload` on only for "true" or "1". It loads a model
only through POST /models/load or a request that turns autoload on, and records the peak of the planned
VRAM it held, and every request that reached it which the router would have refused (a bad key, too many
headers) or which asked it to manage models or reload (which only the proxy's own calls may do)."""
from __future__ import annotations

import email.parser
import email.policy
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RUNNING = ("loading", "loaded", "sleeping")


class FakeRouter:
    def __init__(self, vram: dict[str, float], keys: list[bytes], load_seconds: float = 0.05,
                 unload_seconds: float = 0.05):
        self.vram, self.keys = dict(vram), list(keys)
        self.load_seconds, self.unload_seconds = load_seconds, unload_seconds
        self.status = {name: "unloaded" for name in vram}
        self.lock = threading.Lock()
        self.peak = 0.0
        self.violations: list[str] = []  # requests the router would have refused, or management from a client
        self.loads: list[str] = []  # who asked for each load: "proxy" (/models/load) or "autoload"
        self.served: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeRouter":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def resident_vram(self) -> float:
        return sum(self.vram[n] for n, s in self.status.items() if s in RUNNING)

    def _set(self, name: str, value: str) -> None:
        with self.lock:
            self.status[name] = value
            self.peak = max(self.peak, self.resident_vram())

    def _load(self, name: str, how: str) -> None:
        self.loads.append(how)
        self._set(name, "loading")
        threading.Timer(self.load_seconds, lambda: self.status[name] == "loading" and self._set(name, "loaded")).start()

    def _handler(self):
        router = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, status: int, payload) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            def error(self, status: int, message: str) -> None:
                self.reply(status, {"error": {"code": status, "message": message}})

            def authorized(self) -> bool:
                if not router.keys or self.path_only in ("/health", "/v1/health"):
                    return True
                key = self.headers.get("Authorization", "") or self.headers.get("X-Api-Key", "")
                if key.startswith("Bearer "):
                    key = key[len("Bearer "):]
                return key.encode("latin-1") in router.keys

            def common(self) -> bool:
                self.path_only, _, query = self.path.partition("?")
                self.params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
                if len(self.headers) > 100:
                    router.violations.append(f"{self.command} {self.path}: more than 100 headers reached the router")
                if not self.authorized():
                    router.violations.append(f"{self.command} {self.path}: a key the router refuses reached it")
                    self.error(401, "Invalid API Key")
                    return False
                return True

            def autoload(self) -> bool:
                value = self.params.get("autoload", "")
                return value in ("true", "1")

            def do_GET(self):  # noqa: N802
                if not self.common():
                    return
                if self.path_only == "/health":
                    return self.reply(200, {"status": "ok"})
                if self.path_only in ("/models", "/v1/models"):
                    if self.params.get("reload"):
                        router.violations.append(f"GET {self.path}: a reload reached the router")
                    with router.lock:
                        data = [{"id": n, "status": {"value": s}} for n, s in router.status.items()]
                    return self.reply(200, {"data": data, "object": "list"})
                if self.path_only == "/metrics":
                    return self.model_request(self.params.get("model", ""), b"# metrics\n")
                self.error(404, "File Not Found")

            def body_json(self) -> dict:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                kind = self.headers.get("Content-Type", "")
                if kind.startswith("multipart/form-data"):
                    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                        b"Content-Type: " + kind.encode() + b"\r\n\r\n" + raw)
                    return {part.get_param("name", header="content-disposition"): part.get_content()
                            for part in message.iter_parts()}
                if kind.split(";")[0].strip() == "application/x-www-form-urlencoded":
                    self.params.update(urllib.parse.parse_qsl(raw.decode("latin-1"), keep_blank_values=True))
                return json.loads(raw.decode("utf-8-sig"))

            def do_POST(self):  # noqa: N802
                if not self.common():
                    return
                try:
                    body = self.body_json()
                except ValueError:
                    return self.error(500, "parse error")
                model = body.get("model") if isinstance(body, dict) and isinstance(body.get("model"), str) else ""
                if self.path_only in ("/models/load", "/models/unload"):
                    return self.manage(model)
                if self.path_only.startswith("/models") or self.path_only in ("/props", "/slots"):
                    router.violations.append(f"POST {self.path}: model management reached the router")
                    return self.error(403, "no")
                hold = body.get("hold", 0) if isinstance(body.get("hold", 0), (int, float)) else 0
                self.model_request(model, json.dumps({"model": model}).encode(), float(hold),
                                   int(body.get("stream_bytes", 0) or 0))

            def manage(self, model: str) -> None:
                if model not in router.status:
                    return self.error(404, "model is not found")
                if self.path_only == "/models/load":
                    if router.status[model] in RUNNING:
                        return self.error(400, "model is already running")
                    router._load(model, "proxy")
                    return self.reply(200, {"success": True})
                if router.status[model] not in RUNNING:
                    return self.error(400, "model is not running")
                threading.Timer(router.unload_seconds, router._set, (model, "unloaded")).start()
                return self.reply(200, {"success": True})

            def model_request(self, model: str, answer: bytes, hold: float = 0.0, stream_bytes: int = 0) -> None:
                if not model:
                    return self.error(400, "model name is missing from the request")
                if model not in router.status:
                    return self.error(400, f"model '{model}' not found")
                if router.status[model] not in RUNNING:
                    if not self.autoload():
                        return self.error(400, "model is not loaded")
                    router._load(model, "autoload")
                    while router.status[model] == "loading":
                        time.sleep(0.01)
                if router.status[model] == "loading":
                    return self.error(503, "Loading model")
                router.served.append(model)
                time.sleep(hold)
                if stream_bytes:
                    return self.stream(stream_bytes)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(answer)
                self.close_connection = True

            def stream(self, size: int) -> None:
                """A long answer, chunked, as a generation streams: writes block while the reader does not read."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                piece = b"data: " + b"x" * 65530 + b"\n\n"
                try:
                    for _ in range(size // len(piece)):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass
                self.close_connection = True

        return Handler
