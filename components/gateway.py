"""InferenceGateway: Envoy AI Gateway 1.1 in front of the model servers, with remote fallback.

A request enters the tailnet-only HTTPS listener, presents a client certificate (when the stack
says mTLS) and a gateway-issued API key, and is routed by the model named in its body: the AI
gateway's ext_proc copies the body's `model` into `x-ai-eg-model` (overwriting anything a client
sent), and each AIGatewayRoute rule matches that header exactly. A rule's backends are tried in
priority order; a BackendTrafficPolicy retry is what moves a failed request to the next priority
(priority alone only fails over once hosts are marked unhealthy).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Optional

from typing import Callable

import pulumi
import pulumi_kubernetes as k8s

from common.constants import ENVOY_OWNING_GATEWAY_LABEL, ENVOY_POD_LABELS, PART_OF, service_fqdn
from config.gateway import GatewayConfig
from config.types import PodPeer, StackConfig
from engines import ServerBuild
from common.constants import LOAD_BALANCER_WAIVER, MTLS_ANNOTATION, TAILSCALE_CLASS, TAILSCALE_HOSTNAME, tailnet_device

from .gateway_routes import (
    MODEL_HEADER,
    object_ref,
    embedding_routes,
    route_rules,
    split_rules,
    hashed_rules,
    traffic_policy_spec,
)
from .meta import VALUE_NOTES_ANNOTATION, token, value_notes

AIGW = "aigateway.envoyproxy.io/v1beta1"
EG = "gateway.envoyproxy.io/v1alpha1"
GWAPI = "gateway.networking.k8s.io/v1"
# Paths on which an embedding model would be asked to generate: refused at the gateway.
GENERATIVE_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/anthropic/v1/messages")
CLIENT_ID_HEADER = "x-client-id"


def derived_client_key(master: str, client: str) -> str:
    """A client's key from the master key: stable, unique per client, useless without the master."""
    return "sk-infer-" + hmac.new(master.encode(), client.encode(), hashlib.sha256).hexdigest()[:40]


SecretReader = Callable[[str], pulumi.Output[str]]


def envoy_peer(gw: GatewayConfig) -> PodPeer:
    """The gateway's Envoy pods, which call the model servers (admitted by the namespace's policy)."""
    return PodPeer(namespace=gw.envoy_namespace, pod_labels={**ENVOY_POD_LABELS, ENVOY_OWNING_GATEWAY_LABEL: gw.name})


def client_keys(gw: GatewayConfig, secret: SecretReader) -> dict[str, pulumi.Output[str]]:
    """Each client's API key: its own secret config key, or derived from the master key."""
    keys = {}
    for client, settings in gw.clients.items():
        if settings.key_config:
            keys[client] = secret(settings.key_config)
        elif gw.master_key_config:
            keys[client] = secret(gw.master_key_config).apply(lambda value, c=client: derived_client_key(value, c))
        else:  # refused by config.checks.gateway_problems
            raise ValueError(f"gateway client {client}: no key_config and no master_key_config")
    return keys


def upstream_keys(gw: GatewayConfig, stack: StackConfig, builds: dict[str, ServerBuild],
                  secret: SecretReader) -> dict[str, pulumi.Output[str]]:
    """The key the gateway sends to each tier: a provider's, or a local server's own."""
    keys = {}
    for tier, settings in gw.tiers.items():
        if settings.remote is not None and settings.remote.api_key_config:
            keys[tier] = secret(settings.remote.api_key_config)
        elif settings.local is not None:
            local = stack.models[settings.local]
            credentials = builds[settings.local].credentials
            if local.api_key is not None and local.api_key.from_config and credentials is not None:
                # The key clients send (llama.cpp: the key file's first line; during a rotation the
                # new key is the second).
                keys[tier] = secret(local.api_key.from_config).apply(credentials.client_key)
    return keys


@dataclass(frozen=True)
class InferenceGatewayArgs:
    gateway: GatewayConfig
    stack: StackConfig
    namespace: str
    # Each server as its engine builds it (engines.server_builds): the names a local tier answers to.
    builds: dict[str, ServerBuild]
    # client id -> API key, and tier -> the key the gateway sends upstream (a remote provider's,
    # or a local llama.cpp server's --api-key): Pulumi secrets.
    client_keys: dict[str, pulumi.Input[str]] = field(default_factory=dict)
    provider_keys: dict[str, pulumi.Input[str]] = field(default_factory=dict)


