"""The admission proxy's container in a router's pod (incluster/admission_proxy.py, run from the server's
programs ConfigMap in a plain pinned python image): on the server's port, in front of the router on the
pod's loopback."""

from __future__ import annotations

import json
from typing import Optional

from common.constants import API_KEY_VOLUME
from config.types import ModelCacheConfig, ModelServer
from engines.base import Admission, Credentials
from planning.capacity import RoomWait, ServerPlan
from planning.residency import ADMISSION_MEMORY_REQUEST

from .prefetch import ADMISSION_CONTROL, CONTROL_MOUNT, LIBRARY_STATUS, ROOM_STATUS, room_published
from .programs import PROGRAMS_DIR, command
from .security import CONTAINER_SECURITY, SCRATCH_VOLUME

# Mostly idle (asyncio, one process); the limit holds the request bodies held while their model is
# admitted (incluster/admission_proxy.py MAX_HELD_BYTES, 96 MiB together), the one JSON parse at a time
# and the connections' buffers: about 350 MiB at worst, measured by tests/test_incluster_proxy.py.
ADMISSION_RESOURCES = {"requests": {"cpu": "50m", "memory": ADMISSION_MEMORY_REQUEST},
                       "limits": {"cpu": "1", "memory": "512Mi"}}
# How long a server sharing a router's card waits for room before its init container exits to be restarted,
# saying why; and when the router's status is old enough that no proxy writes it any more: four of the keeper's
# 30 s rounds, which copy the proxy's (rewritten every 30 s, incluster/admission.py PIN_CHECK_SECONDS).
ROOM_WAIT_SECONDS = 900
ROOM_STALE_SECONDS = 150

def admission_container(model: ModelServer, admission: Admission, credentials: Optional[Credentials], probes: dict,
                        file_mounts: list[dict], writes_room: bool = False) -> dict:
    """The proxy, with the probes the server's port is checked by (``probes``: startup and readiness,
    answered through it by the server; liveness asks only whether the proxy accepts connections).
    ``file_mounts``: the server's config files (admission.json) and its programs. ``writes_room``: servers share
    the router's card and wait on its status (planning/capacity.py RoomWait)."""
    env = [
        {"name": "ADMISSION_PLAN_FILE", "value": admission.plan_file},
        {"name": "LISTEN_PORT", "value": str(model.port)},
        {"name": "ROUTER_URL", "value": f"http://127.0.0.1:{admission.server_port}"},
        {"name": "LIBRARY_STATUS", "value": LIBRARY_STATUS},
        {"name": "ADMISSION_CONTROL", "value": ADMISSION_CONTROL},
    ]
    mounts = list(file_mounts) + [SCRATCH_VOLUME, CONTROL_MOUNT]
    if writes_room:  # on the control volume; the keeper copies it to the model cache (room_published)
        env.append({"name": "ROOM_STATUS", "value": ROOM_STATUS})
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


def room_container(room: RoomWait, cache: ModelCacheConfig, mounts: list[dict]) -> dict:
    """The init container of a server sharing its card with a router: starts the pod once the router holds no
    more than the budget that leaves it room (incluster/room.py), as the router's keeper publishes it on the
    model cache both pods mount (read-only here). ``mounts``: the server's programs."""
    return {
        "name": "room",
        "image": room.image,
        "command": command("room"),
        "env": [
            {"name": "ROOM_STATUS", "value": room_published(cache, room.router_name)},
            {"name": "ROOM_BUDGET_FILE", "value": f"{PROGRAMS_DIR}/{ROOM_BUDGET_FILE}"},
            {"name": "ROOM_STALE_SECONDS", "value": str(ROOM_STALE_SECONDS)},
            {"name": "ROOM_WAIT_SECONDS", "value": str(ROOM_WAIT_SECONDS)},
        ],
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        "volumeMounts": [*mounts, {"name": "models", "mountPath": cache.mount_path, "readOnly": True}],
    }


# The router's budget the wait holds it to, a file of the server's programs ConfigMap beside room.py (read at the
# wait's start, not written into the pod: a neighbour's edit that changes the router's budget restarts no pod).
ROOM_BUDGET_FILE = "room.json"


def room_files(plan: ServerPlan) -> dict[str, str]:
    if plan.room is None:
        return {}
    return {ROOM_BUDGET_FILE: json.dumps({"router": plan.room.router_name,
                                          "router_budget_gib": plan.room.vram_budget_gib}) + "\n"}
