"""The pod of a model server: its container, probes sized for a cold start, where the weights
are mounted, the optional prefetch init container, and the security every container gets."""

from __future__ import annotations

import functools
import hashlib

from common.constants import API_KEY_VOLUME, OFFLINE_SECRET_PLACEHOLDER
from common.quantity import parse_quantity
from config.types import ModelCacheConfig, ModelServer, NodePool
from engines import ServerBuild
from planning.capacity import ServerPlan

from .admission_proxy import admission_container, room_container
from .meta import selector
from .prefetch import CONTROL_VOLUME, hub_token_env, library_container, library_keeper, prefetch_container
from .rpc import split_affinity, wait_container
from .programs import PROGRAMS_DIR, volume_items
from .security import (CONTAINER_SECURITY, HF_CACHE, HF_HOME_DIR, SCRATCH_EMPTY_DIR, SCRATCH_ENV, SCRATCH_VOLUME,
                       pod_security, pool_nodes)

KEY_FINGERPRINT_ANNOTATION = "inference-plane/api-key-fingerprint"


@functools.lru_cache(maxsize=256)
def key_fingerprint(key: str) -> str:
    """scrypt (~50 ms, on purpose: the annotation is readable, the key may be weak); computed once per
    distinct key in a run. The offline render's placeholder has no key to fingerprint: a rendered
    folder says so, and a GitOps user restarts the server when rotating (docs/day-2.md)."""
    if key == OFFLINE_SECRET_PLACEHOLDER:
        return "offline-render"
    return hashlib.scrypt(key.encode(), salt=b"inference-plane/api-key", n=2**14, r=8, p=1, dklen=8).hex()


def _probe(path: str, period: int, **extra: int) -> dict:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, **extra}


def _loopback_probe(path: str, port: int, period: int, **extra: int) -> dict:
    """A server behind an admission proxy listens only on the pod's loopback, which the kubelet's HTTP
    probes cannot reach: curl inside its container (llama.cpp's server images carry it for their own
    HEALTHCHECK, .devops/*.Dockerfile)."""
    return {"exec": {"command": ["curl", "-fsS", "-o", "/dev/null", "--max-time", str(extra.get("timeoutSeconds", 5)),
                                 f"http://127.0.0.1:{port}{path}"]}, "periodSeconds": period, **extra}


def _cache_mount(model: ModelServer, cache: ModelCacheConfig, built: ServerBuild) -> tuple[dict, list[dict]]:
    """Where the weights live for this server: its volume mount and environment."""
    if model.workload.cache_volume is not None:
        # Prefetched into a claim per replica at the default Hugging Face cache path; the engine
        # itself never downloads (HF_HUB_OFFLINE) and makes no outbound connections.
        # HF_HOME explicitly: huggingface_hub derives it from XDG_CACHE_HOME when unset, and
        # XDG_CACHE_HOME points at the scratch volume (SCRATCH_ENV), where no weights are.
        env = [{"name": "HOME", "value": HF_HOME_DIR}, {"name": "HF_HOME", "value": HF_CACHE},
               {"name": "HF_HUB_OFFLINE", "value": "1"}]
        return {"name": "weights", "mountPath": HF_CACHE}, env
    # The engine's own downloader caches on the shared volume: the download is a one-time cost. A
    # router downloads nothing itself (its init container and keeper do).
    token = hub_token_env(cache) if built.downloads_weights else []
    return {"name": "models", "mountPath": cache.mount_path}, built.cache_env + token


# The engine's config files of a server, by mount folder: {file name: content} (ServerBuild.files).
ConfigFiles = dict[str, dict[str, str]]


def config_map_name(server: str) -> str:
    """The ConfigMap of a server's files (a router's preset and library), named after the server."""
    return f"{server}-files"


def programs_config_map_name(model: ModelServer) -> str:
    return f"{model.name}-programs"


PROGRAMS_MOUNT = {"name": "programs", "mountPath": PROGRAMS_DIR, "readOnly": True}


def pod_programs(model: ModelServer, built: ServerBuild, plan: ServerPlan) -> tuple[str, ...]:
    """The in-cluster programs the pod runs (components/programs.py PROGRAMS)."""
    names = ["room"] if plan.room is not None else []
    if plan.split is not None:
        names.append("rpc_wait")
    if built.admission is not None:
        names.append("admission")
    if model.prefetch is not None:
        if not model.prefetch.command:
            names.append("prefetch")
    elif built.library is not None:
        names.append("library")
    return tuple(names)


def files_mounts(files: ConfigFiles) -> list[dict]:
    return [{"name": f"files-{index}", "mountPath": folder, "readOnly": True} for index, folder in enumerate(files)]


def container_spec(model: ModelServer, pool: NodePool, cache: ModelCacheConfig, plan: ServerPlan,
                   built: ServerBuild) -> dict:
    requests: dict[str, str] = {"cpu": model.resources.cpu_request, "memory": plan.memory_request}
    limits: dict[str, str] = {"cpu": model.resources.cpu_limit, "memory": plan.memory_limit}
    if model.uses_gpu(pool):
        requests[pool.gpu_resource] = limits[pool.gpu_resource] = str(model.gpus)
    mount, env = _cache_mount(model, cache, built)
    env = env + SCRATCH_ENV
    mounts = [mount, SCRATCH_VOLUME]
    credentials = built.credentials
    if model.api_key is not None and credentials is not None:
        mounts.append({"name": API_KEY_VOLUME, "mountPath": credentials.mount_dir, "readOnly": True})
    env += built.env
    mounts += files_mounts(built.files)
    health = built.health_path
    admission = built.admission
    probe = _probe if admission is None else (
        lambda path, period, **extra: _loopback_probe(path, admission.server_port, period, **extra))
    return {
        "name": model.name,
        "image": model.image,
        "args": list(built.args),
        "env": env,
        **({"ports": [{"name": "http", "containerPort": model.port, "protocol": "TCP"}]} if admission is None else {}),
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": {"requests": requests, "limits": limits},
        **server_probes(probe, health, plan),
        # Generous: a long prompt keeps the server busy, and a restart costs a full model load.
        "livenessProbe": probe(health, 30, timeoutSeconds=10, failureThreshold=6),
        "volumeMounts": mounts,
    }