def _envoy_service(gw: GatewayConfig) -> dict:
    service: dict = {"type": "LoadBalancer"}
    if gw.load_balancer_class is not None:
        service["loadBalancerClass"] = gw.load_balancer_class
    if gw.load_balancer_class == TAILSCALE_CLASS:
        # The tailnet operator names the device after this annotation, else <namespace>-<service>,
        # and Envoy Gateway names the Service envoy-<ns>-<gateway>-<hash>: without it nothing
        # answers at the listener's hostname.
        service["annotations"] = {TAILSCALE_HOSTNAME: tailnet_device(gw.hostname)}
    return service


class InferenceGateway(pulumi.ComponentResource):
    """Gateway, policies, backends and AI routes for one stack's inference plane."""

    gateway: k8s.apiextensions.CustomResource
    routes: list[k8s.apiextensions.CustomResource]
    endpoint: pulumi.Output[str]

    def __init__(self, name: str, args: InferenceGatewayArgs, opts: Optional[pulumi.ResourceOptions] = None):
        missing = sorted(set(args.gateway.clients) - set(args.client_keys))
        if missing:  # checked before anything is registered
            raise ValueError(f"no API key value for gateway clients: {', '.join(missing)}")
        missing = sorted(t for t, tier in args.gateway.tiers.items() if tier.remote is not None and t not in args.provider_keys)
        if missing:
            raise ValueError(f"no provider key value for tiers: {', '.join(missing)}")
        if args.gateway.name != name:
            # Stacks brought up before the component was named "gateway" know it by the Gateway's name.
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(aliases=[pulumi.Alias(name=args.gateway.name)]))
        super().__init__(token("InferenceGateway"), name, None, opts)
        self._args = args
        gw = args.gateway
        self._labels = {**PART_OF, "inference-plane/gateway": gw.name}

        if gw.create_class:
            self._cr(
                f"{name}-class",
                GWAPI,
                "GatewayClass",
                {"name": gw.class_name, "labels": dict(self._labels)},
                {"controllerName": "gateway.envoyproxy.io/gatewayclass-controller"},
            )
        proxy_meta = self._meta(f"{gw.name}-proxy")
        if gw.load_balancer_class != TAILSCALE_CLASS:
            # Off the tailnet on purpose: the reason the config gave, for the policy and the reader.
            proxy_meta["annotations"] = {LOAD_BALANCER_WAIVER: gw.load_balancer_reason or ""}
        proxy = self._cr(
            f"{name}-proxy",
            EG,
            "EnvoyProxy",
            proxy_meta,
            {
                "provider": {
                    "type": "Kubernetes",
                    "kubernetes": {
                        # Tailnet by default: the load-balancer class hands the Service to the tailnet
                        # operator; a LAN or other class only with load_balancer_reason.
                        "envoyService": _envoy_service(gw)
                    },
                }
            },
        )
        certificate = self._cr(
            f"{name}-certificate",
            "cert-manager.io/v1",
            "Certificate",
            self._meta(gw.tls_secret),
            {
                "secretName": gw.tls_secret,
                "dnsNames": [gw.hostname],
                "issuerRef": {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": args.stack.cluster.cert_manager_issuer},
            },
        )
        gateway_meta = self._meta(gw.name)
        # Read by the policy pack: a client certificate must be required whenever this says so.
        gateway_meta["annotations"] = {MTLS_ANNOTATION: "required" if gw.client_ca_secret else "off"}
        self.gateway = self._cr(
            name,
            GWAPI,
            "Gateway",
            gateway_meta,
            {
                "gatewayClassName": gw.class_name,
                "listeners": [
                    {
                        "name": "https",
                        "protocol": "HTTPS",
                        "port": gw.port,
                        "hostname": gw.hostname,
                        "tls": {
                            "mode": "Terminate",
                            "certificateRefs": [{"group": "", "kind": "Secret", "name": gw.tls_secret}],
                        },
                        "allowedRoutes": {"namespaces": {"from": "Same"}},
                    }
                ],
                "infrastructure": {"parametersRef": {"group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "name": f"{gw.name}-proxy"}},
            },
            depends_on=[proxy, certificate],
        )
        gateway_ref = object_ref("gateway.networking.k8s.io", "Gateway", gw.name)
        self._client_traffic(name, gateway_ref)
        self._api_keys(name, gateway_ref)
        self._tiers(name)
        self.routes = self._ai_routes(name)
        self._embedding_guard(name)
        self._llamacpp_embeddings(name)
        self.endpoint = pulumi.Output.from_input(f"https://{gw.hostname}")
        self.register_outputs({"endpoint": self.endpoint, "routes": [r.metadata["name"] for r in self.routes]})

    # -- helpers ---------------------------------------------------------------------------------

    def _parent_refs(self) -> list[dict]:
        return [object_ref("gateway.networking.k8s.io", "Gateway", self._args.gateway.name)]

    def _meta(self, object_name: str) -> dict:
        return {"name": object_name, "namespace": self._args.namespace, "labels": dict(self._labels)}

    def _cr(self, resource_name: str, api_version: str, kind: str, meta: dict, spec: dict, depends_on=None):
        # Custom resources have no readiness await; the controllers reconcile in any order, so
        # depends_on only orders what refers to a Secret or object created here.
        return k8s.apiextensions.CustomResource(
            resource_name,
            api_version=api_version,
            kind=kind,
            metadata=meta,
            spec=spec,
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends_on or []),
        )

    def _secret(self, resource_name: str, secret_name: str, values: dict[str, pulumi.Input[str]],
                holds: Optional[dict[str, str]] = None):
        """``holds``: what each key must hold, for whoever creates the Secret by hand (a rendered
        folder's SECRETS.md reads it from the VALUE_NOTES_ANNOTATION)."""
        meta = self._meta(secret_name)
        if holds:
            meta["annotations"] = {**meta.get("annotations", {}), VALUE_NOTES_ANNOTATION: value_notes(holds)}
        return k8s.core.v1.Secret(
            resource_name,
            metadata=meta,
            type="Opaque",
            string_data=pulumi.Output.secret(pulumi.Output.all(**values)) if values else {},
            opts=pulumi.ResourceOptions(parent=self),
        )

    # -- pieces ----------------------------------------------------------------------------------

    def _client_traffic(self, name: str, gateway_ref: dict) -> None:
        gw = self._args.gateway
        # One ClientTrafficPolicy for everything: policies of one kind on one target do not merge.
        spec: dict = {
            "targetRefs": [gateway_ref],
            "connection": {"bufferLimit": gw.buffer_limit},
            "timeout": {"http": {"streamIdleTimeout": gw.stream_idle_timeout}},
        }
        if gw.client_ca_secret is not None:
            # Bare probes without a client certificate die at the TLS handshake, by design.
            spec["tls"] = {
                "clientValidation": {
                    "mode": "RequireAndVerify",
                    "caCertificateRefs": [{"group": "", "kind": "Secret", "name": gw.client_ca_secret}],
                }
            }
        self._cr(f"{name}-clients", EG, "ClientTrafficPolicy", self._meta(f"{gw.name}-clients"), spec)

    def _api_keys(self, name: str, gateway_ref: dict) -> None:
        gw = self._args.gateway
        secret_name = f"{gw.name}-api-keys"
        secret = self._secret(f"{name}-api-keys", secret_name, {c: self._args.client_keys[c] for c in sorted(gw.clients)},
                              holds={c: f"client {c}'s own gateway key" for c in sorted(gw.clients)})
        self._cr(
            f"{name}-api-key-auth",
            EG,
            "SecurityPolicy",
            self._meta(f"{gw.name}-api-keys"),
            {
                # On the Gateway: every route behind it, AI or plain, needs a key.
                "targetRefs": [gateway_ref],
                "apiKeyAuth": {
                    "credentialRefs": [{"group": "", "kind": "Secret", "name": secret_name}],
                    # The configured header first, then Authorization: Envoy's api_key_auth takes the
                    # first header present, strips a leading "Bearer " from any header
                    # (source/extensions/filters/http/api_key_auth/api_key_auth.cc, KeySources::Source::getKey;
                    # Envoy 1.38 in Envoy Gateway v1.8.3), and answers 401 without trying the next. So
                    # OpenAI SDKs, Open WebUI and editor plugins, which send `Authorization: Bearer <key>`,
                    # work unchanged, and a client sending both is judged by x-api-key.
                    "extractFrom": [{"headers": list(dict.fromkeys([gw.api_key_header, "authorization"]))}],
                    # The client's key is stripped before forwarding (both headers): it never reaches an
                    # engine or a provider (each tier gets its own key from a BackendSecurityPolicy).
                    "sanitize": True,
                    "forwardClientIDHeader": CLIENT_ID_HEADER,
                },
            },
            depends_on=[self.gateway, secret],
        )

    def _tiers(self, name: str) -> None:
        gw, stack, ns = self._args.gateway, self._args.stack, self._args.namespace
        for tier_name, tier in gw.tiers.items():
            if tier.local is not None:
                model = stack.models[tier.local]
                # The engine's Service by FQDN (headless for a StatefulSet: every ready pod). All
                # tiers of a chain are FQDN endpoints so they share one cluster and its priorities.
                endpoint = {"fqdn": {"hostname": service_fqdn(model.name, ns), "port": model.port}}
                prefix = "/v1"
            else:
                remote = tier.remote
                if remote is None:  # refused by config.checks.gateway_problems
                    raise ValueError(f"tier {tier_name}: neither local nor remote")
                endpoint = {"fqdn": {"hostname": remote.host, "port": remote.port}}
                prefix = remote.prefix
            backend = self._cr(f"{name}-backend-{tier_name}", EG, "Backend", self._meta(tier_name), {"endpoints": [endpoint]})
            if tier.remote is not None:
                self._cr(
                    f"{name}-backend-tls-{tier_name}",
                    GWAPI,
                    "BackendTLSPolicy",
                    self._meta(f"{tier_name}-tls"),
                    {
                        "targetRefs": [object_ref("gateway.envoyproxy.io", "Backend", tier_name)],
                        "validation": {"wellKnownCACertificates": "System", "hostname": tier.remote.host},
                    },
                    depends_on=[backend],
                )
            service_backend = self._cr(
                f"{name}-ai-backend-{tier_name}",
                AIGW,
                "AIServiceBackend",
                self._meta(tier_name),
                {
                    "schema": {"name": "OpenAI", "prefix": prefix},
                    "backendRef": {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": tier_name},
                },
                depends_on=[backend],
            )
            if tier_name in self._args.provider_keys:
                key_secret = f"{tier_name}-provider-key"
                secret = self._secret(f"{name}-provider-key-{tier_name}", key_secret, {"apiKey": self._args.provider_keys[tier_name]},
                                      holds={"apiKey": self._key_source(tier_name)})
                self._cr(
                    f"{name}-provider-auth-{tier_name}",
                    AIGW,
                    "BackendSecurityPolicy",
                    self._meta(key_secret),
                    {
                        "targetRefs": [object_ref("aigateway.envoyproxy.io", "AIServiceBackend", tier_name)],
                        "type": "APIKey",
                        "apiKey": {"secretRef": {"name": key_secret}},
                    },
                    depends_on=[service_backend, secret],
                )

    def _ai_routes(self, name: str) -> list[k8s.apiextensions.CustomResource]:
        gw = self._args.gateway
        routes = []
        # (resource prefix, rules, retried status codes); chat keeps the first landing's names.
        groups = [("routes", route_rules(gw, self._args.builds, "chat"), gw.retry.status_codes)]
        if embedding_routes(gw):
            groups.append(("embedding-routes", route_rules(gw, self._args.builds, "embedding"), gw.retry.embedding_status_codes))
        for prefix, group_rules, status_codes in groups:
            for index, rules in enumerate(split_rules(group_rules), start=1):
                routes.append(self._ai_route(name, f"{prefix}-{index}", rules, status_codes))
        return routes

    def _ai_route(self, name: str, suffix: str, rules: list[dict], status_codes: list[int]):
        gw = self._args.gateway
        route_name = f"{gw.name}-{suffix}"
        route = self._cr(
            f"{name}-{suffix}",
            AIGW,
            "AIGatewayRoute",
            self._meta(route_name),
            {
                "parentRefs": self._parent_refs(),
                "rules": rules,
            },
        )
        spec = traffic_policy_spec(gw, self._args.stack, route_name, rules, status_codes)
        self._cr(
            f"{name}-{suffix}-traffic",
            EG,
            "BackendTrafficPolicy",
            self._meta(route_name),
            spec,
            depends_on=[route],
        )
        hashed = hashed_rules(gw, self._args.stack, rules)
        if hashed:
            self._cr(
                f"{name}-{suffix}-affinity",
                EG,
                "BackendTrafficPolicy",
                self._meta(f"{route_name}-affinity"),
                traffic_policy_spec(gw, self._args.stack, route_name, rules, status_codes, hashed),
                depends_on=[route],
            )
        return route

    def _embedding_guard(self, name: str) -> None:
        """Refuse generation requests that name an embedding model, before they reach it."""
        gw = self._args.gateway
        models = [r.model for r in embedding_routes(gw)]
        if not models:
            return
        filter_name = f"{gw.name}-embedding-guard"
        guard = self._cr(
            f"{name}-embedding-guard-filter",
            EG,
            "HTTPRouteFilter",
            self._meta(filter_name),
            {
                "directResponse": {
                    "statusCode": 400,
                    "contentType": "application/json",
                    "body": {
                        "type": "Inline",
                        "inline": '{"error":{"code":400,"type":"invalid_request_error",'
                        '"message":"this is an embedding model: use /v1/embeddings"}}',
                    },
                }
            },
        )
        # The AI gateway sets x-ai-eg-model from the body and re-matches the route; a longer path
        # with that header then wins over the AI routes' "/" and answers 400 instead of nonsense.
        rules = [
            {
                "matches": [
                    {
                        "path": {"type": "PathPrefix", "value": path},
                        "headers": [{"type": "Exact", "name": MODEL_HEADER, "value": model}],
                    }
                    for path in GENERATIVE_PATHS
                ],
                "filters": [{"type": "ExtensionRef", "extensionRef": {"group": "gateway.envoyproxy.io", "kind": "HTTPRouteFilter", "name": filter_name}}],
            }
            for model in models
        ]
        self._cr(
            f"{name}-embedding-guard",
            GWAPI,
            "HTTPRoute",
            self._meta(filter_name),
            {"parentRefs": self._parent_refs(), "rules": rules},
            depends_on=[guard],
        )

    def _llamacpp_embeddings(self, name: str) -> None:
        gw, stack = self._args.gateway, self._args.stack
        path = gw.llamacpp_embeddings
        if path is None:
            return
        model = stack.models[path.model]
        filters: list[dict] = [
            {
                "type": "URLRewrite",
                "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v1/embeddings"}},
            }
        ]
        depends = []
        key = self._args.provider_keys.get(self._local_tier_of(path.model) or "")
        if key is not None:
            # The client's gateway key was stripped; llama.cpp wants its own as a bearer token.
            credential = f"{gw.name}-llamacpp-credential"
            secret = self._secret(
                f"{name}-llamacpp-credential", credential, {"credential": pulumi.Output.concat("Bearer ", key)},
                holds={"credential": "'Bearer ' followed by " + self._key_source(self._local_tier_of(path.model) or "")},
            )
            inject = self._cr(
                f"{name}-llamacpp-credential-filter",
                EG,
                "HTTPRouteFilter",
                self._meta(credential),
                # overwrite: OpenAI SDK clients always send an Authorization header (the gateway key
                # it carried is not llama.cpp's); without it Envoy Gateway keeps the client's header
                # (the field defaults to false) and llama.cpp, which reads Authorization first, says 401.
                {"credentialInjection": {"overwrite": True,
                                         "credential": {"valueRef": {"group": "", "kind": "Secret", "name": credential}}}},
                depends_on=[secret],
            )
            depends.append(inject)
            filters.append(
                {
                    "type": "ExtensionRef",
                    "extensionRef": {"group": "gateway.envoyproxy.io", "kind": "HTTPRouteFilter", "name": credential},
                }
            )
        route = self._cr(
            f"{name}-llamacpp-embeddings",
            GWAPI,
            "HTTPRoute",
            self._meta(f"{gw.name}-llamacpp-embeddings"),
            {
                "parentRefs": self._parent_refs(),
                "hostnames": [gw.hostname],
                "rules": [
                    {
                        "matches": [{"path": {"type": "PathPrefix", "value": path.path}}],
                        "filters": filters,
                        "backendRefs": [{"group": "", "kind": "Service", "name": model.name, "port": model.port}],
                        "timeouts": {"request": path.timeout},
                    }
                ],
            },
            depends_on=depends,
        )
        # Envoy Gateway sets no route-level idle timeout: the ClientTrafficPolicy's
        # streamIdleTimeout would end a batch that takes longer than it to answer (an embeddings
        # response arrives all at once at the end). The route's own idle limit is its request timeout.
        self._cr(
            f"{name}-llamacpp-embeddings-traffic",
            EG,
            "BackendTrafficPolicy",
            self._meta(f"{gw.name}-llamacpp-embeddings"),
            {
                "targetRefs": [object_ref("gateway.networking.k8s.io", "HTTPRoute", f"{gw.name}-llamacpp-embeddings")],
                "timeout": {"http": {"streamIdleTimeout": path.timeout}},
            },
            depends_on=[route],
        )

    def _key_source(self, tier_name: str) -> str:
        """Where a tier's upstream key comes from, in words a person creating the Secret can follow."""
        tier = self._args.gateway.tiers[tier_name]
        model = self._args.stack.models.get(tier.local) if tier.local else None
        if model is not None and model.api_key is not None:
            return (f"the first line of {model.api_key.secret_key} in Secret {model.api_key.secret_name} "
                    f"(models.{tier.local}'s llama.cpp key)")
        if tier.remote is not None and tier.remote.api_key_config:
            return f"the provider's API key (config {tier.remote.api_key_config})"
        return f"tier {tier_name}'s upstream key"

    def _local_tier_of(self, model_key: str) -> Optional[str]:
        return next((n for n, t in self._args.gateway.tiers.items() if t.local == model_key), None)
