"""The admission proxy's container (framing.py and proxy.py beside this module, run with `python3 -c`
in a plain python image): in a router's pod, on the server's port, in front of the router on the pod's loopback."""

from __future__ import annotations

import functools
from pathlib import Path

from common.constants import API_KEY_VOLUME
from config.types import ModelServer
from engines import engine_of
from engines.base import Admission
from planning.residency import ADMISSION_MEMORY_REQUEST

from ..security import CONTAINER_SECURITY

# Mostly idle (asyncio, one process); the limit leaves room for a few request bodies held while their
# model is admitted (each at most 32 MiB: proxy.MAX_BODY_BYTES).
ADMISSION_RESOURCES = {"requests": {"cpu": "50m", "memory": ADMISSION_MEMORY_REQUEST},
                       "limits": {"cpu": "1", "memory": "512Mi"}}


@functools.cache
def proxy_source() -> str:
    """framing.py, then proxy.py: one source for `python3 -c` (proxy.py's package import of framing
    then fails and is skipped; the names are already defined)."""
    here = Path(__file__).parent
    return (here / "framing.py").read_text() + "\n\n" + (here / "proxy.py").read_text()


def admission_container(model: ModelServer, admission: Admission, probes: dict, file_mounts: list[dict]) -> dict:
    """The proxy, with the probes the server's port is checked by (``probes``: startup and readiness,
    answered through it by the server; liveness asks only whether the proxy accepts connections)."""
    credentials = engine_of(model).credentials(model)
    env = [
        {"name": "ADMISSION_PLAN_FILE", "value": admission.plan_file},
        {"name": "LISTEN_PORT", "value": str(model.port)},
        {"name": "ROUTER_URL", "value": f"http://127.0.0.1:{admission.server_port}"},
    ]
    mounts = list(file_mounts)
    if model.api_key is not None and credentials is not None:
        env.append({"name": "ROUTER_AUTH_FILE", "value": credentials.key_file(model.api_key.secret_key)})
        mounts.append({"name": API_KEY_VOLUME, "mountPath": credentials.mount_dir, "readOnly": True})
    return {
        "name": "admission",
        "image": admission.image,
        "command": ["python3", "-c", proxy_source()],
        "env": env,
        "ports": [{"name": "http", "containerPort": model.port, "protocol": "TCP"}],
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": ADMISSION_RESOURCES,
        **probes,
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 6},
        "volumeMounts": mounts,
    }
