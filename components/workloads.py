"""The two ways a model server's pods run, each with its own builder:

- a Deployment on the shared cache (weights downloaded once for every replica), Recreate;
- a StatefulSet with a claim per replica (prefetched weights beside the engine), Parallel.

Both are replaced delete-first when a change forces replacement: the capacity plan counts one
copy of each server, and a create-first copy would wait for the GPU and memory the old one holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional
import pulumi
import pulumi_kubernetes as k8s

from config.types import ModelServer
from planning.startup import StartupBudget, rollout_waits

from .meta import labels, selector

CLAIM_TEMPLATE = "weights"


@dataclass(frozen=True)
class WorkloadParts:
    """What a builder is given: the object's metadata, the pod template, and what it waits on."""

    name: str  # the Pulumi resource name
    model: ModelServer
    metadata: dict
    service_metadata: dict
    template: dict
    budget: StartupBudget
    depends_on: list[pulumi.Resource]
    parent: pulumi.Resource


def _service_spec(model: ModelServer, headless: bool) -> dict:
    spec: dict = {
        "type": "ClusterIP",
        "selector": selector(model.name),
        "ports": [{"name": "http", "port": model.port, "targetPort": "http", "protocol": "TCP"}],
    }
    if headless:
        spec["clusterIP"] = "None"
    return spec


def _options(parts: WorkloadParts, depends_on: list, ignore: Optional[list[str]] = None) -> pulumi.ResourceOptions:
    """What every model server's workload is registered with: Pulumi waits out the rollout's budget,
    and a forced replacement deletes first (see the module docstring)."""
    model = parts.model
    create, update = rollout_waits(parts.budget, model.workload.kind, model.workload.replicas)
    return pulumi.ResourceOptions(
        parent=parts.parent,
        depends_on=depends_on,
        custom_timeouts=pulumi.CustomTimeouts(create=f"{create}s", update=f"{update}s"),
        delete_before_replace=True,
        ignore_changes=ignore or None,
    )


def deployment(parts: WorkloadParts) -> tuple[k8s.apps.v1.Deployment, k8s.core.v1.Service]:
    model, budget = parts.model, parts.budget
    spec = {
        "replicas": model.workload.replicas,
        # A rolling update would load a second copy of the weights onto the same GPU and into the
        # same node's memory before releasing the first.
        "strategy": {"type": "Recreate"},
        # Kubernetes' default of 600 s would mark a cold start ProgressDeadlineExceeded, which
        # GitOps health checks report as failure while the model still downloads.
        "progressDeadlineSeconds": budget.wait_seconds,
        "selector": {"matchLabels": selector(model.name)},
        "template": parts.template,
    }
    # Pulumi's default 10-minute wait would fail a cold start: wait out the whole budget. Replicas
    # share the cache, so one download serves them all.
    workload = k8s.apps.v1.Deployment(parts.name, metadata=parts.metadata, spec=spec, opts=_options(parts, parts.depends_on))
    # Created once the Deployment is ready: a Service created alongside would run its own
    # 10-minute clock waiting for endpoints while the model downloads.
    service = k8s.core.v1.Service(
        f"{parts.name}-svc",
        metadata=parts.service_metadata,
        spec=_service_spec(model, headless=False),
        opts=pulumi.ResourceOptions(parent=parts.parent, depends_on=[workload]),
    )
    return workload, service


def statefulset(parts: WorkloadParts) -> tuple[k8s.apps.v1.StatefulSet, k8s.core.v1.Service]:
    model = parts.model
    # Headless: the gateway resolves every ready pod. Created first, so the StatefulSet's
    # serviceName exists (and a headless Service has no await).
    service = k8s.core.v1.Service(
        f"{parts.name}-svc",
        metadata=parts.service_metadata,
        spec=_service_spec(model, headless=True),
        opts=pulumi.ResourceOptions(parent=parts.parent),
    )
    spec: dict = {
        "replicas": model.workload.replicas,
        "serviceName": model.name,
        "selector": {"matchLabels": selector(model.name)},
        # All replicas start (and download) at once: OrderedReady would make the second wait out
        # the first one's hour-long cold start.
        "podManagementPolicy": "Parallel",
        "template": parts.template,
    }
    ignore: list[str] = []
    volume = model.workload.cache_volume
    if volume is not None:
        spec["volumeClaimTemplates"] = [
            {
                "metadata": {"name": CLAIM_TEMPLATE, "labels": labels(model.workload_name, "model-cache")},
                "spec": {
                    # Node-local: the weights live beside the engine that reads them.
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": volume.storage_class,
                    "resources": {"requests": {"storage": volume.size}},
                },
            }
        ]
        # Keep the prefetched weights when the StatefulSet is deleted or scaled down.
        spec["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Retain", "whenScaled": "Retain"}
        # Any change to a claim template forces the StatefulSet's replacement (the field is
        # immutable): both replicas down at once, and the new size still not applied to the
        # existing claims. The template is fixed at creation; resize the claims themselves
        # (docs/day-2.md: "Changing a running stack"). The element, not the list: when the template is
        # added or removed (a path only one side has), Pulumi keeps the program's value and the
        # StatefulSet is replaced with it; ignoring the whole list would drop an added template
        # from the update and leave pods mounting a volume that does not exist.
        ignore.append("spec.volumeClaimTemplates[0]")
    workload = k8s.apps.v1.StatefulSet(
        parts.name, metadata=parts.metadata, spec=spec, opts=_options(parts, [*parts.depends_on, service], ignore)
    )
    return workload, service


BUILDERS = {"Deployment": deployment, "StatefulSet": statefulset}


def build(parts: WorkloadParts) -> tuple[pulumi.CustomResource, k8s.core.v1.Service]:
    return BUILDERS[parts.model.workload.kind](parts)


