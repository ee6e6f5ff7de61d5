"""The helpers of a model split over nodes (models.<key>.rpc; engines/llamacpp_rpc.py): for each, a ggml-rpc-server
Deployment on a node of its own, a Service the main server's --rpc names, and a network policy that admits the main
server's pods alone, on the helper's port alone.

llama.cpp's RPC protocol has no authentication and no encryption ("never run the RPC server on an open network",
its README): whoever reaches the port can allocate the helper's memory and run graphs on it. So the namespace's
policy does not select a helper's pods (components/namespace.py excludes RPC_HELPER_LABEL), nothing routes to
them (no Ingress, no gateway route; policy/rules.py checks both), and the helper's own policy is the only one that
admits anything: the main server's pods, on its port. It sends nothing anywhere (egress denied).

A helper has no probes: ggml-rpc-server answers no health check and serves one client at a time (a kubelet
connection queued behind the main server's would time out and restart it under the main server). Its readiness is
the main server's: llama-server loads its blocks onto every helper before it answers /health, and aborts when a
helper goes away (ggml-rpc.cpp RPC_STATUS_ASSERT); the kubelet restarts it, and its init container waits for the
helpers again (incluster/rpc_wait.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from common.constants import NAME_LABEL, RPC_HELPER_COMPONENT, RPC_HELPER_LABEL
from config.types import ClusterConfig, ModelServer, NodePool
from planning.capacity import ServerPlan

from .meta import labels, metadata
from .programs import command
from .security import (CONTAINER_SECURITY, SCRATCH_EMPTY_DIR, SCRATCH_ENV, SCRATCH_VOLUME, checkov_waivers, pod_security,
                       pool_nodes)

# On the main server's and every helper's pods: no two of them share a node (required anti-affinity).
SPLIT_LABEL = "inference-plane/split"
HELPER_COMPONENT = RPC_HELPER_COMPONENT
# Where the helper's image keeps ggml-rpc-server (images/llama-rpc/Dockerfile puts the binaries where llama.cpp's
# own images do).
RPC_SERVER_BINARY = "/app/ggml-rpc-server"
TENSOR_CACHE = "/var/cache/ggml-rpc"


# checkov's probe checks, waived on a helper with the reason (docs/guardrails.md lists every waiver).
NO_PROBE_WAIVERS = {
    "CKV_K8S_8": "ggml-rpc-server answers no health check and serves one client at a time: a liveness probe would "
                 "queue behind the main server's connection and restart the helper under it (docs/rpc-split.md)",
    "CKV_K8S_9": "ggml-rpc-server answers no health check; the split's readiness is the main server's, which loads its "
                 "blocks onto every helper before it answers /health (docs/rpc-split.md)",
}


def split_affinity(server_name: str) -> dict:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {SPLIT_LABEL: server_name}}, "topologyKey": "kubernetes.io/hostname"}]}}


def wait_container(model: ModelServer, plan: ServerPlan, mounts: list[dict]) -> dict:
    """The main server's init container: starts the pod once every helper accepts a connection."""
    split = model.rpc
    if split is None or plan.split is None:
        raise ValueError("components/rpc.py: a split server without its split plan")
    return {
        "name": "rpc-wait",
        "image": split.programs_image,
        "command": command("rpc_wait"),
        "env": [
            {"name": "RPC_HELPERS", "value": plan.helper_endpoints(split.port)},
            {"name": "RPC_WAIT_SECONDS", "value": str(split.wait_seconds)},
        ],
        "securityContext": dict(CONTAINER_SECURITY),
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        "volumeMounts": mounts,
    }


@dataclass(frozen=True)
class HelperArgs:
    model: ModelServer
    plan: ServerPlan
    namespace: str
    pools: dict[str, NodePool]
    cluster: ClusterConfig


