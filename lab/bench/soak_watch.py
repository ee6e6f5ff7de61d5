"""What lab/bench/router_soak.py watches while the router runs: the GPU's memory (nvidia-smi, whole card and
per process), the router's /models states, and its log, each sample stamped with this process's
monotonic clock so that the three can be lined up afterwards. Plus the client: one chat request,
streamed or not, timed to its first token, optionally cancelled by closing the socket mid-stream.
Standard library only (it runs on the GPU machine under whatever Python is there)."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


def now() -> float:
    return time.monotonic()


class Sampler:
    """A daemon thread calling ``sample()`` every ``period`` seconds until stopped; ``samples`` holds
    (t, value) for every call that returned something."""

    def __init__(self, period: float):
        self.period = period
        self.samples: list[tuple[float, object]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self):  # pragma: no cover - overridden
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                value = self.sample()
                if value is not None:
                    self.samples.append((now(), value))
            except Exception as e:  # noqa: BLE001 - a sampler never takes the run down; its errors are kept
                if len(self.errors) < 20:
                    self.errors.append(f"{type(e).__name__}: {e}"[:200])
            self._stop.wait(self.period)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def have_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


class CardMemory:
    """`nvidia-smi --query-gpu=memory.used -lms <ms>`: the whole card's used MiB, one line per period,
    stamped when read."""

    def __init__(self, period_ms: int = 200):
        self.samples: list[tuple[float, int]] = []
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-lms", str(period_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            first = line.strip().split(",")[0].strip()
            if first.isdigit():
                self.samples.append((now(), int(first)))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._thread.join(timeout=5)


def alias_of(pid: int) -> Optional[str]:
    """The model a child llama-server serves: the router starts each with `--alias <name>`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for i, arg in enumerate(argv[:-1]):
        if arg == b"--alias":
            return argv[i + 1].decode(errors="replace")
    return None


class ProcessMemory(Sampler):
    """Per process on the card (`--query-compute-apps`): {model name (or pid): MiB}."""

    def __init__(self, period: float = 0.5):
        super().__init__(period)
        self.names: dict[int, str] = {}

    def sample(self):
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        found = {}
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                pid = int(parts[0])
                if pid not in self.names:
                    self.names[pid] = alias_of(pid) or f"pid {pid}"
                found[self.names[pid]] = found.get(self.names[pid], 0) + int(parts[1])
        return found


class Statuses(Sampler):
    """GET /models: {model: state} (unloaded | loading | loaded | sleeping), plus failed/exit_code."""

    def __init__(self, port: int, key: str, period: float = 0.2):
        super().__init__(period)
        self.port, self.key = port, key

    def sample(self):
        status, body = get(self.port, self.key, "/models", timeout=5)
        if status != 200:
            raise RuntimeError(f"GET /models answered {status}")
        out = {}
        for m in json.loads(body)["data"]:
            s = m.get("status") or {}
            out[m["id"]] = s.get("value", "?") + (f" failed:{s.get('exit_code')}" if s.get("failed") else "")
        return out


# Router log lines worth keeping (srv/server-models.cpp's messages; a child's lines carry its `[port]`).
LOG_KEEP = re.compile(r"evicting idle LRU|models_max limit reached|spawning server instance with name|exited with status|"
                      r"stopping model instance|force-killing|failed to load|is not loaded, loading|fully loaded|"
                      r"load_mode|out of memory|CUDA error|GGML_ASSERT|ABORT|error|queued|went idle|sleeping|proxy", re.I)


class LogTail(Sampler):
    """New lines of the router's log (its children's are forwarded into it), stamped when read; only
    the lines LOG_KEEP matches are kept with their time, all are counted."""

    def __init__(self, path: Path, period: float = 0.05):
        super().__init__(period)
        self.path, self.offset, self.partial, self.lines = path, 0, b"", 0

    def sample(self):
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        if not chunk:
            return None
        self.offset += len(chunk)
        data = self.partial + chunk
        *complete, self.partial = data.split(b"\n")
        t = now()
        self.lines += len(complete)
        for raw in complete:
            line = raw.decode(errors="replace").rstrip()
            if LOG_KEEP.search(line):
                self.samples.append((t, line[:400]))
        return None


def get(port: int, key: str, path: str, timeout: float = 10) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post(port: int, key: str, path: str, body: dict, timeout: float = 30) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@dataclass
class Result:
    """One chat request as the client saw it (times in seconds from its send)."""
    index: int
    model: str
    kind: str  # sequential | concurrent | cancel | cold | warm-reference
    stream: bool
    max_tokens: int
    sent: float = 0.0  # monotonic
    status: Optional[int] = None
    first_token_s: Optional[float] = None
    total_s: Optional[float] = None
    chunks: int = 0
    cancelled: bool = False
    error: str = ""
    resident_before: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


def chat(port: int, key: str, result: Result, timeout: float, cancel_after: Optional[int] = None) -> Result:
    """Send ``result``'s request and fill it in. Streaming: the first token is the first `data:` chunk
    (llama-server sends the role with the first generated token); with ``cancel_after`` the socket is
    closed after that many chunks, as a client that goes away does."""
    body = {"model": result.model, "messages": [{"role": "user", "content": f"Say something about the number {result.index}."}],
            "max_tokens": result.max_tokens, "temperature": 0, "top_k": 1, "seed": 0, "stream": result.stream,
            "ignore_eos": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=max(1.0, timeout))
    result.sent = now()
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        result.status = resp.status
        if resp.status != 200:
            result.error = resp.read()[:300].decode(errors="replace")
        elif not result.stream:
            answer = json.loads(resp.read())
            result.first_token_s = now() - result.sent
            result.chunks = int((answer.get("usage") or {}).get("completion_tokens") or 0)
        else:
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                if line == b"data: [DONE]":
                    break
                if result.first_token_s is None:
                    result.first_token_s = now() - result.sent
                result.chunks += 1
                if b'"error"' in line[:40]:
                    result.error = line[:300].decode(errors="replace")
                    break
                if cancel_after is not None and result.chunks >= cancel_after:
                    result.cancelled = True
                    break
    except (OSError, http.client.HTTPException, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"[:300]
    finally:
        conn.close()  # for a cancelled stream: the client going away mid-answer
    result.total_s = now() - result.sent
    return result
