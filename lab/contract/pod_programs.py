"""Run the in-cluster programs (incluster/) as their pod runs them: the rendered container's command, with
the rendered programs ConfigMap's files written where the pod's volume puts them (a temp folder standing
for the mount path), under the Python minor version of the container's image where this machine has one.
Standard library only: the router soak uses it on a GPU machine that has no venv.

    root = write_programs(config_map, pod_spec, tmp_path / "programs")
    command = pod_command(container, root)     # ["/path/to/python3.12", "-B", "-E", "-s", "<root>/admission_proxy.py"]
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path, PurePosixPath

DEFAULT_MINOR = "3.12"


def image_minor(image: str | None) -> str:
    """The Python minor version an image carries (docker.io/library/python:3.12.11-slim-bookworm: 3.12)."""
    match = re.search(r"python:(\d+\.\d+)", image or "")
    return match.group(1) if match else DEFAULT_MINOR


@cache
def pod_python(minor: str = DEFAULT_MINOR) -> str:
    """An interpreter of that minor version (on the PATH, the system's, pyenv's), else this one: the programs
    are also held to that version's grammar by tests/test_incluster_programs.py, which runs everywhere."""
    candidates = [shutil.which(f"python{minor}"), f"/usr/bin/python{minor}", f"/usr/local/bin/python{minor}",
                  *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{minor}.*/bin/python{minor}")))]
    for candidate in candidates:
        if not candidate or not os.path.exists(candidate):
            continue
        try:
            version = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                     capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if version == minor:
            return candidate
    return sys.executable


def programs_under(root: Path, mount: str = "/opt/inference-plane") -> Path:
    """Where the programs volume lands when every absolute path of the pod is moved under ``root``."""
    return root / mount.lstrip("/")


def write_programs(config_map: dict, pod_spec: dict, root: Path) -> Path:
    """The programs volume as the kubelet lays it out: each item's key written at its path under ``root``."""
    (volume,) = [v for v in pod_spec["volumes"] if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]]
    for item in volume["configMap"]["items"]:
        target = root / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(config_map["data"][item["key"]])
    return root


def pod_command(container: dict, root: Path) -> list[str]:
    """A container's (or an exec probe's) command with the interpreter of its image's Python and the
    programs' mount path moved to ``root``."""
    command = list(container["command"])
    assert command[0] == "python3", command
    (script,) = [arg for arg in command if arg.endswith(".py")]
    mount = str(PurePosixPath(script).parent)
    python = pod_python(image_minor(container.get("image")))
    return [python] + [arg.replace(mount, str(root), 1) if arg == script else arg for arg in command[1:]]


@contextlib.contextmanager
def admission_proxy(container: dict, programs_root: Path, env: dict[str, str], work: Path, seconds: float = 20):
    """The rendered admission proxy (``container``) run as the pod runs it, with ``env`` (its rendered env with
    this run's paths and ports; LISTEN_PORT among them); yields its base URL once /health answers. A failing
    test shows the proxy's own log; at the end, SIGTERM."""
    from lab.contract.server import request

    port = env["LISTEN_PORT"]
    log = work / "proxy.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(pod_command(container, programs_root), env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + seconds
        while True:
            try:
                if request(base + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield base, proc, log
    except BaseException:
        print("admission proxy log (last 40 lines):", *log.read_text(errors="replace").splitlines()[-40:], sep="\n")
        raise
    finally:
        proc.terminate()
        proc.wait(timeout=10)
