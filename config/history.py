"""What the last update of this stack applied, against what this run would apply: the edits that
Pulumi and the API server would turn into a wedge or a silent no-op are refused or said here,
before anything is registered.

The program exports ``snapshot(stack)`` as the plain stack output ``history`` (names, pools,
claim sizes: nothing secret) and reads it back on the next run (``plane.previous_history``).
Offline (render) and on a stack's first update there is none, and nothing is compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from common.constants import NODE_LOCAL_CLASSES
from common.quantity import parse_quantity

from .types import ModelServer, Problem, StackConfig

HISTORY_VERSION = 1
# (setting, its default before the k3s defaults, what that default did, the line that keeps it).
FORMER_DEFAULTS = (
    ("cluster.cni", "cilium", "CiliumNetworkPolicy, the model hub reached by name only", "cni: cilium"),
    ("cluster.ingress.namespace", "ingress", "the ingress controller admitted from namespace ingress",
     "ingress: {namespace: ingress}"),
    ("cluster.monitoring", "namespace monitoring", "scrapes, alerts and the scrapers admitted",
     "monitoring: {namespace: monitoring}"),
    ("cluster.storage", "namespace rook-ceph", "egress to the storage daemons in rook-ceph",
     "storage: {namespace: rook-ceph}"),
    ("model_cache.access_mode", "ReadWriteMany", "a claim every node mounts", "access_mode: ReadWriteMany"),
)


def snapshot(stack: StackConfig, vram_gib: Optional[Mapping[str, float]] = None) -> dict[str, Any]:
    """The facts of this update that a later edit must be compared with; ``vram_gib``: each server's planned VRAM
    per replica on its card (the plan's), which a router beside it may take only once the server is gone."""
    servers = {}
    for key, model in stack.models.items():
        volume = model.workload.cache_volume
        servers[key] = {
            "name": model.name,
            "workload": model.workload_name,
            "kind": model.workload.kind,
            "node_pool": model.node_pool,
            "replicas": model.workload.replicas,
            "cache_volume": {"storage_class": volume.storage_class, "size": volume.size} if volume else None,
            "router": model.on_demand is not None,
            "vram_gib": (vram_gib or {}).get(key),
        }
    cache = stack.model_cache
    return {
        "version": HISTORY_VERSION,
        "settings": {setting: _now(stack, setting) for setting, *_ in FORMER_DEFAULTS},
        "servers": servers,
        "model_cache": {"claim_name": cache.claim_name, "storage_class": cache.storage_class, "size": cache.size},
    }


@dataclass
class HistoryVerdict:
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # models key now -> the key the same server had in the last update (its resources' old name).
    renamed_keys: dict[str, str] = field(default_factory=dict)
    # node pool -> (server name, VRAM GiB) of GPU servers the last update ran there and this one removes: their
    # pods hold the card until the update deletes them (at its end), so a router in that pool does not take
    # their memory in this update (planning/capacity.py), only in the next.
    leaving: dict[str, list[tuple[str, float]]] = field(default_factory=dict)


def _count(number: Any, noun: str) -> str:
    """Numbers come back from the engine's outputs as floats (protobuf Struct): 2.0 replicas."""
    count = int(number)
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _same_size(a: str, b: str) -> bool:
    return parse_quantity(a) == parse_quantity(b)


def compare(previous: Optional[dict[str, Any]], stack: StackConfig) -> HistoryVerdict:
    verdict = HistoryVerdict()
    if not isinstance(previous, dict) or previous.get("version") != HISTORY_VERSION:
        return verdict
    verdict.warnings += _defaults_moved(previous.get("settings"), stack)
    before: dict[str, dict] = previous.get("servers") or {}
    for key, model in stack.models.items():
        old_key = key if key in before else _renamed_from(key, model, before, stack)
        if old_key is None:
            continue  # a new server
        if old_key != key:
            # Its resources are registered under the old key as an alias: the same objects, no
            # create that would collide with them (AlreadyExists) nor a second pod for one GPU.
            verdict.renamed_keys[key] = old_key
        _server(verdict, key, model, before[old_key], stack)
    _leaving(verdict, before, stack)
    _model_cache(verdict, previous.get("model_cache") or {}, stack)
    return verdict


def _leaving(verdict: HistoryVerdict, before: dict[str, dict], stack: StackConfig) -> None:
    """GPU servers of the last update gone from a pool where a router runs now (removed, or moved to another
    pool): recorded in ``verdict.leaving``."""
    routed = {m.node_pool for m in stack.models.values() if m.on_demand is not None}
    kept = set(verdict.renamed_keys.values()) | set(stack.models)
    for old_key, old in before.items():
        vram, pool = old.get("vram_gib"), old.get("node_pool")
        if "vram_gib" not in old and pool in routed and old_key not in kept:
            # A history from before it recorded VRAM: what the server held is not known, so it is not kept.
            verdict.warnings.append(
                f"models.{old_key}: {old.get('name')} leaves node pool {pool} in this update, beside a router, and the "
                "last update's history (an older release) does not say how much VRAM its pods hold until the update "
                "deletes them: the router may take that memory first. Safer: remove it alone in this update and "
                "grow the library in the next")
            continue
        if old.get("router") or not isinstance(vram, (int, float)) or not vram or pool not in routed:
            continue
        now = stack.models.get(old_key) or next((m for k, m in stack.models.items()
                                                  if verdict.renamed_keys.get(k) == old_key), None)
        if old_key in kept and now is not None and now.node_pool == pool:
            continue
        verdict.leaving.setdefault(pool, []).append((str(old.get("name")), float(vram)))


def _renamed_from(key: str, model: ModelServer, before: dict[str, dict], stack: StackConfig) -> Optional[str]:
    """A key that is gone and whose server had this server's Kubernetes name: the same server."""
    for old_key, old in before.items():
        if old_key not in stack.models and old.get("name") == model.name:
            return old_key
    return None


def _server(verdict: HistoryVerdict, key: str, model: ModelServer, old: dict, stack: StackConfig) -> None:
    path = f"models.{key}"
    volume = model.workload.cache_volume
    old_volume = old.get("cache_volume")
    per_replica_claims = old.get("kind") == "StatefulSet" and old_volume is not None
    if per_replica_claims and model.workload.kind == "StatefulSet" and old.get("workload") != model.workload_name \
            and model.workload.name is None:
        verdict.problems.append((
            f"{path}.name",
            f"renaming {old['name']} to {model.name} renames StatefulSet {old['workload']} and its claims, so "
            f"{_count(old.get('replicas', 1), 'replica')} fetch their weights again with every replica down; to keep the "
            f"weights add {path}.workload.name: {old['workload']} (the Service and pods take the new name), or set "
            f"{path}.workload.name: {model.name} to rename and download again",
        ))
    pinned = _node_local_claims(model, old, stack) if old.get("node_pool") != model.node_pool else None
    if pinned is not None:
        claims, storage_class = pinned
        verdict.problems.append((
            f"{path}.node_pool",
            f"moving {model.name} from {old['node_pool']} to {model.node_pool}: {claims} pinned to "
            f"{old['node_pool']}'s nodes ({storage_class} volumes carry required node affinity), so "
            f"its pods would stay Pending and every pulumi up fail at its timeout; keep node_pool: "
            f"{old['node_pool']}, or delete those claims first (their weights are fetched again)",
        ))
    if per_replica_claims and volume is not None and model.workload_name == old.get("workload"):
        changed = []
        if old_volume["storage_class"] != volume.storage_class:
            changed.append(f"storage_class {old_volume['storage_class']} -> {volume.storage_class}")
        if not _same_size(old_volume["size"], volume.size):
            changed.append(f"size {old_volume['size']} -> {volume.size}")
        if changed:
            verdict.warnings.append(
                f"{path}.workload.cache_volume: {', '.join(changed)} is not applied: a StatefulSet's claim template "
                f"cannot change, so the program leaves it and {old['workload']}'s claims keep "
                f"{old_volume['storage_class']} {old_volume['size']}; to apply it, give the StatefulSet new claims "
                f"(set {path}.workload.name to a new name: weights are fetched again), or resize each claim by hand "
                "where its class allows expansion"
            )


def _node_local_claims(model: ModelServer, old: dict, stack: StackConfig) -> Optional[tuple[str, str]]:
    """The server's claims that are pinned to its old nodes, as (which claims are, their class)."""
    old_volume = old.get("cache_volume")
    if old.get("kind") == "StatefulSet" and old_volume and old_volume.get("storage_class") in NODE_LOCAL_CLASSES:
        return f"its per-replica claims of StatefulSet {old['workload']} are", old_volume["storage_class"]
    if model.workload.cache_volume is None and stack.model_cache.storage_class in NODE_LOCAL_CLASSES:
        return f"the shared claim {stack.model_cache.claim_name} is", stack.model_cache.storage_class
    return None


def _model_cache(verdict: HistoryVerdict, old: dict, stack: StackConfig) -> None:
    cache = stack.model_cache
    if old.get("claim_name") != cache.claim_name:
        return  # a new claim: created with this size and class
    if old.get("size") and not _same_size(old["size"], cache.size):
        grow = parse_quantity(cache.size) > parse_quantity(old["size"])
        if not grow:
            why = "the API server refuses to shrink a claim"
        elif cache.storage_class in NODE_LOCAL_CLASSES:
            why = f"{cache.storage_class} volumes cannot grow (their StorageClass has no volume expansion)"
        else:
            why = ""
        if why:
            verdict.problems.append((
                "model_cache.size",
                f"{old['size']} -> {cache.size}: {why}, so the resize is refused and every later pulumi up fails; keep "
                f"size: {old['size']}, or give model_cache.claim_name a new name for a new claim of {cache.size} "
                "(its weights are fetched again)",
            ))
    if old.get("storage_class") and old["storage_class"] != cache.storage_class:
        verdict.warnings.append(
            f"model_cache.storage_class {old['storage_class']} -> {cache.storage_class} is not applied: a claim's class "
            f"cannot change, so the program leaves claim {cache.claim_name} on {old['storage_class']}; to move the "
            "weights, give model_cache.claim_name a new name (a new claim on the new class; weights fetched again)"
        )


def _left_out(stack: StackConfig, setting: str) -> bool:
    """Whether the stack file leaves this setting to its default."""
    parts = setting.split(".")
    owner: Any = stack
    for part in parts[:-1]:
        if part not in owner.model_fields_set:
            return True
        owner = getattr(owner, part)
        if owner is None:
            return False
    return parts[-1] not in owner.model_fields_set


def _defaults_moved(settings: Any, stack: StackConfig) -> list[str]:
    """A setting this stack leaves out whose default is not what the last update ran with: the
    defaults became k3s' (the change preview shows the objects that change)."""
    warnings = []
    for setting, former, meant, line in FORMER_DEFAULTS:
        if not _left_out(stack, setting):
            continue
        now = _now(stack, setting)
        if isinstance(settings, dict):
            if setting in settings and settings[setting] != now:
                warnings.append(f"{setting} is not set, so it is now the k3s default ({now}); the last update ran with "
                                f"{settings[setting]}; to keep that, set it ({line}), else this update changes it")
        else:  # a history from before the k3s defaults: what it ran with is not recorded
            warnings.append(f"{setting} is not set: releases before the k3s defaults made that {former} ({meant}); it "
                            f"is now {now}; if the last update left it out too, set it to keep what runs ({line})")
    return warnings


def _now(stack: StackConfig, setting: str) -> str:
    value: Any = stack
    for part in setting.split("."):
        value = getattr(value, part) if value is not None else None
    return "none" if value is None else str(getattr(value, "namespace", value))
