"""The prefetch init container: downloads a model's weights into the replica's claim before the
engine starts, with the standard-library downloader beside this module (hub_download.py, run with
`python3 -c` in a plain python image) or the user's own command."""

from __future__ import annotations

import functools
from pathlib import Path

from config.types import ModelServer

from ..security import CONTAINER_SECURITY, HF_CACHE, HF_HOME_DIR, SCRATCH_VOLUME

# Init and sidecar containers get requests and limits too: an unbounded init container can
# still OOM the node while 100 GiB of weights stream through the page cache.
PREFETCH_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "2Gi"}}


@functools.cache
def hub_download_source() -> str:
    """The built-in downloader (see its docstring); read only when a pod prefetches."""
    return (Path(__file__).parent / "hub_download.py").read_text()


def prefetch_container(model: ModelServer) -> dict:
    prefetch = model.prefetch
    if prefetch is None:
        raise ValueError(f"{model.name}: no prefetch settings")
    return {
        "name": "prefetch",
        "image": prefetch.image,
        "command": list(prefetch.command) if prefetch.command else ["python3", "-c", hub_download_source()],
        "env": [
            {"name": "HF_REPO", "value": prefetch.repo},
            {"name": "HF_REVISION", "value": prefetch.revision},
            {"name": "HOME", "value": HF_HOME_DIR},
            # The same cache as the engine reads (see _cache_mount), never derived from XDG_CACHE_HOME.
            {"name": "HF_HOME", "value": HF_CACHE},
        ],
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": PREFETCH_RESOURCES,
        "volumeMounts": [{"name": "weights", "mountPath": HF_CACHE}, SCRATCH_VOLUME],
    }
