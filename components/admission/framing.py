"""HTTP/1.1 framing for the admission proxy (proxy.py): reading a request's head and body, answering an
error, noticing a client that left, the server's API keys. Standard library only; run as the first part
of the proxy's `python3 -c` source (components/admission: proxy_source)."""

import asyncio
import hmac
import json
import os
import sys

MAX_HEADER_BYTES = 64 * 1024
# A chat request with a few images inlined as base64 stays far below this.
MAX_BODY_BYTES = 32 * 1024 * 1024
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
              "content-length", "expect"}


def log(message: str) -> None:
    print(f"admission: {message}", file=sys.stderr, flush=True)


class AdmissionError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def read_head(reader, response: bool = False):
    """The start line and headers; returns (method, target, headers, leftover) or (status, headers, leftover)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await reader.read(65536)
        if not chunk:
            raise ConnectionError("closed before the headers ended")
        data += chunk
        if len(data) > MAX_HEADER_BYTES and b"\r\n\r\n" not in data[:MAX_HEADER_BYTES]:
            raise AdmissionError(431, "request headers too large")
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    parts = lines[0].split(" ", 2)
    if response:
        return int(parts[1]), headers, rest
    if len(parts) != 3:
        raise AdmissionError(400, "malformed request line")
    return parts[0], parts[1], headers, rest


def header(headers, name: str):
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


async def read_body(reader, headers, rest: bytes) -> bytes:
    """A body framed by Content-Length or chunked (decoded); none otherwise (the connection's next bytes
    are not this request's)."""
    if (header(headers, "transfer-encoding") or "").lower().endswith("chunked"):
        data, body = bytearray(rest), bytearray()
        while True:
            while b"\r\n" not in data:
                more = await reader.read(65536)
                if not more:
                    raise ConnectionError("closed inside a chunked body")
                data += more
            size_line, _, remainder = bytes(data).partition(b"\r\n")
            try:
                size = int(size_line.split(b";")[0], 16)
            except ValueError:
                raise AdmissionError(400, "malformed chunked body") from None
            data = bytearray(remainder)
            while len(data) < size + 2:
                more = await reader.read(65536)
                if not more:
                    raise ConnectionError("closed inside a chunked body")
                data += more
            if size == 0:
                return bytes(body)
            body += data[:size]
            del data[:size + 2]
            if len(body) > MAX_BODY_BYTES:
                raise AdmissionError(413, "request body too large")
    length = header(headers, "content-length")
    if length is None:
        return b""
    if not length.isdigit():
        raise AdmissionError(400, "malformed Content-Length")
    length = int(length)
    if length > MAX_BODY_BYTES:
        raise AdmissionError(413, "request body too large")
    body = bytearray(rest[:length])
    while len(body) < length:
        more = await reader.read(min(1 << 20, length - len(body)))
        if not more:
            raise ConnectionError("closed inside the body")
        body += more
    return bytes(body)


class Keys:
    """The server's API keys (every line of its key file, re-read when the Secret's file changes): checked
    before anything is admitted, so a request the router would refuse unloads nothing."""

    def __init__(self, path):
        self.path, self.version, self.keys = path, None, ()

    def current(self) -> tuple:
        if not self.path:
            return ()
        try:
            stat = os.stat(self.path)
            version = (stat.st_mtime_ns, stat.st_ino, stat.st_size)
            if version != self.version:
                with open(self.path) as f:
                    self.keys = tuple(line.strip() for line in f if line.strip())
                self.version = version
        except OSError as e:
            log(f"key file {self.path} unreadable, keeping the last keys: {e!r}")
        return self.keys

    def allows(self, headers) -> bool:
        keys = self.current()
        if not keys:
            return True
        bearer = header(headers, "authorization") or ""
        given = bearer[7:].strip() if bearer[:7].lower() == "bearer " else (header(headers, "x-api-key") or "").strip()
        return any(hmac.compare_digest(given.encode(), key.encode()) for key in keys)


def answer(writer, status: int, payload: dict, extra: str = "") -> None:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
              502: "Bad Gateway", 503: "Service Unavailable"}.get(status, "Error")
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                 f"Connection: close\r\n{extra}\r\n".encode() + body)


def error(writer, status: int, message: str) -> None:
    extra = "Retry-After: 5\r\n" if status == 503 else ""
    kind = "authentication_error" if status == 401 else "admission_error"  # the router's type for a bad key
    answer(writer, status, {"error": {"code": status, "message": message, "type": kind}}, extra)


async def client_gone(reader) -> None:
    """Completes when the client closes its side (it sends nothing more after its request)."""
    while True:
        try:
            chunk = await reader.read(65536)
        except (ConnectionError, OSError):
            return
        if not chunk:
            return


