"""Run the in-cluster programs (incluster/) as their pod runs them: the rendered container's command, with
the rendered programs ConfigMap's files written where the pod's volume puts them (a temp folder standing
for the mount path), under the pinned image's Python minor version where this machine has one.

    root = write_programs(config_map, pod_spec, tmp_path / "programs")
    command = pod_command(container, root)     # ["/path/to/python3.12", "-B", "-E", "-s", "<root>/admission_proxy.py"]
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

from components.programs import PROGRAMS_DIR
from config.defaults import PREFETCH_IMAGE


def image_minor() -> str:
    """The Python minor version of the pinned image the programs run in (python:3.12.11-slim-bookworm: 3.12)."""
    match = re.search(r"python:(\d+\.\d+)", PREFETCH_IMAGE)
    assert match, f"the pinned downloader image {PREFETCH_IMAGE} does not name its Python version"
    return match.group(1)


@cache
def pod_python() -> str:
    """An interpreter of the image's minor version (pyenv's, the system's), else this one: the programs
    are also held to that version's syntax by tests/test_incluster_programs.py, which runs everywhere."""
    minor = image_minor()
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


def programs_under(root: Path) -> Path:
    """Where the programs volume lands when every absolute path of the pod is moved under ``root``."""
    return root / PROGRAMS_DIR.lstrip("/")


def write_programs(config_map: dict, pod_spec: dict, root: Path) -> Path:
    """The programs volume as the kubelet lays it out: each item's key written at its path under ``root``."""
    (volume,) = [v for v in pod_spec["volumes"] if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]]
    for item in volume["configMap"]["items"]:
        target = root / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(config_map["data"][item["key"]])
    return root


def pod_command(container: dict, root: Path) -> list[str]:
    """The container's command with the interpreter of the image's version and the mount path at ``root``."""
    command = list(container["command"])  # a container's, or an exec probe's
    assert command[0] == "python3", command
    return [pod_python()] + [arg.replace(PROGRAMS_DIR, str(root)) for arg in command[1:]]
