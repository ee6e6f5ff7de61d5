"""Workloads and claims: a Deployment's or StatefulSet's pods as far as a change's consequences go,
what becomes of a claim that exists before the edit, and the run's hints (the capacity plan's
budgets, the node pools' GPU slots)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

from common.constants import MODEL_SERVER_KINDS

# The annotation the model servers carry: seconds from pod start to ready on an empty cache
# (download + load), or the load only when an init container prefetches the weights.
from common.constants import COLD_START_ANNOTATION
from common.quantity import GIB, parse_quantity
from engines import weights_flags

from .provider import RegisteredLike, kind_of, object_id, unwrap_secrets
from .report import Entry

GPU_RESOURCE = re.compile(r"(^|[./])gpu([./]|$)")


def _bytes(text: Any) -> Optional[float]:
    """A Kubernetes quantity ("40Gi", "115.5Gi", "500M") in base units; None when unreadable."""
    try:
        return float(parse_quantity(str(text).strip()))
    except ValueError:
        return None


ClaimKey = tuple[str, str]  # (namespace, claim name)


@dataclass(frozen=True)
class WorkloadObject:
    """A rendered Deployment or StatefulSet (not the config's workload settings, config.types.Workload):
    its pods, as far as a change's consequences go."""

    resource: Any
    kind: str
    namespace: str
    name: str
    replicas: int
    strategy: str
    template: Mapping[str, Any]
    gpu: Mapping[str, float]
    shared_claims: tuple[str, ...]
    claim_templates: Mapping[str, Mapping[str, Any]]
    when_deleted: str
    when_scaled: str
    cold_start: Optional[int]

    @property
    def label(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    def weights_source(self) -> tuple[str, ...]:
        """What its pods download: the weights its engine's flags name, and the prefetch's repo and revision.
        When it changes, the weights on its claims are not the ones it needs."""
        pod = self.template.get("spec") or {}
        flags = weights_flags()
        found: list[str] = []
        for container in _all_containers(pod):
            args = [str(a) for a in (container.get("args") or []) + (container.get("command") or [])]
            for i, arg in enumerate(args[:-1]):
                if arg in flags:
                    found.append(f"{flags[arg]} {args[i + 1]}")
            env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}
            if env.get("HF_REPO"):
                found.append(f"{env['HF_REPO']}@{env.get('HF_REVISION') or 'main'}")
        return tuple(found)

    def claims(self) -> list[ClaimKey]:
        """Every claim its pods mount: the shared ones, then one per template per ordinal."""
        return [key for key, _ in self.claim_slots()]

    def claim_slots(self) -> list[tuple[ClaimKey, tuple[str, int]]]:
        """Each claim with the place it fills: ("shared", i) or ("ordinal", i)."""
        slots = [((self.namespace, c), ("shared", i)) for i, c in enumerate(self.shared_claims)]
        for template in self.claim_templates:
            slots += [((self.namespace, f"{template}-{self.name}-{i}"), ("ordinal", i)) for i in range(self.replicas)]
        return slots

    def gpu_total(self, resource: str) -> float:
        return self.gpu.get(resource, 0.0) * self.replicas

    def timeout(self, which: str) -> Optional[str]:
        return (getattr(self.resource, "custom_timeouts", None) or {}).get(which)


def _all_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A pod spec's containers in the order they run: init containers first."""
    return (pod.get("initContainers") or []) + (pod.get("containers") or [])


def _int(value: Any, default: int) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


def workload(resource: Optional[RegisteredLike]) -> Optional[WorkloadObject]:
    if resource is None or object_id(resource) is None or kind_of(resource) not in MODEL_SERVER_KINDS:
        return None
    inputs = unwrap_secrets(resource.inputs)
    kind = kind_of(resource)
    spec = inputs.get("spec") or {}
    template = spec.get("template") or {}
    pod = template.get("spec") or {}
    gpu: dict[str, float] = {}
    for container in pod.get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        for key, value in limits.items():
            if GPU_RESOURCE.search(key):
                gpu[key] = gpu.get(key, 0.0) + float(_bytes(value) or 0.0)
    shared = tuple(
        v["persistentVolumeClaim"]["claimName"]
        for v in pod.get("volumes") or []
        if isinstance(v.get("persistentVolumeClaim"), dict) and v["persistentVolumeClaim"].get("claimName")
    )
    templates = {
        (t.get("metadata") or {}).get("name", ""): t.get("spec") or {} for t in spec.get("volumeClaimTemplates") or []
    }
    if kind == "Deployment":
        strategy = (spec.get("strategy") or {}).get("type") or "RollingUpdate"
    else:
        strategy = (spec.get("updateStrategy") or {}).get("type") or "RollingUpdate"
    retention = spec.get("persistentVolumeClaimRetentionPolicy") or {}
    annotations = (inputs.get("metadata") or {}).get("annotations") or {}
    cold = annotations.get(COLD_START_ANNOTATION)
    obj = object_id(resource)
    if obj is None:  # a workload without metadata.name: nothing to say about its pods
        return None
    return WorkloadObject(
        resource=resource,
        kind=kind,
        namespace=obj.namespace,
        name=obj.name or resource.name,
        replicas=_int(spec.get("replicas"), 1),
        strategy=strategy,
        template=template,
        gpu=gpu,
        shared_claims=shared,
        claim_templates=templates,
        when_deleted=retention.get("whenDeleted") or "Retain",
        when_scaled=retention.get("whenScaled") or "Retain",
        cold_start=_int(cold, 0) if cold is not None else None,
    )


def _secret_names(template: Mapping[str, Any]) -> set[str]:
    pod = template.get("spec") or {}
    names: set[str] = set()
    for volume in pod.get("volumes") or []:
        if isinstance(volume.get("secret"), dict):
            names.add(volume["secret"].get("secretName", ""))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if isinstance(source.get("secret"), dict):
                names.add(source["secret"].get("name", ""))
    for container in _all_containers(pod):
        for env in container.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef")
            if isinstance(ref, dict):
                names.add(ref.get("name", ""))
        for source in container.get("envFrom") or []:
            if isinstance(source.get("secretRef"), dict):
                names.add(source["secretRef"].get("name", ""))
    return names - {""}


@dataclass(frozen=True)
class LibraryModel:
    """One model on demand as the plan exports it (capacity_plan.servers.<key>.residency.models.<name>)."""

    weights_gib: float
    source: str  # org/repo:TAG[@revision]
    pinned: bool
    # The plan's load estimate: from the page cache (a reload of the same weights) and off the volume.
    warm_seconds: Optional[float]
    cold_seconds: Optional[float]


@dataclass(frozen=True)
class ServerHint:
    weights_gib: Optional[float]
    download_seconds: Optional[int]
    load_seconds: Optional[int]
    key: Optional[str] = None  # models.<key> in the stack's config
    # A router's models on demand, by public name.
    library: Optional[dict[str, LibraryModel]] = None
    server: Optional[str] = None  # the server's name (its objects are named after it)
    # A router's VRAM budget (residency.vram_budget_gib): what its admission proxy lets it hold on the card.
    vram_budget_gib: Optional[float] = None
    # Shares a router's card and waits at start until the router holds at most this (capacity_plan ... .room).
    room_gib: Optional[float] = None


def _library(residency: Any) -> Optional[dict[str, LibraryModel]]:
    models = residency.get("models") if isinstance(residency, dict) else None
    if not isinstance(models, dict):
        return None
    def seconds(m: dict, which: str) -> Optional[float]:
        swap = m.get("swap_seconds")
        value = swap.get(which) if isinstance(swap, dict) else None
        return float(value) if isinstance(value, (int, float)) else None

    return {str(name): LibraryModel(float(m.get("weights_gib") or 0), str(m.get("source") or ""), bool(m.get("pinned")),
                                    seconds(m, "warm"), seconds(m, "cold"))
            for name, m in models.items() if isinstance(m, dict)}


def server_hints(run: Any) -> dict[str, ServerHint]:
    """Per workload name, from the exported capacity plan (``capacity_plan.servers``)."""
    plan = (getattr(run, "outputs", None) or {}).get("capacity_plan") or {}
    hints: dict[str, ServerHint] = {}
    servers = plan.get("servers") if isinstance(plan, dict) else None
    for key, server in (servers or {}).items():
        if not isinstance(server, dict) or not server.get("name"):
            continue
        budget = server.get("budget") or {}
        size = _bytes(server.get("weights", ""))
        # Plans from before workload.name existed name the workload after the server.
        hints[server.get("workload") or server["name"]] = ServerHint(
            weights_gib=round(size / GIB, 1) if size else None,
            download_seconds=_int(budget.get("download_seconds"), 0) if "download_seconds" in budget else None,
            load_seconds=_int(budget.get("load_seconds"), 0) if "load_seconds" in budget else None,
            key=str(key),
            library=_library(server.get("residency")),
            server=str(server["name"]),
            vram_budget_gib=_float((server.get("residency") or {}).get("vram_budget_gib")),
            room_gib=_float((server.get("room") or {}).get("vram_budget_gib")),
        )
    return hints


def _float(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class CardPlan:
    """One GPU as the plan fills it (capacity_plan.nodes[].gpus[])."""

    vram_gib: float
    workloads: dict[str, float]  # workload name -> planned VRAM GiB on this card


def card_plans(run: Any) -> dict[tuple[str, int, int], CardPlan]:
    """(pool, node, gpu) -> that card's plan, from the exported capacity plan."""
    plan = (getattr(run, "outputs", None) or {}).get("capacity_plan") or {}
    cards: dict[tuple[str, int, int], CardPlan] = {}
    for node in (plan.get("nodes") if isinstance(plan, dict) else None) or []:
        for gpu in (node.get("gpus") if isinstance(node, dict) else None) or []:
            size = _float(gpu.get("vram_gib")) if isinstance(gpu, dict) else None
            if size is None:
                continue
            workloads = {str(w): float(g) for w, g in (gpu.get("workloads") or {}).items() if _float(g) is not None}
            cards[(str(node.get("pool")), _int(node.get("node"), 0), _int(gpu.get("gpu"), 0))] = CardPlan(size, workloads)
    return cards


def gpu_slots(run: Any) -> dict[str, int]:
    """GPU resource -> how many the cluster advertises (nodes x GPUs per node x containers per
    GPU), from the stack config's node pools when the run carries it."""
    pools = getattr(getattr(run, "config", None), "node_pools", None) or {}
    slots: dict[str, int] = {}
    for pool in pools.values() if isinstance(pools, dict) else ():
        resource = getattr(pool, "gpu_resource", None)
        if resource:
            count = 1
            for attribute in ("nodes", "gpus_per_node", "gpu_shares"):
                count *= _int(getattr(pool, attribute, 1) or 1, 1)
            slots[resource] = slots.get(resource, 0) + count
    return slots


@dataclass
class _ClaimFate:
    fate: Literal["kept", "lost", "orphaned"]
    why: str
    source: str  # "pvc" or "template"
    managed_after: bool = False


def _pvc_fate(e: Entry) -> _ClaimFate:
    action = e.action
    if e.op in ("same", "update") or action.blocked:
        return _ClaimFate("kept", "", "pvc", managed_after=True)
    if e.op == "delete":
        if action.retained:
            return _ClaimFate("orphaned", "its resource is removed but retained (retainOnDelete)", "pvc")
        return _ClaimFate("lost", "its resource is removed and the claim deleted", "pvc")
    # replace
    if action.create_first:
        if action.retained:
            return _ClaimFate("orphaned", "replaced by a claim of another name or namespace; the old one is retained", "pvc")
        return _ClaimFate("lost", "replaced by a claim of another name or namespace; the old one is deleted at the end", "pvc")
    if action.retained:
        return _ClaimFate("kept", "the delete-first replacement skips the delete (retainOnDelete)", "pvc", managed_after=True)
    return _ClaimFate("lost", f"replaced delete-first ({', '.join(action.replace_paths)}): deleted, then created empty", "pvc")


def _template_claim_fate(e: Entry, old_set: WorkloadObject, template: str, ordinal: int, new_set: Optional[WorkloadObject]) -> _ClaimFate:
    replaced = e.op == "replace" and not e.action.blocked and not e.action.retained
    if replaced and old_set.when_deleted == "Delete":
        return _ClaimFate("lost", "its StatefulSet is deleted to be replaced and "
                          "persistentVolumeClaimRetentionPolicy.whenDeleted is Delete", "template")
    if new_set is not None and template in new_set.claim_templates and ordinal < new_set.replicas:
        return _ClaimFate("kept", "", "template", managed_after=True)
    if e.op == "delete" and e.action.retained:
        return _ClaimFate("kept", "its StatefulSet is retained and keeps running", "template")
    set_gone = new_set is None
    if set_gone and old_set.when_deleted == "Delete":
        return _ClaimFate("lost", "its StatefulSet goes and persistentVolumeClaimRetentionPolicy.whenDeleted is Delete", "template")
    if not set_gone and ordinal >= new_set.replicas and old_set.when_scaled == "Delete":
        return _ClaimFate("lost", "scaled down with persistentVolumeClaimRetentionPolicy.whenScaled Delete", "template")
    if set_gone:
        why = f"StatefulSet {old_set.namespace}/{old_set.name} goes; whenDeleted is Retain, so its claims stay"
    elif template not in new_set.claim_templates:
        why = f"the claim template {template!r} is gone from the StatefulSet"
    else:
        why = "scaled down; kept (whenScaled Retain) and re-used if it scales up again"
    return _ClaimFate("orphaned", why, "template")
