"""Who may reach each model server, read back from the rendered objects: the namespace's policy
(which pods it admits), the Ingresses and their source allowlists, the gateway's routes that end at
the server, the scrapes that select it, and whether its pod takes an API key. A route whose entry
pods (the configured controller's, the gateway's Envoy pods) the rendered policy does not admit is
printed BLOCKED. Where the controller really runs, the manifests cannot say: PREREQUISITES.md gives
the kubectl command that shows it, and the summary names the namespace and labels it expects."""

from __future__ import annotations

import json
from typing import Iterable, Optional

from common.constants import COMPONENT_LABEL, ENVOY_OWNING_GATEWAY_LABEL, NAME_LABEL, TAILSCALE_CLASS, service_fqdn
from config.checks import public_ranges
from config.ingress import SOURCE_RANGE_ANNOTATIONS, TRAEFIK_MIDDLEWARES
from config.types import StackConfig
from policy.rpc import helpers as rpc_helpers, selects
from policy.rules import keyed_services

Peer = tuple[str, dict[str, str]]  # (namespace, pod labels); no labels: every pod there
NODES = "(nodes)"  # Cilium's host and remote-node entities: the kubelet's probes


def _of(objects: Iterable[dict], kind: str, namespace: Optional[str] = None) -> list[dict]:
    return [o for o in objects if o.get("kind") == kind
            and (namespace is None or o["metadata"].get("namespace") == namespace)]


def _namespace_wide(policy: dict) -> bool:
    spec = policy["spec"]
    return not (spec.get("podSelector") or {}).get("matchLabels") and not (spec.get("endpointSelector") or {}).get("matchLabels")


def admitted(objects: list[dict], namespace: str, pod_labels: Optional[dict[str, str]] = None) -> list[Peer]:
    """The peers the namespace's policies let in (plain or Cilium): those of the namespace-wide ones, or with
    ``pod_labels``, only those of the policies that select such pods (a server's own in-cluster clients)."""
    peers: list[Peer] = []
    objects = [o for o in objects if o["kind"] not in ("NetworkPolicy", "CiliumNetworkPolicy") or (
        _namespace_wide(o) if pod_labels is None else
        not _namespace_wide(o) and ((o["spec"].get("podSelector") or o["spec"].get("endpointSelector") or {})
                                    .get("matchLabels") or {}).items() <= pod_labels.items())]
    for policy in _of(objects, "NetworkPolicy", namespace):
        for rule in policy["spec"].get("ingress") or []:
            for source in rule.get("from") or []:
                if "namespaceSelector" in source:
                    ns = source["namespaceSelector"].get("matchLabels", {}).get("kubernetes.io/metadata.name", "*")
                    peers.append((ns, dict((source.get("podSelector") or {}).get("matchLabels") or {})))
                elif "podSelector" in source:
                    peers.append((namespace, dict(source["podSelector"].get("matchLabels") or {})))
    for policy in _of(objects, "CiliumNetworkPolicy", namespace):
        for rule in policy["spec"].get("ingress") or []:
            for endpoint in rule.get("fromEndpoints") or []:
                labels = dict(endpoint.get("matchLabels") or {})
                ns = labels.pop("k8s:io.kubernetes.pod.namespace", None)
                if ns is not None:
                    peers.append((ns, labels))
            if {"host", "remote-node"} & set(rule.get("fromEntities") or []):
                peers.append((NODES, {}))
    return peers


def _admits(peers: list[Peer], namespace: str, labels: dict[str, str]) -> bool:
    """Whether some admitted peer selects pods of ``namespace`` carrying ``labels``."""
    return any(ns == namespace and peer.items() <= labels.items() for ns, peer in peers)


def _peer_text(peer: Peer, own: str) -> str:
    ns, labels = peer
    if ns == NODES:
        return "the nodes (kubelet probes)"
    if ns == own and not labels:
        return f"pods of {ns}"
    pods = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return f"{pods} pods in {ns}" if pods else f"pods in {ns}"


def _sources(ingress: dict, objects: list[dict]) -> Optional[list[str]]:
    annotations = ingress["metadata"].get("annotations") or {}
    for name in SOURCE_RANGE_ANNOTATIONS:
        if annotations.get(name):
            return [r.strip() for r in annotations[name].split(",")]
    for ref in (annotations.get(TRAEFIK_MIDDLEWARES) or "").split(","):
        namespace_name = ref.strip().removesuffix("@kubernetescrd")
        for middleware in _of(objects, "Middleware"):
            meta = middleware["metadata"]
            if f"{meta['namespace']}-{meta['name']}" == namespace_name and "ipAllowList" in middleware["spec"]:
                return list(middleware["spec"]["ipAllowList"]["sourceRange"])
    return None


