"""AINamespace: the namespace the model servers run in, and the default-deny policy around it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from common.constants import PART_OF, RPC_HELPER_LABEL
from config.types import ClusterConfig, NamespaceConfig, PodPeer
from common.constants import WORLD_EGRESS_WAIVER

from .meta import token

# ICMP that must pass for path-MTU discovery, unreachables and IPv6 neighbour discovery: the
# CT-related path did not pass related ICMP empirically, so the seed allows these types explicitly.
ICMP_V4_TYPES = (0, 3, 8, 11, 12)
ICMP_V6_TYPES = (1, 2, 3, 4, 128, 129, 133, 134, 135, 136, 143)
POLICY_NAME = "default-deny-ingress"  # the seed's name; the policy governs egress too


@dataclass(frozen=True)
class AINamespaceArgs:
    namespace: NamespaceConfig
    cluster: ClusterConfig
    # The gateway's Envoy pods, which call the model servers; None when there is no gateway.
    gateway: Optional[PodPeer] = None
    # A model is split over nodes: the policy leaves its helpers' pods to their own (components/rpc.py).
    rpc_helpers: bool = False


def _icmp_rule(direction: str) -> dict:
    fields = [{"type": t, "family": "IPv4"} for t in ICMP_V4_TYPES]
    fields += [{"type": t, "family": "IPv6"} for t in ICMP_V6_TYPES]
    peer = "fromEndpoints" if direction == "ingress" else "toEndpoints"
    return {
        peer: [{"matchExpressions": [{"key": "io.kubernetes.pod.namespace", "operator": "Exists"}]}],
        "icmps": [{"fields": fields}],
    }


def _controller_peer(cluster: ClusterConfig) -> Optional[PodPeer]:
    """The ingress controller's pods, or None when the cluster has no ingress controller."""
    if cluster.ingress is None:
        return None
    return PodPeer(namespace=cluster.ingress.namespace, pod_labels=cluster.ingress.pod_labels)


def _cilium_peer(peer: PodPeer) -> dict:
    return {"matchLabels": {"k8s:io.kubernetes.pod.namespace": peer.namespace, **peer.pod_labels}}


def cilium_policy_spec(ns: NamespaceConfig, cluster: ClusterConfig, gateway: Optional[PodPeer] = None) -> dict:
    own = PodPeer(namespace=ns.name)
    controller = _controller_peer(cluster)
    ingress = [{"fromEndpoints": [_cilium_peer(own)]}]
    if controller:
        ingress.append({"fromEndpoints": [_cilium_peer(controller)]})
    if cluster.monitoring:
        ingress.append({"fromEndpoints": [_cilium_peer(cluster.monitoring)]})
    if gateway:
        ingress.append({"fromEndpoints": [_cilium_peer(gateway)]})
    # Kubelet probes come from the host; remote-node covers node-local paths on the other nodes.
    ingress.append({"fromEntities": ["host", "remote-node"]})
    ingress.append(_icmp_rule("ingress"))

    egress = [{"toEndpoints": [_cilium_peer(own)]}]
    if controller:
        egress.append({"toEndpoints": [_cilium_peer(controller)]})
    if cluster.storage:
        egress.append({"toEndpoints": [_cilium_peer(cluster.storage)]})
    dns_rule: dict = {
        "toEndpoints": [_cilium_peer(cluster.dns)],
        # TCP too: a DNS answer larger than 512 bytes is retried over TCP.
        "toPorts": [{"ports": [{"port": "53", "protocol": "UDP"}, {"port": "53", "protocol": "TCP"}]}],
    }
    hub = ns.model_hub_egress
    if hub.mode == "fqdn":
        # toFQDNs only learns addresses from lookups that pass through Cilium's DNS proxy.
        dns_rule["toPorts"][0]["rules"] = {"dns": [{"matchPattern": "*"}]}
    egress.append(dns_rule)
    # host/remote-node: kubelet probe replies and node-local reach (Ceph mons on the host network).
    entities = ["host", "remote-node"] + (["world"] if hub.mode == "world" else [])
    egress.append({"toEntities": entities})
    if hub.mode == "fqdn":
        egress.append(
            {
                "toFQDNs": [
                    {"matchPattern": h} if h.startswith("*") else {"matchName": h} for h in hub.hosts
                ],
                "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}],
            }
        )
    egress.append(_icmp_rule("egress"))
    return {"endpointSelector": {}, "ingress": ingress, "egress": egress}


def egress_summary(ns: NamespaceConfig, cluster: ClusterConfig) -> str:
    """What the namespace's pods may reach on the internet, as the policy really enforces it."""
    hub = ns.model_hub_egress
    # The seed's host and remote-node entities (kubelet, Ceph mons on the host network) admit every port of
    # every node's own addresses, the API server's too where it runs on a node: said, not left out.
    nodes = "; and every node's own addresses on any port (Cilium host and remote-node entities)"
    if hub.mode == "fqdn":
        return f"namespace {ns.name}: internet egress only to {', '.join(hub.hosts)} on 443 (Cilium toFQDNs){nodes}"
    if cluster.cni == "cilium":
        return f"namespace {ns.name}: internet egress to any address and port (Cilium world entity){nodes}"
    return (f"namespace {ns.name}: internet egress to any public address on 443 (plain NetworkPolicy cannot "
            f"match host names; {', '.join(PRIVATE_RANGES)} excluded)")


