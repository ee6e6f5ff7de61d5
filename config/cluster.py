"""The cluster a stack runs in, as the config describes it: its CNI, ingress controller, storage and
monitoring peers, and the namespace the servers run in with its egress (``cluster:`` and ``namespace:``
of a stack; config/types.py holds the rest and re-exports these)."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field

from .defaults import MODEL_HUB_HOSTS
from .values import DnsLabel, DnsName, FqdnPattern, Labels, QualifiedName, Reason, Strict, doc


# --- cluster -------------------------------------------------------------------------------------

# Namespaces Kubernetes itself uses: a stack must never label or fence them.
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "default"})


class PodPeer(Strict):
    """A set of pods in another namespace that the inference namespace talks to."""

    namespace: DnsLabel = doc("The peer's namespace.")
    pod_labels: Labels = doc("Labels selecting the peer's pods; empty: every pod in the namespace.", default={})


class IngressController(Strict):
    """The cluster's ingress controller: its class and where its pods run (for the network policy)."""

    kind: Literal["traefik", "ingress-nginx", "other"] = doc(
        "Which controller serves the class: the program sets the annotations long streamed completions need "
        "(ingress-nginx: 60 s read timeout, 1 MiB body limit by default; Traefik streams and has no body limit).",
        default="traefik",
    )
    class_name: DnsName = doc("The IngressClass the chat endpoint's Ingress names.", default="traefik")
    namespace: DnsLabel = doc("Namespace of the controller's pods, admitted by the network policy (k3s' Traefik: kube-system).",
                              default="kube-system")
    pod_labels: Labels = doc("Labels of the controller's pods.", default={"app.kubernetes.io/name": "traefik"})


class ClusterConfig(Strict):
    """What the program needs to know about the cluster it deploys to. The defaults are k3s', the most common
    homelab distribution, as it installs: Flannel with kube-router's NetworkPolicy controller, Traefik in
    kube-system, the local-path storage class, ServiceLB for LoadBalancer Services, no monitoring; a
    cluster with other parts says so here (the shipped stacks show Cilium, ingress-nginx, Ceph, Longhorn)."""

    kubernetes_version: Annotated[str, Field(pattern=r"^1\.[0-9]{2}$")] = doc(
        "Every rendered manifest is checked against this Kubernetes version's schemas.", default="1.33"
    )
    cni: Literal["cilium", "networkpolicy"] = doc(
        "cilium: CiliumNetworkPolicy (ICMP, host entities and host names expressible); networkpolicy: plain "
        "NetworkPolicy (k3s' kube-router, Calico, Antrea).",
        default="networkpolicy",
    )
    ingress: Optional[IngressController] = doc(
        "The ingress controller that serves an exposed chat endpoint; null: the cluster has none (nothing can be "
        "exposed, and the network policy admits no ingress namespace).",
        default=IngressController(),
    )
    cert_manager_issuer: DnsName = doc("The cert-manager ClusterIssuer for every TLS certificate.", default="letsencrypt-cluster")
    issuer_solver: Literal["dns01", "http01", "ca"] = doc(
        "How cert_manager_issuer proves a name. dns01: ACME through a public DNS zone you control, which works for a "
        "LAN-only name in it (the seed's letsencrypt-cluster solves through Cloudflare); http01: ACME fetches a token "
        "over port 80 from the internet, which no host of this program can answer (none is published), so it is "
        "refused; ca: a CA or self-signed ClusterIssuer, any name (.lan, .ts.net), clients trust its CA.",
        default="dns01",
    )
    monitoring: Optional[PodPeer] = doc(
        "The pods that scrape /metrics (e.g. namespace: monitoring); null when the cluster runs no monitoring.",
        default=None,
    )
    storage: Optional[PodPeer] = doc(
        "Where the model cache's storage daemons live (CephFS: namespace rook-ceph); null for node-local storage "
        "(local-path).",
        default=None,
    )
    dns: PodPeer = doc(
        "The cluster DNS pods (egress on port 53).",
        default=PodPeer(namespace="kube-system", pod_labels={"k8s-app": "kube-dns"}),
    )
    public_dns_label: Optional[QualifiedName] = doc(
        "A label that makes external-dns publish a record on the internet. The program never sets it and refuses "
        "any exposure that asks for it: the llama.cpp API stays LAN-only.",
        default=None,
    )


class ModelHubEgress(Strict):
    """Where model servers may connect to download weights."""

    mode: Optional[Literal["fqdn", "world"]] = doc(
        "fqdn: only the named hosts (Cilium toFQDNs). world: any address on 443, which needs a reason. Image "
        "pulls are the kubelet's, not the pod's, so pods need nothing else from the internet. null: fqdn with "
        "cni cilium; world with plain NetworkPolicy, which cannot name hosts (the render summary says so).",
        default=None,
    )
    hosts: list[FqdnPattern] = doc(
        "The model hub's hosts: Hugging Face serves metadata from huggingface.co and files from its CDN and Xet hosts.",
        default=MODEL_HUB_HOSTS,
        min_length=1,
    )
    reason: Optional[Reason] = doc(
        "Required with mode world: why the hosts cannot be named (recorded on the policy object).", default=None
    )


class NamespaceConfig(Strict):
    """The namespace the model servers (and the gateway's objects) live in."""

    name: DnsLabel = doc("The namespace's name.", default="ai")
    pod_security: Literal["restricted", "baseline", "privileged"] = doc(
        "Pod Security level enforced: the pods need no privilege, the GPU comes in through the device-plugin API.",
        default="restricted",
    )
    pod_security_reason: Optional[Reason] = doc(
        "Required for a level below restricted: why the namespace admits more privileged pods (said in the summary).",
        default=None,
    )
    model_hub_egress: ModelHubEgress = doc("Egress for weight downloads.", default=ModelHubEgress())
