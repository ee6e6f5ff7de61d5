"""The downloaders' containers: a single-model server's prefetch init container (the weights into the
replica's claim before the engine starts: incluster/hub_download.py, or the user's own command), and a
router's init container and keeper (incluster/library.py); each run from the server's programs
ConfigMap in a plain pinned python image."""

from __future__ import annotations

from typing import Optional

from common.constants import API_KEY_VOLUME
from config.types import ModelCacheConfig, ModelServer
from engines.base import Credentials, Library
from planning.residency import KEEPER_MEMORY_REQUEST

from .programs import command
from .security import CONTAINER_SECURITY, HF_CACHE, HF_HOME_DIR, SCRATCH, SCRATCH_VOLUME

# Init and sidecar containers get requests and limits too: an unbounded init container can
# still OOM the node while 100 GiB of weights stream through the page cache.
PREFETCH_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
# A router's keeper idles between checks (~20 MiB of Python); the limit is the prefetch's, for the
# weights a new model streams through the page cache.
KEEPER_RESOURCES = {"requests": {"cpu": "10m", "memory": KEEPER_MEMORY_REQUEST}, "limits": PREFETCH_RESOURCES["limits"]}
# How often the keeper looks at its mounted ConfigMap (the kubelet itself refreshes it every ~60 s).
KEEP_SECONDS = 30
# How long the keeper waits for the requests in flight on a model it is about to reload (new settings, new
# weights, dropped) before reloading anyway: a long completion on a CPU runs for minutes; meanwhile new
# requests for that model alone get a 503 the gateway retries on its next tier. Past it, one still running is cut.
DRAIN_SECONDS = 600
HEARTBEAT = f"{SCRATCH}/keeper-heartbeat"
# Which listed models are served and why the others are not, on the pod's scratch volume: written by the
# init container and the keeper, read by the admission proxy for its /metrics.
LIBRARY_STATUS = f"{SCRATCH}/library-status.json"
# A volume of the router's pod that only the admission proxy and the keeper mount (not the router, whose children
# run model code): the proxy's control socket and its room status, which nothing else may reach or write.
CONTROL_DIR = "/var/run/inference-plane"
CONTROL_VOLUME = {"name": "control", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
CONTROL_MOUNT = {"name": "control", "mountPath": CONTROL_DIR}
# A GPU router's status for the servers sharing its card (incluster/room.py reads it): the admission proxy
# writes it on the control volume and the keeper copies it to the model cache, in a folder of its own (the
# proxy, which faces the network, never writes the cache).
ROOM_STATUS = f"{CONTROL_DIR}/room-status.json"
ROOM_DIR = ".inference-plane-room"


def room_published(cache: ModelCacheConfig, router_name: str) -> str:
    return f"{cache.mount_path}/{ROOM_DIR}/{router_name}.json"


# The admission proxy's control socket, on the control volume the proxy and the keeper share: the keeper drains
# a model there before the router reloads it (incluster/admission_proxy.py Control); no port, and no other
# container of the pod mounts it.
ADMISSION_CONTROL = f"{CONTROL_DIR}/admission.sock"


def hub_token_env(cache: ModelCacheConfig) -> list[dict]:
    """HF_TOKEN from the user's Secret, for a container that downloads (read by llama.cpp, hub_download.py
    and library.py alike); nothing without model_cache.hub_token."""
    token = cache.hub_token
    if token is None:
        return []
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": token.secret_name, "key": token.secret_key}}}]


def prefetch_container(model: ModelServer, cache: ModelCacheConfig, program_mounts: list[dict],
                       planned_bytes: Optional[int] = None) -> dict:
    """``planned_bytes``: what the plan counted for the download; the built-in downloader fetches nothing of a
    repo whose files are larger (incluster/hub_download.py), so the pod does not start on a size the plan
    never saw."""
    prefetch = model.prefetch
    if prefetch is None:
        raise ValueError(f"{model.name}: no prefetch settings")
    return {
        "name": "prefetch",
        "image": prefetch.image,
        "command": list(prefetch.command) if prefetch.command else command("prefetch"),
        "env": [
            {"name": "HF_REPO", "value": prefetch.repo},
            {"name": "HF_REVISION", "value": prefetch.revision},
            {"name": "HOME", "value": HF_HOME_DIR},
            # The same cache as the engine reads (see _cache_mount), never derived from XDG_CACHE_HOME.
            {"name": "HF_HOME", "value": HF_CACHE},
            *([{"name": "PLANNED_BYTES", "value": str(planned_bytes)}] if planned_bytes and not prefetch.command else []),
            *hub_token_env(cache),
        ],
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": PREFETCH_RESOURCES,
        "volumeMounts": [{"name": "weights", "mountPath": HF_CACHE}, SCRATCH_VOLUME,
                         *([] if prefetch.command else program_mounts)],
    }


def _library_env(library: Library, cache: ModelCacheConfig) -> list[dict]:
    return [
        {"name": "HF_LIBRARY", "value": library.list_file},
        # The engines' LLAMA_CACHE on this volume: the blobs are shared with single-model servers.
        {"name": "HUB_CACHE", "value": cache.mount_path},
        {"name": "LIBRARY_DIR", "value": library.folder},
        {"name": "PRESET", "value": library.preset_file},
        {"name": "SERVED_PRESET", "value": library.served_preset},
        {"name": "HOME", "value": SCRATCH},
        {"name": "HEARTBEAT", "value": HEARTBEAT},
        {"name": "LIBRARY_STATUS", "value": LIBRARY_STATUS},
        *hub_token_env(cache),
    ]


def library_container(model: ModelServer, library: Library, cache: ModelCacheConfig, file_mounts: list[dict]) -> dict:
    """A router's init container: every model it may load fetched before it starts, into the shared
    cache's hub layout and linked into the router's own folder (incluster/library.py, library mode). A
    model fetched at its first request would hold that request for the whole download (tens of
    minutes for a 20 GiB model); a wrong hf_repo would show up only then."""
    return {
        "name": "prefetch",
        "image": library.image,
        "command": command("library"),
        "env": _library_env(library, cache),
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": PREFETCH_RESOURCES,
        "volumeMounts": [{"name": "models", "mountPath": cache.mount_path}, *file_mounts, SCRATCH_VOLUME],
    }


def library_keeper(model: ModelServer, library: Library, credentials: Optional[Credentials], cache: ModelCacheConfig,
                   file_mounts: list[dict], server_port: int, drains: bool = False, publishes_room: bool = False) -> dict:
    """A router's sidecar (incluster/library.py, keeper mode): applies a changed library or preset without a
    restart: fetches new models, removes dropped ones, then has the router re-read its preset."""
    env = _library_env(library, cache) + [
        {"name": "KEEP_SECONDS", "value": str(KEEP_SECONDS)},
        # Over the pod's loopback: the server itself (behind any admission proxy), with its own key.
        {"name": "RELOAD_URL", "value": f"http://127.0.0.1:{server_port}{library.reload_path}"},
        # Behind an admission proxy: each model a reload touches is drained there first.
        *([{"name": "ADMISSION_CONTROL", "value": ADMISSION_CONTROL},
           {"name": "DRAIN_SECONDS", "value": str(DRAIN_SECONDS)}] if drains else []),
        # The proxy's status for the servers sharing the card, copied where they read it.
        *([{"name": "ROOM_STATUS", "value": ROOM_STATUS},
           {"name": "ROOM_PUBLISH", "value": room_published(cache, model.name)}] if publishes_room else []),
    ]
    mounts = [{"name": "models", "mountPath": cache.mount_path}, *file_mounts, SCRATCH_VOLUME,
              *([CONTROL_MOUNT] if drains else [])]
    if model.api_key is not None and credentials is not None:
        env.append({"name": "ROUTER_AUTH_FILE", "value": credentials.key_file(model.api_key.secret_key)})
        mounts.append({"name": API_KEY_VOLUME, "mountPath": credentials.mount_dir, "readOnly": True})
    # The heartbeat is written by a thread while the keeper's main thread lives (a download may take
    # an hour; the probe asks whether the process runs, not whether it is idle).
    beat = {"exec": {"command": [*command("library"), "alive"]}, "periodSeconds": 2 * KEEP_SECONDS, "timeoutSeconds": 10}
    return {
        "name": "library",
        "image": library.image,
        "command": command("library"),
        "env": env,
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": KEEPER_RESOURCES,
        "readinessProbe": beat,
        "livenessProbe": {**beat, "failureThreshold": 3},
        "volumeMounts": mounts,
    }
