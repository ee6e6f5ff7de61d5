"""The policy pack's rule for a model split over nodes (components/rpc.py): llama.cpp's RPC protocol has no
authentication, so each helper's port is admitted to the main server's pods alone, and nothing routes to it."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from common.constants import NAME_LABEL, RPC_HELPER_LABEL

Report = Callable[[str], None]
Props = Mapping[str, Any]
# The namespace's policy when a split's helpers are left to their own (components/namespace.py).
ALL_BUT_HELPERS = {"matchExpressions": [{"key": RPC_HELPER_LABEL, "operator": "DoesNotExist"}]}


def _of(resources: list[Props], kind: str) -> list[Props]:
    return [r for r in resources if r.get("kind") == kind]


def _selector(policy: Props) -> Any:
    spec = policy.get("spec") or {}
    return spec.get("endpointSelector") if policy.get("kind") == "CiliumNetworkPolicy" else spec.get("podSelector")


def selects(policy: Props, labels: Mapping[str, str]) -> bool:
    """Whether a policy's selector selects pods with these labels (matchLabels, and the one expression this
    program writes)."""
    selector = _selector(policy)
    if selector is None:
        return False
    if (selector.get("matchLabels") or {}).items() > labels.items():
        return False
    for expression in selector.get("matchExpressions") or []:
        present = expression.get("key") in labels
        if expression.get("operator") == "DoesNotExist" and present or expression.get("operator") == "Exists" and not present:
            return False
        if expression.get("operator") not in ("DoesNotExist", "Exists"):
            return False  # not written by this program: taken as not selecting
    return True


def helpers(resources: list[Props]) -> list[tuple[Props, Mapping[str, str]]]:
    """(Deployment, pod labels) of every split helper."""
    found = []
    for workload in _of(resources, "Deployment"):
        labels = ((workload.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
        if RPC_HELPER_LABEL in labels:
            found.append((workload, labels))
    return found


def _peers_only_main(policy: Props, main: Mapping[str, str], port: int) -> bool:
    """Every ingress rule admits the main server's pods (of its namespace) alone, on the RPC port alone; no egress."""
    spec = policy.get("spec") or {}
    namespace = (policy.get("metadata") or {}).get("namespace")
    rules = spec.get("ingress") or []
    if policy.get("kind") == "CiliumNetworkPolicy":
        for rule in rules:
            if set(rule) - {"fromEndpoints", "toPorts"}:
                return False
            for endpoint in rule.get("fromEndpoints") or [{}]:
                labels = dict(endpoint.get("matchLabels") or {})
                if labels.pop("k8s:io.kubernetes.pod.namespace", None) != namespace or not labels or labels.items() > main.items():
                    return False
                if labels.get(NAME_LABEL) != main.get(NAME_LABEL):
                    return False
            ports = [p for tp in rule.get("toPorts") or [] for p in tp.get("ports") or []]
            if not ports or any(_port(p.get("port")) != port for p in ports):
                return False
        return not spec.get("egress") and (spec.get("enableDefaultDeny") or {}).get("egress") is True
    if set(spec.get("policyTypes") or []) != {"Ingress", "Egress"} or spec.get("egress"):
        return False
    for rule in rules:
        peers = rule.get("from") or []
        if not peers or any(set(peer) != {"podSelector"} or (peer["podSelector"].get("matchLabels") or {}).get(NAME_LABEL)
                            != main.get(NAME_LABEL) or peer["podSelector"].get("matchExpressions") for peer in peers):
            return False
        ports = rule.get("ports") or []
        if not ports or any(_port(p.get("port")) != port for p in ports):
            return False
    return True


def _port(value: Any) -> Any:
    """A port as a number (the engine hands numbers over as floats, Cilium writes them as strings)."""
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return value


def rpc_helpers_fenced(resources: list[Props], report: Report, config: Mapping) -> None:
    policies = _of(resources, "NetworkPolicy") + _of(resources, "CiliumNetworkPolicy")
    services = _of(resources, "Service")
    for workload, labels in helpers(resources):
        name = (workload.get("metadata") or {}).get("name")
        namespace = (workload.get("metadata") or {}).get("namespace")
        main = {NAME_LABEL: labels[RPC_HELPER_LABEL]}
        containers = ((workload.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        ports = {_port(p.get("containerPort")) for c in containers for p in c.get("ports") or []}
        selecting = [p for p in policies if (p.get("metadata") or {}).get("namespace") == namespace and selects(p, labels)]
        if not selecting:
            report(f"RPC helper {name}: no network policy selects its pods (its port has no authentication)")
        for policy in selecting:
            if len(ports) != 1 or not _peers_only_main(policy, main, next(iter(ports))):
                report(f"RPC helper {name}: policy {(policy.get('metadata') or {}).get('name')} admits more than "
                       f"{main[NAME_LABEL]}'s pods on the RPC port, or lets the helper connect out")
        for service in services:
            spec = service.get("spec") or {}
            selector = spec.get("selector") or {}
            if selector and selector.items() <= labels.items() and spec.get("type", "ClusterIP") != "ClusterIP":
                report(f"RPC helper {name}: Service {(service.get('metadata') or {}).get('name')} is {spec.get('type')}")
        for ingress in _of(resources, "Ingress"):
            backends = [p.get("backend", {}).get("service", {}).get("name") for rule in (ingress.get("spec") or {}).get("rules") or []
                        for p in (rule.get("http") or {}).get("paths") or []]
            if name in backends:
                report(f"RPC helper {name}: routed by Ingress {(ingress.get('metadata') or {}).get('name')}")
        for backend in _of(resources, "Backend"):
            if any(name in str(e) for e in (backend.get("spec") or {}).get("endpoints") or []):
                report(f"RPC helper {name}: a gateway Backend ({(backend.get('metadata') or {}).get('name')}) points at it")
