"""Start a real llama-server with a rendered container's exact arguments and check what it promises.

The server runs as the pod would: the pod's runAsUser and runAsGroup, its fsGroup and supplemental
groups, the API-key file owned by root and the fsGroup with the Secret volume's mode 0440, and the
cache folders group-owned by the fsGroup (what the kubelet does to a volume with fsGroup set).

Only what cannot exist here is changed: the model is a tiny GGUF (``-m`` in place of ``--hf-repo``:
resolving ``--hf-repo`` offline needs the Hub's cache layout and manifest that the pinned build's
downloader writes, which no test can produce without the network), the host is loopback, the port
is free, the API-key file is a temp file holding a test key, and the cache paths in the environment
point into a temp folder.
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
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

# Lines a CPU build prints for the GPU flags (--n-gpu-layers), which the render sets on purpose.
GPU_WARNINGS = ("no usable GPU found", "compiled without GPU support", "consult docs/build.md")
# What llama.cpp logs for an argument it does not take or a setting it overrides.
BAD_LOG = re.compile(r"invalid argument|unknown argument|error: |deprecated|is ignored|ignoring|disabl(ed|ing) .* because", re.I)
TEST_KEY = "contract-test-key-1"
# Informational lines (level I) such as the start-up hint that names --no-webui as deprecated;
# warnings (W) and errors (E), and the argument parser's unprefixed lines, all count.
INFO = re.compile(r"^\d+\.\d+\.\d+\.\d+ I ")


class ContractFailure(AssertionError):
    """A server that does not do what its rendered container promises; one line saying what."""


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict

    def json(self):
        return json.loads(self.body)


def request(url: str, data: Optional[dict] = None, headers: Optional[dict] = None, timeout: float = 30) -> Answer:
    body = json.dumps(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Answer(r.status, r.read(), dict(r.headers))
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.read(), dict(e.headers))


def log_until(cmd: list[str], log: Path, marker: str, seconds: float) -> str:
    """Run a program with its output in ``log`` until ``marker`` appears there (or it exits, or ``seconds``
    pass), stop it, and return what it logged: for a load report read off llama-server's log."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and proc.poll() is None:
                if marker in log.read_text(errors="replace"):
                    break
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return log.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flag_value(args: list[str], flag: str) -> Optional[str]:
    return args[args.index(flag) + 1] if flag in args else None


def local_args(args: list[str], model: Optional[Path], port: int, key_file: Optional[Path]) -> list[str]:
    """The rendered args with only the unavoidable substitutions (``model`` None: keep --hf-repo)."""
    out, i = [], 0
    while i < len(args):
        flag = args[i]
        if flag in ("--hf-repo", "-hf", "-hfr") and model is not None:
            out += ["-m", str(model)]
            i += 2
            continue
        if flag == "--host":
            out += [flag, "127.0.0.1"]
            i += 2
            continue
        if flag == "--port":
            out += [flag, str(port)]
            i += 2
            continue
        if flag == "--api-key-file":
            out += [flag, str(key_file)]
            i += 2
            continue
        out.append(flag)
        i += 1
    return out


def stop(proc: subprocess.Popen, seconds: float = 10, group: bool = False) -> None:
    """SIGTERM, and SIGKILL if it has not exited within ``seconds``; reaped either way. ``group``: the signals go
    to its whole process group (a program started with start_new_session, and what it started), while it runs."""
    def send(sig: int) -> None:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)

    if group and proc.poll() is not None:
        return  # exited and reaped: its group may be gone with it
    send(signal.SIGTERM)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()


def without(args: list[str], dropped: dict[str, int]) -> list[str]:
    """The args less each flag in ``dropped`` and the values it takes (flag -> how many)."""
    kept: list[str] = []
    skip = 0
    for arg in args:
        if skip:
            skip -= 1
        elif arg in dropped:
            skip = dropped[arg]
        else:
            kept.append(arg)
    return kept


class StoppedEarly(Exception):
    """serve() stopped the server during its start, as asked (``stop_when``)."""


@dataclass
class Running:
    base: str
    args: list[str]
    log: Path
    key: Optional[str]
    pid: int = 0
    # What the probe path answered while the server started, in order (a status, or "refused").
    before_ready: list = field(default_factory=list)
    ready_at: float = 0.0  # monotonic time of the first 200

    def uid(self) -> int:
        """The real uid the server process runs as."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def as_pod(security: Optional[dict]) -> tuple[list[str], Optional[int]]:
    """The command prefix that runs a process with the pod's identity, and the fsGroup; nothing when
    the pod sets none. A process that cannot change identity fails: a server run as whoever runs
    the tests would prove nothing about the pod's permissions."""
    if not security:
        return [], None
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        raise ContractFailure("cannot start llama-server as the pod's user and groups: the contract tests need root "
                              "and setpriv (util-linux) to take them; run them as root (CI does)")
    uid, gid = security["runAsUser"], security.get("runAsGroup", security["runAsUser"])
    fs_group = security.get("fsGroup")
    groups = sorted({g for g in [fs_group, *security.get("supplementalGroups", [])] if g is not None})
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={','.join(map(str, groups)) or gid}",
              "--inh-caps=-all", "--"]
    return prefix, fs_group