def _gateway_routes(service: dict, objects: list[dict]) -> list[tuple[dict, list[str]]]:
    """(Gateway, public model names) for every AI route rule that ends at this Service."""
    meta = service["metadata"]
    fqdn = service_fqdn(meta["name"], meta["namespace"])
    backends = {b["metadata"]["name"] for b in _of(objects, "Backend")
                if any(e.get("fqdn", {}).get("hostname") == fqdn for e in b["spec"].get("endpoints") or [])}
    ai_backends = {a["metadata"]["name"] for a in _of(objects, "AIServiceBackend")
                   if a["spec"]["backendRef"]["name"] in backends}
    found: list[tuple[dict, list[str]]] = []
    for gateway in _of(objects, "Gateway"):
        names = []
        for route in _of(objects, "AIGatewayRoute"):
            if not any(ref.get("name") == gateway["metadata"]["name"] for ref in route["spec"].get("parentRefs") or []):
                continue
            for rule in route["spec"].get("rules") or []:
                if any(ref["name"] in ai_backends for ref in rule.get("backendRefs") or []):
                    names += [h["value"] for m in rule.get("matches") or [] for h in m.get("headers") or []
                              if h.get("type") == "Exact"] or ["any model"]
        for route in _of(objects, "HTTPRoute"):
            if any(ref.get("name") == gateway["metadata"]["name"] for ref in route["spec"].get("parentRefs") or []) and any(
                    ref.get("name") in backends for rule in route["spec"].get("rules") or []
                    for ref in rule.get("backendRefs") or []):
                names += [m["path"]["value"] for rule in route["spec"]["rules"] for m in rule.get("matches") or []
                          if "path" in m]
        if names:
            found.append((gateway, names))
    return found


def reach_lines(objects: list[dict], stack: StackConfig) -> list[str]:
    servers = [s for s in _of(objects, "Service")
               if (s["metadata"].get("labels") or {}).get("app.kubernetes.io/component") in COMPONENT_LABEL.values()]
    if not servers:
        return []
    lines: list[str] = []
    for namespace in sorted({s["metadata"]["namespace"] for s in servers}):
        peers = admitted(objects, namespace)
        keyed = keyed_services(objects)
        lines.append(f"  who may reach each server (the policy of namespace {namespace} admits only "
                     f"{'; '.join(_peer_text(p, namespace) for p in peers) or 'nothing'}; everything else is denied):")
        if namespace == stack.namespace.name and stack.namespace.pod_security != "restricted":
            lines.append(f"    Pod Security {stack.namespace.pod_security}, not restricted: "
                         f"{said(stack.namespace.pod_security_reason)}")
        for service in (s for s in servers if s["metadata"]["namespace"] == namespace):
            lines.append(f"    {service['metadata']['name']:<16} " + "; ".join(_reach(service, objects, peers, keyed, stack)))
        lines += _helper_reach(objects, namespace)
    return lines


def _helper_reach(objects: list[dict], namespace: str) -> list[str]:
    """A split's helpers: what the policies that select their pods admit, read back from them."""
    lines = []
    policies = [o for o in objects if o["kind"] in ("NetworkPolicy", "CiliumNetworkPolicy")
                and o["metadata"].get("namespace") == namespace]
    for workload, labels in rpc_helpers(objects):
        if workload["metadata"].get("namespace") != namespace:
            continue
        admitted_by = []
        for policy in (p for p in policies if selects(p, labels)):
            spec = policy["spec"]
            for rule in spec.get("ingress") or []:
                peers = [dict(e.get("matchLabels") or {}) for e in rule.get("fromEndpoints") or []] + [
                    dict((p.get("podSelector") or {}).get("matchLabels") or {}) for p in rule.get("from") or []]
                ports = [str(p.get("port")) for tp in rule.get("toPorts") or [] for p in tp.get("ports") or []] + [
                    str(p.get("port")) for p in rule.get("ports") or []]
                for peer in peers:
                    peer.pop("k8s:io.kubernetes.pod.namespace", None)
                    who = ", ".join(f"{k}={v}" for k, v in sorted(peer.items())) or "every pod"
                    admitted_by.append(f"{who} pods on port {'/'.join(ports) or 'any'}")
        said_of = "; ".join(admitted_by) or "nothing (no policy admits anything)"
        lines.append(f"    {workload['metadata']['name']:<16} RPC helper (no authentication): only {said_of}; "
                     "no Ingress, no gateway route, no egress")
    return lines


