"""Facts stated once. Anything written in two places drifts; these are read from here."""

from __future__ import annotations

# The Pulumi project name: the config namespace (`inference-plane:models`) and the type tokens.
PROJECT = "inference-plane"
TOKEN_PREFIX = f"{PROJECT}:index"
# What the offline render passes for a `secure:` config value, which only the Pulumi CLI can decrypt.
OFFLINE_SECRET_PLACEHOLDER = "offline-render-placeholder"
# The cluster's DNS domain, as every Service's FQDN ends (kubelet --cluster-domain default).
CLUSTER_DOMAIN = "svc.cluster.local"
NAME_LABEL = "app.kubernetes.io/name"
PART_OF = {"app.kubernetes.io/part-of": PROJECT, "app.kubernetes.io/managed-by": "pulumi"}
# Envoy Gateway labels the Envoy pods (and their Service) of a Gateway with the Gateway's name.
ENVOY_OWNING_GATEWAY_LABEL = "gateway.envoyproxy.io/owning-gateway-name"
ENVOY_POD_LABELS = {NAME_LABEL: "envoy"}
# llama.cpp's readiness: 503 while loading, 200 once the weights are resident.
LLAMACPP_HEALTH_PATH = "/health"
LLAMACPP_METRICS_PATH = "/metrics"
# The app.kubernetes.io/component label of each server role. "embeddings" (plural) is what running
# stacks carry and the policy pack matches; changing it would restart every embedding server.
COMPONENT_LABEL = {"chat": "chat", "embedding": "embeddings"}


def service_fqdn(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.{CLUSTER_DOMAIN}"
