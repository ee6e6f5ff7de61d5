"""What the cluster must already have for a rendered folder to apply and run, read from the objects
themselves: the custom resources' groups (with the release their vendored schemas come from,
schemas/README.md), the classes and issuers they name, the RuntimeClasses and device-plugin
resources the pods ask for, and the GatewayClass when the folder does not create it."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from common.constants import RPC_HELPER_LABEL, TAILSCALE_CLASS
from policy.rules import containers, pod_spec

SCHEMAS_README = Path(__file__).resolve().parent.parent / "schemas" / "README.md"
# Groups Kubernetes serves itself (no CRD to install).
CORE_GROUPS = {"", "apps", "batch", "policy", "networking.k8s.io", "rbac.authorization.k8s.io", "storage.k8s.io",
               "node.k8s.io", "autoscaling", "scheduling.k8s.io", "coordination.k8s.io"}
# Who serves a group's objects (the CRDs alone do nothing).
CONTROLLERS = {
    "aigateway.envoyproxy.io": "Envoy AI Gateway: its controller, and the extension server Envoy Gateway calls",
    "gateway.envoyproxy.io": "Envoy Gateway, configured with AI Gateway's extension manager",
    "gateway.networking.k8s.io": "Envoy Gateway; its gateway-helm chart carries the Gateway API v1.5.1 CRDs, "
                                 "experimental channel",
    "cert-manager.io": "cert-manager",
    "operator.victoriametrics.com": "the VictoriaMetrics operator",
    "cilium.io": "Cilium as the cluster's CNI",
    "autoscaling.k8s.io": "the Vertical Pod Autoscaler",
    "monitoring.coreos.com": "the Prometheus operator",
    "traefik.io": "Traefik v3 with its Kubernetes CRD provider, which k3s' bundled Traefik has",
}
# Which device plugin advertises a GPU resource.
DEVICE_PLUGINS = {
    "nvidia.com/": "the NVIDIA device plugin or GPU Operator",
    "gpu.intel.com/": "Intel's GPU device plugin",
    "amd.com/": "AMD's GPU device plugin",
}


@functools.cache
def schema_releases(readme: Path = SCHEMAS_README) -> dict[str, str]:
    """api group -> the upstream release its vendored schemas come from (the README's table)."""
    releases = {}
    for line in readme.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"[a-z0-9.-]+\.[a-z]+", cells[0]):
            releases[cells[0]] = cells[1].split(" (")[0]
    return releases


def _group(manifest: dict) -> str:
    api = manifest.get("apiVersion", "")
    return api.rsplit("/", 1)[0] if "/" in api else ""


def _label(manifest: dict) -> str:
    return f"{manifest['kind']} {manifest['metadata']['name']}"


def _secret_refs(pod: dict) -> list[tuple[str, str]]:
    """(Secret, key) every container's environment and the pod's volumes read."""
    refs = []
    for container in containers(pod):
        for env in container.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                refs.append((ref["name"], ref.get("key", "")))
    for volume in pod.get("volumes") or []:
        if "secret" in volume:
            refs.append((volume["secret"]["secretName"], ""))
    return refs


