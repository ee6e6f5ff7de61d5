"""Start a real llama-server in router mode (no model of its own; each model runs as a child process)
from a preset text and the router's arguments, and talk to it.

What a test cannot have here is substituted, nothing else: each named model's file becomes a tiny GGUF
(its section's model / hf-repo keys are replaced by ``model = <path>``), the host is loopback, the port
is free, the preset and API-key paths point into a temp folder, and HOME / LLAMA_CACHE point there too
(an HF cache would otherwise add every cached model to the router's list, see ROUTER_FACTS.md).

    with start_router(preset_text, args, {"tiny-a": path_a, ...}, api_key="k") as router:
        router.chat("tiny-a")        # Answer(status, body, headers)
        router.statuses()            # {"tiny-a": "loaded", "tiny-b": "unloaded", ...}
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from lab.contract.server import Answer, free_port, request

GREEDY = {"temperature": 0, "top_k": 1, "seed": 0}
# What the router counts against --models-max (server-models.h is_running(): loading, loaded, sleeping).
RUNNING = ("loading", "loaded", "sleeping")
# Preset keys that name a model's weights (long and short flag names without dashes, and env names).
MODEL_KEYS = {"model", "m", "hf-repo", "hf", "hfr", "hf-file", "hff", "model-url", "mu", "docker-repo", "dr",
              "LLAMA_ARG_MODEL", "LLAMA_ARG_HF_REPO", "LLAMA_ARG_HF_FILE", "LLAMA_ARG_MODEL_URL", "LLAMA_ARG_DOCKER_REPO"}
DEFAULT_MODELS_MAX = 4  # common/common.h: models_max


class RouterFailure(AssertionError):
    """The router did not start or answer as expected; one line saying what."""


def substitute_models(preset_text: str, models: dict[str, Path]) -> str:
    """The preset with each named section's weights replaced by ``model = <path>`` (added where the
    section names none). A named model without a section gets one, appended."""
    out: list[str] = []
    section: Optional[str] = None
    seen: set[str] = set()
    header = re.compile(r"^\s*\[\s*([^\]]*?)\s*\]\s*(?:[;#].*)?$")
    key = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*=")
    for line in preset_text.splitlines():
        m = header.match(line)
        if m:
            section = m.group(1)
            out.append(line)
            if section in models:
                seen.add(section)
                out.append(f"model = {models[section]}")
            continue
        k = key.match(line)
        if section in models and k and k.group(1) in MODEL_KEYS:
            continue
        out.append(line)
    for name, path in models.items():
        if name not in seen:
            out += ["", f"[{name}]", f"model = {path}"]
    return "\n".join(out) + "\n"


def local_args(args: list[str], port: int, preset: Path, key_file: Optional[Path], api_key: Optional[str]) -> list[str]:
    """The router's args with loopback host, a free port, and this run's preset and key file."""
    out, i = [], 0
    replaced = {"--host": "127.0.0.1", "--port": str(port), "--models-preset": str(preset)}
    if key_file is not None:
        replaced["--api-key-file"] = str(key_file)
    if api_key is not None:
        replaced["--api-key"] = api_key
    while i < len(args):
        flag = args[i]
        if flag in replaced:
            out += [flag, replaced.pop(flag)]
            i += 2
            continue
        out.append(flag)
        i += 1
    for flag in ("--host", "--port", "--models-preset"):
        if flag in replaced:
            out += [flag, replaced[flag]]
    if api_key is not None and "--api-key" not in args and "--api-key-file" not in args:
        out += ["--api-key-file", str(key_file)]
    return out


def models_max(args: list[str]) -> int:
    """--models-max as the router reads it (0: no limit)."""
    return int(args[args.index("--models-max") + 1]) if "--models-max" in args else DEFAULT_MODELS_MAX


@dataclass
class Router:
    base: str
    key: Optional[str]
    work: Path
    preset: Path
    log: Path
    proc: subprocess.Popen = field(repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def get(self, path: str, auth: bool = True, headers: Optional[dict] = None, timeout: float = 120) -> Answer:
        return request(self.base + path, None, {**(self.auth() if auth else {}), **(headers or {})}, timeout=timeout)

    def post(self, path: str, data: dict, auth: bool = True, headers: Optional[dict] = None, timeout: float = 300) -> Answer:
        return request(self.base + path, data, {**(self.auth() if auth else {}), **(headers or {})}, timeout=timeout)

    def models(self, reload: bool = False) -> list[dict]:
        answer = self.get("/models?reload=1" if reload else "/models")
        if answer.status != 200:
            raise RouterFailure(f"GET /models answered {answer.status}: {answer.body[:200]!r}")
        return answer.json()["data"]

    def statuses(self, reload: bool = False) -> dict[str, str]:
        """model id -> unloaded | loading | loaded | sleeping (| downloading | downloaded)."""
        return {m["id"]: m["status"]["value"] for m in self.models(reload)}

    def running(self) -> list[str]:
        """The models that count against --models-max."""
        return sorted(name for name, status in self.statuses().items() if status in RUNNING)

    def chat(self, model: str, content: str = "hi", max_tokens: int = 4, auth: bool = True, timeout: float = 300) -> Answer:
        body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **GREEDY}
        return self.post("/v1/chat/completions", body, auth=auth, timeout=timeout)

    def load(self, model: str, seconds: float = 120) -> None:
        """What the admission proxy does before it passes a request on (the rendered router loads nothing on
        its own, --no-models-autoload): POST /models/load, then wait until the model is loaded."""
        answer = self.post("/models/load", {"model": model})
        if answer.status not in (200, 400):  # 400: already running
            raise RouterFailure(f"POST /models/load {model} answered {answer.status}: {answer.body[:200]!r}")
        self.wait_status(model, ("loaded", "sleeping"), seconds)

    def wait_status(self, model: str, wanted: tuple[str, ...], seconds: float = 120) -> str:
        deadline = time.monotonic() + seconds
        while True:
            status = self.statuses().get(model)
            if status in wanted:
                return status
            if time.monotonic() > deadline:
                raise RouterFailure(f"model {model} stayed {status} for {seconds:.0f}s, never {'/'.join(wanted)}")
            time.sleep(0.1)

    def children(self) -> list[int]:
        """PIDs of the router's child processes (one per running model)."""
        return child_pids(self.pid)

    def write_preset(self, text: str) -> None:
        self.preset.write_text(text)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def child_pids(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, seconds: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def start_router(binary: Path, preset_text: str, args: list[str], models: dict[str, Path], api_key: Optional[str] = None,
                 startup_seconds: float = 60, env: Optional[dict] = None, key_file_text: Optional[str] = None) -> Iterator[Router]:
    """Write the preset (model files substituted), start ``binary`` in router mode on a free loopback
    port, wait until GET /health answers 200 (the router's own readiness; no model is loaded by then
    unless the preset says load-on-startup), and yield a Router. ``key_file_text``: the key file's whole
    text (comments, several keys), instead of ``api_key`` alone. At the end: SIGTERM (the router stops
    its children), then whatever child is left is killed."""
    work = Path(tempfile.mkdtemp(prefix="llama-router-"))
    (work / "home").mkdir()
    preset = work / "preset.ini"
    preset.write_text(substitute_models(preset_text, models))
    key_file = None
    if api_key is not None:
        key_file = work / "api-key"
        key_file.write_text(key_file_text if key_file_text is not None else api_key + "\n")
        os.chmod(key_file, 0o440)
    port = free_port()
    command = [str(binary), *local_args(args, port, preset, key_file, api_key)]
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(work / "home"), "LLAMA_CACHE": str(work / "home" / "cache"),
                   **(env or {})}
    log = work / "router.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment, cwd=work)
    router = Router(f"http://127.0.0.1:{port}", api_key, work, preset, log, proc)
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + startup_seconds
        while True:
            if proc.poll() is not None:
                raise RouterFailure(f"router exited with {proc.returncode} at start: {last_line(router)}")
            try:
                if request(router.base + "/health", timeout=2).status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                pass
            if time.monotonic() > deadline:
                raise RouterFailure(f"/health never answered 200 within {startup_seconds:.0f}s")
            time.sleep(0.05)
        yield router
    finally:
        kids.update(child_pids(proc.pid))
        stop(proc)
        for pid in kids:  # children exit on their own when the router's pipe closes; never leave one
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(work, ignore_errors=True)


def last_line(router: Router) -> str:
    lines = [l for l in router.log_text().splitlines() if l.strip()]
    bad = [l for l in lines if re.search(r"error|failed|not recognized|exceeds", l, re.I)]
    return (bad or lines or ["(no output)"])[-1].strip()[:300]


def wait_gone(pids: list[int], seconds: float = 30) -> list[int]:
    """The pids still alive after waiting up to ``seconds`` for them to exit."""
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def parse_json(answer: Answer) -> dict:
    try:
        return json.loads(answer.body)
    except ValueError:
        return {}