def _shared_copy(path: Path, folder: Path, mode: int) -> Path:
    """A copy another user can read (the pytest and build caches live under root's home)."""
    target = folder / path.name
    shutil.copy2(path, target)
    os.chmod(target, mode)
    return target


@contextmanager
def serve(binary: Path, container: dict, model: Path, probe_path: str, startup_seconds: float = 60,
          key_file_text: str = TEST_KEY, pod_security: Optional[dict] = None,
          key_file_mode: Optional[int] = None, hub_endpoint: Optional[str] = None,
          work: Optional[Path] = None, stop_when: Optional[Callable[[], bool]] = None) -> Iterator[Running]:
    """``hub_endpoint``: keep --hf-repo and download from this stand-in Hub (MODEL_ENDPOINT) into the
    pod's cache folder; ``work``: reuse a folder (and its cache) from an earlier start; ``stop_when``:
    stop the server (SIGTERM, as the kubelet does) once this holds during the start, raising StoppedEarly."""
    args = list(container.get("args") or [])
    owned = work is None  # removed at the end (it holds a copy of the binary); a given folder is the caller's
    work = work or Path(tempfile.mkdtemp(prefix="llama-contract-"))
    prefix, fs_group = as_pod(pod_security)
    if prefix:
        os.chmod(work, 0o755)
        binary = _shared_copy(binary, work, 0o755)
        if hub_endpoint is None:
            model = _shared_copy(model, work, 0o444)
    key_file = None
    if "--api-key-file" in args:
        key_file = work / "api-key"
        key_file.write_text(key_file_text)
        os.chmod(key_file, 0o440)  # the Secret volume's defaultMode
        if fs_group is not None:
            os.chown(key_file, 0, fs_group)  # a Secret volume's files: root, and the pod's fsGroup
        if key_file_mode is not None:
            os.chmod(key_file, key_file_mode)
    port = free_port()
    env = {"PATH": "/usr/bin:/bin"}
    for item in container.get("env") or []:
        value = item.get("value", "")
        # Cache paths of the pod (volumes) become folders of this run.
        env[item["name"]] = str(work / value.lstrip("/")) if value.startswith("/") else value
        if value.startswith("/") and fs_group is not None:
            # A volume with fsGroup: group-owned, group-writable, setgid (what the kubelet applies).
            folder = work / value.lstrip("/")
            folder.mkdir(parents=True, exist_ok=True)
            for part in [folder, *folder.relative_to(work).parents]:
                path = work / part
                if path != work:
                    os.chown(path, 0, fs_group)
                    os.chmod(path, 0o2775)
    if hub_endpoint is not None:
        env["MODEL_ENDPOINT"] = hub_endpoint
    log = work / "server.log"
    with open(log, "wb") as out:
        command = local_args(args, None if hub_endpoint else model, port, key_file)
        proc = subprocess.Popen([*prefix, str(binary), *command], stdout=out, stderr=subprocess.STDOUT, env=env)
    running = Running(f"http://127.0.0.1:{port}", args, log, TEST_KEY if key_file else None, proc.pid)
    try:
        deadline = time.monotonic() + startup_seconds
        while True:
            if proc.poll() is not None:
                raise ContractFailure(f"llama-server exited with {proc.returncode} at start: {last_error(running)}")
            try:
                answer = request(running.base + probe_path, timeout=2)
                running.before_ready.append(answer.status)
                if answer.status == 200:
                    running.ready_at = time.monotonic()
                    break
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                running.before_ready.append("refused")
            if stop_when is not None and stop_when():
                raise StoppedEarly(running.before_ready)
            if time.monotonic() > deadline:
                raise ContractFailure(f"{probe_path} never answered 200 within {startup_seconds:.0f}s")
            time.sleep(0.05)
        yield running
    finally:
        stop(proc)
        if owned:
            shutil.rmtree(work, ignore_errors=True)


def last_error(running: Running) -> str:
    lines = [l for l in running.log_text().splitlines() if l.strip()]
    bad = [l for l in lines if BAD_LOG.search(l)]
    return (bad or lines or ["(no output)"])[-1].strip()[:300]


def complaints(running: Running) -> list[str]:
    """Log lines where the server says an argument the render chose is wrong, unknown or overridden."""
    return [l.strip() for l in running.log_text().splitlines()
            if BAD_LOG.search(l) and not INFO.match(l) and not any(g in l for g in GPU_WARNINGS) and "unauthorized" not in l]
