"""Facts stated once. Anything written in two places drifts; these are read from here."""

from __future__ import annotations

import re

# Stated in the policy pack, which must run without the project's modules.
from policy.rules import CLUSTER_DOMAIN, LLAMACPP_HEALTH_PATH

# The Pulumi project name: the config namespace (`inference-plane:models`) and the type tokens.
PROJECT = "inference-plane"
TOKEN_PREFIX = f"{PROJECT}:index"
# What the offline render passes for a `secure:` config value, which only the Pulumi CLI can decrypt.
OFFLINE_SECRET_PLACEHOLDER = "offline-render-placeholder"
NAME_LABEL = "app.kubernetes.io/name"
PART_OF = {"app.kubernetes.io/part-of": PROJECT, "app.kubernetes.io/managed-by": "pulumi"}
# Envoy Gateway labels the Envoy pods (and their Service) of a Gateway with the Gateway's name.
ENVOY_OWNING_GATEWAY_LABEL = "gateway.envoyproxy.io/owning-gateway-name"
ENVOY_POD_LABELS = {NAME_LABEL: "envoy"}
# llama.cpp's readiness is LLAMACPP_HEALTH_PATH: 503 while loading, 200 once the weights are resident.
LLAMACPP_METRICS_PATH = "/metrics"
# The app.kubernetes.io/component label of each server role. "embeddings" (plural) is what running
# stacks carry and the policy pack matches; changing it would restart every embedding server.
COMPONENT_LABEL = {"chat": "chat", "embedding": "embeddings"}


def service_fqdn(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.{CLUSTER_DOMAIN}"


__all__ = [
    "CLUSTER_DOMAIN", "COMPONENT_LABEL", "ENVOY_OWNING_GATEWAY_LABEL", "ENVOY_POD_LABELS", "LLAMACPP_HEALTH_PATH",
    "LLAMACPP_METRICS_PATH", "NAME_LABEL", "OFFLINE_SECRET_PLACEHOLDER", "PART_OF", "PROJECT", "TOKEN_PREFIX", "service_fqdn",
]

# A git commit as the Hugging Face Hub names it: the only revision that never moves (branches and
# tags can). components/hub_download.py keeps its own copy: it runs alone, with `python3 -c`.
COMMIT_ID = re.compile(r"[0-9a-f]{40}")