def prerequisites(objects: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """(what the cluster needs, what provides it, the objects that need it), CRDs first."""
    releases = schema_releases()
    needs: dict[str, tuple[str, list[str]]] = {}

    def need(what: str, who: str, how: str = "") -> None:
        needs.setdefault(what, (how, []))
        if who not in needs[what][1]:
            needs[what][1].append(who)

    for m in objects:
        group = _group(m)
        if group not in CORE_GROUPS:
            version = releases.get(group, "no vendored schema")
            need(f"CRDs of {group}", _label(m), f"{CONTROLLERS.get(group, 'its controller')}; checked against {version}")
    created = {(m["kind"], m["metadata"]["name"]) for m in objects}
    for m in objects:
        spec = m.get("spec") or {}
        if m["kind"] == "Ingress" and spec.get("ingressClassName"):
            need(f"IngressClass {spec['ingressClassName']}", _label(m), "its controller running")
        if m["kind"] == "Gateway" and ("GatewayClass", spec.get("gatewayClassName")) not in created:
            need(f"GatewayClass {spec.get('gatewayClassName')}", _label(m))
        if m["kind"] == "EnvoyProxy":
            service = ((spec.get("provider") or {}).get("kubernetes") or {}).get("envoyService") or {}
            if service.get("loadBalancerClass") == TAILSCALE_CLASS:
                need("the Tailscale Kubernetes operator", _label(m),
                     "it serves loadBalancerClass tailscale; without it the gateway's Service stays Pending")
            elif service.get("type", "LoadBalancer") == "LoadBalancer":
                which = service.get("loadBalancerClass")
                need(f"a LoadBalancer controller{f' for class {which}' if which else ''}", _label(m),
                     "k3s' ServiceLB or MetalLB on a LAN; without one the gateway's Service stays Pending")
        if m["kind"] == "PersistentVolumeClaim" and spec.get("storageClassName"):
            need(f"StorageClass {spec['storageClassName']}", _label(m))
        for template in spec.get("volumeClaimTemplates") or []:
            if template.get("spec", {}).get("storageClassName"):
                need(f"StorageClass {template['spec']['storageClassName']}", _label(m))
        if m["kind"] == "Certificate":
            ref = spec.get("issuerRef") or {}
            need(f"{ref.get('kind', 'Issuer')} {ref.get('name')}", _label(m), "cert-manager")
        issuer = (m["metadata"].get("annotations") or {}).get("cert-manager.io/cluster-issuer")
        if issuer:
            need(f"ClusterIssuer {issuer}", _label(m), "cert-manager")
        pod = pod_spec(m)
        if pod:
            namespace = m["metadata"].get("namespace", "default")
            for secret, key in _secret_refs(pod):
                if ("Secret", secret) not in created:
                    need(f"Secret {secret} in namespace {namespace}", _label(m), f"yours, key {key}" if key else "yours")
            if pod.get("runtimeClassName"):
                need(f"RuntimeClass {pod['runtimeClassName']}", _label(m))
            labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if RPC_HELPER_LABEL in labels:
                # llama.cpp's published images have no RPC (built without GGML_RPC): the split's image is the user's.
                image = (pod.get("containers") or [{}])[0].get("image")
                need(f"image {image} with ggml-rpc-server and llama-server built with GGML_RPC", _label(m),
                     "make rpc-image (images/llama-rpc/Dockerfile), pushed where the nodes pull from; docs/rpc-split.md")
            for container in pod.get("containers") or []:
                for resource in (container.get("resources") or {}).get("limits") or {}:
                    plugin = next((p for prefix, p in DEVICE_PLUGINS.items() if resource.startswith(prefix)), None)
                    if plugin is not None:
                        need(f"{resource} on the nodes", _label(m), plugin)
    return sorted(((what, how, who) for what, (how, who) in needs.items()),
                  key=lambda item: (not item[0].startswith("CRDs"), item[0]))


def admitted_pods(objects: list[dict[str, Any]]) -> list[str]:
    """A kubectl command per pod group the namespaces' policies let in from elsewhere: the controller,
    the gateway's Envoy pods, the scrapers. If one lists nothing, those pods run elsewhere (or carry
    other labels) and the policy keeps them out."""
    from .reach import NODES, admitted

    commands = []
    for namespace in sorted({m["metadata"]["name"] for m in objects if m["kind"] == "Namespace"}):
        for peer_ns, labels in admitted(objects, namespace):
            if peer_ns in (namespace, NODES):
                continue
            selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
            command = f"kubectl get pods -n {peer_ns}" + (f" -l {selector}" if selector else "")
            if command not in commands:
                commands.append(command)
    return commands


# The Gateway API release Envoy Gateway 1.8 and AI Gateway 1.1 are built against (schemas/README.md), and the
# experimental channel their chart installs (BackendTLSPolicy v1 arrived in v1.4).
GATEWAY_API = "v1.5.1"


def setup_steps(objects: list[dict[str, Any]], stack: Any) -> list[tuple[str, str]]:
    """Settings of the cluster's own components that the objects depend on but cannot show, each with the
    command that checks it: (what to do, the check). ``stack``: the validated stack config (or None)."""
    steps: list[tuple[str, str]] = []
    groups = {_group(m) for m in objects}
    if "gateway.networking.k8s.io" in groups:
        steps.append((
            f"The Gateway API {GATEWAY_API} CRDs, experimental channel, before Envoy Gateway's chart: k3s' bundled "
            "Traefik installs older ones (its traefik-crd chart), which Helm 3 then leaves in place (Helm 4 fails), and "
            "without BackendTLSPolicy v1 the remote tier's TLS policy is refused and the fallback breaks: "
            f"`kubectl apply --server-side --force-conflicts -f https://github.com/kubernetes-sigs/gateway-api/releases/"
            f"download/{GATEWAY_API}/experimental-install.yaml`",
            "kubectl get crd gateways.gateway.networking.k8s.io -o jsonpath='{.metadata.annotations.gateway\\.networking"
            f"\\.k8s\\.io/bundle-version}}'   # {GATEWAY_API}; and backendtlspolicies.gateway.networking.k8s.io serves v1"))
    if stack is None:
        return steps
    for key, pool in stack.node_pools.items():
        if pool.gpu_resource and pool.gpu_shares > 1:
            sharing = pool.sharing() if callable(getattr(pool, "sharing", None)) else None
            how = ("NVIDIA's device plugin with time-slicing: `sharing.timeSlicing.resources: [{name: nvidia.com/gpu, "
                   f"replicas: {pool.gpu_shares}}}]` in its config (GPU Operator: the devicePlugin config map)"
                   if sharing == "time-slicing" else
                   f"Intel's GPU device plugin started with `-shared-dev-num {pool.gpu_shares}`")
            steps.append((f"node pool {key}: {pool.gpu_shares} containers share one GPU ({pool.gpu_resource}): {how}; "
                          "with a stock plugin the second pod stays Pending",
                          f"kubectl get nodes -o custom-columns=NODE:.metadata.name,GPU:'.status.allocatable.{_escaped(pool.gpu_resource)}'"
                          f"   # {pool.gpu_shares} per GPU"))
        if pool.backend in ("cuda",) and pool.gpu_resource:
            steps.append((f"node pool {key}: the NVIDIA driver (>= 580 for the CUDA 13 images llama.cpp b10731 ships) "
                          "before k3s' first start, then the NVIDIA container toolkit: k3s finds it at start and writes "
                          "the nvidia RuntimeClass's handler into its containerd config",
                          "nvidia-smi --query-gpu=driver_version --format=csv,noheader; "
                          "grep -c nvidia /var/lib/rancher/k3s/agent/etc/containerd/config.toml"))
        if pool.gpu_resource and not pool.gpu_resource.startswith("nvidia.com/") and not pool.supplemental_groups:
            steps.append((f"node pool {key}: the pods run as UID 1000 with no extra group, so the device nodes the "
                          f"plugin hands them ({pool.gpu_resource}) must be open to every user (Talos' siderolabs "
                          "extensions: yes); where /dev/dri/renderD* is root:render 0660 (Ubuntu, Debian), set "
                          f"node_pools.{key}.supplemental_groups to the render and video GIDs, or llama.cpp falls back "
                          "to the CPU without a word",
                          "ls -ln /dev/dri/   # on each node of the pool: mode crw-rw-rw-, or the GIDs you list"))
        if pool.supplemental_groups:
            steps.append((f"node pool {key}: the pods join the GIDs {', '.join(map(str, pool.supplemental_groups))} to open "
                          "/dev/dri (the render and video groups on the node); with other GIDs llama.cpp falls back to "
                          "the CPU, silently", "getent group render video   # on each node of the pool"))
    exposed = [m for m in stack.models.values() if m.exposure is not None and m.exposure.source_ranges]
    ingress = stack.cluster.ingress
    if exposed and ingress is not None and ingress.kind in ("traefik", "ingress-nginx"):
        steps.append((f"{ingress.kind}'s Service with `externalTrafficPolicy: Local`: behind k3s' ServiceLB (klipper-lb) "
                      "with the default Cluster policy every client arrives as a pod address (10.42.x), inside the "
                      "private ranges the source check admits, so the check admits everyone (the key still holds). "
                      "k3s' Traefik: a HelmChartConfig for traefik in kube-system with `service.spec.externalTrafficPolicy: "
                      "Local`; and keep the k3s pod and service CIDRs (--cluster-cidr, --service-cidr) out of the ranges "
                      "you list",
                      f"kubectl get svc -n {ingress.namespace} -o custom-columns=NAME:.metadata.name,"
                      "POLICY:.spec.externalTrafficPolicy   # Local"))
    if stack.observability is not None and stack.cluster.monitoring is not None:
        steps.append(("VictoriaMetrics' VMAgent and VMAlert selecting every namespace's VMServiceScrape and VMRule "
                      "(selectAllByDefault, or their selectors matching this folder's labels), kube-state-metrics and "
                      "the kubelet's cAdvisor scraped (the alerts read kube_* and container_* series), and Grafana's "
                      "dashboard sidecar searching this namespace",
                      "kubectl get vmagent,vmalert -A -o yaml | grep -i selectAllByDefault; "
                      "kubectl get pods -A -l app.kubernetes.io/name=kube-state-metrics"))
    return steps


def _escaped(resource: str) -> str:
    return resource.replace(".", "\\.")


def prerequisites_text(stack: str, objects: list[dict[str, Any]], config: Any = None) -> str:
    lines = [f"# What the cluster needs before this folder applies (stack {stack})", "",
             "Read from the manifests in this folder; `pulumi up` needs the same. Install these first, then",
             "follow SECRETS.md (namespace, Secrets, then `kubectl apply -k .`).", ""]
    found = prerequisites(objects)
    for what, how, who in found:
        lines.append(f"- {what}{f' ({how})' if how else ''}: for {', '.join(who)}")
    if not found:
        lines.append("- nothing beyond Kubernetes itself")
    steps = setup_steps(objects, config)
    if steps:
        lines += ["", "How those components must be set up for this folder, each with the command that checks it:", ""]
        for what, check in steps:
            lines += [f"- {what}", f"  check: `{check}`"]
    commands = admitted_pods(objects)
    if commands:
        lines += ["", "The network policy lets in these pods from other namespaces, as configured (`cluster`, `gateway`).",
                  "Each command must list the pods that serve it; if one lists nothing, they run elsewhere or carry",
                  "other labels, and the policy keeps them out (fix `cluster.ingress`, `cluster.monitoring`,",
                  "`gateway.envoy_namespace`):", ""]
        lines += [f"    {command}" for command in commands]
    return "\n".join(lines) + "\n"
