"""The admission proxy's container in a router's pod (incluster/admission_proxy.py, run from the server's
programs ConfigMap in a plain pinned python image): on the server's port, in front of the router on the
pod's loopback."""

from __future__ import annotations

from typing import Optional

from common.constants import API_KEY_VOLUME
from config.types import ModelServer
from engines.base import Admission, Credentials
from planning.residency import ADMISSION_MEMORY_REQUEST

from .prefetch import ADMISSION_CONTROL, LIBRARY_STATUS
from .programs import command
from .security import CONTAINER_SECURITY, SCRATCH_VOLUME

# Mostly idle (asyncio, one process); the limit holds the request bodies held while their model is
# admitted (incluster/admission_proxy.py MAX_HELD_BYTES, 96 MiB together), the one JSON parse at a time
# and the connections' buffers: about 350 MiB at worst, measured by tests/test_incluster_proxy.py.
ADMISSION_RESOURCES = {"requests": {"cpu": "50m", "memory": ADMISSION_MEMORY_REQUEST},
                       "limits": {"cpu": "1", "memory": "512Mi"}}


def admission_container(model: ModelServer, admission: Admission, credentials: Optional[Credentials], probes: dict,
                        file_mounts: list[dict]) -> dict:
    """The proxy, with the probes the server's port is checked by (``probes``: startup and readiness,
    answered through it by the server; liveness asks only whether the proxy accepts connections).
    ``file_mounts``: the server's config files (admission.json) and its programs."""
    env = [
        {"name": "ADMISSION_PLAN_FILE", "value": admission.plan_file},
        {"name": "LISTEN_PORT", "value": str(model.port)},
        {"name": "ROUTER_URL", "value": f"http://127.0.0.1:{admission.server_port}"},
        {"name": "LIBRARY_STATUS", "value": LIBRARY_STATUS},
        {"name": "ADMISSION_CONTROL", "value": ADMISSION_CONTROL},
    ]
    mounts = list(file_mounts) + [SCRATCH_VOLUME]
    if model.api_key is not None and credentials is not None:
        env.append({"name": "ROUTER_AUTH_FILE", "value": credentials.key_file(model.api_key.secret_key)})
        mounts.append({"name": API_KEY_VOLUME, "mountPath": credentials.mount_dir, "readOnly": True})
    return {
        "name": "admission",
        "image": admission.image,
        "command": command("admission"),
        "env": env,
        "ports": [{"name": "http", "containerPort": model.port, "protocol": "TCP"}],
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": ADMISSION_RESOURCES,
        **probes,
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 6},
        "volumeMounts": mounts,
    }