def _np_peer(peer: PodPeer) -> dict:
    selector: dict = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": peer.namespace}}}
    if peer.pod_labels:
        selector["podSelector"] = {"matchLabels": dict(peer.pod_labels)}
    return selector


# Private ranges are cluster and LAN addresses; the model hub is on the internet.
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")


def network_policy_spec(ns: NamespaceConfig, cluster: ClusterConfig, gateway: Optional[PodPeer] = None) -> dict:
    """The same intent as plain NetworkPolicy. ICMP and host entities cannot be expressed here."""
    controller = _controller_peer(cluster)
    sources = [{"podSelector": {}}] + ([_np_peer(controller)] if controller else [])
    if cluster.monitoring:
        sources.append(_np_peer(cluster.monitoring))
    if gateway:
        sources.append(_np_peer(gateway))
    egress: list[dict] = [{"to": [{"podSelector": {}}] + ([_np_peer(controller)] if controller else [])}]
    if cluster.storage:
        egress.append({"to": [_np_peer(cluster.storage)]})
    egress.append(
        {
            "to": [_np_peer(cluster.dns)],
            "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
        }
    )
    # Plain NetworkPolicy cannot name hosts: world egress (the config insists on mode: world and its
    # reason here) is the internet on 443, never the cluster's or the LAN's private ranges.
    egress.append(
        {
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_RANGES)}}],
            "ports": [{"port": 443, "protocol": "TCP"}],
        }
    )
    return {
        "podSelector": {},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": sources}],
        "egress": egress,
    }


def _leave_helpers(spec: dict, selector: str, helpers: bool) -> dict:
    """The namespace's policy, selecting every pod but a split's helpers: policies add up, so one that admitted the
    namespace's pods to a helper would open its unauthenticated port to them all."""
    if helpers:
        spec[selector] = {"matchExpressions": [{"key": RPC_HELPER_LABEL, "operator": "DoesNotExist"}]}
    return spec


class AINamespace(pulumi.ComponentResource):
    """A namespace for model servers with a default-deny network policy that lets in only its peers."""

    namespace: k8s.core.v1.Namespace
    policy: pulumi.CustomResource
    name: pulumi.Output[str]

    def __init__(self, name: str, args: AINamespaceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        ns, cluster = args.namespace, args.cluster
        if ns.name != name:
            # Stacks brought up before the component was named "namespace" know it by the namespace's name.
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(aliases=[pulumi.Alias(name=ns.name)]))
        super().__init__(token("AINamespace"), name, None, opts)
        labels = {
            **PART_OF,
            "pod-security.kubernetes.io/enforce": ns.pod_security,
            "pod-security.kubernetes.io/warn": ns.pod_security,
        }
        # Retained: deleting a namespace deletes every object in it, the retained model caches
        # included. A destroy or a move to another namespace leaves it (and the weights) in place;
        # delete it with kubectl once the weights are no longer wanted.
        self.namespace = k8s.core.v1.Namespace(
            name, metadata={"name": ns.name, "labels": labels}, opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True)
        )
        after_ns = pulumi.ResourceOptions(parent=self, depends_on=[self.namespace])
        policy_meta: dict = {"name": POLICY_NAME, "namespace": ns.name, "labels": dict(PART_OF)}
        if ns.model_hub_egress.mode == "world":
            # The policy pack's waiver: world egress only with the reason recorded on the object.
            policy_meta["annotations"] = {WORLD_EGRESS_WAIVER: ns.model_hub_egress.reason}
        if cluster.cni == "cilium":
            self.policy = k8s.apiextensions.CustomResource(
                f"{name}-{POLICY_NAME}",
                api_version="cilium.io/v2",
                kind="CiliumNetworkPolicy",
                metadata=policy_meta,
                spec=_leave_helpers(cilium_policy_spec(ns, cluster, args.gateway), "endpointSelector", args.rpc_helpers),
                opts=after_ns,
            )
        else:
            self.policy = k8s.networking.v1.NetworkPolicy(
                f"{name}-{POLICY_NAME}",
                metadata=policy_meta,
                spec=_leave_helpers(network_policy_spec(ns, cluster, args.gateway), "podSelector", args.rpc_helpers),
                opts=after_ns,
            )
        self.name = self.namespace.metadata.apply(lambda m: m["name"])
        self.register_outputs({"name": self.name})


def clients_policy(cni: str, namespace: str, server_labels: dict[str, str], port: int, clients: list[PodPeer]) -> tuple[str, dict]:
    """(kind, spec) of the policy that admits a server's in-cluster clients from other namespaces to its pods on
    its port: added to the namespace's default-deny policy (policies add up), selecting that server's pods alone."""
    if cni == "cilium":
        return "CiliumNetworkPolicy", {
            "endpointSelector": {"matchLabels": dict(server_labels)},
            "ingress": [{"fromEndpoints": [_cilium_peer(peer) for peer in clients],
                         "toPorts": [{"ports": [{"port": str(port), "protocol": "TCP"}]}]}],
        }
    return "NetworkPolicy", {
        "podSelector": {"matchLabels": dict(server_labels)},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [_np_peer(peer) for peer in clients], "ports": [{"port": port, "protocol": "TCP"}]}],
    }