def said(reason: str | None) -> str:
    """An operator's acknowledgement as the summary repeats it: quoted, so that no reason (one printable
    line, config/values.py Reason) can pass for a line or a clause of the summary."""
    return "the operator's reason: " + json.dumps(reason, ensure_ascii=False)


def _reach(service: dict, objects: list[dict], peers: list[Peer], keyed: set[str], stack: StackConfig) -> list[str]:
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    cluster = stack.cluster
    ways: list[str] = []
    for ingress in _of(objects, "Ingress", namespace):
        if not any(p["backend"].get("service", {}).get("name") == name for rule in ingress["spec"].get("rules") or []
                   for p in rule.get("http", {}).get("paths") or []):
            continue
        host = ingress["spec"]["rules"][0]["host"]
        sources = _sources(ingress, objects)
        model = next((m for m in stack.models.values() if m.name == name), None)
        exposure = model.exposure if model is not None else None
        if sources and public_ranges(sources):
            reason = exposure.public_reason if exposure is not None else None
            who = f"clients on the internet ({', '.join(sources)}" + (f"; {said(reason)}" if reason else "") + ")"
        else:
            reason = exposure.public_reason if exposure is not None else None
            # The controller checks the client address it sees: behind k3s' ServiceLB with the default Cluster
            # policy every client arrives as a pod address, inside the private ranges (PREREQUISITES.md says so).
            seen = (" (as the controller sees client addresses: its Service needs externalTrafficPolicy: Local, "
                    "PREREQUISITES.md)" if cluster.ingress is not None and cluster.ingress.kind in ("traefik", "ingress-nginx")
                    else "")
            who = (f"LAN clients in {', '.join(sources)}{seen}" if sources else
                   "any client the controller serves" + (f" ({said(reason)})" if reason else ""))
        controller = cluster.ingress
        through = "an ingress controller the config does not describe"
        if controller is not None:
            through = f"{controller.kind} pods in {controller.namespace}"
            if not _admits(peers, controller.namespace, dict(controller.pod_labels)):
                through += " - BLOCKED: the policy does not admit them; fix cluster.ingress"
        own = sorted(exposure.annotations) if exposure is not None else []
        ways.append(f"{who} at https://{host} through {through}" + (f" (your annotations: {', '.join(own)})" if own else ""))
    for gateway, names in _gateway_routes(service, objects):
        envoy = {ENVOY_OWNING_GATEWAY_LABEL: gateway["metadata"]["name"], NAME_LABEL: "envoy"}
        hosts = sorted({listener.get("hostname", "*") + (f":{listener['port']}" if listener.get("port", 443) != 443 else "")
                        for listener in gateway["spec"].get("listeners") or []})
        text = f"gateway clients at https://{', '.join(hosts)} for {', '.join(names)}"
        # Where Envoy Gateway runs this gateway's Envoy pods: the configured namespace, these labels.
        envoy_namespace = stack.gateway.envoy_namespace if stack.gateway is not None else "envoy-gateway-system"
        if not _admits(peers, envoy_namespace, envoy):
            text += f" - BLOCKED: the policy does not admit the gateway's Envoy pods in {envoy_namespace}"
        if stack.gateway is not None and stack.gateway.load_balancer_class == TAILSCALE_CLASS:
            text += " (the tailnet device of that name, through the Tailscale operator)"
        elif stack.gateway is not None:
            how = (f"load-balancer class {stack.gateway.load_balancer_class}" if stack.gateway.load_balancer_class
                   else "the cluster's default load balancer")
            text += f" ({how}: {said(stack.gateway.load_balancer_reason)})"
        ways.append(text)
    own = admitted(objects, namespace, dict(service["spec"].get("selector") or {}))
    if own:
        ways.append("in-cluster clients from " + "; ".join(_peer_text(p, namespace) for p in own))
    if not ways:
        ways.append("in-cluster only (no Ingress, no gateway route)")
    labels = service["metadata"].get("labels") or {}
    scrapes = [s for s in _of(objects, "VMServiceScrape", namespace)
               if (s["spec"].get("selector", {}).get("matchLabels") or {}).items() <= labels.items()]
    if scrapes and cluster.monitoring is not None:
        ways.append(f"scraped from {cluster.monitoring.namespace}")
    ways.append("API key required" if name in keyed else "no API key")
    return ways
