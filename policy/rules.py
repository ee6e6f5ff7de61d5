"""The guardrails, as plain functions over Kubernetes objects (what the provider would apply).

Each rule takes the object's properties (or every object, for a stack rule), a ``report``
callback and the pack's config. ``pack.py`` wraps them as CrossGuard policies for
``pulumi preview --policy-pack policy``; the offline render calls the same functions over every
resource it renders. Nothing here imports Pulumi; the facts the rules check against are the
program's own (common/constants.py, which imports nothing), so the pack and the program cannot drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

from common.constants import (
    API_KEY_VOLUME,
    CLUSTER_DOMAIN,
    COLD_START_ANNOTATION,
    HEALTH_ANNOTATION,
    LOAD_BALANCER_WAIVER,
    LLAMACPP_HEALTH_PATH,
    MODEL_SERVER_COMPONENTS,
    MTLS_ANNOTATION,
    PINNED_IMAGE,
    ROUTER_CLIENT_PATHS,
    ROUTER_PRESET_FLAG,
    TAILSCALE_CLASS,
    TAILSCALE_HOSTNAME,
    WORKLOAD_KINDS,
    WORLD_EGRESS_WAIVER,
    WRITABLE_ROOT_WAIVER,
    probe_allows_seconds,
    tailnet_device,
)

from . import rpc

Report = Callable[[str], None]
Props = Mapping[str, Any]

CREDENTIAL_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.I)


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    check: Callable[..., None]
    stack: bool = False


def _meta(props: Props) -> Mapping[str, Any]:
    return props.get("metadata") or {}


def _annotations(props: Props) -> Mapping[str, str]:
    return _meta(props).get("annotations") or {}


def _labels(props: Props) -> Mapping[str, str]:
    return _meta(props).get("labels") or {}


def pod_spec(props: Props) -> Optional[Mapping[str, Any]]:
    kind = props.get("kind")
    if kind == "Pod":
        return props.get("spec")
    if kind == "CronJob":
        return (((props.get("spec") or {}).get("jobTemplate") or {}).get("spec") or {}).get("template", {}).get("spec")
    if kind in WORKLOAD_KINDS:
        return ((props.get("spec") or {}).get("template") or {}).get("spec")
    return None


def containers(spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    yield from spec.get("initContainers") or []
    yield from spec.get("containers") or []


def _env(container: Mapping[str, Any]) -> dict[str, str]:
    return {e.get("name"): e.get("value") for e in container.get("env") or [] if "value" in e}


HF_ENV = ("HF_HUB_OFFLINE", "HF_REPO", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")


def hf_hub_cache(env: Mapping[str, str]) -> str:
    """Where huggingface_hub reads and writes its cache for this environment (its constants module:
    HF_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub)."""
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]
    home = env.get("HF_HOME") or f"{env.get('XDG_CACHE_HOME') or (env.get('HOME') or '/root') + '/.cache'}/huggingface"
    return f"{home.rstrip('/')}/hub"


def _persistent_volumes(props: Props, spec: Mapping[str, Any]) -> set[str]:
    claims = {(_meta(t).get("name")) for t in (props.get("spec") or {}).get("volumeClaimTemplates") or []}
    return claims | {v.get("name") for v in spec.get("volumes") or [] if "persistentVolumeClaim" in v}


# --- resource rules ------------------------------------------------------------------------------


def pod_security_restricted(props: Props, report: Report, config: Mapping) -> None:
    spec = pod_spec(props)
    if spec is None:
        return
    pod_ctx = spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            report(f"{flag} is set")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            report(f"volume {volume.get('name')} is a hostPath")
    if pod_ctx.get("runAsUser") == 0:
        report("the pod runs as UID 0")
    writable_root_ok = bool(_annotations(props).get(WRITABLE_ROOT_WAIVER))
    for container in containers(spec):
        ctx = container.get("securityContext") or {}
        name = container.get("name")
        if not (ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is True):
            report(f"container {name}: runAsNonRoot is not true")
        seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            report(f"container {name}: seccompProfile is not RuntimeDefault")
        if ctx.get("allowPrivilegeEscalation") is not False:
            report(f"container {name}: allowPrivilegeEscalation is not false")
        if ctx.get("privileged"):
            report(f"container {name}: privileged")
        if "ALL" not in ((ctx.get("capabilities") or {}).get("drop") or []):
            report(f"container {name}: capabilities do not drop ALL")
        if (ctx.get("capabilities") or {}).get("add"):
            report(f"container {name}: adds capabilities")
        if ctx.get("readOnlyRootFilesystem") is not True and not writable_root_ok:
            report(
                f"container {name}: root filesystem is writable; mount writable paths as emptyDir, or annotate "
                f"the workload {WRITABLE_ROOT_WAIVER}: <reason>"
            )


def images_pinned(props: Props, report: Report, config: Mapping) -> None:
    spec = pod_spec(props)
    if spec is None:
        return
    for container in containers(spec):
        image = container.get("image", "")
        if not PINNED_IMAGE.fullmatch(image):
            report(f"container {container.get('name')}: image {image!r} is not pinned to a build tag or digest")


def _probe_seconds(probe: Optional[Mapping[str, Any]]) -> int:
    if not probe:
        return 0
    return probe_allows_seconds(int(probe.get("periodSeconds", 10)), int(probe.get("failureThreshold", 3)))


def model_server_budgets(props: Props, report: Report, config: Mapping) -> None:
    if props.get("kind") not in WORKLOAD_KINDS or _labels(props).get("app.kubernetes.io/component") not in MODEL_SERVER_COMPONENTS:
        return
    spec = pod_spec(props) or {}
    annotations = _annotations(props)
    (server, *_) = spec.get("containers") or [{}]
    if not ((server.get("resources") or {}).get("limits") or {}).get("memory"):
        report(f"container {server.get('name')}: no memory limit")
    cold_start = annotations.get(COLD_START_ANNOTATION)
    if cold_start is None:
        report(f"no {COLD_START_ANNOTATION} annotation: the cold-start estimate is unknown")
    elif _probe_seconds(server.get("startupProbe")) < int(cold_start):
        report(
            f"startup probe allows {_probe_seconds(server.get('startupProbe'))} s, less than the model's "
            f"cold start of {cold_start} s: the pod would be killed while it downloads"
        )
    health = annotations.get(HEALTH_ANNOTATION)
    # The readiness the Service sees: the container holding the port it targets (a proxy in front of
    # the server answers the server's health through it).
    front = next((c for c in spec.get("containers") or [] if any(p.get("name") == "http" for p in c.get("ports") or [])),
                 server)
    readiness = ((front.get("readinessProbe") or {}).get("httpGet") or {}).get("path")
    if readiness is None:
        report("no HTTP readiness probe")
    elif health is not None and readiness != health:
        report(f"readiness probes {readiness}, not the engine's health path {health}")
    if "llama.cpp" in server.get("image", "") and readiness not in (None, LLAMACPP_HEALTH_PATH):
        report("llama.cpp's readiness is /health: 503 until the model is resident")


def narrow_egress(props: Props, report: Report, config: Mapping) -> None:
    if props.get("kind") not in ("CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy"):
        return
    if _annotations(props).get(WORLD_EGRESS_WAIVER):
        return
    for rule in (props.get("spec") or {}).get("egress") or []:
        wide = {"world", "all"} & set(rule.get("toEntities") or [])
        if wide:
            report(
                f"egress to {', '.join(sorted(wide))}: name the hosts with toFQDNs, or annotate "
                f"{WORLD_EGRESS_WAIVER}: <reason>"
            )


def exposure_lan_only(props: Props, report: Report, config: Mapping) -> None:
    kind = props.get("kind")
    public_labels = set(config.get("publicDnsLabels") or [])
    if kind == "Ingress":
        spec = props.get("spec") or {}
        tls_hosts = {h for t in spec.get("tls") or [] for h in t.get("hosts") or []}
        for rule in spec.get("rules") or []:
            if rule.get("host") not in tls_hosts:
                report(f"host {rule.get('host')} is served without TLS")
        if not spec.get("tls"):
            report("no TLS")
        for key in public_labels & set(_labels(props)):
            report(f"carries the public-DNS label {key}: the record would be published on the internet")
    if kind == "Service" and (props.get("spec") or {}).get("type") in ("LoadBalancer", "NodePort"):
        report(f"Service type {props['spec']['type']}: only the gateway's tailnet listener may face out")
    if kind == "EnvoyProxy":
        service = ((((props.get("spec") or {}).get("provider") or {}).get("kubernetes") or {}).get("envoyService") or {})
        off_tailnet = service.get("loadBalancerClass") != TAILSCALE_CLASS
        if service.get("type", "LoadBalancer") == "LoadBalancer" and off_tailnet and not _annotations(props).get(LOAD_BALANCER_WAIVER):
            which = f"class {service['loadBalancerClass']}" if service.get("loadBalancerClass") else "no loadBalancerClass"
            report(f"the gateway's LoadBalancer has {which} and no {LOAD_BALANCER_WAIVER} reason: it could get a "
                   "public address")


def no_inline_credentials(props: Props, report: Report, config: Mapping) -> None:
    spec = pod_spec(props)
    if spec is not None:
        for container in containers(spec):
            for env in container.get("env") or []:
                if CREDENTIAL_NAME.search(env.get("name", "")) and "value" in env:
                    report(f"container {container.get('name')}: {env['name']} is a literal; take it from a Secret")
            args = container.get("args") or []
            if "--api-key" in args or "--hf-token" in args:
                report(f"container {container.get('name')}: a credential on the command line; use a file from a Secret")
    if props.get("kind") in ("HTTPRoute", "HTTPRouteFilter"):
        text = repr(props.get("spec"))
        if re.search(r"Bearer [A-Za-z0-9._-]{8,}", text):
            report("a bearer credential inline in a route; inject it from a Secret")


# --- stack rules ---------------------------------------------------------------------------------


def _by_kind(resources: Iterable[Props]) -> dict[str, list[Props]]:
    out: dict[str, list[Props]] = {}
    for props in resources:
        out.setdefault(props.get("kind", ""), []).append(props)
    return out


def default_deny(resources: list[Props], report: Report, config: Mapping) -> None:
    """Every pod is selected, in both directions: by a policy of its namespace that selects every pod, or every pod
    but a split's helpers when each helper's pods are selected by a policy of their own in both directions
    (policy/rpc.py checks what that one admits)."""
    kinds = _by_kind(resources)
    covered = set()
    fenced = {(_meta(w).get("namespace"), _meta(w).get("name")) for w, labels in rpc.helpers(resources)
              if any(rpc.selects(p, labels) and _both_ways(p) for p in kinds.get("NetworkPolicy", [])
                     + kinds.get("CiliumNetworkPolicy", []) if _meta(p).get("namespace") == _meta(w).get("namespace"))}
    all_fenced = {ns for ns, _ in fenced} - {_meta(w).get("namespace") for w, _ in rpc.helpers(resources)
                                            if (_meta(w).get("namespace"), _meta(w).get("name")) not in fenced}
    for policy in kinds.get("CiliumNetworkPolicy", []) + kinds.get("NetworkPolicy", []):
        selector = (policy.get("spec") or {}).get("endpointSelector" if policy.get("kind") == "CiliumNetworkPolicy" else "podSelector")
        namespace = _meta(policy).get("namespace")
        if _both_ways(policy) and (selector == {} or (selector == rpc.ALL_BUT_HELPERS and namespace in all_fenced)):
            covered.add(namespace)
    for namespace in kinds.get("Namespace", []):
        name = _meta(namespace).get("name")
        if name not in covered:
            report(f"namespace {name} has no default-deny policy selecting every pod in both directions")


def _both_ways(policy: Props) -> bool:
    spec = policy.get("spec") or {}
    if policy.get("kind") == "CiliumNetworkPolicy":
        deny = spec.get("enableDefaultDeny") or {}
        return ("ingress" in spec or deny.get("ingress") is True) and ("egress" in spec or deny.get("egress") is True)
    return set(spec.get("policyTypes") or []) == {"Ingress", "Egress"}


def _service_fqdns(resources: list[Props], component: str) -> dict[str, Props]:
    out = {}
    for service in _by_kind(resources).get("Service", []):
        if _labels(service).get("app.kubernetes.io/component") == component:
            meta = _meta(service)
            out[f"{meta.get('name')}.{meta.get('namespace')}.{CLUSTER_DOMAIN}"] = service
    return out


def _services_of(resources: list[Props], pods: Callable[[Mapping[str, Any]], bool]) -> set[str]:
    """Services that select the pods of a workload whose pod spec passes ``pods``."""
    kinds = _by_kind(resources)
    found = set()
    for service in kinds.get("Service", []):
        selector = (service.get("spec") or {}).get("selector") or {}
        for workload in kinds.get("Deployment", []) + kinds.get("StatefulSet", []):
            template = (workload.get("spec") or {}).get("template") or {}
            labels = (template.get("metadata") or {}).get("labels") or {}
            if selector and selector.items() <= labels.items() and pods(template.get("spec") or {}):
                found.add(_meta(service).get("name"))
    return found


def keyed_services(resources: list[Props]) -> set[str]:
    """Services whose pods mount an API key (the volume the program names api-key)."""
    return _services_of(resources, lambda spec: any(v.get("name") == API_KEY_VOLUME for v in spec.get("volumes") or []))


def router_management_not_exposed(resources: list[Props], report: Report, config: Mapping) -> None:
    """A router's model management (POST /models downloads any Hub repo into the pod, /models/load,
    /models/unload, DELETE /models) answers any key holder: an Ingress to a router routes only the exact
    inference and listing paths."""
    kinds = _by_kind(resources)
    routers = _services_of(resources, lambda spec: any(ROUTER_PRESET_FLAG in (c.get("args") or []) for c in containers(spec)))
    for ingress in kinds.get("Ingress", []):
        for rule in (ingress.get("spec") or {}).get("rules") or []:
            for path in (rule.get("http") or {}).get("paths") or []:
                service = ((path.get("backend") or {}).get("service") or {}).get("name")
                if service in routers and (path.get("pathType") != "Exact" or path.get("path") not in ROUTER_CLIENT_PATHS):
                    report(f"Ingress {_meta(ingress).get('name')} sends {path.get('pathType')} {path.get('path')} to the "
                           f"router {service}, whose model management any key holder could then call")


def affinity_keeps_fallback(resources: list[Props], report: Report, config: Mapping) -> None:
    """A consistent hash on an AI route's rule whose backends span priorities would keep its requests off
    the fallback: Envoy's hash balancers ignore the retry's priority step (envoyproxy/envoy#9042)."""
    kinds = _by_kind(resources)
    routes = {_meta(r).get("name"): r for r in kinds.get("AIGatewayRoute", []) + kinds.get("HTTPRoute", [])}
    for policy in kinds.get("BackendTrafficPolicy", []):
        if ((policy.get("spec") or {}).get("loadBalancer") or {}).get("type") != "ConsistentHash":
            continue
        for ref in (policy.get("spec") or {}).get("targetRefs") or []:
            route = routes.get(ref.get("name"))
            if route is None:
                continue
            for rule in (route.get("spec") or {}).get("rules") or []:
                if ref.get("sectionName") not in (None, rule.get("name")):
                    continue
                priorities = {b.get("priority", 0) for b in rule.get("backendRefs") or []}
                if len(priorities) > 1:
                    report(f"BackendTrafficPolicy {_meta(policy).get('name')} hashes rule {rule.get('name')} of "
                           f"{ref.get('name')}, whose fallback (priorities {sorted(priorities)}) a hash never reaches")


def embeddings_not_exposed(resources: list[Props], report: Report, config: Mapping) -> None:
    kinds = _by_kind(resources)
    embedding_services = _service_fqdns(resources, "embeddings")
    names = {_meta(s).get("name") for s in embedding_services.values()}
    keyed = keyed_services(resources)
    for ingress in kinds.get("Ingress", []):
        for rule in (ingress.get("spec") or {}).get("rules") or []:
            for path in (rule.get("http") or {}).get("paths") or []:
                service = ((path.get("backend") or {}).get("service") or {}).get("name")
                if service not in names:
                    continue
                # Exposed on request, only the exact embeddings path, and only behind the server's key.
                if path.get("pathType") != "Exact" or not str(path.get("path", "")).endswith("/embeddings"):
                    report(f"Ingress {_meta(ingress).get('name')} sends {path.get('path')} to the embedding server {service}")
                elif service not in keyed:
                    report(f"Ingress {_meta(ingress).get('name')} exposes the embedding server {service}, which takes no API key")
    for route in kinds.get("HTTPRoute", []):
        for rule in (route.get("spec") or {}).get("rules") or []:
            targets = {b.get("name") for b in rule.get("backendRefs") or []} & names
            paths = [(m.get("path") or {}).get("value", "/") for m in rule.get("matches") or [{}]]
            if targets and not all(p.rstrip("/").endswith("/embeddings") for p in paths):
                report(f"HTTPRoute {_meta(route).get('name')} sends {', '.join(paths)} to the embedding server")
    # AI routes may carry an embedding model (with fallback), provided generation requests that
    # name it are refused before they reach it.
    backends = {_meta(b).get("name"): b for b in kinds.get("Backend", [])}
    ai_backends = {_meta(b).get("name"): b for b in kinds.get("AIServiceBackend", [])}
    guarded = set()
    for route in kinds.get("HTTPRoute", []):
        for rule in (route.get("spec") or {}).get("rules") or []:
            if rule.get("backendRefs") or not rule.get("filters"):
                continue
            paths = {(m.get("path") or {}).get("value") for m in rule.get("matches") or []}
            if "/v1/chat/completions" in paths and "/v1/completions" in paths:
                guarded |= {h.get("value") for m in rule.get("matches") or [] for h in m.get("headers") or []}
    for route in kinds.get("AIGatewayRoute", []):
        for rule in (route.get("spec") or {}).get("rules") or []:
            models = {h.get("value") for m in rule.get("matches") or [] for h in m.get("headers") or [] if h.get("type") == "Exact"}
            for ref in rule.get("backendRefs") or []:
                backend = ai_backends.get(ref.get("name")) or {}
                target = (backend.get("spec") or {}).get("backendRef", {}).get("name")
                endpoints = ((backends.get(target) or {}).get("spec") or {}).get("endpoints") or []
                if any((e.get("fqdn") or {}).get("hostname") in embedding_services for e in endpoints):
                    if not models or not models <= guarded:
                        report(
                            f"AIGatewayRoute {_meta(route).get('name')} rule {rule.get('name')} reaches an embedding "
                            "server without a guard refusing chat requests for its model"
                        )


def gateway_requires_auth(resources: list[Props], report: Report, config: Mapping) -> None:
    kinds = _by_kind(resources)

    def targets(policy: Props) -> set[str]:
        return {r.get("name") for r in (policy.get("spec") or {}).get("targetRefs") or [] if r.get("kind") == "Gateway"}

    keyed = set()
    for policy in kinds.get("SecurityPolicy", []):
        if ((policy.get("spec") or {}).get("apiKeyAuth") or {}).get("credentialRefs"):
            keyed |= targets(policy)
    verified = set()
    for policy in kinds.get("ClientTrafficPolicy", []):
        validation = (((policy.get("spec") or {}).get("tls") or {}).get("clientValidation") or {})
        if validation.get("caCertificateRefs") and validation.get("mode", "RequireAndVerify") in ("RequireAndVerify", "RequireAny"):
            verified |= targets(policy)
    for gateway in kinds.get("Gateway", []):
        name = _meta(gateway).get("name")
        if name not in keyed:
            report(f"Gateway {name} admits requests without an API key (no apiKeyAuth SecurityPolicy on it)")
        if _annotations(gateway).get(MTLS_ANNOTATION) == "required" and name not in verified:
            report(f"Gateway {name} must require a client certificate (mTLS) but no ClientTrafficPolicy verifies one")


def hf_cache_on_weights_volume(props: Props, report: Report, config: Mapping) -> None:
    """Every container of a pod that uses the Hugging Face cache resolves it to the same path, and
    that path is on a persistent volume (a claim), not on scratch: a prefetch that writes where the
    engine does not look leaves an offline engine with no weights."""
    spec = pod_spec(props)
    if spec is None:
        return
    persistent = _persistent_volumes(props, spec)
    seen: dict[str, str] = {}
    for container in containers(spec):
        env = _env(container)
        if not any(k in env for k in HF_ENV):
            continue
        cache = hf_hub_cache(env)
        seen[container.get("name", "?")] = cache
        mounts = [m for m in container.get("volumeMounts") or []
                  if cache == m.get("mountPath") or cache.startswith(m.get("mountPath", "").rstrip("/") + "/")]
        mount = max(mounts, key=lambda m: len(m.get("mountPath", "")), default=None)
        if mount is None or mount.get("name") not in persistent:
            where = f"volume {mount.get('name')}, not a claim" if mount else "no volume"
            report(f"container {container.get('name')} uses the Hugging Face cache at {cache} ({where}); "
                   "set HF_HOME to a path on the weights claim")
    if len(set(seen.values())) > 1:
        listed = ", ".join(f"{name} at {path}" for name, path in sorted(seen.items()))
        report(f"containers disagree on the Hugging Face cache ({listed}); set the same HF_HOME in each")


def tailnet_name_resolves(resources: list[Props], report: Report, config: Mapping) -> None:
    """A Gateway served on the tailnet answers at its listeners' hostnames only when its EnvoyProxy
    names the tailnet device after them (the first DNS label; MagicDNS adds the tailnet suffix)."""
    kinds = _by_kind(resources)
    proxies = {_meta(p).get("name"): p for p in kinds.get("EnvoyProxy", [])}
    for gateway in kinds.get("Gateway", []):
        spec = gateway.get("spec") or {}
        ref = (spec.get("infrastructure") or {}).get("parametersRef") or {}
        proxy = proxies.get(ref.get("name")) if ref.get("kind") == "EnvoyProxy" else None
        if proxy is None:
            continue
        service = (((proxy.get("spec") or {}).get("provider") or {}).get("kubernetes") or {}).get("envoyService") or {}
        if service.get("loadBalancerClass") != TAILSCALE_CLASS:
            continue
        device = (service.get("annotations") or {}).get(TAILSCALE_HOSTNAME)
        for listener in spec.get("listeners") or []:
            host = listener.get("hostname")
            if host and tailnet_device(host) != device:
                named = f"names the device {device!r}" if device else f"has no {TAILSCALE_HOSTNAME} annotation"
                report(f"Gateway {_meta(gateway).get('name')} listens on {host} but EnvoyProxy {ref.get('name')} {named}; "
                       f"set {TAILSCALE_HOSTNAME}: {tailnet_device(host)} on its envoyService")


def _seconds(duration: Any) -> Optional[float]:
    """A Gateway API duration (1h, 5m, 600s, 300ms, combined) in seconds; None if unparseable."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(duration or ""))
    if not parts or "".join(n + u for n, u in parts) != str(duration):
        return None
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def idle_outlasts_request(resources: list[Props], report: Report, config: Mapping) -> None:
    """A route whose request may take T must not go idle-timed-out before T: the idle limit is the
    BackendTrafficPolicy's on the route, else the ClientTrafficPolicy's on its Gateway (Envoy
    Gateway sets no route-level idle timeout of its own)."""
    kinds = _by_kind(resources)

    def idle_by_target(kind: str, policy_kind: str) -> dict[str, float]:
        out = {}
        for policy in kinds.get(policy_kind, []):
            idle = _seconds((((policy.get("spec") or {}).get("timeout") or {}).get("http") or {}).get("streamIdleTimeout"))
            for ref in (policy.get("spec") or {}).get("targetRefs") or []:
                if ref.get("kind") == kind and idle is not None:
                    out[ref.get("name")] = idle
        return out

    on_route, on_gateway = idle_by_target("HTTPRoute", "BackendTrafficPolicy"), idle_by_target("Gateway", "ClientTrafficPolicy")
    for route in kinds.get("HTTPRoute", []):
        name = _meta(route).get("name")
        spec = route.get("spec") or {}
        idle = on_route.get(name)
        if idle is None:
            limits = [on_gateway[p.get("name")] for p in spec.get("parentRefs") or [] if p.get("name") in on_gateway]
            idle = min(limits) if limits else None
        for rule in spec.get("rules") or []:
            request = _seconds((rule.get("timeouts") or {}).get("request"))
            if idle is not None and request and idle < request:
                report(f"HTTPRoute {name}: request timeout {request:g}s but streams idle out after {idle:g}s; "
                       f"add a BackendTrafficPolicy on the route with timeout.http.streamIdleTimeout >= {request:g}s")
    # AI Gateway generates an HTTPRoute of the AIGatewayRoute's name; a non-streamed completion sends
    # nothing until it is done, so the route's idle limit bounds the longest completion.
    for route in kinds.get("AIGatewayRoute", []):
        name = _meta(route).get("name")
        spec = route.get("spec") or {}
        listener = [on_gateway[p.get("name")] for p in spec.get("parentRefs") or [] if p.get("name") in on_gateway]
        for rule in spec.get("rules") or []:
            timeouts = rule.get("timeouts") or {}
            if "request" not in timeouts:
                report(f"AIGatewayRoute {name} rule {rule.get('name')}: no timeouts.request, so AI Gateway cuts every "
                       "request at 60 s; set it (0s: unbounded)")
                continue
            request = _seconds(timeouts["request"])
            if name not in on_route and listener and (not request or request > min(listener)):
                report(f"AIGatewayRoute {name}: completions may take {'unbounded time' if not request else f'{request:g}s'} "
                       f"but the listener ends a silent stream after {min(listener):g}s, and a non-streamed answer is "
                       "silent until done; add a BackendTrafficPolicy on the route with timeout.http.streamIdleTimeout")
            per_try = _seconds(rule.get("streamIdleTimeout"))
            if per_try is not None and name in on_route and per_try < on_route[name]:
                report(f"AIGatewayRoute {name} rule {rule.get('name')}: streamIdleTimeout {per_try:g}s is a per-try idle "
                       f"limit: a completion silent that long is re-run on the next tier before the route's "
                       f"{on_route[name]:g}s; remove it or raise it")


# Package managers installing at container start: the pod then depends on an index being up and
# reachable (egress to it), and on unpinned transitive dependencies, at every restart.
# A package install, or a script fetched and piped into a shell (`curl ... | sh`): either runs code the
# image does not hold, from wherever the network says, at every start.
RUNTIME_INSTALL = re.compile(r"\b(pip3?|uv pip|npm|yarn|apt-get|apt|apk|dnf|yum)\s+(install|add)\b"
                             r"|\|\s*(ba|da|z)?sh\b|\b(curl|wget)\b[^|;&]*\|\s*\S+")


def no_runtime_installs(props: Props, report: Report, config: Mapping) -> None:
    """Containers run what their image holds: nothing is installed when a pod starts."""
    spec = pod_spec(props)
    if spec is None:
        return
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        line = " ".join([*(container.get("command") or []), *(container.get("args") or [])])
        found = RUNTIME_INSTALL.search(line)
        if found:
            report(f"container {container.get('name')} runs `{found.group(0)}` at start: every restart then needs the "
                   "package index and unpinned dependencies; use an image that already holds the tool")


RESOURCE_RULES = [
    Rule("pod-security-restricted", "Pods meet the restricted Pod Security Standard, read-only root included.", pod_security_restricted),
    Rule("images-pinned", "Every container image is pinned to a build tag or a digest.", images_pinned),
    Rule("model-server-budgets", "Model servers have a memory limit, a cold-start budget and real readiness.", model_server_budgets),
    Rule("narrow-egress", "No world egress where FQDN rules can name the hosts.", narrow_egress),
    Rule("exposure-lan-only", "Ingresses use TLS and no public-DNS label; nothing else faces out.", exposure_lan_only),
    Rule("no-inline-credentials", "Credentials come from Secrets, never literals in specs.", no_inline_credentials),
    Rule("hf-cache-on-weights-volume", "Containers sharing the Hugging Face cache agree on it, on a claim.", hf_cache_on_weights_volume),
    Rule("no-runtime-installs", "Nothing is installed from a package index when a pod starts.", no_runtime_installs),
]
STACK_RULES = [
    Rule("default-deny", "Every namespace has a default-deny network policy.", default_deny, stack=True),
    Rule("embeddings-not-exposed", "An embedding model is never reachable by a chat request: an Ingress may route only its exact "
         "embeddings path, behind its API key.", embeddings_not_exposed, stack=True),
    Rule("router-management-not-exposed", "A router's Ingress routes only exact inference and listing paths, never its "
         "model management.", router_management_not_exposed, stack=True),
    Rule("affinity-keeps-fallback", "Session affinity only on AI route rules with no fallback a hash would skip.",
         affinity_keeps_fallback, stack=True),
    Rule("gateway-requires-auth", "The gateway demands an API key, and a client certificate when mTLS is on.", gateway_requires_auth, stack=True),
    Rule("idle-outlasts-request", "No route idles out before its own request timeout.", idle_outlasts_request, stack=True),
    Rule("tailnet-name-resolves", "A tailnet Gateway's device is named after its listener hostname.", tailnet_name_resolves, stack=True),
    Rule("rpc-helpers-fenced", "A split's RPC helpers admit the main server's pods alone, on their port alone, connect "
         "nowhere, and nothing routes to them.", rpc.rpc_helpers_fenced, stack=True),
]


def run_rules(resources: list[tuple[str, Props]], config: Mapping) -> list[tuple[str, str, str]]:
    """Every violation as (rule, resource, message); resources are (name, props)."""
    violations: list[tuple[str, str, str]] = []
    for rule in RESOURCE_RULES:
        for name, props in resources:
            rule.check(props, lambda message, n=name, r=rule.name: violations.append((r, n, message)), config)
    everything = [props for _, props in resources]
    for rule in STACK_RULES:
        rule.check(everything, lambda message, r=rule.name: violations.append((r, "stack", message)), config)
    return violations