def helper_pod(args: HelperArgs, index: int) -> tuple[dict, dict]:
    """(the pod template, the pod's labels) of helper ``index``."""
    model, plan = args.model, args.plan
    split, planned = model.rpc, plan.split
    if split is None or planned is None:
        raise ValueError("components/rpc.py: a split server without its split plan")
    helper, share = split.helpers[index], planned.helpers[index]
    pool = args.pools[helper.node_pool]
    name = plan.helper_name(index)
    pod_labels = {**labels(name, HELPER_COMPONENT), RPC_HELPER_LABEL: model.name, SPLIT_LABEL: model.name}
    memory = plan.helper_memory(index)
    resources: dict = {"requests": {"cpu": model.resources.cpu_request, "memory": memory},
                       "limits": {"cpu": model.resources.cpu_limit, "memory": memory}}
    if share.backend != "cpu" and pool.gpu_resource:
        resources["requests"][pool.gpu_resource] = resources["limits"][pool.gpu_resource] = "1"
    server_args = ["-H", "0.0.0.0", "-p", str(split.port), "-t", str(helper.threads)]
    mounts: list[dict] = [dict(SCRATCH_VOLUME)]
    volumes: list[dict] = [dict(SCRATCH_EMPTY_DIR)]
    env = list(SCRATCH_ENV)
    if split.tensor_cache:
        # -c: what the main server sends is kept by hash ($LLAMA_CACHE/rpc/), so its restart sends hashes, not
        # the helper's blocks, over the link. Sized for the blocks it holds.
        server_args.append("-c")
        env.append({"name": "LLAMA_CACHE", "value": TENSOR_CACHE})
        mounts.append({"name": "tensor-cache", "mountPath": TENSOR_CACHE})
        volumes.append({"name": "tensor-cache",
                        "emptyDir": {"sizeLimit": f"{math.ceil(share.weights_gib * 1.05) + 1}Gi"}})
    security = pod_security(pool.supplemental_groups if share.backend != "cpu" else ())
    spec: dict = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": security,
        "containers": [{
            "name": "rpc-server",
            "image": helper.image or model.image,
            "command": [RPC_SERVER_BINARY],
            "args": server_args,
            "env": env,
            "ports": [{"name": "rpc", "containerPort": split.port, "protocol": "TCP"}],
            "securityContext": dict(CONTAINER_SECURITY),
            "resources": resources,
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
        "affinity": split_affinity(model.name),
    }
    nodes = pool_nodes(pool, helper.node)
    if nodes:
        spec["nodeSelector"] = nodes
    if pool.runtime_class and share.backend != "cpu":
        spec["runtimeClassName"] = pool.runtime_class
    return {"metadata": {"labels": pod_labels}, "spec": spec}, pod_labels


def helper_policy(cni: str, namespace: str, helper_labels: dict[str, str], main_labels: dict[str, str],
                  port: int) -> tuple[str, dict]:
    """(kind, spec): the helper's pods admit the main server's pods on the RPC port, and nothing else; they
    reach nothing."""
    selector = {NAME_LABEL: helper_labels[NAME_LABEL]}
    if cni == "cilium":
        return "CiliumNetworkPolicy", {
            "endpointSelector": {"matchLabels": selector},
            "ingress": [{"fromEndpoints": [{"matchLabels": {**main_labels, "k8s:io.kubernetes.pod.namespace": namespace}}],
                         "toPorts": [{"ports": [{"port": str(port), "protocol": "TCP"}]}]}],
            # No egress rule, and default deny set for both directions in so many words (Cilium's default is deny
            # only for a direction that has rules): the helper answers; it never connects.
            "enableDefaultDeny": {"ingress": True, "egress": True},
        }
    return "NetworkPolicy", {
        "podSelector": {"matchLabels": selector},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": main_labels}}], "ports": [{"port": port, "protocol": "TCP"}]}],
        "egress": [],
    }


class RpcHelpers:
    """The helpers' objects, children of the main server's component."""

    def __init__(self, name: str, args: HelperArgs, main_labels: dict[str, str], parent: pulumi.Resource):
        model, plan = args.model, args.plan
        if model.rpc is None or plan.split is None:
            raise ValueError("components/rpc.py: a split server without its split plan")
        self.workloads: list[k8s.apps.v1.Deployment] = []
        self.services: list[k8s.core.v1.Service] = []
        self.policies: list[pulumi.CustomResource] = []
        child = pulumi.ResourceOptions(parent=parent)
        for index in range(len(plan.split.helpers)):
            helper = plan.helper_name(index)
            template, pod_labels = helper_pod(args, index)
            meta = metadata(helper, args.namespace, helper, HELPER_COMPONENT)
            workload_meta = metadata(helper, args.namespace, helper, HELPER_COMPONENT,
                                     annotations=checkov_waivers(args.cluster.cni, extra=NO_PROBE_WAIVERS))
            self.workloads.append(k8s.apps.v1.Deployment(f"{name}-rpc-{index}", metadata=workload_meta, spec={
                "replicas": 1,
                # One helper: a second would hold its blocks again beside the first.
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": {NAME_LABEL: helper}},
                "template": template,
            }, opts=pulumi.ResourceOptions(parent=parent, delete_before_replace=True)))
            self.services.append(k8s.core.v1.Service(f"{name}-rpc-{index}", metadata=meta, spec={
                "type": "ClusterIP",
                "selector": {NAME_LABEL: helper},
                "ports": [{"name": "rpc", "port": model.rpc.port, "targetPort": "rpc", "protocol": "TCP"}],
            }, opts=child))
            kind, spec = helper_policy(args.cluster.cni, args.namespace, pod_labels, main_labels, model.rpc.port)
            policy_meta = metadata(f"{helper}-rpc", args.namespace, helper, HELPER_COMPONENT)
            self.policies.append(
                k8s.apiextensions.CustomResource(f"{name}-rpc-{index}-policy", api_version="cilium.io/v2", kind=kind,
                                                 metadata=policy_meta, spec=spec, opts=child)
                if kind == "CiliumNetworkPolicy" else
                k8s.networking.v1.NetworkPolicy(f"{name}-rpc-{index}-policy", metadata=policy_meta, spec=spec, opts=child))

    @property
    def resources(self) -> list[pulumi.Resource]:
        return [*self.workloads, *self.services, *self.policies]

