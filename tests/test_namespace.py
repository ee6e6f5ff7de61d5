"""AINamespace in isolation: the namespace and its default-deny policy, peers from config."""

from __future__ import annotations

import pytest

from config import ConfigError
from plane import parse_stack
from components.namespace import ICMP_V4_TYPES, ICMP_V6_TYPES, AINamespace, AINamespaceArgs
from render.offline import run_program


def build(values: dict):
    stack = parse_stack(values)
    args = AINamespaceArgs(namespace=stack.namespace, cluster=stack.cluster)
    return run_program({}, program=lambda: {"ns": AINamespace(stack.namespace.name, args)})


def cilium_spec(run):
    (policy,) = run.find("CiliumNetworkPolicy")
    return policy.inputs["spec"]


def ns_selector(namespace: str, **labels: str) -> dict:
    return {"matchLabels": {"k8s:io.kubernetes.pod.namespace": namespace, **labels}}


def test_namespace_enforces_pod_security(homelab_values):
    run = build(homelab_values)
    labels = run.one("Namespace", "ai").inputs["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_policy_selects_every_pod_and_waits_for_the_namespace(homelab_values):
    run = build(homelab_values)
    (policy,) = run.find("CiliumNetworkPolicy")
    assert policy.inputs["metadata"]["namespace"] == "ai"
    assert policy.inputs["spec"]["endpointSelector"] == {}
    assert run.one("Namespace", "ai").urn in policy.dependencies


def test_cilium_ingress_peers_come_from_config(homelab_values):
    homelab_values["namespace"]["name"] = "llm"
    homelab_values["cluster"]["ingress"] = {
        "class_name": "nginx",
        "namespace": "ingress-nginx",
        "pod_labels": {"app.kubernetes.io/name": "ingress-nginx"},
    }
    homelab_values["cluster"]["monitoring"] = {"namespace": "observability", "pod_labels": {"app": "vmagent"}}
    spec = cilium_spec(build(homelab_values))
    sources = [rule["fromEndpoints"][0] for rule in spec["ingress"] if "fromEndpoints" in rule and "icmps" not in rule]
    assert sources == [
        ns_selector("llm"),
        ns_selector("ingress-nginx", **{"app.kubernetes.io/name": "ingress-nginx"}),
        ns_selector("observability", app="vmagent"),
    ]
    assert {"fromEntities": ["host", "remote-node"]} in spec["ingress"]


def test_no_monitoring_no_storage_means_no_rules_for_them(homelab_values):
    homelab_values["cluster"]["monitoring"] = None
    homelab_values["cluster"]["storage"] = None
    spec = cilium_spec(build(homelab_values))
    namespaces = {
        sel["matchLabels"]["k8s:io.kubernetes.pod.namespace"]
        for rule in spec["ingress"] + spec["egress"]
        for sel in rule.get("fromEndpoints", []) + rule.get("toEndpoints", [])
        if "matchLabels" in sel
    }
    assert namespaces == {"ai", "ingress", "kube-system"}


def test_icmp_passes_both_ways(homelab_values):
    spec = cilium_spec(build(homelab_values))
    for direction in ("ingress", "egress"):
        (rule,) = [r for r in spec[direction] if "icmps" in r]
        fields = rule["icmps"][0]["fields"]
        assert {f["type"] for f in fields if f["family"] == "IPv4"} == set(ICMP_V4_TYPES)
        assert {f["type"] for f in fields if f["family"] == "IPv6"} == set(ICMP_V6_TYPES)
        # Neighbour discovery (133-136) is what IPv6 needs to work at all.
        assert {133, 134, 135, 136} <= set(ICMP_V6_TYPES)


def test_fqdn_egress_replaces_world(homelab_values):
    spec = cilium_spec(build(homelab_values))
    entities = [e for rule in spec["egress"] for e in rule.get("toEntities", [])]
    assert "world" not in entities and {"host", "remote-node"} <= set(entities)
    (fqdn_rule,) = [r for r in spec["egress"] if "toFQDNs" in r]
    assert {"matchName": "huggingface.co"} in fqdn_rule["toFQDNs"]
    assert {"matchPattern": "*.hf.co"} in fqdn_rule["toFQDNs"]
    assert fqdn_rule["toPorts"] == [{"ports": [{"port": "443", "protocol": "TCP"}]}]
    # toFQDNs only works when lookups go through Cilium's DNS proxy.
    (dns_rule,) = [r for r in spec["egress"] if r.get("toEndpoints") == [ns_selector("kube-system", **{"k8s-app": "kube-dns"})]]
    assert dns_rule["toPorts"][0]["rules"] == {"dns": [{"matchPattern": "*"}]}
    assert {"port": "53", "protocol": "UDP"} in dns_rule["toPorts"][0]["ports"]


def test_world_egress_when_asked(homelab_values):
    homelab_values["namespace"]["model_hub_egress"] = {"mode": "world", "reason": "the hub moves CDNs weekly"}
    run = build(homelab_values)
    (policy,) = run.find("CiliumNetworkPolicy")
    assert policy.inputs["metadata"]["annotations"] == {"inference-plane/world-egress": "the hub moves CDNs weekly"}
    spec = cilium_spec(run)
    assert {"toEntities": ["host", "remote-node", "world"]} in spec["egress"]
    assert not any("toFQDNs" in r for r in spec["egress"])


def test_plain_networkpolicy_refuses_named_hosts_it_cannot_enforce(homelab_values):
    """Under plain NetworkPolicy the hub's host names would silently become 'any address on 443'."""
    homelab_values["cluster"]["cni"] = "networkpolicy"
    homelab_values["namespace"]["model_hub_egress"] = {"mode": "fqdn"}
    with pytest.raises(ConfigError, match=r"namespace\.model_hub_egress\.mode: plain NetworkPolicy cannot match host names"):
        parse_stack(homelab_values)


@pytest.mark.parametrize("cni, mode", [("cilium", "fqdn"), ("networkpolicy", "world")])
def test_egress_left_out_is_the_narrowest_the_cni_can_enforce(homelab_values, cni, mode):
    """k3s' kube-router (the default cni) cannot name hosts: a stack that says nothing gets the internet
    on 443 with the reason recorded, Cilium the named hosts; an explicit reason is kept."""
    homelab_values["cluster"]["cni"] = cni
    homelab_values["namespace"].pop("model_hub_egress", None)
    hub = parse_stack(homelab_values).namespace.model_hub_egress
    assert hub.mode == mode
    assert (hub.reason is not None) == (mode == "world")
    homelab_values["namespace"]["model_hub_egress"] = {"reason": "Calico OSS cannot name hosts"}
    if mode == "world":
        assert parse_stack(homelab_values).namespace.model_hub_egress.reason == "Calico OSS cannot name hosts"


def test_plain_networkpolicy_when_the_cni_is_not_cilium(homelab_values):
    homelab_values["cluster"]["cni"] = "networkpolicy"
    homelab_values["namespace"]["model_hub_egress"] = {
        "mode": "world", "reason": "plain NetworkPolicy cannot name the model hub's hosts",
    }
    run = build(homelab_values)
    assert run.find("CiliumNetworkPolicy") == []
    (policy,) = run.find("NetworkPolicy")
    spec = policy.inputs["spec"]
    assert spec["podSelector"] == {} and spec["policyTypes"] == ["Ingress", "Egress"]
    sources = spec["ingress"][0]["from"]
    assert {"podSelector": {}} in sources
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "traefik"}},
    } in sources
    dns = [r for r in spec["egress"] if any(p.get("port") == 53 for p in r.get("ports", []))]
    assert dns and {p["protocol"] for p in dns[0]["ports"]} == {"UDP", "TCP"}
    internet = [r for r in spec["egress"] if any("ipBlock" in peer for peer in r["to"])]
    (block,) = internet
    assert "10.0.0.0/8" in block["to"][0]["ipBlock"]["except"]
    assert block["ports"] == [{"port": 443, "protocol": "TCP"}]