def server_probes(probe, health: str, plan: ServerPlan) -> dict:
    budget = plan.budget
    return {
        # Sized for a cold start: the download (unless prefetched) plus the load; then liveness.
        "startupProbe": probe(health, budget.probe_period_seconds, failureThreshold=budget.probe_failure_threshold),
        # 5 s, not the 1 s default: with every core computing (threads = the CPU limit) the HTTP
        # thread can answer /health late, and a flapping readiness drops the only replica.
        "readinessProbe": probe(health, budget.probe_period_seconds, timeoutSeconds=5),
    }


def pod_spec(model: ModelServer, pool: NodePool, cache: ModelCacheConfig, plan: ServerPlan, built: ServerBuild,
             programs: dict[str, str]) -> dict:
    """The pod; ``built`` is the server as its engine builds it (its files mounted from the server's
    ConfigMap), and ``programs`` the files of the in-cluster programs it runs (by path, mounted from its
    programs ConfigMap), each computed once by the component that also writes the ConfigMaps."""
    files = built.files
    security = pod_security(pool.supplemental_groups)
    volumes: list[dict] = []
    if model.workload.cache_volume is None:
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": cache.claim_name}})
    if model.api_key is not None:
        volumes.append(
            {"name": API_KEY_VOLUME, "secret": {"secretName": model.api_key.secret_name, "defaultMode": 0o440}}
        )
    spec: dict = {
        # The server never talks to the API server.
        "automountServiceAccountToken": False,
        # Service links put <SERVICE>_PORT variables into the environment, and llama-server reads
        # LLAMA_ARG_* variables as flags: keep the environment to what is set here.
        "enableServiceLinks": False,
        "securityContext": security,
        "containers": [container_spec(model, pool, cache, plan, built)],
    }
    admission = built.admission
    if admission is not None:
        # The pod's port answers through the proxy: the server's readiness, as the Service sees it.
        spec["containers"].append(admission_container(model, admission, built.credentials,
                                                      server_probes(_probe, built.health_path, plan),
                                                      files_mounts(files) + [PROGRAMS_MOUNT], plan.room_status))
    library = built.library
    if model.prefetch is not None:
        spec["initContainers"] = [prefetch_container(model, cache, [PROGRAMS_MOUNT],
                                                     int(float(parse_quantity(plan.weights))))]
    elif library is not None:
        mounts = files_mounts(files) + [PROGRAMS_MOUNT]
        spec["initContainers"] = [library_container(model, library, cache, mounts)]
        spec["containers"].append(library_keeper(model, library, built.credentials, cache, mounts,
                                                 admission.server_port if admission is not None else model.port,
                                                 drains=admission is not None, publishes_room=plan.room_status))
    if plan.split is not None:
        # First: llama-server aborts at start when a helper does not answer (components/rpc.py).
        spec["initContainers"] = [wait_container(model, plan, [PROGRAMS_MOUNT]), *spec.get("initContainers", [])]
    if plan.room is not None:
        # First: nothing of the server starts before the router sharing its card has made room.
        spec["initContainers"] = [room_container(plan.room, cache, [PROGRAMS_MOUNT]), *spec.get("initContainers", [])]
    for index, folder in enumerate(files.values()):
        # Whole files, never subPath: the kubelet then updates them in place when the ConfigMap changes.
        volumes.append({"name": f"files-{index}", "configMap": {
            "name": config_map_name(model.name), "items": [{"key": name, "path": name} for name in folder]}})
    if programs:
        # Whole files too: the kubelet updates them in place; what runs changes with a restart, which the
        # template's programs annotation brings when their code changes (components/programs.py).
        volumes.append({"name": "programs", "configMap": {
            "name": programs_config_map_name(model), "items": volume_items(programs), "defaultMode": 0o444}})
    volumes.append(dict(SCRATCH_EMPTY_DIR))
    if admission is not None:
        volumes.append(dict(CONTROL_VOLUME))
    spec["volumes"] = volumes
    if pool.runtime_class and model.uses_gpu(pool):
        # The NVIDIA container runtime is not every node's default (k3s, RKE2): without the class the
        # container starts without the driver's libraries and falls back to the CPU.
        spec["runtimeClassName"] = pool.runtime_class
    nodes = pool_nodes(pool, model.rpc.node if model.rpc is not None and plan.split is not None else None)
    if nodes:
        spec["nodeSelector"] = nodes
    if plan.split is not None:
        # The main server and its helpers each on a node of their own: the plan gave each a node's memory.
        spec["affinity"] = split_affinity(model.name)
    elif model.workload.one_per_node:
        # One engine per node: two would fight over one GPU and one pool of unified memory.
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": selector(model.name)}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        }
    return spec
